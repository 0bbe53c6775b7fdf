"""Historical step 1 — ``fwd_decay_cumsum``: chunk-local cumulative gates in log base 2.

For chunk n of C = 16 tokens the kernel writes

    b[r] = Σ_{s ≤ r} g_s / ln 2        (r = 0..15, the sum restarted at every chunk start)

in float32: ``log₂`` of the decay from the chunk start through token r, so the later steps
restore a decay with the hardware's ``exp2``. b is ≤ 0 and decreasing inside a chunk; across
chunks nothing is carried (each program is independent), which is why b only ever spans 16 tokens.

The original walked the 16 rows with a running vector ``s ← s + g / ln 2``; ``tl.cumsum`` is that
same scan over the tile. Grid ``(⌈K/BK⌉, ⌈T/16⌉, B·H)``; HBM: g read once, b written once (float32,
the size of g). An invalid gate (NaN, > 0, -inf) becomes NaN as it is read
(:func:`gla_ref.triton.common.gates.valid_gate`), so the later steps return NaN for it, never a finite value.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton.common.host import autotune, autotune_configs
from gla_ref.triton.common.gates import valid_gate


@autotune(autotune_configs([triton.Config({}, num_warps=w) for w in (1, 2, 4)]), ["K", "BK"])
@triton.jit
def decay_cumsum_kernel(g, b, T, H: tl.constexpr, K: tl.constexpr, C: tl.constexpr,
                        BK: tl.constexpr):
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    rows = (i_n * C + tl.arange(0, C)).to(tl.int64)
    o_k = i_k * BK + tl.arange(0, BK)
    offs = (i_b * T * H + i_h) * K + rows[:, None] * (H * K) + o_k[None, :]
    mask = (rows < T)[:, None] & (o_k < K)[None, :]
    b_g = valid_gate(tl.load(g + offs, mask=mask, other=0.0).to(tl.float32)) * 1.4426950408889634  # 1 / ln 2
    tl.store(b + offs, tl.cumsum(b_g, axis=0), mask=mask)


def launch_decay_cumsum(g: torch.Tensor, chunk_size: int, BK: int) -> torch.Tensor:
    """b from a contiguous ``[B, T, H, K]`` natural-log gate (already validated)."""
    B, T, H, K = g.shape
    b = torch.empty(g.shape, dtype=torch.float32, device=g.device)
    grid = (triton.cdiv(K, BK), triton.cdiv(T, chunk_size), B * H)
    decay_cumsum_kernel[grid](g, b, T, H=H, K=K, C=chunk_size, BK=BK)
    return b
