"""The one device switch of gla_ref.

Every notebook and kernel asks this module what runs where:

* a CUDA GPU       -> native Triton kernels; Pallas on its GPU (Triton) backend;
* a TPU            -> Pallas lowered through Mosaic;
* neither (a CPU)  -> Triton's interpreter and Pallas ``interpret=True``.

On a TPU runtime (Colab's), PyTorch runs on the CPU, so the Triton kernels run in the interpreter
there too. Where Triton cannot be installed (macOS, Windows) its cells are skipped (``%%needs
triton``, :mod:`gla_ref.runtime`).

Frameworks are imported lazily, so ``import gla_ref.device`` stays cheap.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from functools import lru_cache
from typing import NamedTuple

from gla_ref._validate import check_flag

_DEBUG = contextvars.ContextVar("gla_ref_debug", default=False)
"""The debug switch, per context (thread or asyncio task): see :func:`debug`."""


@lru_cache(maxsize=None)
def has_cuda() -> bool:
    """True when PyTorch sees a CUDA device (False when torch is missing)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class GPU(NamedTuple):
    """A CUDA GPU as the chapters choose for it: its name, compute capability and memory."""
    name: str
    capability: tuple
    memory_gib: float

    @property
    def bf16(self) -> bool:
        """bfloat16 tensor cores: compute capability 8.0 on (A100, L4, H100, H200); a T4 (7.5) has fp16 ones only."""
        return tuple(self.capability) >= (8, 0)

    @property
    def hopper(self) -> bool:
        """Compute capability 9.x (H100, H200): ``wgmma`` and TMA, which the Mosaic GPU launcher needs."""
        return self.capability[0] == 9

    def summary(self) -> str:
        """One phrase: capability, memory, and what that means for the chapters."""
        dtypes = "bf16 tensor cores" if self.bf16 else "no bf16 tensor cores: chapters use float16"
        hopper = "; Hopper: the Mosaic GPU launcher runs" if self.hopper else ""
        return f"sm_{self.capability[0]}{self.capability[1]}, {self.memory_gib:.0f} GiB, {dtypes}{hopper}"


def gpu() -> GPU | None:
    """The CUDA GPU this process uses, or None without one."""
    if not has_cuda():
        return None
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return GPU(props.name, (props.major, props.minor), props.total_memory / 2**30)


def half_dtype():
    """The 16-bit torch dtype a chapter runs the kernels in here: bfloat16 on a GPU with bf16 tensor cores, float16
    on one without (a T4) and on a CPU (Triton's interpreter computes bf16 ``tl.dot`` wrongly)."""
    import torch

    card = gpu()
    return torch.bfloat16 if card is not None and card.bf16 else torch.float16


def jax_default_device():
    """The device JAX puts new arrays on: the one a ``jax.default_device(...)`` context (or the
    ``jax_default_device`` setting) names, else the default backend's first device. Not cached: a
    ``jax.default_device`` context can change it between calls."""
    import jax

    dev = jax.config.jax_default_device
    if isinstance(dev, str):
        return jax.devices(dev)[0]
    return jax.devices()[0] if dev is None else dev


def jax_platform() -> str:
    """The platform of :func:`jax_default_device`: ``"gpu"``, ``"tpu"`` or ``"cpu"``. Inside
    ``jax.default_device(jax.devices("cpu")[0])`` on a GPU machine this is ``"cpu"``."""
    return jax_default_device().platform


def torch_device() -> str:
    """The device PyTorch tensors should live on: ``"cuda"`` or ``"cpu"``."""
    return "cuda" if has_cuda() else "cpu"


def triton_interpret() -> bool:
    """True when Triton must run in its CPU interpreter (no CUDA device)."""
    return not has_cuda()


def use_triton_interpreter() -> bool:
    """Run Triton in its CPU interpreter when there is no GPU; returns whether Triton interprets.

    ``gla_ref.triton`` calls it before it defines any ``@triton.jit`` kernel. Triton chooses interpreted or
    compiled versions of its own library functions (``tl.sum``, ``tl.cumsum``, ...) when it is first imported,
    from the environment, so when Triton is not imported yet ``TRITON_INTERPRET=1`` is set for that import.
    Where Triton has knobs (``triton.knobs``; Triton 3.4 on) the switch is then handed to
    ``triton.knobs.runtime.interpret`` and the variable taken out of ``os.environ`` again: it holds for this
    process, but child processes do not inherit it (a child that imports ``gla_ref.triton`` makes the same
    choice for itself). A variable the user set is left alone; with a Triton that has no knobs it stays set.
    When something imported Triton first, in compiled mode (``torch.optim.AdamW`` can, FLA does), see
    :func:`interpret_imported_triton`.
    """
    if triton_interpret() and not triton_interprets():
        if "triton" in sys.modules:
            interpret_imported_triton(sys.modules["triton"])
            return triton_interprets()
        ours = os.environ.get("TRITON_INTERPRET") != "1"
        os.environ["TRITON_INTERPRET"] = "1"
        import triton

        runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
        if ours and runtime is not None and hasattr(runtime, "interpret"):
            runtime.interpret = True
            del os.environ["TRITON_INTERPRET"]
    return triton_interprets()


