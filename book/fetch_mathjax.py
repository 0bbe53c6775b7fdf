"""Put MathJax 3 into book/_vendor/mathjax/ so the book typesets math with no CDN.

The files come from a package registry, the only network the build may use:
PyPI's ``django-static-mathjax`` wheel (which ships MathJax's ``es5/`` components), or
npm's ``mathjax`` tarball as a fallback. Only the pieces the HTML pages can load are kept:
the ``tex-chtml.js`` bundle, the TeX extensions it autoloads, the CHTML output and its woff
fonts, and the menu / accessibility components. Running it again does nothing when the
same version is already in place.

Why not book/_static/: Jupyter Book adds a <script> tag for every .js file found under the
static paths as soon as a book/_static folder exists, which would load all of MathJax's
components on every page. book/_vendor is listed in html_static_path instead, so its
mathjax/ folder is copied to _static/mathjax/ in the site and only tex-chtml.js is loaded.

Usage: ``python book/fetch_mathjax.py [--force]``
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MATHJAX_VERSION = "3.2.2"
PYPI_REQUIREMENT = "django-static-mathjax==3.2.2.1"
NPM_PACKAGE = f"mathjax@{MATHJAX_VERSION}"
DEST = Path(__file__).resolve().parent / "_vendor" / "mathjax"
STAMP = ".version"
# Paths under MathJax's es5/ directory that the pages may request.
KEEP = ("tex-chtml.js", "input/", "output/", "ui/", "a11y/", "sre/", "adaptors/")
# Files that must exist afterwards: the bundle, one autoloaded extension, one font.
REQUIRED = (
    "tex-chtml.js",
    "input/tex/extensions/boldsymbol.js",
    "output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff",
    "LICENSE",
)


def is_installed(dest: Path = DEST) -> bool:
    """True when ``dest`` holds this MathJax version with every required file."""
    stamp = dest / STAMP
    return (
        stamp.is_file()
        and stamp.read_text().strip() == MATHJAX_VERSION
        and all((dest / name).is_file() for name in REQUIRED)
    )


def _members(names: list[str]) -> tuple[str, str]:
    """Return (prefix of the es5/ directory, path of LICENSE) inside an archive listing."""
    bundles = [n for n in names if n.endswith("es5/tex-chtml.js")]
    if len(bundles) != 1:
        raise RuntimeError(f"expected one es5/tex-chtml.js in the archive, found {bundles}")
    es5 = bundles[0][: -len("tex-chtml.js")]
    root = es5[: -len("es5/")]
    if root + "LICENSE" not in names:
        raise RuntimeError(f"no LICENSE next to {es5} in the archive")
    return es5, root + "LICENSE"


def _extract(read, names: list[str], staging: Path) -> None:
    """Copy the kept es5/ files and the LICENSE, via ``read(name) -> bytes``, into staging."""
    es5, license_name = _members(names)
    wanted = {license_name: "LICENSE"}
    for name in names:
        rel = name[len(es5):]
        if name.startswith(es5) and not name.endswith("/") and rel.startswith(KEEP):
            wanted[name] = rel
    for name, rel in wanted.items():
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(read(name))


def _from_pypi(workdir: Path, staging: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         "--only-binary", ":all:", "-d", str(workdir), PYPI_REQUIREMENT],
        check=True,
    )
    (wheel,) = workdir.glob("django_static_mathjax-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        _extract(zf.read, zf.namelist(), staging)


def _from_npm(workdir: Path, staging: Path) -> None:
    subprocess.run(["npm", "pack", NPM_PACKAGE, "--silent"], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL)
    (tgz,) = workdir.glob("mathjax-*.tgz")
    with tarfile.open(tgz) as tf:
        files = {m.name: m for m in tf.getmembers() if m.isfile()}
        _extract(lambda name: tf.extractfile(files[name]).read(), list(files), staging)


def fetch(dest: Path = DEST, force: bool = False) -> str:
    """Install MathJax into ``dest``; returns where it came from ("present", "pypi" or "npm")."""
    if is_installed(dest) and not force:
        return "present"
    errors = []
    for source, getter in (("pypi", _from_pypi), ("npm", _from_npm)):
        with tempfile.TemporaryDirectory() as tmp:
            workdir, staging = Path(tmp) / "download", Path(tmp) / "mathjax"
            workdir.mkdir()
            try:
                getter(workdir, staging)
            except (OSError, RuntimeError, ValueError, subprocess.CalledProcessError,
                    zipfile.BadZipFile, tarfile.TarError) as err:
                errors.append(f"{source}: {err}")
                continue
            (staging / STAMP).write_text(MATHJAX_VERSION + "\n")
            if not is_installed(staging):
                errors.append(f"{source}: archive lacks one of {REQUIRED}")
                continue
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(staging, dest)
            return source
    raise RuntimeError("could not fetch MathJax " + MATHJAX_VERSION + ":\n  " + "\n  ".join(errors))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="fetch again even when present")
    args = parser.parse_args(argv)
    source = fetch(force=args.force)
    size = sum(p.stat().st_size for p in DEST.rglob("*") if p.is_file())
    print(f"MathJax {MATHJAX_VERSION} in {DEST} ({source}, {size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
