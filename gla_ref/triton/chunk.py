"""Chunkwise GLA with materialised states and secondary-level chunking (paper Alg. 3/4, §4.3).

Forward, one kernel per step:

1. Γ = chunk-local cumsum of the log-gates, float32            (:mod:`chunk_cumsum`)
2. S_n, the state entering each chunk, and the final state      (:mod:`chunk_state`)
3. A, the intra-chunk matrix: sub-chunk pairs by tensor-core matmuls,
   diagonal sub-chunk tiles in float32 by running gate products (:mod:`chunk_intra`)
4. O = scale·(Q ⊙ exp Γ) S_n + (A ⊙ M) V                        (:mod:`chunk_output`)

Backward (the seven steps of the FLA reading notes): Γ is kept from the forward, S_n is
recomputed (step 2 again), dS runs the reverse recurrence from the final-state cotangent to dh0
(:func:`chunk_state_bwd`), then dv and dA (:mod:`chunk_backward`), the intra-chunk dq/dk
(:mod:`chunk_backward_intra`), and the inter-chunk dq/dk merged with the gate gradient dg.
Everything but the two state recurrences is parallel over chunks.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from gla_ref._validate import check_flag
from gla_ref.triton._common import check_chunk_size, prepare, resolve_scale
from gla_ref.triton.chunk_backward import chunk_bwd_dqkg, chunk_bwd_dv
from gla_ref.triton.chunk_cumsum import chunk_local_cumsum
from gla_ref.triton.chunk_intra import chunk_intra_attention
from gla_ref.triton.chunk_output import chunk_output
from gla_ref.triton.chunk_state import chunk_state_bwd, chunk_state_fwd

class ChunkGLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, scale, initial_state, output_final_state, chunk_size):
        q, k, v, g = (x.contiguous() for x in (q, k, v, g))
        h0 = None if initial_state is None else initial_state.contiguous()
        gc = chunk_local_cumsum(g, chunk_size)
        h, ht = chunk_state_fwd(k, v, gc, h0, output_final_state, chunk_size)
        A = chunk_intra_attention(q, k, gc, scale, chunk_size)
        o = chunk_output(q, v, gc, h, A, scale, chunk_size)
        ctx.save_for_backward(q, k, v, gc, h0, A)
        ctx.scale, ctx.chunk_size, ctx.g_dtype = scale, chunk_size, g.dtype
        return o, ht

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dht):
        q, k, v, gc, h0, A = ctx.saved_tensors
        C, scale = ctx.chunk_size, ctx.scale
        do = do.contiguous()
        dht = None if dht is None else dht.contiguous()
        h, _ = chunk_state_fwd(k, v, gc, h0, False, C)
        dh, dh0 = chunk_state_bwd(q, gc, do, dht, scale, h0 is not None, C)
        dv = chunk_bwd_dv(k, gc, A, dh, do, C)
        dq, dk, dg = chunk_bwd_dqkg(q, k, v, gc, h, dh, do, scale, C, ctx.g_dtype)
        return dq, dk, dv, dg, None, dh0, None, None


def chunk_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Gated linear attention, chunkwise with materialised states (Triton; differentiable).

    q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H, K]`` log forget gates (≤ 0), all on
    one CUDA device (or CPU under Triton's interpreter); q, k, v share a dtype (float32, float16,
    bfloat16). ``initial_state`` ``[B, H, K, V]`` float32 or None. K, V ≤ 256; ``chunk_size`` C in
    16/32/64, with sub-chunks of 16. Returns ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype,
    final_state ``[B, H, K, V]`` float32 when ``output_final_state`` else None. Gradients flow to
    q, k, v, g and initial_state, and from both o and final_state.
    """
    dims = prepare(q, k, v, g, initial_state, gate_ranks=(4,))
    chunk_size = check_chunk_size(chunk_size)
    output_final_state = check_flag("output_final_state", output_final_state)
    return ChunkGLAFunction.apply(q, k, v, g, resolve_scale(scale, dims.K), initial_state,
                                  output_final_state, chunk_size)
