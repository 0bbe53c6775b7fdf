"""Step 4 of chunk GLA: the intra-chunk matrix A by secondary-level chunking (paper §4.3, Fig. 3).

Inside chunk n (positions r, s = 0..C−1, Γ the chunk-local cumulative gate),

    A[r, s] = scale · Σ_d q_rd k_sd exp(Γ_rd − Γ_sd)      for s ≤ r,   0 above the diagonal.

The chunk is cut into sub-chunks of c tokens. For a key sub-chunk j and every later query row the
exponent splits at ``Γ_e``, the last row e of sub-chunk j:

    A[r, s∈j] = (q_r ⊙ exp(Γ_r − Γ_e)) · (k_s ⊙ exp(Γ_e − Γ_s))     r > e ≥ s, both exponents ≤ 0,

a tensor-core matmul with half-precision operands (the orange tiles of Fig. 3). Pairs inside one
sub-chunk (the pink diagonal tiles) have no such split point; they are summed in float32 straight
from Eq. 4, one key column at a time, exponent ``Γ_r − Γ_s ≤ 0`` masked before exp.

Grid ``(⌈T/C⌉, B·H)``: a program owns one chunk's ``C × C`` tile of A. HBM: q, k, Γ read once
(the diagonal loop re-reads rows from cache), A written once in float32, zeros above the diagonal.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton._common import autotune_configs, block
from gla_ref.triton.chunk_state import _precision

SUB_CHUNK = 16
"""c: the sub-chunk size (tl.dot's smallest tile)."""


def _configs():
    return autotune_configs([triton.Config({}, num_warps=w, num_stages=s)
                             for w, s in ((4, 2), (4, 1), (8, 2))])


@triton.autotune(configs=_configs(), key=["K", "T_BUCKET", "C"])
@triton.jit
def chunk_intra_kernel(q, k, gc, A, scale, T, T_BUCKET, H: tl.constexpr,
                       K: tl.constexpr, C: tl.constexpr, c: tl.constexpr, BK: tl.constexpr,
                       PREC: tl.constexpr):
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = tl.arange(0, C)                    # position inside the chunk
    o_c = tl.arange(0, c)
    t = i_n * C + o_t
    m_t = t < T
    t_c = tl.minimum(t, T - 1)               # rows past T repeat the last real gate row (g = 0 there)
    sub = o_t // c                           # sub-chunk of each row
    p_s = sub * c                            # first row of that sub-chunk
    base = (i_b.to(tl.int64) * T * H + i_h) * K

    b_A = tl.zeros([C, C], dtype=tl.float32)     # pairs in different sub-chunks
    b_D = tl.zeros([C, c], dtype=tl.float32)     # b_D[r, j] = A[r, p_s(r) + j]: the diagonal tiles
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        p_tk = base + t[:, None] * (H * K) + o_k[None, :]
        b_q = tl.load(q + p_tk, mask=m_t[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_k = tl.load(k + p_tk, mask=m_t[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_g = tl.load(gc + base + t_c[:, None] * (H * K) + o_k[None, :], mask=m_k[None, :], other=0.0)
        for j in tl.static_range(C // c - 1):
            e = j * c + c - 1
            g_e = tl.load(gc + base + tl.minimum(i_n * C + e, T - 1) * (H * K) + o_k, mask=m_k, other=0.0)
            later = (o_t > e)[:, None]
            in_j = (sub == j)[:, None]
            b_qt = tl.where(later, b_q * tl.exp(tl.where(later, b_g - g_e[None, :], 0.0)), 0.0)
            b_kt = tl.where(in_j, b_k * tl.exp(tl.where(in_j, g_e[None, :] - b_g, 0.0)), 0.0)
            b_A += tl.dot(b_qt.to(k.dtype.element_ty), tl.trans(b_kt.to(k.dtype.element_ty)), input_precision=PREC)
        for j in range(c):
            s = p_s + j                      # key column j of each row's diagonal tile
            t_s = i_n * C + s
            b_ks = tl.load(k + base + t_s[:, None] * (H * K) + o_k[None, :],
                           mask=(t_s < T)[:, None] & m_k[None, :], other=0.0).to(tl.float32)
            b_gs = tl.load(gc + base + tl.minimum(t_s, T - 1)[:, None] * (H * K) + o_k[None, :],
                           mask=m_k[None, :], other=0.0)
            causal = (o_t >= s)[:, None]
            b_a = tl.sum(tl.where(causal, b_q * b_ks * tl.exp(tl.where(causal, b_g - b_gs, 0.0)), 0.0), axis=1)
            b_D += tl.where(o_c[None, :] == j, b_a[:, None], 0.0)

    p_A = A + (i_b.to(tl.int64) * T * H + i_h) * C + t[:, None] * (H * C)
    tl.store(p_A + o_t[None, :], b_A * scale, mask=m_t[:, None] & (sub[:, None] != sub[None, :]))
    tl.store(p_A + p_s[:, None] + o_c[None, :], b_D * scale, mask=m_t[:, None])


def chunk_intra_attention(q, k, gc, scale: float, chunk_size: int) -> torch.Tensor:
    """A ``[B, T, H, C]`` in float32: row t holds A[t, ·] of its chunk (scale included)."""
    B, T, H, K = q.shape
    A = torch.empty(B, T, H, chunk_size, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(T, chunk_size), B * H)
    chunk_intra_kernel[grid](q, k, gc, A, scale, T, T_BUCKET=triton.next_power_of_2(T), H=H, K=K,
                             C=chunk_size, c=min(SUB_CHUNK, chunk_size), BK=min(64, block(K)),
                             PREC=_precision(q))
    return A
