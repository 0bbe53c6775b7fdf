"""The one device switch of gla_ref.

Every notebook and kernel asks this module what runs where:

* a CUDA GPU       -> native Triton kernels; Pallas on its GPU (Triton) backend;
* a TPU            -> Pallas lowered through Mosaic;
* neither (a CPU)  -> Triton's interpreter and Pallas ``interpret=True``.

Frameworks are imported lazily, so ``import gla_ref.device`` stays cheap.
"""

from __future__ import annotations

import contextlib
import os
from functools import lru_cache

_DEBUG = False


@lru_cache(maxsize=None)
def has_cuda() -> bool:
    """True when PyTorch sees a CUDA device (False when torch is missing)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@lru_cache(maxsize=None)
def jax_platform() -> str:
    """JAX's default platform: ``"gpu"``, ``"tpu"`` or ``"cpu"``."""
    import jax

    return jax.default_backend()


def torch_device() -> str:
    """The device PyTorch tensors should live on: ``"cuda"`` or ``"cpu"``."""
    return "cuda" if has_cuda() else "cpu"


def triton_interpret() -> bool:
    """True when Triton must run in its CPU interpreter (no CUDA device)."""
    return not has_cuda()


def use_triton_interpreter() -> bool:
    """Set ``TRITON_INTERPRET=1`` when there is no GPU; returns whether it is set.

    Must run before any ``@triton.jit`` kernel is defined: ``gla_ref.triton`` calls it first.
    """
    if triton_interpret():
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET") == "1"


def pallas_interpret() -> bool:
    """True when Pallas kernels must run with ``interpret=True`` (JAX on CPU)."""
    return jax_platform() == "cpu"


def backend() -> str:
    """Where the kernels run: ``"cuda"``, ``"tpu"`` or ``"cpu"``."""
    if has_cuda():
        return "cuda"
    try:
        if jax_platform() == "tpu":
            return "tpu"
    except ImportError:
        pass
    return "cpu"


def describe() -> str:
    """One line naming the device and what will run on it (printed by every chapter's setup cell)."""
    kind = backend()
    if kind == "cuda":
        import torch

        return f"GPU {torch.cuda.get_device_name()}: native Triton kernels, Pallas on its Triton backend"
    if kind == "tpu":
        return "TPU: Pallas kernels lowered through Mosaic (Triton kernels are not available)"
    return "CPU: Triton's interpreter and Pallas interpret mode (small shapes, fp32/fp16)"


def debug(enabled: bool = True):
    """Turn value checks in kernels on or off (NaN/inf inputs, positive log-gates).

    Checks need a device sync, so they are off by default. Works as a call or a context manager::

        gla_ref.device.debug(True)
        with gla_ref.device.debug(True): ...
    """
    global _DEBUG
    previous, _DEBUG = _DEBUG, bool(enabled)

    @contextlib.contextmanager
    def _restore():
        global _DEBUG
        try:
            yield
        finally:
            _DEBUG = previous

    return _restore()


def is_debug() -> bool:
    """Whether kernels check input values before launching."""
    return _DEBUG
