"""Triton kernels for GLA (PyTorch autograd functions).

Without a CUDA device, every kernel runs in Triton's CPU interpreter: the switch is made here,
before any kernel is defined, so users set nothing themselves. The interpreter takes float32 and
float16 inputs; bfloat16 is refused there with a TypeError (its bf16 matmul returns garbage).

What the switch touches (:func:`gla_ref.device.use_triton_interpreter`): on a machine without CUDA,
importing this package makes Triton interpret for the whole process — every other Triton kernel
defined afterwards, other libraries' included, is interpreted too. Triton reads the switch from
``TRITON_INTERPRET`` when it is first imported; where it has knobs (``triton.knobs``) the switch
then moves to ``triton.knobs.runtime.interpret`` and the variable is removed again, so child
processes do not inherit it (with a Triton without knobs it stays in ``os.environ``, children included).
Triton picks interpreted or compiled library functions at that first import, so on such a machine
this package must be imported before anything imports ``triton`` (torch's FLOP counter, say);
otherwise the import raises an ImportError that says so. With a GPU nothing is set.

``chunk_gla``, ``chunk_simple_gla``, ``fused_chunk_gla`` and ``fused_recurrent_gla`` take packed
batches: ``cu_seqlens``, FLA's int32 or int64 ``[N + 1]`` offsets into a batch with B = 1, with initial and
final states ``[N, H, K, V]``.
"""

import sys

from gla_ref.device import triton_interprets, use_triton_interpreter

# Triton's own library functions (tl.sum, tl.cumsum, ...) pick compiled or interpreted mode when
# triton is first imported: if that happened before the switch, the interpreter cannot run them.
_imported_compiled = "triton" in sys.modules and not triton_interprets()
if use_triton_interpreter() and _imported_compiled:
    raise ImportError("triton was imported before gla_ref.triton on a machine without CUDA, so its "
                      "interpreter cannot run: import gla_ref.triton first, or set TRITON_INTERPRET=1 "
                      "before importing triton")

# kernels (each module defines its autograd.Function and the public function)
from gla_ref.triton.chunk import chunk_gla  # noqa: E402
from gla_ref.triton.chunk_simple import chunk_simple_gla  # noqa: E402
from gla_ref.triton.fused_chunk import fused_chunk_gla  # noqa: E402
from gla_ref.triton.fused_recurrent import fused_recurrent_gla  # noqa: E402

__all__ = ["chunk_gla", "chunk_simple_gla", "fused_chunk_gla", "fused_recurrent_gla"]

