"""Pallas kernels for GLA (JAX): one shared chunk math, TPU (Mosaic) and GPU (Triton) launchers.

* :func:`chunk_gla` — non-fused: a state kernel writes the state entering each chunk, a
  parallel kernel computes the outputs (paper Alg. 3/4).
* :func:`fused_chunk_gla` — fused: the state stays on chip across chunks (Alg. 5/6).
* :func:`chunk_simple_gla` — scalar gates ``[B, T, H]`` or a per-head decay ``g_gamma [H]``.

Each is a ``jax.custom_vjp`` whose backward pass is Pallas kernels too, with gradients for
q, k, v, the gates (``g_gamma`` included) and the initial state. The launcher follows
:mod:`gla_ref.device`: Mosaic on a TPU, Triton on a GPU, the interpreter on a CPU.
"""

from gla_ref.pallas.chunk import chunk_gla
from gla_ref.pallas.fused_chunk import fused_chunk_gla
from gla_ref.pallas.simple import chunk_simple_gla

__all__ = ["chunk_gla", "chunk_simple_gla", "fused_chunk_gla"]
