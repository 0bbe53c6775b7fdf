"""A first Triton kernel, for chapter 4's on-ramp: the chunk-local cumulative log-gate.

For chunk n of C tokens (math numbering, tokens ``(n−1)C+1 … nC``) and every key channel,

    log Λ_{(n−1)C+j} = g_{(n−1)C+1} + … + g_{(n−1)C+j},      j = 1 … C,

the sum restarted at every chunk, in float32. It is step 1 of ``chunk_gla`` cut down to what a
first kernel needs: fixed-length batches only (no ``cu_seqlens``), all K channels in one block, one
launch config and no autotuning. The library's step 1 (:mod:`gla_ref.triton.chunk.cumsum`) is the
same computation with packed batches, blocks along K and the shared ``_tiles`` addressing helpers;
the two agree bit for bit on fixed-length input with valid gates under the interpreter, and to
float32 rounding on a GPU (tests/triton/test_triton_first_kernel.py).

Grid ``(⌈T/C⌉, B·H)``: program ``(i_n, i_bh)`` owns the ``C × K`` gate tile of the chunk at 0-based
index ``i_n`` (chunk [i_n + 1] of the math) of one (batch row, head). It reads g once and writes
the result once; rows past T and columns past K are masked, never loaded or stored. Offsets are
int64 (``B·T·H·K`` passes 2³¹ at realistic sizes), built by pointer arithmetic, without
``make_block_ptr``. It does not check the gates' values: ``g`` should hold log-gates ≤ 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref import device
from gla_ref.triton.common.host import MAX_K, check_chunk_size  # MAX_K: a program holds all K channels of a chunk


@triton.jit
def first_cumsum_kernel(g, b, T, H: tl.constexpr, K: tl.constexpr, C: tl.constexpr, BK: tl.constexpr):
    i_n, i_bh = tl.program_id(0), tl.program_id(1)             # chunk i_n of (batch row, head) i_bh
    i_b, i_h = i_bh // H, i_bh % H
    t = i_n.to(tl.int64) * C + tl.arange(0, C)                  # the chunk's C tokens, int64
    o_k = tl.arange(0, BK)                                     # all K channels, padded to a power of two
    offs = (i_b.to(tl.int64) * T + t[:, None]) * (H * K) + i_h * K + o_k[None, :]  # g[i_b, t, i_h, k]
    mask = (t < T)[:, None] & (o_k < K)[None, :]                # no row past T, no column past K
    b_g = tl.load(g + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(b + offs, tl.cumsum(b_g, axis=0), mask=mask)      # the running sum down the chunk's rows


def first_chunk_cumsum(g: torch.Tensor, chunk_size: int = 64, *, num_warps: int = 4,
                       num_stages: int = 2) -> torch.Tensor:
    """``log Λ``: the cumulative sum of the log-gates ``g`` restarted at every chunk, in float32.

    ``g`` is a ``[B, T, H, K]`` float16, bfloat16 or float32 tensor (K ≤ 256) on a CUDA device, or on
    the CPU under Triton's interpreter; ``chunk_size`` C is 16, 32 or 64 (as for ``chunk_gla``).
    ``num_warps`` and ``num_stages`` are passed to the launch unchanged (the interpreter ignores
    them). Returns a float32 tensor of g's shape. Bad input raises a ValueError or TypeError naming
    the argument before anything is launched.
    """
    if not isinstance(g, torch.Tensor):
        raise TypeError(f"g must be a torch.Tensor, got {type(g).__name__}")
    if g.dim() != 4 or 0 in g.shape:
        raise ValueError(f"g must have shape [B, T, H, K] with every size >= 1, got {tuple(g.shape)}")
    if g.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"g must be float16, bfloat16 or float32, got {g.dtype}")
    if g.shape[3] > MAX_K:
        raise ValueError(f"g has K = {g.shape[3]} channels; this kernel holds all of K in one block, "
                         f"so K must be at most {MAX_K}")
    if g.device.type != "cuda" and not device.triton_interpret():
        raise ValueError(f"g is on {g.device}: Triton kernels need CUDA tensors when a GPU is present")
    C = check_chunk_size(chunk_size)
    for name, value in (("num_warps", num_warps), ("num_stages", num_stages)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if num_warps & (num_warps - 1):
        raise ValueError(f"num_warps must be a power of two, got {num_warps}")
    g = g.contiguous()
    B, T, H, K = g.shape
    b = torch.empty(g.shape, dtype=torch.float32, device=g.device)
    grid = (triton.cdiv(T, C), B * H)
    first_cumsum_kernel[grid](g, b, T, H=H, K=K, C=C, BK=triton.next_power_of_2(K),
                              num_warps=num_warps, num_stages=num_stages)
    return b
