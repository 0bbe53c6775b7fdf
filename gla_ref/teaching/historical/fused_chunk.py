"""Historical step 3 — ``fused_chunk_gla_fwd_kernel``: the inter-chunk part, state kept on chip.

A program owns one ``BK × BV`` block of one head's state S and walks the chunks of 16 tokens in
order, S never leaving the chip (the "fused" of the name). Per chunk, with q_g, k_g from step 2
and ``b_last`` the chunk's last row of the log₂ gate,

    O_inter = q_g S                        (what the state entering the chunk gives its queries)
    S      ← diag(2^b_last) S + k_gᵀ V      (the chunk's keys, already decayed to the chunk end)

Only the state's history is computed here: the contribution of a query's own chunk is step 4's.
Grid ``(⌈V/BV⌉, ⌈K/BK⌉, B·H)``. HBM: q_g, k_g, v and one row of b per chunk read once; a float32
partial output ``[⌈K/BK⌉, B, T, H, V]`` written once (one slab per key block, summed by step 5);
the float32 final state when asked. No per-chunk state is stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton.common.host import autotune, autotune_configs
from gla_ref.triton.common.precision import dot_precision


@autotune(autotune_configs([triton.Config({}, num_warps=w, num_stages=s)
                                           for w, s in ((2, 1), (4, 2), (4, 1), (8, 2))]), ["K", "V", "BK", "BV"])
@triton.jit
def fused_chunk_fwd_kernel(qg, kg, v, b, o, h0, ht, T, B, H: tl.constexpr, K: tl.constexpr,
                           V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           PREC: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr):
    i_v, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = tl.arange(0, C)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    qk_head = (i_b * T * H + i_h) * K
    v_head = (i_b * T * H + i_h) * V
    o_head = i_k.to(tl.int64) * B * T * H * V + v_head  # this key block's slab of the partial output
    p_s = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    m_s = (o_k < K)[:, None] & (o_v < V)[None, :]
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + p_s, mask=m_s, other=0.0)
    for n in range(0, tl.cdiv(T, C)):
        rows = (n * C + o_t).to(tl.int64)
        m_k = (rows < T)[:, None] & (o_k < K)[None, :]
        m_v = (rows < T)[:, None] & (o_v < V)[None, :]
        b_q = tl.load(qg + qk_head + rows[:, None] * (H * K) + o_k[None, :], mask=m_k, other=0.0)
        # k_g loaded transposed, [BK, C], ready for k_gᵀ V
        m_kt = (o_k < K)[:, None] & (rows < T)[None, :]
        b_kt = tl.load(kg + qk_head + rows[None, :] * (H * K) + o_k[:, None], mask=m_kt, other=0.0)
        b_v = tl.load(v + v_head + rows[:, None] * (H * V) + o_v[None, :], mask=m_v, other=0.0)
        last = tl.minimum(n * C + C - 1, T - 1).to(tl.int64)
        b_last = tl.load(b + qk_head + last * (H * K) + o_k, mask=o_k < K, other=0.0)
        b_o = tl.dot(b_q.to(tl.float32), S, input_precision=PREC)
        tl.store(o + o_head + rows[:, None] * (H * V) + o_v[None, :], b_o, mask=m_v)
        S = S * tl.exp2(b_last)[:, None] + tl.dot(b_kt, b_v, input_precision=PREC)
    if STORE_HT:
        tl.store(ht + p_s, S, mask=m_s)


def launch_fused_chunk(qg, kg, v, b, h0, output_final_state: bool, chunk_size: int, BK: int, BV: int):
    """``(o_inter [NK, B, T, H, V] float32, final state or None)`` from contiguous, validated inputs."""
    B, T, H, K = qg.shape
    V = v.shape[-1]
    grid = (triton.cdiv(V, BV), triton.cdiv(K, BK), B * H)
    o = torch.empty(grid[1], B, T, H, V, dtype=torch.float32, device=v.device)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=v.device) if output_final_state else None
    fused_chunk_fwd_kernel[grid](qg, kg, v, b, o, h0, ht, T, B, H=H, K=K, V=V,
                                 C=chunk_size, BK=BK, BV=BV, PREC=dot_precision(v),
                                 USE_H0=h0 is not None, STORE_HT=output_final_state)
    return o, ht
