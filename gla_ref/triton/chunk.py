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

Packed batches (``cu_seqlens``, FLA's convention): the N sequences of a ``B = 1`` batch are cut
into chunks from their own first tokens, listed in one host-built table (:func:`prepare_packed`,
the call's one device sync); the chunk-parallel kernels run over all NT chunks at once and the two
recurrences over the N sequences, each from its own initial state to its own final state.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from gla_ref._validate import check_flag, check_scale
from gla_ref.triton._common import check_chunk_size, prepare_packed
from gla_ref.triton.chunk_backward import chunk_bwd_dqkg, chunk_bwd_dv
from gla_ref.triton.chunk_cumsum import chunk_local_cumsum
from gla_ref.triton.chunk_intra import chunk_intra_attention
from gla_ref.triton.chunk_output import chunk_output
from gla_ref.triton.chunk_state import chunk_state_bwd, chunk_state_fwd


class ChunkGLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, scale, initial_state, output_final_state, chunk_size, varlen=None):
        q, k, v, g = (x.contiguous() for x in (q, k, v, g))
        h0 = None if initial_state is None else initial_state.contiguous()
        gc = chunk_local_cumsum(g, chunk_size, varlen)
        h, ht = chunk_state_fwd(k, v, gc, h0, output_final_state, chunk_size, varlen)
        A = chunk_intra_attention(q, k, gc, scale, chunk_size, varlen)
        o = chunk_output(q, v, gc, h, A, scale, chunk_size, varlen)
        ctx.save_for_backward(q, k, v, gc, h0, A)
        ctx.scale, ctx.chunk_size, ctx.g_dtype, ctx.varlen = scale, chunk_size, g.dtype, varlen
        return o, ht

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dht):
        q, k, v, gc, h0, A = ctx.saved_tensors
        C, scale, varlen = ctx.chunk_size, ctx.scale, ctx.varlen
        do = do.contiguous()
        dht = None if dht is None else dht.contiguous()
        h, _ = chunk_state_fwd(k, v, gc, h0, False, C, varlen)
        dh, dh0 = chunk_state_bwd(q, gc, do, dht, scale, h0 is not None, C, varlen)
        dv = chunk_bwd_dv(k, gc, A, dh, do, C, varlen)
        dq, dk, dg = chunk_bwd_dqkg(q, k, v, gc, h, dh, do, scale, C, ctx.g_dtype, varlen)
        return dq, dk, dv, dg, None, dh0, None, None, None


def chunk_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
              cu_seqlens=None):
    """Gated linear attention, chunkwise with materialised states (Triton; differentiable).

    q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H, K]`` log forget gates (≤ 0), all on
    one CUDA device (or CPU under Triton's interpreter); q, k, v share a dtype: float32, float16 or
    bfloat16 on a GPU, float32 or float16 on a CPU (the interpreter's bf16 matmul is wrong, so bf16
    is refused there). ``initial_state`` ``[B, H, K, V]`` float32 or None. K, V ≤ 256;
    ``chunk_size`` C in 16/32/64, with sub-chunks of 16. ``cu_seqlens``: None, or int64 ``[N + 1]``
    offsets of N sequences packed in a batch with B = 1 (FLA's convention; read on the host, one
    sync), each chunked and run from its own start; states are then ``[N, H, K, V]``. Returns
    ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype, final_state ``[B, H, K, V]`` (``[N, H,
    K, V]``) float32 when ``output_final_state`` else None. Gradients flow to q, k, v, g and
    initial_state, and from both o and final_state.
    """
    chunk_size = check_chunk_size(chunk_size)
    dims, varlen = prepare_packed(q, k, v, g, initial_state, gate_ranks=(4,), cu_seqlens=cu_seqlens,
                                  chunk_size=chunk_size)
    output_final_state = check_flag("output_final_state", output_final_state)
    return ChunkGLAFunction.apply(q, k, v, g, check_scale(scale, dims.K), initial_state,
                                  output_final_state, chunk_size, varlen)
