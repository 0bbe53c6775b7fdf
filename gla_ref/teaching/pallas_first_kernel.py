"""A first Pallas kernel: the chunk-local cumulative log-gate ``b`` (``log Λ``), one chunk per program.

Chapter 5 starts here before the GLA kernels. For the log-gates ``g`` of one head, cut into chunks
of ``C`` rows, the kernel computes ``b_i = g_1 + … + g_i`` restarting at every chunk (rows i of the
chunk, 1-based in the math), so that ``Λ = exp(b)`` is the decay from the chunk's start to row i.
This is step 1 of every chunked GLA path (the Triton kernels call it ``b`` too; the Pallas paths
compute it in XLA, :func:`gla_ref.pallas.chunk._local_cumsum`).

* grid ``(BH, T / C)``: one program per (head, chunk);
* ``BlockSpec((squeezed, C, K), index_map)`` for the input and the output: the program at grid point
  ``(i, n)`` owns rows ``n·C … n·C + C − 1`` of head ``i`` (0-based code index ``n`` is chunk
  ``[n + 1]`` of the math), all ``K`` columns;
* the body sums inside the block as one matmul by a lower triangle of ones (float32, exact for the
  products by 0 and 1), which lowers to the MXU through Mosaic on a TPU and to ``tl.dot`` through
  Triton on a GPU (where C and K must then be powers of two ≥ 16).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from gla_ref._validate import check_chunk_sizes
from gla_ref.pallas import compat
from gla_ref.testing import assert_close

__all__ = ["CHECK_CASES", "check", "chunk_cumsum_kernel", "chunk_local_cumsum"]


def chunk_cumsum_kernel(g_ref, b_ref):
    """One program: ``b = L g`` for its ``[C, K]`` block, ``L`` the lower triangle of ones (float32)."""
    C = g_ref.shape[0]
    rows = lax.broadcasted_iota(jnp.int32, (C, C), 0)
    cols = lax.broadcasted_iota(jnp.int32, (C, C), 1)
    lower = jnp.where(rows >= cols, 1.0, 0.0).astype(jnp.float32)
    b_ref[...] = jnp.dot(lower, g_ref[...].astype(jnp.float32), precision=lax.Precision.HIGHEST,
                         preferred_element_type=jnp.float32)


def chunk_local_cumsum(g, chunk_size, *, interpret=False, compiler_params=None):
    """``b [BH, T, K]`` float32: the cumulative sum of ``g [BH, T, K]`` over each chunk of ``chunk_size`` rows.

    Args:
        g: log forget gates of ``BH`` heads, ``[BH, T, K]``, floating point; ``T`` a multiple of
            ``chunk_size``.
        chunk_size: rows per chunk (per program).
        interpret: run in Pallas' interpreter (True on a CPU; a ``pltpu.InterpretParams`` for the TPU
            interpreter); False compiles for the device.
        compiler_params: passed to ``pl.pallas_call`` (e.g. ``compat.tpu_compiler_params`` or
            ``compat.triton_compiler_params``); None lets Pallas choose.
    """
    if getattr(g, "ndim", None) != 3:
        raise ValueError(f"g must be [BH, T, K] (3 dimensions), got shape {getattr(g, 'shape', type(g))}")
    if not jnp.issubdtype(g.dtype, jnp.floating):
        raise TypeError(f"g must be a floating-point array, got {g.dtype}")
    check_chunk_sizes(chunk_size)
    BH, T, K = g.shape
    if T % chunk_size:
        raise ValueError(f"the length T={T} of g must be a multiple of chunk_size={chunk_size}")
    spec = pl.BlockSpec((compat.squeezed(), chunk_size, K), lambda i, n: (i, n, 0))
    return pl.pallas_call(chunk_cumsum_kernel, grid=(BH, T // chunk_size), in_specs=[spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct((BH, T, K), jnp.float32), interpret=interpret,
                          compiler_params=compiler_params, name="chunk_local_cumsum")(g)


CHECK_CASES = ((1, 16, 16, 16), (3, 64, 20, 16), (2, 96, 8, 32), (2, 40, 5, 8))
"""``(BH, T, K, chunk_size)`` of :func:`check`: one chunk, several, K not a power of two, C = 8."""


def check(fn, tol: float = 1e-6) -> float:
    """Hold ``fn(g, chunk_size, interpret=True)`` to the assertions :func:`chunk_local_cumsum` passes.

    For each of :data:`CHECK_CASES`, on random log-gates ``g ≤ 0``: a ``[BH, T, K]`` float32 result
    within ``tol`` (relative RMSE) of a float64 cumulative sum restarted at every chunk, whose first row
    per chunk is that row's gate exactly, and which is not the running sum over the whole sequence.
    Raises AssertionError naming the case; returns the largest error.
    """
    worst = 0.0
    for BH, T, K, C in CHECK_CASES:
        g = -jnp.abs(jax.random.normal(jax.random.key(BH * T + K), (BH, T, K), jnp.float32))
        b = fn(g, C, interpret=True)
        case = f"BH={BH}, T={T}, K={K}, chunk_size={C}"
        if b.shape != (BH, T, K) or b.dtype != jnp.float32:
            raise AssertionError(f"{case}: expected float32 {(BH, T, K)}, got {b.dtype} {b.shape}")
        g64 = np.asarray(g, np.float64)
        ref = np.cumsum(g64.reshape(BH, T // C, C, K), axis=2).reshape(BH, T, K)
        worst = max(worst, assert_close(f"b ({case})", ref, b, tol))
        if not np.array_equal(np.asarray(b)[:, ::C], np.asarray(g)[:, ::C]):
            raise AssertionError(f"{case}: the first row of a chunk must be its own gate (b restarts)")
        if T > C and np.allclose(np.asarray(b), np.cumsum(g64, axis=1)):
            raise AssertionError(f"{case}: b is the running sum over the whole sequence, not per chunk")
    return worst
