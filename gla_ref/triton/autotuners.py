"""Every autotuned kernel of :mod:`gla_ref.triton`, found by walking its modules.

Benchmarks that report which kernels tuned, or that pin one config at a time, name a kernel by
its module path below ``gla_ref.triton`` and its name, e.g. ``chunk.state.chunk_state_fwd_kernel``.
A kernel imported into a sibling module is listed once, under the module that defines it.
"""

from __future__ import annotations

import importlib
import pkgutil


def autotuners() -> dict:
    """``{"module.kernel": autotuner}`` for every ``triton.autotune`` kernel of gla_ref.triton, sorted."""
    import gla_ref.triton as package  # first: it selects the interpreter on a machine without CUDA
    from triton.runtime.autotuner import Autotuner

    found = {}  # id → (label, autotuner)
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(info.name)
        label = info.name.removeprefix(f"{package.__name__}.")
        for name, obj in vars(module).items():
            if isinstance(obj, Autotuner):
                home = getattr(obj.fn, "module", None) or getattr(obj.fn, "__module__", None)
                if home == module.__name__ or id(obj) not in found:
                    found[id(obj)] = (f"{label}.{name}", obj)
    return dict(sorted(found.values(), key=lambda pair: pair[0]))
