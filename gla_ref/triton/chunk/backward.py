"""Steps 4–7 of the chunk GLA backward (numbered as in :mod:`chunk`; after the states S_[i] of step 2
and their gradients dS_[i+1] of step 3).

Chunk indices are 0-based: the chunk at index i is chunk [i+1] of the math, S_[i] = ``h[:, :, i]`` enters
it and dS_[i+1] = ``dh[:, :, i]`` is the gradient of the state leaving it; b = log Λ the chunk-local
cumulative log-gate (book/notation.md: Λ = exp b, Γ = exp(b_last − b), γ = exp b_last).

**Step 4, dv** (one kernel). In the chunk at index i, with A from the forward (scale included) and M
the causal mask,

    dV_[i+1] = (A ⊙ M)ᵀ dO_[i+1] + (K_[i+1] ⊙ exp(b_last − b)) dS_[i+1].

Grid ``(⌈V/BV⌉, ⌈T/C⌉, B·H)``; HBM: A, dO, k, b and a ``K × BV`` slice of dS_[i+1] read, dv written.

**Step 5, dA** (one kernel). dA = scale · (dO Vᵀ) ⊙ M, the cotangent of A / scale (A includes the scale),
stored in float32 ``[B, T, H, C]`` like A (zeros above the diagonal). Grid ``(⌈T/C⌉, B·H)``; HBM: dO and v
read once.

**Step 6, intra-chunk dq, dk** (:mod:`chunk_backward_intra`): from dA, q, k and b by sub-chunks, written in
float32.

**Step 7, dq, dk, dg** (one kernel: the inter-chunk parts added to the intra-chunk ones, then the
gate gradient). A V loop forms, with S_[i] the state entering the chunk and dS_[i+1] the gradient of
the one leaving it,

    dQ_inter = scale · exp b ⊙ (dO S_[i]ᵀ),      dK_inter = exp(b_last − b) ⊙ (V dS_[i+1]ᵀ),

which are added to the intra-chunk parts. The gate gradient is the closed form of paper §4.3
restricted to one chunk: with db = q ⊙ dq − k ⊙ dk (the gradient of b, row by row),

    dg_j = Σ_{j' ≥ j in chunk} db_{j'}  +  dlogγ,
    dlogγ = γ ⊙ Σ_v (S_[i] ⊙ dS_[i+1])  +  Σ_j k_j ⊙ dk_inter,j,

dlogγ being the gradient of the chunk's total log-decay log γ = b_last (which every token's g
enters), so no sequence-wide reverse cumsum is needed. Grid ``(⌈K/BK⌉, ⌈T/C⌉, B·H)``: a program owns a chunk's
``C × BK`` tiles of dq, dk, dg. HBM: dO, v, a ``BK × V`` slice of S_[i] and dS_[i+1], then q, k, b and
the float32 intra-chunk dq, dk read; dq, dk, dg written once.

Packed batch (``varlen``): every grid's chunk axis runs over the NT chunks of all sequences and its
batch·head axis over H; a program reads its row of the chunk table and its sequence's two offsets,
and dlogγ needs no change (a chunk never crosses a sequence end, and dS_[i+1] of a sequence's last
chunk is that sequence's final-state cotangent).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton.common.host import (
    autotune,
    autotune_configs,
    block,
    block_configs,
    cdiv,
    num_chunks,
    varlen_args,
)
from gla_ref.triton.common.precision import dot_precision
from gla_ref.triton.common.tiles import (
    block_range,
    chunk_state_offset,
    chunk_tokens,
    inter_chunk_dqk,
    load_causal_A,
    load_rows,
    program_chunk,
    reverse_cumsum,
    store_rows,
    token_base,
    token_bases,
)
from gla_ref.triton.chunk.backward_intra import chunk_bwd_dqk_intra


def _dqkg_configs():
    # no BK = 32 with 4 warps: with it, Triton 3.6–3.7 on Hopper reads shared memory out of bounds
    # in kernels of this shape (several dots per V step; triton-lang/triton#11366). Kept: the best and
    # the runner-up (within 1.07x) at every measured head shape (benchmarks/results/config_timings_nvidia_h200.json)
    return autotune_configs([triton.Config({"BK": bk, "BV": bv}, num_warps=w, num_stages=s)
                             for bk, bv, w, s in ((64, 64, 4, 2), (32, 128, 8, 2))])


@autotune(block_configs("BV"), ["K", "V", "C", "IS_VARLEN"], BV="V")
@triton.jit
def chunk_bwd_dv_kernel(k, b, A, dh, do, dv, cu_seqlens, chunk_indices, T, H: tl.constexpr,
                        K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, PREC: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    p_dh = dh + chunk_state_offset(i_bh, i_t, T, K, V, C, IS_VARLEN)
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    o_t, t, m_t = chunk_tokens(i_n, T, C)
    t_c, t_last = tl.minimum(t, T - 1), tl.minimum(i_n * C + C, T) - 1
    o_v, m_v = block_range(i_v, BV, V)
    base_k, base_v = token_bases(bos, i_h, H, K, V)

    b_A = load_causal_A(A, bos, i_h, t, m_t, o_t, H, C)
    b_do = load_rows(do + base_v, t, m_t, o_v, m_v, H * V)
    b_dv = tl.dot(tl.trans(b_A.to(b_do.dtype)), b_do, input_precision=PREC)
    for i_k in range(tl.cdiv(K, BK)):
        o_k, m_k = block_range(i_k, BK, K)
        b_k = load_rows(k + base_k, t, m_t, o_k, m_k, H * K)
        b_g = tl.load(b + base_k + t_c[:, None] * (H * K) + o_k[None, :], mask=m_k[None, :], other=0.0)
        g_last = tl.load(b + base_k + t_last * (H * K) + o_k, mask=m_k, other=0.0)
        b_kt = (b_k * tl.exp(g_last[None, :] - b_g)).to(b_k.dtype)
        b_dh = load_rows(p_dh, o_k, m_k, o_v, m_v, V)
        b_dv += tl.dot(b_kt, b_dh.to(b_k.dtype), input_precision=PREC)
    store_rows(dv + base_v, b_dv, t, m_t, o_v, m_v, H * V)


@autotune(block_configs("BV"), ["V", "C", "IS_VARLEN"], BV="V")
@triton.jit
def chunk_bwd_dA_kernel(v, do, dA, cu_seqlens, chunk_indices, scale, T, H: tl.constexpr,
                        V: tl.constexpr, C: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                        IS_VARLEN: tl.constexpr):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    o_t, t, m_t = chunk_tokens(i_n, T, C)
    base_v = token_base(bos, i_h, H, V)
    b_dA = tl.zeros([C, C], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v, m_v = block_range(i_v, BV, V)
        b_v = load_rows(v + base_v, t, m_t, o_v, m_v, H * V)
        b_do = load_rows(do + base_v, t, m_t, o_v, m_v, H * V)
        b_dA += tl.dot(b_do, tl.trans(b_v), input_precision=PREC)
    b_dA = tl.where(o_t[:, None] >= o_t[None, :], b_dA * scale, 0.0)
    store_rows(dA + token_base(bos, i_h, H, C), b_dA, t, m_t, o_t, o_t < C, H * C)


@autotune(_dqkg_configs(), ["K", "V", "C", "IS_VARLEN"], BK="K", BV="V")
@triton.jit
def chunk_bwd_dqkg_kernel(q, k, v, b, h, dh, do, dq_intra, dk_intra, dq, dk, dg, cu_seqlens, chunk_indices,
                          scale, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                          IS_VARLEN: tl.constexpr):
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    p_state = chunk_state_offset(i_bh, i_t, T, K, V, C, IS_VARLEN)
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    o_t, t, m_t = chunk_tokens(i_n, T, C)
    t_c, t_last = tl.minimum(t, T - 1), tl.minimum(i_n * C + C, T) - 1
    o_k, m_k = block_range(i_k, BK, K)
    base_k, base_v = token_bases(bos, i_h, H, K, V)

    _, b_dq, b_dk, b_hdh = inter_chunk_dqk(v, do, h, dh, base_v, p_state, t, m_t, o_k, m_k,
                                           H, V, C, BK, BV, PREC, WITH_DA=False)
    b_g = tl.load(b + base_k + t_c[:, None] * (H * K) + o_k[None, :], mask=m_k[None, :], other=0.0)
    g_last = tl.load(b + base_k + t_last * (H * K) + o_k, mask=m_k, other=0.0)
    b_dk *= tl.exp(g_last[None, :] - b_g)
    b_k = load_rows(k + base_k, t, m_t, o_k, m_k, H * K).to(tl.float32)
    b_dgamma = b_hdh * tl.exp(g_last) + tl.sum(b_k * b_dk, axis=0)
    b_dk += load_rows(dk_intra + base_k, t, m_t, o_k, m_k, H * K)
    b_dq = b_dq * (tl.exp(b_g) * scale) + load_rows(dq_intra + base_k, t, m_t, o_k, m_k, H * K)
    store_rows(dq + base_k, b_dq, t, m_t, o_k, m_k, H * K)
    store_rows(dk + base_k, b_dk, t, m_t, o_k, m_k, H * K)

    # gate gradient: reverse cumulative sum of db inside the chunk, plus the chunk-decay term
    b_q = load_rows(q + base_k, t, m_t, o_k, m_k, H * K).to(tl.float32)
    b_dg = reverse_cumsum(b_q * b_dq - b_k * b_dk) + b_dgamma[None, :]
    store_rows(dg + base_k, b_dg, t, m_t, o_k, m_k, H * K)


def chunk_bwd_dv(k, b, A, dh, do, chunk_size: int, varlen=None) -> torch.Tensor:
    """dv ``[B, T, H, V]`` in do's dtype (chunks of each packed sequence with ``varlen``)."""
    B, T, H, K = k.shape
    V = do.shape[-1]
    dv = torch.empty_like(do)
    grid = lambda meta: (cdiv(V, meta["BV"]), num_chunks(T, chunk_size, varlen), B * H)
    chunk_bwd_dv_kernel[grid](k, b, A, dh, do, dv, T=T, H=H, K=K,
                              V=V, C=chunk_size, BK=min(64, block(K)), PREC=dot_precision(k), **varlen_args(varlen))
    return dv


