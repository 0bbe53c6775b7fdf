"""Steps 4–7 of the chunk GLA backward (after the states S_n and their gradients dS_{n+1}).

**dv** (one kernel). In chunk n, with A from the forward (scale included) and M the causal mask,

    dV_n = (A_n ⊙ M)ᵀ dO_n + (K_n ⊙ exp(γ_n − Γ_n)) dS_{n+1}.

Grid ``(⌈V/BV⌉, ⌈T/C⌉, B·H)``; HBM: A, dO, k, Γ and a ``K × BV`` slice of dS_{n+1} read, dv written.

**dq, dk, dg** (one kernel: dA, intra-chunk dq/dk, inter-chunk dq/dk and the gate gradient).
dA = (dO Vᵀ) ⊙ M is made on chip while the V loop also forms the inter-chunk parts

    dQ_inter = scale · exp Γ ⊙ (dO S_nᵀ),      dK_inter = exp(γ − Γ) ⊙ (V dS_{n+1}ᵀ).

The intra-chunk parts follow A's secondary chunking: key sub-chunk j against later query rows as
two tensor-core matmuls split at Γ_e (e the last row of j), the diagonal c × c tiles in float32
log space one column at a time (every exponent ≤ 0). The gate gradient is the closed form of
paper §4.3 restricted to one chunk: with dΓ = q ⊙ dq − k ⊙ dk,

    dg_r = Σ_{r' ≥ r in chunk} dΓ_{r'}  +  dγ_n,
    dγ_n = exp γ_n ⊙ Σ_v (S_n ⊙ dS_{n+1})  +  Σ_r k_r ⊙ dk_inter,r,

dγ_n being the gradient of the chunk's total decay γ_n (which every token's g enters), so no
sequence-wide reverse cumsum is needed. Grid ``(⌈K/BK⌉, ⌈T/C⌉, B·H)``; HBM: q, k, Γ, dO, v and a
``BK × V`` slice of S_n and dS_{n+1} read; dq, dk, dg written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton._common import autotune_configs, block, block_configs
from gla_ref.triton._tiles import (
    block_range,
    chunk_tokens,
    inter_chunk_dqk,
    load_causal_A,
    load_rows,
    reverse_cumsum,
    store_rows,
    token_bases,
)
from gla_ref.triton.chunk_intra import SUB_CHUNK
from gla_ref.triton.chunk_state import _precision, prune_blocks


def _dqkg_configs():
    # BK ≥ 64: with BK = 32 and 4 warps, Triton 3.6–3.7 on Hopper reads shared memory out of bounds
    # in kernels of this shape (several dots on one dO/V tile; triton-lang/triton#11366)
    return autotune_configs([triton.Config({"BK": 64}, num_warps=w, num_stages=s)
                             for w, s in ((4, 2), (8, 2), (4, 3), (8, 1))])


@triton.autotune(configs=block_configs("BV"), key=["K", "V", "T_BUCKET", "C"],
                 prune_configs_by=prune_blocks(BV="V"))
@triton.jit
def chunk_bwd_dv_kernel(k, gc, A, dh, do, dv, T, T_BUCKET, H: tl.constexpr,
                        K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, PREC: tl.constexpr):
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, C)
    o_t, t, m_t = chunk_tokens(i_n, T, C)
    t_c, t_last = tl.minimum(t, T - 1), tl.minimum(i_n * C + C, T) - 1
    o_v, m_v = block_range(i_v, BV, V)
    base_k, base_v = token_bases(i_b, i_h, T, H, K, V)
    p_dh = dh + (i_bh.to(tl.int64) * NT + i_n) * K * V

    b_A = load_causal_A(A, i_b, i_h, t, m_t, o_t, T, H, C)
    b_do = load_rows(do + base_v, t, m_t, o_v, m_v, H * V)
    b_dv = tl.dot(tl.trans(b_A.to(b_do.dtype)), b_do, input_precision=PREC)
    for i_k in range(tl.cdiv(K, BK)):
        o_k, m_k = block_range(i_k, BK, K)
        b_k = load_rows(k + base_k, t, m_t, o_k, m_k, H * K)
        b_g = tl.load(gc + base_k + t_c[:, None] * (H * K) + o_k[None, :], mask=m_k[None, :], other=0.0)
        g_last = tl.load(gc + base_k + t_last * (H * K) + o_k, mask=m_k, other=0.0)
        b_kt = (b_k * tl.exp(g_last[None, :] - b_g)).to(b_k.dtype)
        b_dh = load_rows(p_dh, o_k, m_k, o_v, m_v, V)
        b_dv += tl.dot(b_kt, b_dh.to(b_k.dtype), input_precision=PREC)
    store_rows(dv + base_v, b_dv, t, m_t, o_v, m_v, H * V)


@triton.autotune(configs=_dqkg_configs(), key=["K", "V", "T_BUCKET", "C"],
                 prune_configs_by=prune_blocks(BK="K"))
@triton.jit
def chunk_bwd_dqkg_kernel(q, k, v, gc, h, dh, do, dq, dk, dg, scale, T, T_BUCKET,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                          c: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, C)
    o_t, t, m_t = chunk_tokens(i_n, T, C)
    t_c, t_last = tl.minimum(t, T - 1), tl.minimum(i_n * C + C, T) - 1
    sub = o_t // c
    o_k, m_k = block_range(i_k, BK, K)
    m_tk = m_t[:, None] & m_k[None, :]
    base_k, base_v = token_bases(i_b, i_h, T, H, K, V)
    p_tk = base_k + t[:, None] * (H * K) + o_k[None, :]
    p_state = (i_bh.to(tl.int64) * NT + i_n) * K * V

    b_q = tl.load(q + p_tk, mask=m_tk, other=0.0).to(tl.float32)
    b_k = tl.load(k + p_tk, mask=m_tk, other=0.0).to(tl.float32)
    b_g = tl.load(gc + base_k + t_c[:, None] * (H * K) + o_k[None, :], mask=m_k[None, :], other=0.0)
    g_last = tl.load(gc + base_k + t_last * (H * K) + o_k, mask=m_k, other=0.0)

    # the V loop: dA = dO Vᵀ, and the inter-chunk products with S_n and dS_{n+1}
    b_dA, b_dq, b_dk, b_hdh = inter_chunk_dqk(v, do, h, dh, base_v, p_state, t, m_t, o_k, m_k,
                                              H, V, C, BK, BV, PREC)
    b_dq *= tl.exp(b_g) * scale
    b_dk *= tl.exp(g_last[None, :] - b_g)
    b_dgamma = b_hdh * tl.exp(g_last) + tl.sum(b_k * b_dk, axis=0)
    b_dA = tl.where(o_t[:, None] >= o_t[None, :], b_dA * scale, 0.0)

    # intra-chunk, key sub-chunk j against later query rows, split at Γ_e (e: last row of j)
    DT = k.dtype.element_ty
    for j in tl.static_range(C // c - 1):
        e = j * c + c - 1
        g_e = tl.load(gc + base_k + tl.minimum(i_n * C + e, T - 1) * (H * K) + o_k, mask=m_k, other=0.0)
        later = (o_t > e)[:, None]
        in_j = (sub == j)[:, None]
        f_q = tl.where(later, tl.exp(tl.where(later, b_g - g_e[None, :], 0.0)), 0.0)
        f_k = tl.where(in_j, tl.exp(tl.where(in_j, g_e[None, :] - b_g, 0.0)), 0.0)
        b_dq += f_q * tl.dot(b_dA.to(DT), (b_k * f_k).to(DT), input_precision=PREC)
        b_dk += f_k * tl.dot(tl.trans(b_dA).to(DT), (b_q * f_q).to(DT), input_precision=PREC)

    # diagonal tiles in float32 log space: row r pairs with row p = (first row of its sub-chunk) + j.
    # Their dA entries are gathered once by exact float32 products with a 0/1 matrix:
    # D_q[r, j] = dA[r, p], D_k[s, j] = dA[p(s), s]
    o_c = tl.arange(0, c)
    b_dAd = tl.where(sub[:, None] == sub[None, :], b_dA, 0.0)
    pick = tl.where(o_t[:, None] % c == o_c[None, :], 1.0, 0.0)
    D_q = tl.dot(b_dAd, pick, input_precision="ieee")
    D_k = tl.dot(tl.trans(b_dAd), pick, input_precision="ieee")
    for j in range(c):
        p = sub * c + j
        t_p = i_n * C + p
        m_p = (t_p < T)[:, None] & m_k[None, :]
        p_pk = base_k + t_p[:, None] * (H * K) + o_k[None, :]
        b_qp = tl.load(q + p_pk, mask=m_p, other=0.0).to(tl.float32)
        b_kp = tl.load(k + p_pk, mask=m_p, other=0.0).to(tl.float32)
        b_gp = tl.load(gc + base_k + tl.minimum(t_p, T - 1)[:, None] * (H * K) + o_k[None, :],
                       mask=m_k[None, :], other=0.0)
        dA_rp = tl.sum(tl.where(o_c[None, :] == j, D_q, 0.0), axis=1)   # dA[r, p(r)]
        dA_pr = tl.sum(tl.where(o_c[None, :] == j, D_k, 0.0), axis=1)   # dA[p(s), s]
        q_side = (o_t >= p)[:, None]          # dq[r] += dA[r,p] k_p exp(Γ_r − Γ_p),  p ≤ r
        k_side = (p >= o_t)[:, None]          # dk[s] += dA[p,s] q_p exp(Γ_p − Γ_s),  p ≥ s
        b_dq += tl.where(q_side, dA_rp[:, None] * b_kp * tl.exp(tl.where(q_side, b_g - b_gp, 0.0)), 0.0)
        b_dk += tl.where(k_side, dA_pr[:, None] * b_qp * tl.exp(tl.where(k_side, b_gp - b_g, 0.0)), 0.0)

    # gate gradient: reverse cumulative sum of dΓ inside the chunk, plus the chunk-decay term
    b_dG = b_q * b_dq - b_k * b_dk
    b_dg = reverse_cumsum(b_dG) + b_dgamma[None, :]
    tl.store(dq + p_tk, b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + p_tk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    tl.store(dg + p_tk, b_dg.to(dg.dtype.element_ty), mask=m_tk)


def chunk_bwd_dv(k, gc, A, dh, do, chunk_size: int) -> torch.Tensor:
    B, T, H, K = k.shape
    V = do.shape[-1]
    dv = torch.empty_like(do)
    grid = lambda meta: (triton.cdiv(V, meta["BV"]), triton.cdiv(T, chunk_size), B * H)
    chunk_bwd_dv_kernel[grid](k, gc, A, dh, do, dv, T, T_BUCKET=triton.next_power_of_2(T), H=H, K=K,
                              V=V, C=chunk_size, BK=min(64, block(K)), PREC=_precision(k))
    return dv


def chunk_bwd_dqkg(q, k, v, gc, h, dh, do, scale: float, chunk_size: int, g_dtype):
    """dq, dk (q's dtype) and dg (``g_dtype``)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dg = torch.empty(B, T, H, K, dtype=g_dtype, device=q.device)
    grid = lambda meta: (triton.cdiv(K, meta["BK"]), triton.cdiv(T, chunk_size), B * H)
    chunk_bwd_dqkg_kernel[grid](q, k, v, gc, h, dh, do, dq, dk, dg, scale, T,
                                T_BUCKET=triton.next_power_of_2(T), H=H, K=K, V=V, C=chunk_size,
                                c=min(SUB_CHUNK, chunk_size), BV=min(64, block(V)), PREC=_precision(q))
    return dq, dk, dg
