"""Chunkwise GLA with materialised states and secondary-level chunking (paper Alg. 3/4, §4.3).

Notation (book/notation.md): ``b`` is the chunk-local cumulative log-gate log Λ (restarted at every
chunk, as in the references), so exp(b) = Λ (queries, from the chunk start), exp(b_last − b) = Γ
(keys, to the chunk end) and exp(b_last) = γ (the whole chunk). Chunk indices here are 0-based: the chunk at
index i is chunk [i+1] of the math, ``h[:, :, i]`` holds S_[i], the state *entering* it, and
``dh[:, :, i]`` holds dS_[i+1], the gradient of the state *leaving* it.

Forward, one kernel per step:

1. b = log Λ, the chunk-local cumsum of the log-gates, float32, and from it the two decayed
   operands of steps 2 and 4 in the input dtype: K ⊙ Γ and scale·Q ⊙ Λ
   (:mod:`chunk_cumsum`; freed when the forward ends)
2. h: S_[i], the state entering each chunk (stored in the input dtype, or float32 with
   ``states_in_fp32``), and the final state (float32), from K ⊙ Γ, V and log γ   (:mod:`chunk_state`)
3. A, the intra-chunk matrix: sub-chunk pairs by tensor-core matmuls,
   diagonal sub-chunk tiles in float32 by running gate products;
   stored in the input dtype, which both readers round it to       (:mod:`chunk_intra`)
4. O_[i+1] = (scale·Q ⊙ Λ) S_[i] + (A ⊙ M) V                        (:mod:`chunk_output`)

Steps 2 and 4 take the decayed operands rather than q, k and b: they round them to the input dtype
for their matmuls anyway, so forming them once in step 1 changes no bit of their products and
spares the sequential state kernel and every value block of the output kernel the float32 b
tile (benchmarks/results/decayed_operands_nvidia_h200.json).

Backward, seven numbered steps (those of the FLA reading notes; chapters 4 and 6 use these numbers):

1. b = log Λ: not recomputed, the forward saves it (with A) for the backward.
   Computed once, by the forward's :func:`chunk_cumsum.chunk_gates_and_operands`.
2. h = S_[0..N−1], the states entering the chunks, recomputed (forward step 2 again), in float32.
   :func:`chunk_state.chunk_state_fwd` (kernel ``chunk_state_fwd_kernel``).
3. dh = dS_[1..N], the reverse recurrence dS_[i] = γ_{i+1} ⊙ dS_[i+1] + scale·(Q ⊙ Λ)ᵀ dO over
   chunk [i+1], from the final-state cotangent dS_[N] down to dh0 = dS_[0].
   :func:`chunk_state.chunk_state_bwd` (kernel ``chunk_state_bwd_kernel``).
4. dV = (A ⊙ M)ᵀ dO + (K ⊙ Γ) dS, per chunk.
   :func:`chunk_backward.chunk_bwd_dv` (kernel ``chunk_bwd_dv_kernel``).
5. dA = scale·(dO Vᵀ) ⊙ M, the cotangent of the intra-chunk scores, float32.
   :func:`chunk_backward.chunk_bwd_dA` (kernel ``chunk_bwd_dA_kernel``).
6. The intra-chunk dq, dk from dA by sub-chunks (pairs split at a reference row, diagonal tiles in
   float32). :func:`chunk_backward_intra.chunk_bwd_dqk_intra` (kernel ``chunk_bwd_intra_kernel``).
7. The inter-chunk dq = scale·Λ ⊙ (dO S_[i]ᵀ) and dk = Γ ⊙ (V dS_[i+1]ᵀ) added to step 6, then the
   gate gradient dg (reverse cumsum of q ⊙ dq − k ⊙ dk inside the chunk plus the chunk decay's
   term). :func:`chunk_backward.chunk_bwd_dqkg_inter` (kernel ``chunk_bwd_dqkg_kernel``).

:func:`chunk_backward.chunk_bwd_dqkg` runs steps 5, 6 and 7 in that order. Everything but the two
state recurrences (forward step 2, backward steps 2 and 3) is parallel over chunks.

Packed batches (``cu_seqlens``, FLA's convention): the N sequences of a ``B = 1`` batch are cut
into chunks from their own first tokens, listed in one host-built table (:func:`prepare_packed`,
the call's one device sync); the chunk-parallel kernels run over all NT chunks at once and the two
recurrences over the N sequences, each from its own initial state to its own final state.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from gla_ref._validate import check_flag, check_scale
from gla_ref.triton.common.host import check_chunk_size, prepare_packed
from gla_ref.triton.common.ops import Door, FamilyOp
from gla_ref.triton.chunk.backward import chunk_bwd_dqkg, chunk_bwd_dv
from gla_ref.triton.chunk.cumsum import chunk_gates_and_operands
from gla_ref.triton.chunk.intra import chunk_intra_attention
from gla_ref.triton.chunk.output import chunk_output
from gla_ref.triton.chunk.state import chunk_state_bwd, chunk_state_fwd


def chunk_forward(q, k, v, g, h0, scale, output_final_state, chunk_size, states_in_fp32, varlen=None):
    """Forward steps 1-4 on contiguous inputs: ``(o, final state or None, b, A)``, b and A kept for the backward."""
    b, qt, kt = chunk_gates_and_operands(q, k, g, scale, chunk_size, varlen)
    h, ht = chunk_state_fwd(kt, v, b, h0, output_final_state, chunk_size, varlen, states_in_fp32=states_in_fp32,
                            decayed=True)
    del kt                                   # before A is allocated: the forward's peak stays lower
    A = chunk_intra_attention(q, k, b, scale, chunk_size, varlen)
    o = chunk_output(qt, v, h, A, chunk_size, varlen)
    return o, ht, b, A


def chunk_backward(q, k, v, g_dtype, h0, b, A, do, dht, scale, chunk_size, varlen=None):
    """Backward steps 1-7 on contiguous inputs, b and A from the forward (the states are recomputed, in float32):
    ``(dq, dk, dv, dg, dh0)``, dg in ``g_dtype``."""
    C = chunk_size
    h, _ = chunk_state_fwd(k, v, b, h0, False, C, varlen, states_in_fp32=True)  # dq, dk read it: float32
    dh, dh0 = chunk_state_bwd(q, b, do, dht, scale, h0 is not None, C, varlen)
    dv = chunk_bwd_dv(k, b, A, dh, do, C, varlen)
    dq, dk, dg = chunk_bwd_dqkg(q, k, v, b, h, dh, do, scale, C, g_dtype, varlen)
    return dq, dk, dv, dg, dh0


class ChunkGLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, initial_state, scale, output_final_state, options, varlen=None):
        q, k, v, g = (x.contiguous() for x in (q, k, v, g))
        h0 = None if initial_state is None else initial_state.contiguous()
        o, ht, b, A = chunk_forward(q, k, v, g, h0, scale, output_final_state, *options, varlen=varlen)
        ctx.save_for_backward(q, k, v, b, h0, A)
        ctx.scale, ctx.chunk_size, ctx.g_dtype, ctx.varlen = scale, options[0], g.dtype, varlen
        return o, ht

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dht):
        q, k, v, b, h0, A = ctx.saved_tensors
        dht = None if dht is None else dht.contiguous()
        grads = chunk_backward(q, k, v, ctx.g_dtype, h0, b, A, do.contiguous(), dht, ctx.scale, ctx.chunk_size,
                               varlen=ctx.varlen)
        return (*grads, None, None, None, None)


def _op_backward(q, k, v, g, h0, ht, b, A, do, dht, scale, chunk_size, states_in_fp32, varlen=None):
    """:func:`chunk_backward` as the custom operator calls a family's backward."""
    return chunk_backward(q, k, v, g.dtype, h0, b, A, do, dht, scale, chunk_size, varlen)


