"""Fused chunk GLA: FlashLinearAttention without materialisation (paper Alg. 5/6), autograd wrapper.

The forward (:mod:`gla_ref.triton.fused_chunk.forward`) and the backward
(:mod:`gla_ref.triton.fused_chunk.backward`) each keep the chunk state on chip and store no state in HBM,
at the price of a sequential walk over the chunks inside each program (parallel only over batch,
heads and one dimension of the state).

Memory. With s the bytes of an element of q, k, v and s_g of g, a call on contiguous tensors (others
are copied first) allocates exactly:

- forward: o, ``s·B·T·H·V``, and the final state, ``4·B·H·K·V``, when asked for;
- backward: dq and dk, ``s·B·T·H·K`` each; dv, ``s·B·T·H·V``; dg, ``s_g·B·T·H·K`` (with g); dh0,
  ``4·B·H·K·V`` (with an initial state).

For V ≤ 256 that is 0 bytes beyond its inputs and outputs: each program holds the whole dimension
its output sums over, so no float32 partial is written per block, and the dg buffer carries
``q ⊙ dq`` between the two backward kernels that need it. A larger V is cut into NV = ``⌈V/256⌉``
slices for dq, dk, dg (:mod:`gla_ref.triton.fused_chunk.forward`'s ``WHOLE_V``): the backward then
allocates float32 partials, ``4·NV·B·T·H·K`` for each of dq, dk (and dg), and their float32 sums,
``4·B·T·H·K`` each, which are the outputs themselves for float32 tensors and are cast into them
(``s·B·T·H·K``, ``s_g·B·T·H·K``) otherwise. Autograd keeps the inputs and the final state, nothing
else. (:func:`allocated_bytes` evaluates these formulas; the tests check them against every allocation.)
A packed batch (``cu_seqlens``, B = 1) allocates the same with N sequences' states in place of B.
"""

from __future__ import annotations

import torch

from gla_ref._validate import check_flag, check_scale
from gla_ref.triton.common.host import (
    check_chunk_size,
    prepare_packed,
    stateful_function,
)
from gla_ref.triton.common.ops import Door, FamilyOp
from gla_ref.triton.fused_chunk.backward import fused_chunk_backward
from gla_ref.triton.fused_chunk.forward import CHUNK_SIZES, WHOLE_V, fused_chunk_forward

__all__ = ["fused_chunk_gla"]


def allocated_bytes(B, T, H, K, V, dtype, gate_dtype=None, initial_state=False, output_final_state=False):
    """Bytes ``(forward, backward)`` that one call allocates (its outputs, and the partials of a V
    above 256: see the module docstring), for inputs of ``dtype``, gates of ``gate_dtype`` (None: no
    gate) and the given options."""
    size = lambda d: torch.empty((), dtype=d).element_size()
    state = 4 * B * H * K * V
    forward = size(dtype) * B * T * H * V + (state if output_final_state else 0)
    backward = size(dtype) * B * T * H * V + (state if initial_state else 0)
    NV = -(-V // WHOLE_V)
    for d in (dtype, dtype) + ((gate_dtype,) if gate_dtype is not None else ()):  # dq, dk, dg
        if NV == 1:
            backward += size(d) * B * T * H * K
        else:  # the partials, their float32 sum, and its cast when d is not float32
            backward += 4 * (NV + 1) * B * T * H * K + (0 if d == torch.float32 else size(d) * B * T * H * K)
    return forward, backward


FusedChunkGLA = Door(stateful_function(
    "FusedChunkGLA", fused_chunk_forward, fused_chunk_backward,
    "Saves only the inputs (and the final state when it is returned, for the gate gradient)."),
    FamilyOp("fused_chunk_gla", fused_chunk_forward, fused_chunk_backward, option_types=(int, bool)))


def fused_chunk_gla(q, k, v, g=None, *, scale=None, initial_state=None, output_final_state=False,
                    chunk_size=16, cu_seqlens=None, states_in_fp32=False):
    """GLA in chunks of ``chunk_size`` tokens, the state kept on chip from the first chunk to the last.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; K ≤ 256, V ≤ 4096. float32, float16 or bfloat16 on a
            GPU; float32 or float16 on a CPU (Triton's interpreter computes bf16 wrongly: refused).
        g: log forget gates ``[B, T, H, K]`` (finite, ≤ 0), or None for plain linear attention. An
            invalid gate (NaN, > 0, or -inf, a hard reset: split the sequences with cu_seqlens)
            makes o and the final state NaN; under ``gla_ref.device.debug(True)`` a ValueError
            naming its position.
        scale: multiplies ``q``; default ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` (``[N, H, K, V]`` packed) float32 state S_0, or None (zeros).
        output_final_state: also return the float32 state after the last token.
        chunk_size: C in {16, 32, 64}; the intra-chunk part costs O(C) per token (exact at any C).
        cu_seqlens: None, or int32/int64 ``[N + 1]`` offsets of N sequences packed in a batch with B = 1
            (FLA's convention, as in :func:`gla_ref.triton.chunk.chunk_gla`; read on the host, one
            sync), each chunked from its own first token.
        states_in_fp32: a bool, default False (chunk_gla's name). The state is always summed in float32 on
            chip; where it enters the forward's output matmul (and dS the dv kernel's) it is rounded to q's
            dtype, as chunk_gla's output kernel reads bf16 states, unless this is True (float32 operands,
            TF32 for 16-bit inputs: bf16 o and dv 3.7e-3 and 3.6e-3 of float64 instead of 3.9e-3, 4-6 %
            slower on the H200; :func:`~gla_ref.triton.fused_chunk.forward.state_dot`). No effect on float32 inputs.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype; final_state ``[B, H, K, V]``
        (``[N, H, K, V]`` packed) or None.

    Accuracy: the backward sums the gate gradient's terms over the later tokens in runs of
    :data:`~gla_ref.triton.fused_chunk.backward.RESTART` (1024) tokens, each started afresh from the state and its
    gradient at the run's end. With bf16 inputs on an H200 (K = V = 128) dg is then within 4.1e-3 relative RMSE
    of float64 at T = 4096 and 16384, like o and the other gradients; one sum over every later token let the
    terms' TF32 errors add up, 1.0e-2 at 16384 (``benchmarks/fused_dg_error_model.py`` models both).
    """
    dims, varlen = prepare_packed(q, k, v, g, initial_state, gate_ranks=(None, 4), cu_seqlens=cu_seqlens)
    scale = check_scale(scale, dims.K)
    chunk_size = check_chunk_size(chunk_size, CHUNK_SIZES)
    output_final_state = check_flag("output_final_state", output_final_state)
    options = (chunk_size, check_flag("states_in_fp32", states_in_fp32))
    return FusedChunkGLA.apply(q, k, v, g, initial_state, scale, output_final_state, options, varlen)
