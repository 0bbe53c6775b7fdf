"""Step 1 of the forward on Mosaic GPU: the chunk-local cumulative log-gates ``b`` in one kernel.

Status: the launcher's default for per-key gates (:data:`gla_ref.pallas.chunk.GATE_SUM_KERNELS`). Checked in the
Mosaic GPU interpreter against float64 and lowered for CUDA (tests/pallas/test_pallas_mosaic_gpu.py); on an H200 (jax
0.11.2, B=8, H=16, K=128, float32 g) within 1.0e-7 of the largest float64 sum, its NaN rule held, and the gates'
step took 0.48 ms at T=4096 and 1.21 ms at 16384 against the scan's 0.62 and 1.81 ms
(benchmarks/results/mosaic_forward_nvidia_h200.json, ``gate_kernel_only``). That is 1.8 TB/s for the 2.15 GB it
moves at 16384, under half the H200's bandwidth: one chunk a program, its read and write not overlapped.

``b_t = Σ_{s ≤ t in t's chunk} g_s`` (float32, :func:`gla_ref.pallas.chunk._local_cumsum`), read by every later
kernel. In XLA this step is a layout change of ``g`` from ``[B, T, H, K]`` to ``[B, H, T, K]``, a cast and a scan:
on the H200 (jax 0.11.2, B=8, H=16, K=128) 0.60 ms at T=4096 and 1.81 ms at T=16384, about a third of the launcher's
forward (benchmarks/results/mosaic_glue_nvidia_h200.json). Here one program per chunk reads its ``g`` tile
straight from the API's layout by TMA and writes its ``b`` tile in the kernel layout: the least HBM traffic
the step can have.

The sum is a matmul by a triangle of ones on the tensor cores, ``b = L g`` with ``L_ts = [s ≤ t]``. A wgmma takes
bfloat16 operands, so ``g`` goes in as three bf16 parts, ``g = g₁ + g₂ + g₃`` (:func:`_three_parts`: each part
rounds what the ones before it left, 8 significant bits each, 24 in all, a float32's), and ``L g₁ + L g₂ + L g₃``
has products by 0 and 1 only, exact, summed in float32: the float32 sum, in another order. A NaN gate must make
its whole chunk's column NaN (the contract of :func:`gla_ref.pallas.chunk._local_cumsum`), rows before it too,
which ``L``'s zeros would carry only if the tensor cores gave ``0 · NaN = NaN``; so ``0 · (𝟙 g₁)``, the column's
total times 0, is added to every row, as the scan form does.

Grid and ownership: ``(B, H, N)``, one warpgroup per chunk ``n`` of head ``h``: it owns ``b``'s ``[C, K]`` tile.
Invalid gates (NaN, > 0, -inf) become NaN here (:func:`gla_ref._validate.invalid_gates_to_nan`), where the
kernels first read ``g``.

HBM traffic: ``g`` read once (``C·K`` of its dtype per program), ``b`` written once (``C·K`` float32): at T=16384,
K=128, float32 gates, 2.15 GB in all, 0.51 ms at the H200's 4.2 TB/s.

SMEM per program at ``K = 128``: the ``g`` tile (32 KiB in float32, reused for ``b``; a bfloat16 ``g`` gets its
own float32 ``b`` tile), one bf16 part (16 KiB) and the two ``[C, C]`` bf16 matrices (8 KiB each).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from gla_ref._validate import invalid_gates_to_nan
from gla_ref.pallas import compat
from gla_ref.pallas.launchers.mosaic_gpu.common import (CHUNK_SIZE, MIN_DIM, Ops, interpret_params, tokens, transforms,
                                                        triangle_ones)

GATE_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
"""The dtypes of ``g`` the kernel reads as they are (others are cast to float32 before it, in
:func:`gla_ref.pallas.chunk._gate_layout`)."""
PARTS = 3
"""bf16 parts of a float32 gate: 3 × 8 significant bits hold a float32's 24."""


def _three_parts(g, dtype=jnp.bfloat16):
    """``g₁, g₂, g₃`` in ``dtype``, each the rounding of what the parts before it left of ``g`` (float32): their
    sum is ``g`` to about 2⁻²⁴ of it. A generator, so that only one part and the remainder are live at a time."""
    rest = g
    for _ in range(PARTS):
        part = rest.astype(dtype)
        yield part
        rest = rest - part.astype(jnp.float32)


