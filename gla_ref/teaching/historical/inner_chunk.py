"""Historical step 4 — ``fwd_inner_chunk``: the intra-chunk attention matrix, in float32.

Inside chunk n (rows i, j = 0..15, b the chunk-local log₂ gate of step 1),

    A[i, j] = scale · Σ_d q_id k_jd 2^(b_id − b_jd)      for j ≤ i,   0 above the diagonal,

the log-space form of ``(Q ⊙ Λ)(K / Λ)ᵀ``: the exponent is a difference taken before ``exp2``,
masked to 0 above the diagonal, so it is always ≤ 0 and nothing overflows. The price is that the
reduction over d is an element-wise product and a sum, not a matmul: no tensor cores, which is
why the chunk was kept at 16 tokens. A program builds the tile one query row at a time, as the
original did.

Grid ``(⌈K/BK⌉, ⌈T/16⌉, B·H)``. HBM: q, k, b read once; A ``[⌈K/BK⌉, B, H, ⌈T/16⌉, 16, 16]``
written once in float32 (one partial per key block, summed by step 5).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton.common.host import autotune, autotune_configs
from gla_ref.triton.common.gates import at_most_zero


@autotune(autotune_configs([triton.Config({}, num_warps=w) for w in (4, 2, 8)]), ["K", "BK"])
@triton.jit
def inner_chunk_kernel(q, k, b, A, scale, T, B, H: tl.constexpr, K: tl.constexpr, C: tl.constexpr,
                       BK: tl.constexpr):
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = tl.arange(0, C)
    o_k = i_k * BK + tl.arange(0, BK)
    head = (i_b * T * H + i_h) * K
    rows = (i_n * C + o_t).to(tl.int64)
    offs = head + rows[:, None] * (H * K) + o_k[None, :]
    mask = (rows < T)[:, None] & (o_k < K)[None, :]
    b_k = tl.load(k + offs, mask=mask, other=0.0).to(tl.float32)
    b_b = tl.load(b + offs, mask=mask, other=0.0)
    p_A = A + ((i_k.to(tl.int64) * B * H + i_bh) * tl.cdiv(T, C) + i_n) * (C * C)
    for i in range(0, C):
        t = i_n.to(tl.int64) * C + i
        m_i = (o_k < K) & (o_k * 0 + t < T)  # the token test as a vector (the interpreter wants one)
        b_qi = tl.load(q + head + t * (H * K) + o_k, mask=m_i, other=0.0).to(tl.float32) * scale
        b_bi = tl.load(b + head + t * (H * K) + o_k, mask=m_i, other=0.0)
        causal = o_t <= i
        # exponent b_i − b_j masked before exp2, and capped at 0 (the scan may round it a bit above
        # 0) by a where that keeps the NaN of an invalid gate (tl.minimum would return 0 for it)
        d = tl.where(causal[:, None], at_most_zero(b_bi[None, :] - b_b), 0.0)
        s = tl.sum(b_qi[None, :] * b_k * tl.exp2(d), axis=1)
        tl.store(p_A + i * C + o_t, tl.where(causal, s, 0.0))


def launch_inner_chunk(q, k, b, scale: float, chunk_size: int, BK: int) -> torch.Tensor:
    """A ``[NK, B, H, N, C, C]`` float32 (C = ``chunk_size``) from contiguous, validated q, k ``[B, T, H, K]`` and b."""
    B, T, H, K = q.shape
    grid = (triton.cdiv(K, BK), triton.cdiv(T, chunk_size), B * H)
    A = torch.empty(grid[0], B, H, grid[1], chunk_size, chunk_size, dtype=torch.float32, device=q.device)
    inner_chunk_kernel[grid](q, k, b, A, scale, T, B, H=H, K=K, C=chunk_size, BK=BK)
    return A