def chunk_bwd_dA(v, do, scale: float, chunk_size: int, varlen=None) -> torch.Tensor:
    """dA ``[B, T, H, C]`` in float32: row t holds dA[t, ·] of its chunk (scale included, zeros above the diagonal)."""
    B, T, H, V = v.shape
    dA = torch.empty(B, T, H, chunk_size, dtype=torch.float32, device=v.device)
    chunk_bwd_dA_kernel[(num_chunks(T, chunk_size, varlen), B * H)](
        v, do, dA, scale=scale, T=T, H=H, V=V, C=chunk_size,
        PREC=dot_precision(v), **varlen_args(varlen))
    return dA


def chunk_bwd_dqkg(q, k, v, b, h, dh, do, scale: float, chunk_size: int, g_dtype, varlen=None):
    """dq, dk (q's dtype) and dg (``g_dtype``): dA, then the intra-chunk and the inter-chunk kernels."""
    dA = chunk_bwd_dA(v, do, scale, chunk_size, varlen)
    dq_intra, dk_intra = chunk_bwd_dqk_intra(q, k, b, dA, chunk_size, varlen)
    return chunk_bwd_dqkg_inter(q, k, v, b, h, dh, do, dq_intra, dk_intra, scale, chunk_size, g_dtype, varlen)


def chunk_bwd_dqkg_inter(q, k, v, b, h, dh, do, dq_intra, dk_intra, scale: float, chunk_size: int, g_dtype,
                         varlen=None):
    """The last step alone: the inter-chunk dq, dk added to the float32 intra-chunk parts, and dg."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dg = torch.empty(B, T, H, K, dtype=g_dtype, device=q.device)
    grid = lambda meta: (cdiv(K, meta["BK"]), num_chunks(T, chunk_size, varlen), B * H)
    chunk_bwd_dqkg_kernel[grid](q, k, v, b, h, dh, do, dq_intra, dk_intra, dq, dk, dg, scale=scale, T=T,
                                H=H, K=K, V=V, C=chunk_size,
                                PREC=dot_precision(q), **varlen_args(varlen))
    return dq, dk, dg
