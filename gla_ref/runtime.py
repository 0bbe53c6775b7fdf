"""The reader's runtime: what a chapter needs, installing only what is missing, and the project's address.

Every chapter's first cell calls :func:`setup` with the frameworks it uses. On Colab, a laptop or a GPU
machine it

1. installs a framework's modules only when they cannot be imported (``pip install``, the requirements of
   :data:`REQUIREMENTS`, absl with jax): a framework already present — Colab's CUDA torch, a TPU jax — is never
   upgraded or replaced, even when it is older than :data:`MINIMUM` (it says so instead);
2. says plainly when the runtime must be restarted: when an install changed the version of a package
   this Python process has already imported (pip upgrading NumPy under a running kernel, say), the
   old code stays loaded until a restart, so :func:`setup` raises :class:`RestartRequired`;
3. turns on the Triton kernels' autotuning lines (``GLA_REF_SHOW_TUNING``: on a GPU the first call at
   a new shape compiles for minutes, and the reader sees which kernel is being tuned), registers the
   ``%%needs`` cell magic (``%%needs triton`` on a cell's first line runs the cell only
   where Triton can be imported, and otherwise prints what was skipped), and prints
   :func:`gla_ref.device.describe`: what will run where.

Importing this module loads no framework.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pathlib
import subprocess
import sys

REQUIREMENTS = {"torch": {"torch": "torch>=2.5"}, "triton": {"triton": "triton>=3.3"},
                "jax": {"jax": "jax>=0.10", "absl": "absl-py>=1.0"}}
"""Each framework's modules, and what ``pip`` is asked for when one of them cannot be imported (the ``torch``
and ``jax`` extras of gla_ref: jax's Mosaic GPU modules import absl, which jax itself does not require)."""

MINIMUM = {"torch": (2, 5), "triton": (3, 3), "jax": (0, 10)}
"""Oldest release of each framework the library is tested with."""

NO_INSTALL = "GLA_REF_NO_INSTALL"
"""Environment variable: when set to 1, :func:`setup` installs nothing and only reports what is missing."""


class RestartRequired(RuntimeError):
    """An install replaced a package this process had already imported: restart, then run the cell again."""


class CellError(RuntimeError):
    """A ``%%needs`` cell failed; its traceback is already on screen, so this error shows one line only."""

    def _render_traceback_(self):  # IPython's hook: what to print instead of a second traceback
        return [f"CellError: {self} (traceback above)"]


def repository_url() -> str:
    """The project's repository, as ``[project.urls] Repository`` in ``pyproject.toml`` declares it: read
    from the installed package's metadata, or from the ``pyproject.toml`` of the checkout it is imported from."""
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        return tomllib.loads(pyproject.read_text())["project"]["urls"]["Repository"]
    for entry in importlib.metadata.metadata("gla_ref").get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        if label.strip() == "Repository":
            return url.strip()
    raise LookupError("gla_ref's metadata names no Repository URL")


def available(name: str) -> bool:
    """Whether every module of the framework ``name`` (``"torch"``, ``"triton"``, ``"jax"``) can be imported,
    without importing them."""
    return not _missing_modules(name)


def _missing_modules(name: str) -> list:
    return [module for module in REQUIREMENTS[name] if importlib.util.find_spec(module) is None]


def installable(name: str) -> bool:
    """Whether pip can install ``name`` here: Triton publishes wheels for Linux only (macOS and
    Windows run the book without Triton: its cells are skipped)."""
    return name != "triton" or sys.platform.startswith("linux")


def _version_tuple(text: str) -> tuple:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _distribution_versions(names) -> dict:
    """Installed version of each distribution name (None where not installed)."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _imported_distributions() -> list:
    """Distributions whose top-level module this process has imported (their files are in use)."""
    top = {name.split(".")[0] for name in list(sys.modules)}
    dists = importlib.metadata.packages_distributions()
    return sorted({dist for module in top for dist in dists.get(module, ())})


def _pip_install(requirements) -> None:
    print(f"installing {' '.join(requirements)} (missing here) ...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *requirements], check=True)
    importlib.invalidate_caches()


def setup(*needs: str) -> None:
    """Prepare this runtime for a chapter that uses the frameworks ``needs`` (names of :data:`REQUIREMENTS`).

    Installs the missing ones that pip can install here (nothing when ``GLA_REF_NO_INSTALL=1``),
    never touching one already installed; warns about installed ones older than :data:`MINIMUM`;
    raises :class:`RestartRequired` when an install changed a package already imported; registers
    the ``%%needs`` magic under IPython and prints what runs where: a line per framework, then
    :func:`gla_ref.device.describe`.
    """
    unknown = [name for name in needs if name not in REQUIREMENTS]
    if unknown:
        raise ValueError(f"needs must name frameworks among {sorted(REQUIREMENTS)}, got {unknown}")
    lines = []
    missing = [name for name in needs if not available(name) and installable(name)]
    if missing and os.environ.get(NO_INSTALL) != "1":
        imported = _imported_distributions()
        before = _distribution_versions(imported)
        _pip_install([REQUIREMENTS[name][module] for name in missing for module in _missing_modules(name)])
        changed = {name: (old, new) for name, new in _distribution_versions(imported).items()
                   if (old := before[name]) != new}
        if changed:
            what = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in changed.items())
            raise RestartRequired(f"installing {', '.join(missing)} changed packages this kernel has already "
                                  f"loaded ({what}). Restart the runtime (Colab: Runtime > Restart session), "
                                  "then run this cell again.")
    for name in needs:
        lines.append(_status(name))
    _register_magic()
    os.environ.setdefault("GLA_REF_SHOW_TUNING", "1")  # a line per Triton kernel autotuned (minutes on a GPU)
    from gla_ref import device

    lines.append(device.describe())
    for line in lines:
        print(line)


def _status(name: str) -> str:
    """One line on a framework: its version, too old, or missing (and what that skips)."""
    if not available(name):
        why = "pip cannot install it on this platform" if not installable(name) else "not installed"
        return f"{name}: {why}; cells that need it are skipped"
    version = importlib.metadata.version(name)
    if _version_tuple(version) < MINIMUM[name]:
        return (f"{name} {version}: older than the {'.'.join(map(str, MINIMUM[name]))} gla_ref is tested with; "
                f"kept as it is (upgrading it yourself may replace this runtime's accelerator build)")
    return f"{name} {version}"


def needs_cell(line: str, cell: str):
    """The ``%%needs NAME [NAME ...]`` cell magic: run the cell when every named framework can be
    imported, else print which is missing and skip it. A failing cell shows its traceback once and
    then raises :class:`CellError`, so the cell still counts as failed."""
    from IPython import get_ipython

    names = line.split()
    unknown = [name for name in names if name not in REQUIREMENTS]
    if not names or unknown:
        raise ValueError(f"%%needs takes framework names among {sorted(REQUIREMENTS)}, got {line!r}")
    absent = [name for name in names if not available(name)]
    if absent:
        print(f"[skipped: this cell needs {', '.join(absent)}, which cannot be imported here]")
        return None
    result = get_ipython().run_cell(cell, store_history=False)
    if not result.success:
        error = result.error_in_exec or result.error_before_exec
        raise CellError(f"{type(error).__name__}: {error}") from error


def _register_magic() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.register_magic_function(needs_cell, magic_kind="cell", magic_name="needs")