def _gate_sum_kernel(C, K, dtype, interpret):
    """The kernel body and its SMEM scratch: ``g [B, T, H, K]`` (``dtype``) → ``b [B, H, T, K]`` float32."""
    ops = Ops(interpret)
    mgpu = ops.mgpu
    W = mgpu.Layout.WGMMA
    bf16, f32 = jnp.bfloat16, jnp.float32
    own_out = jnp.dtype(dtype) != f32

    def kernel(g_ref, b_ref, g_s, part_s, tri_s, ones_s, ready, *out):
        b_s = out[0] if own_out else g_s
        ib, ih, n = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("n")
        rows = pl.ds(n * C, C)
        mgpu.copy_gmem_to_smem(tokens(g_ref, ib, ih, rows), g_s, ready.at[0])
        tri_s[...] = triangle_ones(ops, C, bf16, upper=False)  # L and 𝟙 are formed while the tile is on its way
        ones_s[...] = ops.cast(jnp.ones((C, C), f32), W).astype(bf16)
        mgpu.barrier_wait(ready.at[0])
        g = invalid_gates_to_nan(ops.load(g_s, W).astype(f32), jnp.where)

        def times(matrices, part):  # each [C, C] matrix times one bf16 part of g (a wgmma each)
            part_s[...] = part
            mgpu.commit_smem()
            return [ops.matmul(m_s, part_s, (C, K)) for m_s in matrices]

        parts = _three_parts(g)
        b, total = times((tri_s, ones_s), next(parts))  # total: every row the column's sum of g₁ (NaN for a NaN)
        b = b + 0.0 * total
        for part in parts:
            b = b + times((tri_s,), part)[0]
        b_s[...] = b
        mgpu.commit_smem()
        mgpu.copy_smem_to_gmem(b_s, b_ref.at[ib, ih, rows])
        mgpu.wait_smem_to_gmem(0)

    scratch = [
        mgpu.SMEM((C, K), dtype, transforms=transforms(dtype, K)),
        mgpu.SMEM((C, K), bf16, transforms=transforms(bf16, K)),
        mgpu.SMEM((C, C), bf16, transforms=transforms(bf16, C)),
        mgpu.SMEM((C, C), bf16, transforms=transforms(bf16, C)),
        mgpu.Barrier(num_arrivals=1, num_barriers=1),
    ]
    if own_out:
        scratch.append(mgpu.SMEM((C, K), f32, transforms=transforms(f32, K)))
    return kernel, scratch


def gate_sums(g, *, chunk_size=CHUNK_SIZE, interpret=False):
    """``b [B, H, T, K]`` (float32): the chunk-local cumulative sums of the log-gates ``g [B, T, H, K]`` (the API's
    layout; float32, bfloat16 or float16; ``T`` a multiple of ``chunk_size``, ``K`` a power of two ≥ 64), with every
    invalid gate's chunk column NaN. One program per chunk on the grid ``(B, H, N)`` (module docstring)."""
    B, T, H, K = g.shape
    if chunk_size != CHUNK_SIZE or T % chunk_size:
        raise ValueError(f"gate_sums takes chunk_size={CHUNK_SIZE} and T a multiple of it, "
                         f"got chunk_size={chunk_size}, T={T}")
    if K < MIN_DIM or K & (K - 1):
        raise ValueError(f"gate_sums takes g with K a power of two >= {MIN_DIM} (a swizzled TMA row), got K={K}")
    if g.dtype not in GATE_DTYPES:
        raise TypeError(f"gate_sums takes g as float32, bfloat16 or float16, got {jnp.dtype(g.dtype).name}")
    mgpu = compat.mosaic_gpu()
    kernel, scratch = _gate_sum_kernel(chunk_size, K, g.dtype, interpret)
    call = mgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((B, H, T, K), jnp.float32), scratch_types=scratch,
                       grid=(B, H, T // chunk_size), grid_names=("b", "h", "n"), compiler_params=mgpu.CompilerParams(),
                       interpret=interpret_params(interpret), kernel_name="gla_gate_sums_mgpu")
    return call(g)
