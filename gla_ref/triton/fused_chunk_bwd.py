"""Fused chunk GLA, backward: states recomputed on chip, never stored (paper Alg. 6).

Same grid as the forward: a program owns one ``BK × BV`` block of one head. Two sweeps, with
``dP = dO Vᵀ`` (i ≥ j) and b, b_C as in the forward:

1. **forward sweep** (:func:`_bwd_dq_kernel`) rebuilds the state S entering each chunk and writes

       dq_i = scale · [ (dO Sᵀ)_i ⊙ exp b_i  +  Σ_{j ≤ i} dP_ij k_j ⊙ exp(b_i − b_j) ];

2. **reverse sweep** (:func:`_bwd_dkv_kernel`) carries dS, the gradient of the state leaving the
   chunk, from the final-state cotangent back to ``dh0 = dS_0``:

       dk_j = scale · Σ_{i ≥ j} dP_ij q_i ⊙ exp(b_i − b_j)  +  (V dSᵀ)_j ⊙ exp(b_C − b_j)
       dV   = Pᵀ dO  +  (K ⊙ exp(b_C − b)) dS
       dS  ← diag(exp b_C) dS  +  scale · (Q ⊙ exp b)ᵀ dO

   and the gate gradient. With ``B_t = Σ_{s ≤ t} g_s`` every term of o and of S_T depends on B
   through ``exp(+B_t)`` next to q_t or ``exp(−B_t)`` next to k_t, except S_T's own ``exp(B_T)``:

       dB_t = q_t ⊙ dq_t − k_t ⊙ dk_t  (+ Σ_v S_T ⊙ dS_T at t = T),   dg_t = Σ_{s ≥ t} dB_s,

   a reverse cumulative sum inside the chunk plus a running total of the later chunks.

The intra-chunk sums run one key j (dq) or one query i (dk, P) at a time, reading that token's
row, so no loop step needs a reduction across the rows of a tile. dq, dk, dg are sums over
value blocks and dv over key blocks: each program writes its float32 part and the launcher adds
them. HBM holds no state: only inputs, gradients and those parts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton.fused_chunk_fwd import (
    chunk_gates,
    col,
    configs,
    decay_from,
    decay_to,
    dot,
    launch_meta,
    load_row,
    load_tile,
    state_block,
    store_tile,
)


@triton.autotune(configs=configs(), key=["BK", "BV", "C", "T_BUCKET"])
@triton.jit
def _bwd_dq_kernel(k, v, g, do, dq, h0, scale, B, T, T_BUCKET,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                   USE_G: tl.constexpr, USE_H0: tl.constexpr):
    i_v, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    DT = k.dtype.element_ty
    o_c = tl.arange(0, C)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    k += (i_b * T * H + i_h) * K
    v += (i_b * T * H + i_h) * V
    do += (i_b * T * H + i_h) * V
    dq += i_v.to(tl.int64) * B * T * H * K + (i_b * T * H + i_h) * K  # this value block's part
    if USE_G:
        g += (i_b * T * H + i_h) * K
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        p_s, m_s = state_block(h0, i_bh, o_k, o_v, K, V)
        S += tl.load(p_s, mask=m_s, other=0.0)
    for n in range(tl.cdiv(T, C)):
        rows = (n * C + o_c).to(tl.int64)
        b, b_last = chunk_gates(g, n, o_k, T, K, H * K, C, BK, USE_G)
        b_k = load_tile(k, rows, o_k, T, K, H * K)
        b_v = load_tile(v, rows, o_v, T, V, H * V)
        b_do = load_tile(do, rows, o_v, T, V, H * V)
        dP = dot(b_do, tl.trans(b_v), DT, PREC)
        b_dq = dot(b_do, tl.trans(S), tl.float32, PREC) * tl.exp(b)
        b_j = tl.zeros([BK], dtype=tl.float32)
        for j in range(C):  # key j reaches the queries i ≥ j with decay exp(b_i − b_j)
            t_j = tl.cast(n * C + j, tl.int64)
            if USE_G:
                b_j += load_row(g, t_j, o_k, T, K, H * K)
            k_j = load_row(k, t_j, o_k, T, K, H * K)
            b_dq += col(dP, j, C)[:, None] * k_j[None, :] * decay_from(b, b_j, j, C)
        store_tile(dq, rows, o_k, T, K, H * K, b_dq * scale)
        b_kd = b_k * tl.exp(b_last[None, :] - b)
        S = S * tl.exp(b_last)[:, None] + dot(tl.trans(b_kd), b_v, tl.float32, PREC)


@triton.autotune(configs=configs(), key=["BK", "BV", "C", "T_BUCKET"])
@triton.jit
def _bwd_dkv_kernel(q, k, v, g, do, dq, dk, dv, dg, ht, dht, dh0, scale, B, T, T_BUCKET,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                    BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                    USE_G: tl.constexpr, USE_DHT: tl.constexpr, USE_H0: tl.constexpr):
    i_v, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    DT = q.dtype.element_ty
    o_c = tl.arange(0, C)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    q += (i_b * T * H + i_h) * K
    k += (i_b * T * H + i_h) * K
    v += (i_b * T * H + i_h) * V
    do += (i_b * T * H + i_h) * V
    dk += i_v.to(tl.int64) * B * T * H * K + (i_b * T * H + i_h) * K
    dv += i_k.to(tl.int64) * B * T * H * V + (i_b * T * H + i_h) * V
    if USE_G:
        g += (i_b * T * H + i_h) * K
        dq += i_v.to(tl.int64) * B * T * H * K + (i_b * T * H + i_h) * K
        dg += i_v.to(tl.int64) * B * T * H * K + (i_b * T * H + i_h) * K
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    dg_acc = tl.zeros([BK], dtype=tl.float32)  # Σ of dB over the later chunks (+ the final-state term)
    if USE_DHT:
        p_s, m_s = state_block(dht, i_bh, o_k, o_v, K, V)
        dS += tl.load(p_s, mask=m_s, other=0.0)
        if USE_G:
            p_s, m_s = state_block(ht, i_bh, o_k, o_v, K, V)
            dg_acc += tl.sum(tl.load(p_s, mask=m_s, other=0.0) * dS, axis=1)
    NT = tl.cdiv(T, C)
    for i_n in range(NT):
        n = NT - 1 - i_n
        rows = (n * C + o_c).to(tl.int64)
        b, b_last = chunk_gates(g, n, o_k, T, K, H * K, C, BK, USE_G)
        b_q = load_tile(q, rows, o_k, T, K, H * K)
        b_k = load_tile(k, rows, o_k, T, K, H * K)
        b_v = load_tile(v, rows, o_v, T, V, H * V)
        b_do = load_tile(do, rows, o_v, T, V, H * V)
        dPT = dot(b_v, tl.trans(b_do), DT, PREC)  # dPᵀ: [key j, query i]
        PT = tl.zeros([C, C], dtype=tl.float32)  # Pᵀ, built one query column at a time
        b_dk = tl.zeros([C, BK], dtype=tl.float32)
        b_i = tl.zeros([BK], dtype=tl.float32)
        for i in range(C):  # query i: scale · q_i ⊙ exp(b_i − b_j) for its keys j ≤ i
            t_i = tl.cast(n * C + i, tl.int64)
            if USE_G:
                b_i += load_row(g, t_i, o_k, T, K, H * K)
            qe = (load_row(q, t_i, o_k, T, K, H * K) * scale)[None, :] * decay_to(b, b_i, i, C)
            PT += tl.where((o_c == i)[None, :], tl.sum(qe * b_k, axis=1)[:, None], 0.0)
            b_dk += col(dPT, i, C)[:, None] * qe
        decay_k = tl.exp(b_last[None, :] - b)  # exp(b_C − b) ≤ 1: key to the end of the chunk
        b_dk += dot(b_v, tl.trans(dS), tl.float32, PREC) * decay_k
        b_dv = dot(PT, b_do, DT, PREC) + dot(b_k * decay_k, dS, tl.float32, PREC)
        store_tile(dk, rows, o_k, T, K, H * K, b_dk)
        store_tile(dv, rows, o_v, T, V, H * V, b_dv)
        if USE_G:
            dB = b_q * load_tile(dq, rows, o_k, T, K, H * K) - b_k * b_dk
            store_tile(dg, rows, o_k, T, K, H * K, dg_acc[None, :] + tl.cumsum(dB, axis=0, reverse=True))
            dg_acc += tl.sum(dB, axis=0)
        dS = dS * tl.exp(b_last)[:, None] + dot(tl.trans(b_q * scale * tl.exp(b)), b_do, tl.float32, PREC)
    if USE_H0:
        p_s, m_s = state_block(dh0, i_bh, o_k, o_v, K, V)
        tl.store(p_s, dS, mask=m_s)


def _total(parts, dtype):
    """Add up the per-block float32 parts ``[N, ...]`` and cast."""
    return (parts.sum(0) if parts.shape[0] > 1 else parts[0]).to(dtype)


def fused_chunk_backward(q, k, v, g, h0, ht, do, dht, scale, chunk_size):
    """Launch both sweeps; returns ``(dq, dk, dv, dg, dh0)`` (dg, dh0 None without g, h0)."""
    grid, meta = launch_meta(q, v, chunk_size)
    NV, NK = grid[0], grid[1]
    dq = q.new_empty(NV, *q.shape, dtype=torch.float32)
    dk = torch.empty_like(dq)
    dg = torch.empty_like(dq) if g is not None else None
    dv = v.new_empty(NK, *v.shape, dtype=torch.float32 if NK > 1 else v.dtype)
    dh0 = torch.empty_like(h0) if h0 is not None else None
    flags = dict(USE_G=g is not None, USE_H0=h0 is not None)
    _bwd_dq_kernel[grid](k, v, g, do, dq, h0, scale, **meta, **flags)
    _bwd_dkv_kernel[grid](q, k, v, g, do, dq, dk, dv, dg, ht, dht, dh0, scale, **meta,
                          USE_DHT=dht is not None, **flags)
    dg = None if g is None else _total(dg, g.dtype)
    return _total(dq, q.dtype), _total(dk, k.dtype), _total(dv, v.dtype), dg, dh0