def _chunk_residuals(q, k, v, g, chunk_size, states_in_fp32):
    """The shapes of what chunk_forward keeps: b (float32, g's shape) and A ``[B, T, H, C]`` in q's dtype."""
    return torch.empty_like(g, dtype=torch.float32), q.new_empty((*q.shape[:3], chunk_size))


ChunkGLA = Door(ChunkGLAFunction, FamilyOp("chunk_gla", chunk_forward, _op_backward, option_types=(int, bool),
                                            residuals=_chunk_residuals))
"""Eager calls: the autograd.Function; under torch.compile: gla_ref::chunk_gla_fwd/_bwd."""


def chunk_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
              cu_seqlens=None, states_in_fp32=False):
    """Gated linear attention, chunkwise with materialised states (Triton; differentiable).

    q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H, K]`` log forget gates (≤ 0), all on
    one CUDA device (or CPU under Triton's interpreter); q, k, v share a dtype: float32, float16 or
    bfloat16 on a GPU, float32 or float16 on a CPU (the interpreter's bf16 matmul is wrong, so bf16
    is refused there). ``initial_state`` ``[B, H, K, V]`` float32 or None. K ≤ 256, V ≤ 4096;
    ``chunk_size`` C in 16/32/64, with sub-chunks of 16. ``cu_seqlens``: None, or int32/int64 ``[N + 1]``
    offsets of N sequences packed in a batch with B = 1 (FLA's convention: a tensor on q's device,
    any stride, or a NumPy array; read on the host, one sync; an empty sequence's final state is
    its initial state), each chunked and run from its own start; states are then ``[N, H, K, V]``. Returns
    ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype, final_state ``[B, H, K, V]`` (``[N, H,
    K, V]``) float32 when ``output_final_state`` else None. Gradients flow to q, k, v, g and
    initial_state, and from both o and final_state. A valid log-gate is finite and ≤ 0: an invalid
    one (NaN, > 0, or -inf, a hard reset: split the sequences with cu_seqlens instead) makes o and
    the final state NaN, or, under ``gla_ref.device.debug(True)``, raises a ValueError naming its
    position.

    ``states_in_fp32`` (a bool, default False, FLA's name): the forward stores the state entering
    each chunk, ``[B, H, ⌈T/C⌉, K, V]``, in q's dtype, as FLA's forward does: for bf16 or fp16
    inputs that halves the bytes the state kernel writes and the output kernel reads, and the
    forward's peak memory by ``2·B·H·⌈T/C⌉·K·V`` bytes. Each stored state is rounded once (the
    recurrence runs in float32 on chip), to the dtype the output kernel rounds it to for its matmul
    anyway, so o is the same either way (bit for bit: same rounding, earlier). True stores them in
    float32 (FLA's choice when its backward reuses them; ours recomputes them). float32 inputs are
    unaffected; the backward always recomputes the states in float32, and the final state is
    float32 either way.
    """
    chunk_size = check_chunk_size(chunk_size)
    dims, varlen = prepare_packed(q, k, v, g, initial_state, gate_ranks=(4,), cu_seqlens=cu_seqlens,
                                  chunk_size=chunk_size)
    output_final_state = check_flag("output_final_state", output_final_state)
    states_in_fp32 = check_flag("states_in_fp32", states_in_fp32)
    return ChunkGLA.apply(q, k, v, g, initial_state, check_scale(scale, dims.K), output_final_state,
                          (chunk_size, states_in_fp32), varlen)