def interpret_imported_triton(triton) -> None:
    """Switch an already imported, compiled-mode ``triton`` to its interpreter (a machine without CUDA only).

    Its library functions were built for the compiler, and the interpreter cannot call them: with a Triton that
    has ``triton.knobs.runtime.interpret`` this turns the knob on and rebuilds those functions for the
    interpreter, so the kernels give the same results as when ``gla_ref.triton`` is imported first (tested).
    Otherwise it raises an ImportError that says what to do.
    """
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        runtime = None
    if runtime is None or not hasattr(runtime, "interpret"):
        raise ImportError("Triton was imported before gla_ref.triton on a machine without CUDA, and this Triton "
                          f"({getattr(triton, '__version__', '?')}) has no triton.knobs.runtime.interpret to switch "
                          "its interpreter on afterwards: import gla_ref.triton first (before anything that imports "
                          "triton), or set TRITON_INTERPRET=1 in the environment before starting Python; "
                          "or use backend='auto'/'reference', which never needs Triton")
    runtime.interpret = True
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, obj in list(vars(module).items()):
            if type(obj) is JITFunction:
                setattr(module, attr, InterpretedFunction(obj.fn))


def triton_interprets() -> bool:
    """Whether Triton runs kernels in its interpreter now: its knob where it has one, else the variable.
    Reads Triton's state only once Triton is imported (it is never imported here)."""
    runtime = getattr(getattr(sys.modules.get("triton"), "knobs", None), "runtime", None)
    if runtime is not None and hasattr(runtime, "interpret"):
        return bool(runtime.interpret)
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


def has_triton() -> bool:
    """Whether Triton can be imported here (pip has no Triton for macOS or Windows), without importing it."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def _jax_platform_or_none():
    """JAX's default platform, or None where JAX is not installed."""
    try:
        return jax_platform()
    except ImportError:
        return None


def describe() -> str:
    """What will run where on this machine, in one line (printed by every chapter's setup cell).

    Names the accelerator, then where the Triton kernels run (compiled for a CUDA GPU, Triton's CPU
    interpreter, or skipped without Triton) and where the Pallas kernels run (Mosaic on a TPU, the GPU,
    or interpret mode on the CPU — also when a GPU is present but this jax has no GPU backend)."""
    platform = _jax_platform_or_none()
    card = gpu()
    if card is not None:
        head = f"GPU {card.name}"
        triton = "Triton kernels compiled for this GPU" if has_triton() else "Triton not installed: its cells skip"
    else:
        head = f"TPU ({_tpu_kind()})" if platform == "tpu" else "CPU"
        triton = ("Triton kernels in Triton's CPU interpreter (fp32/fp16, small shapes)" if has_triton()
                  else "Triton not installed here: its cells skip")
    pallas = {
        None: "JAX not installed: Pallas cells skip",
        "tpu": "Pallas lowered through Mosaic TPU",
        "gpu": "Pallas on the GPU (its Triton backend)",
        "cpu": ("Pallas in interpret mode on the CPU (this jax has no GPU backend)" if card is not None
                else "Pallas in interpret mode on the CPU"),
    }.get(platform, f"Pallas on {platform}")
    return f"{head}: {triton}; {pallas}" + ("" if card is None else f" ({card.summary()})")


def _tpu_kind() -> str:
    import jax

    return jax.devices()[0].device_kind


def debug(enabled: bool = True):
    """Turn the kernels' value checks (NaN/inf inputs, invalid log-gates) on or off, in this context.

    The checks need a device sync, so they are off by default. What they check: q, k, v and the
    initial state are finite, and every log-gate (``g``, ``g_gamma``) is valid, that is finite and
    ≤ 0. NaN, a positive value (a gate passed as a probability instead of its log) and -inf (a gate
    of exactly 0, a hard reset: not supported anywhere, split the sequences with ``cu_seqlens``)
    raise the references' ValueError, naming the argument and its first bad position
    (``g[b=0, t=5, h=1, k=3]``; :func:`gla_ref._validate.check_gate_values`). Without debug a
    kernel does not look, but never returns a finite answer for an invalid gate either: it turns
    the gate into NaN where it reads it, at no extra memory traffic, so every output row of its
    sequence and head from that token on (a chunked kernel may start at the chunk's first row),
    the final state's rows of its key channel and the gradients come out NaN. The references
    check always. Under ``jax.jit`` values are not known, so the Pallas kernels can only give NaN.

    The switch is a context variable: each thread has its own (a new thread starts with it off),
    and an asyncio task starts with its creator's value and keeps its own changes to itself. Two
    forms:

    * ``gla_ref.device.debug(True)``, a plain call, sets it at once for the rest of the current
      context, until the next call (in Jupyter it lasts into the following cells, except with
      ipykernel 7.0.0 or when made in a cell that uses top-level ``await``);
    * ``with gla_ref.device.debug(True): ...`` sets it for the block: on entering (again, in case it
      changed since the call), and on leaving, normally or by an exception, it returns to the value
      it had before the ``debug(...)`` call. Blocks nest. Enter the returned object once, in the
      thread or task that made the call.

    ``enabled`` is a bool (or ``numpy.bool_``); anything else is a TypeError.
    """
    value = check_flag("enabled", enabled)
    token = _DEBUG.set(value)

    @contextlib.contextmanager
    def _scope():
        _DEBUG.set(value)
        try:
            yield
        finally:
            _DEBUG.reset(token)

    return _scope()


def is_debug() -> bool:
    """Whether kernels check input values before launching, in the current context."""
    return _DEBUG.get()
