"""Historical step 2 — ``prepare_qg_kg``: decayed copies of q and k, written to HBM.

With b the chunk-local log₂ gate of step 1 and ``b_last`` its last row in the chunk (the chunk
end, or the last real token of a short final chunk),

    q_g = scale · q ⊙ 2^b                 (decay from the chunk start through the query: ≤ 1)
    k_g = k ⊙ 2^(b_last − b)              (decay from the key to the chunk end: ≤ 1)

so that step 3 needs plain matmuls only: the chunk's queries read the entering state as
``q_g S`` and its keys enter the next state as ``k_gᵀ v``. Both exponents are ≤ 0, so nothing
overflows, but the copies cost a full extra write and read of q and k.

Grid ``(⌈K/BK⌉, ⌈T/16⌉, B·H)``, the same tiling as step 1. HBM: q, k, b read once; q_g and k_g
written once in q's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton.common.host import autotune, autotune_configs
from gla_ref.triton.common.gates import at_most_zero


@autotune(autotune_configs([triton.Config({}, num_warps=w) for w in (1, 2, 4)]), ["K", "BK"])
@triton.jit
def prepare_qg_kg_kernel(q, k, b, qg, kg, scale, T, H: tl.constexpr, K: tl.constexpr,
                         C: tl.constexpr, BK: tl.constexpr):
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    rows = (i_n * C + tl.arange(0, C)).to(tl.int64)
    o_k = i_k * BK + tl.arange(0, BK)
    head = (i_b * T * H + i_h) * K
    offs = head + rows[:, None] * (H * K) + o_k[None, :]
    mask = (rows < T)[:, None] & (o_k < K)[None, :]
    b_b = tl.load(b + offs, mask=mask, other=0.0)
    last = tl.minimum(i_n * C + C - 1, T - 1).to(tl.int64)  # padded rows would repeat this row
    b_last = tl.load(b + head + last * (H * K) + o_k, mask=o_k < K, other=0.0)
    b_q = tl.load(q + offs, mask=mask, other=0.0).to(tl.float32) * tl.exp2(b_b) * scale
    # b_last − b is ≤ 0 up to rounding of the scan: cap it so no positive exponent is evaluated,
    # keeping the NaN of an invalid gate (tl.minimum would return 0 for it)
    b_k = tl.load(k + offs, mask=mask, other=0.0).to(tl.float32) * tl.exp2(at_most_zero(b_last[None, :] - b_b))
    tl.store(qg + offs, b_q.to(qg.dtype.element_ty), mask=mask)
    tl.store(kg + offs, b_k.to(kg.dtype.element_ty), mask=mask)


def launch_prepare_qg_kg(q, k, b, scale: float, chunk_size: int, BK: int):
    """``(q_g, k_g)`` in q's dtype from contiguous, validated q, k ``[B, T, H, K]`` and b (float32)."""
    B, T, H, K = q.shape
    qg, kg = torch.empty_like(q), torch.empty_like(k)
    grid = (triton.cdiv(K, BK), triton.cdiv(T, chunk_size), B * H)
    prepare_qg_kg_kernel[grid](q, k, b, qg, kg, scale, T, H=H, K=K, C=chunk_size, BK=BK)
    return qg, kg
