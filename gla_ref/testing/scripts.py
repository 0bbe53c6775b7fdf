"""The scripts of ``benchmarks/`` loaded as modules, for the tests that run their smoke paths or helpers.

``benchmarks/`` is part of the repository, not of the installed package: these helpers work in a checkout
(gla_ref imported from it) and say so elsewhere.
"""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
"""The repository's root, when gla_ref is imported from a checkout."""

BENCHMARKS = ROOT / "benchmarks"


def script_path(name: str) -> pathlib.Path:
    """``benchmarks/<name>.py``; FileNotFoundError naming the checkout when gla_ref is not imported from one."""
    path = BENCHMARKS / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: benchmark scripts exist only in a checkout of the repository "
                                f"(gla_ref was imported from {ROOT / 'gla_ref'})")
    return path


def load_script(name: str):
    """``benchmarks/<name>.py`` imported under the module name ``name`` (a fresh module on every call)."""
    spec = importlib.util.spec_from_file_location(name, script_path(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
