"""Loading a script of ``benchmarks/`` as a module, for the tests that run its smoke path or its helpers."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script(name: str):
    """``benchmarks/<name>.py`` imported under the module name ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
