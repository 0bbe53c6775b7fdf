"""Step 4 of the chunk GLA forward: the output of each chunk from its entering state and its matrix A.

    O_[i+1] = (scale · Q_[i+1] ⊙ exp b) S_[i]  +  (A ⊙ M) V_[i+1]

for the chunk at 0-based index i (chunk [i+1] of the math), with b = log Λ the chunk-local cumulative
log-gate (book/notation.md: Λ = exp b, Γ = exp(b_last − b), γ = exp b_last) and S_[i] = ``h[:, :, i]``
the state entering the chunk. The first term is the inter-chunk part (exponent b ≤ 0: the reference row
is the chunk start, where S_[i] was taken), its query factor ``qt = scale · Q ⊙ Λ`` formed by step 1
(:func:`~gla_ref.triton.chunk.cumsum.chunk_gates_and_operands`) in q's dtype; the second is the
intra-chunk part, with A from :mod:`chunk_intra` (scale included) and M the causal mask, applied again
with tl.where.

Grid ``(⌈V/BV⌉, ⌈T/C⌉, B·H)``: a program owns one chunk's ``C × BV`` tile of O. It forms the intra
part first (the A and V loads go out before the K loop), then adds the inter part over K blocks of
BK, so one accumulator takes both dots. HBM: qt, A, the ``K × BV`` slice of S_[i] (the bulk of the
bytes: in q's dtype by default, float32 with ``states_in_fp32``; converted to q's dtype for the dot
either way), the ``C × BV`` tile of V read; O written once. Both block sizes are autotuned: BV = V
reads qt and A once per chunk, BK = K issues all loads of the inter part at once. Packed batch
(``varlen``): grid ``(⌈V/BV⌉, NT, H)`` over the NT chunks of all sequences (chunk table row and two
offsets read per program); S_[i] is that chunk's row of h ``[1, H, NT, K, V]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref import specs
from gla_ref.triton.common.host import autotune, autotune_configs, cdiv, num_chunks, varlen_args
from gla_ref.triton.common.precision import dot_precision
from gla_ref.triton.common.tiles import (
    block_range,
    chunk_state_offset,
    chunk_tokens,
    load_causal_A,
    load_rows,
    program_chunk,
    store_rows,
    token_bases,
)


def _configs():
    # BK ≥ 64: several dots go into one tile (triton-lang/triton#11366); the two configs that won at
    # the measured head shapes (benchmarks/results/config_timings_nvidia_h200.json), and 64 × 128, which
    # read q and b (now qt) half as often at V ≥ 256 (H200, T=4096: 0.64 -> 0.52 ms at 128x256, 2.0 -> 1.55 at 256x512)
    return autotune_configs([triton.Config({"BK": bk, "BV": bv}, num_warps=w, num_stages=s)
                             for bk, bv, w, s in ((*specs.OUTPUT_BLOCKS, 4, 2), (128, 64, 4, 2), (64, 128, 4, 2))])


@autotune(_configs(), ["K", "V", "C", "IS_VARLEN"], BK="K", BV="V")
@triton.jit
def chunk_output_kernel(qt, v, h, A, o, cu_seqlens, chunk_indices, T, H: tl.constexpr,
                        K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, PREC: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    p_h = h + chunk_state_offset(i_bh, i_t, T, K, V, C, IS_VARLEN)
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    o_t, t, m_t = chunk_tokens(i_n, T, C)
    o_v, m_v = block_range(i_v, BV, V)
    base_k, base_v = token_bases(bos, i_h, H, K, V)

    b_A = load_causal_A(A, bos, i_h, t, m_t, o_t, H, C)
    b_v = load_rows(v + base_v, t, m_t, o_v, m_v, H * V)
    b_o = tl.dot(b_A.to(b_v.dtype), b_v, input_precision=PREC)
    for i_k in range(tl.cdiv(K, BK)):
        o_k, m_k = block_range(i_k, BK, K)
        b_qt = load_rows(qt + base_k, t, m_t, o_k, m_k, H * K)
        b_h = load_rows(p_h, o_k, m_k, o_v, m_v, V)
        b_o += tl.dot(b_qt, b_h.to(b_qt.dtype), input_precision=PREC)
    store_rows(o + base_v, b_o, t, m_t, o_v, m_v, H * V)


def chunk_output(qt, v, h, A, chunk_size: int, varlen=None) -> torch.Tensor:
    """O ``[B, T, H, V]`` in qt's dtype from the decayed queries ``qt = scale·Q ⊙ Λ`` (step 1's
    :func:`~gla_ref.triton.chunk.cumsum.chunk_gates_and_operands`) and the states h and matrix A (chunks
    of each packed sequence with ``varlen``)."""
    B, T, H, K = qt.shape
    V = v.shape[-1]
    o = torch.empty(B, T, H, V, dtype=qt.dtype, device=qt.device)
    grid = lambda meta: (cdiv(V, meta["BV"]), num_chunks(T, chunk_size, varlen), B * H)
    chunk_output_kernel[grid](qt, v, h, A, o, T=T, H=H, K=K, V=V, C=chunk_size, PREC=dot_precision(qt),
                              **varlen_args(varlen))
    return o
