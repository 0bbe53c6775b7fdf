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
Triton picks interpreted or compiled library functions at that first import; when something imported
``triton`` before this package (torch's FLOP counter, ``AdamW``, FLA), its library functions are rebuilt
for the interpreter where Triton has knobs, and the import raises an ImportError that says what to do
where it has none. With a GPU nothing is set.

``chunk_gla``, ``chunk_simple_gla``, ``fused_chunk_gla`` and ``fused_recurrent_gla`` take packed
batches: ``cu_seqlens``, FLA's int32 or int64 ``[N + 1]`` offsets into a batch with B = 1, with initial and
final states ``[N, H, K, V]``.
"""

from gla_ref.device import use_triton_interpreter

# Before any kernel is defined: on a machine without CUDA, Triton's interpreter (also when something imported
# Triton first, in compiled mode: gla_ref.device.interpret_imported_triton).
use_triton_interpreter()

# kernels (each module defines its autograd.Function and the public function)
from gla_ref.triton.chunk import chunk_gla  # noqa: E402
from gla_ref.triton.chunk_simple import chunk_simple_gla  # noqa: E402
from gla_ref.triton.fused_chunk import fused_chunk_gla  # noqa: E402
from gla_ref.triton.fused_recurrent import fused_recurrent_gla  # noqa: E402

__all__ = ["chunk_gla", "chunk_simple_gla", "fused_chunk_gla", "fused_recurrent_gla"]

