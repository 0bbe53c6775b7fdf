"""What every kernel of the Mosaic GPU launcher shares: its sizes and the calls it takes, the token-major
layout, SMEM tile transforms, the interpreter switch and :class:`Ops`, and small register-level helpers.

What a program is. Mosaic GPU runs one *warpgroup* (4 warps, 128 threads) per program; arrays in a kernel
are distributed over the warpgroup's registers in a layout (``WGMMA``: the accumulator layout of the
tensor-core instruction), and every matmul is a ``wgmma``: operands in shared memory (SMEM, swizzled so the
tensor cores read them without bank conflicts, :func:`transforms`), accumulator in registers.

Dtypes: bfloat16 only. A ``wgmma`` reads float32 operands as tf32 (10-bit mantissa, less than the float32
path of the other launchers promises), and tf32 ``wgmma`` only takes K-major operands, so the transposed
``yᵀ`` operand of the state update is not available to it; float32 inputs raise a TypeError that names this
launcher (:func:`check_supported`). Accumulation and states are float32, but for the states the forward
writes for its output kernel alone, in the input dtype (:func:`gla_ref.pallas.launchers.mosaic_gpu.states.state_fwd`).
A float32 operand that needs more than bf16's 8 bits goes in as two bf16 parts (:func:`two_parts`).

Sizes: ``K`` and ``V`` are padded to powers of two of at least 64 (a 128-byte swizzled row of bfloat16,
and the ``wgmma`` M of a warpgroup); chunks are 64 tokens (a register tile of a warpgroup has a multiple
of 64 rows) and ``K ≤ 128``, which keep every kernel's tiles within a Hopper block's 227 KiB of SMEM (the
lowering checks it); the fused kernels take ``K ≤ 64`` (at most 197 KiB; 257 to 314 KiB at ``K = 128``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from gla_ref.pallas import compat
from gla_ref.pallas.launchers.common import Dims

BLOCK_V = 64
"""Value columns per program: the M of one warpgroup's ``wgmma``."""
MIN_DIM = 64
"""``K`` and ``V`` are padded to at least this: a 128-byte swizzled bfloat16 row."""
CHUNK_SIZE = 64
"""The one chunk size: a register tile of a warpgroup has a multiple of 64 rows, and at 128 the
gradient kernel's ``[C, C]`` tiles no longer fit beside the others in 227 KiB of SMEM."""
MAX_K = 128
"""Largest padded ``K``: the gradient kernel's tiles fill about 221 KiB of SMEM at ``K = 128``."""
MAX_K_FUSED = 64
"""Largest padded ``K`` of the fused kernels: they double-buffer four input tiles (``b`` in float32) beside
the per-chunk work tiles, at most about 197 KiB of SMEM at ``K = 64`` and over 227 KiB at ``K = 128``."""
NAME = "mosaic_gpu"

TOKEN_MAJOR = True
"""The layout this launcher's kernels read and write q, k, v, dO, o and dv in: the API's ``[B, T, H, D]``, as the
Triton kernels do. A program's TMA copy takes its ``[C, D]`` tile of one head straight from there, rows ``H·D``
elements apart (:func:`tokens`), so :func:`gla_ref.pallas.chunk.run` transposes none of them. The gates ``b``, the
states and the float32 partials of ``dq``, ``dk`` and the gate gradient stay ``[B, H, …]``."""


def _pow2(x: int) -> int:
    return max(MIN_DIM, 1 << (x - 1).bit_length())


def padded_dims(K: int, V: int) -> tuple[int, int]:
    """``(K_pad, V_pad)``: powers of two, at least 64."""
    return _pow2(K), _pow2(V)


def check_supported(dtype, K_pad: int, chunk_size: int, fused: bool = False) -> None:
    """What this launcher cannot do yet raises here, before any kernel is traced."""
    if jnp.dtype(dtype) != jnp.bfloat16:
        raise TypeError(f"launcher='{NAME}' takes bfloat16 q, k, v, got {jnp.dtype(dtype).name}: its matmuls are "
                        "wgmma, which read float32 as tf32 and only K-major (the state update reads v transposed); "
                        "use launcher='gpu' for float32")
    if chunk_size != CHUNK_SIZE:
        raise ValueError(f"launcher='{NAME}' takes chunk_size={CHUNK_SIZE} only (a register tile of a warpgroup has a "
                         f"multiple of 64 rows; larger chunks overflow SMEM), got chunk_size={chunk_size}")
    if K_pad > MAX_K:
        raise ValueError(f"launcher='{NAME}' takes K <= {MAX_K} (its tiles fill SMEM), got K padded to {K_pad}; "
                         "use launcher='gpu'")
    if fused and K_pad > MAX_K_FUSED:
        raise ValueError(f"launcher='{NAME}' runs the fused path for K <= {MAX_K_FUSED} (its double-buffered tiles "
                         f"fill SMEM), got K padded to {K_pad}; use chunk_gla with launcher='{NAME}', or "
                         "launcher='gpu'")


def supported(dtype, K: int, chunk_size: int, fused: bool = False) -> bool:
    """Whether :func:`check_supported` lets a call with head size ``K`` (unpadded) through: what
    :func:`gla_ref.pallas.chunk.make_plan` asks before choosing this launcher by itself."""
    try:
        check_supported(dtype, _pow2(K), chunk_size, fused)
    except (TypeError, ValueError):
        return False
    return True


def check_call(q, g, chunk_size: int, fused: bool = False) -> None:
    """:func:`check_supported` for a public call's ``q [B, T, H, K]`` and gate ``g [B, T, H, Kg]``."""
    check_supported(q.dtype, _pow2(q.shape[-1]), chunk_size, fused)


def tokens(ref, ib, ih, rows, cols=None):
    """Tokens ``rows`` of head ``ih`` (only the columns ``cols``, if given) of a ``[B, T, H, D]`` array in HBM: the
    ``[C, D]`` box a TMA copy reads or writes (:data:`TOKEN_MAJOR`)."""
    return ref.at[ib, rows, ih] if cols is None else ref.at[ib, rows, ih, cols]


def dims_of(x, y, chunk_size):
    """The sizes of a call whose ``x`` (q or k) is ``[B, T, H, K]`` and ``y`` (v or dO) ``[B, T, H, V]``."""
    B, T, H, K = x.shape
    V = y.shape[-1]
    return Dims(B, H, T // chunk_size, chunk_size, K, V, min(BLOCK_V, V), K)  # GLA's per-key gate only


def transforms(dtype, width):
    """Tiling + swizzle of an SMEM tile whose rows are ``width`` elements (wgmma and TMA read it)."""
    mgpu = compat.mosaic_gpu()
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = mgpu.find_swizzle(width * bits)
    return mgpu.TilingTransform((8, swizzle * 8 // bits)), mgpu.SwizzleTransform(swizzle)


def interpret_params(interpret):
    """``True`` → the Mosaic GPU interpreter's parameters; ``False`` stays False; params pass through."""
    if interpret is True:
        params = compat.gpu_interpret_params()
        if params is None:
            raise ValueError(f"interpret=True with launcher='{NAME}' needs a JAX with the Mosaic GPU interpreter "
                             f"(jax {jax.__version__} has none)")
        return params
    return interpret


class Ops:
    """The few operations whose form differs between compiled Mosaic GPU and its interpreter.

    Compiled, a register array gets an explicit layout (``plgpu.load(..., layout=)``,
    ``layout_cast``); the interpreter keeps arrays in their logical form and has no ``load``
    primitive, so there a plain ``ref[...]`` is the same read. A transposed operand is a
    ``ref.transpose`` view; JAX 0.10's interpreter cannot read such a view, so it gets a
    transposed copy in SMEM (the same values; the compiled kernel never makes it).
    """

    def __init__(self, interpret):
        self.interpret = bool(interpret)
        self.mgpu = compat.mosaic_gpu()
        self.copy_transposed = self.interpret and not compat.gpu_interpreter_reads_transposed_refs()

    def load(self, ref, layout):
        return ref[...] if self.interpret else compat.mosaic_gpu_load(ref, layout)

    def cast(self, x, layout):
        return x if self.interpret else self.mgpu.layout_cast(x, layout)

    def matmul(self, a_ref, b_ref, shape, lo=None):
        """``a_ref @ b_ref`` (SMEM tiles) as one wgmma, float32 ``shape``; given ``lo``, ``a_ref @ (b_ref + lo)``
        as two wgmmas into one accumulator (``b_ref, lo``: a float32 operand's two bf16 parts, :func:`two_parts`)."""
        mgpu = self.mgpu

        def run(acc):
            for b in (b_ref,) if lo is None else (b_ref, lo):
                mgpu.wgmma(acc, a_ref, b)
            return acc[...]

        return pl.run_scoped(run, mgpu.ACC(shape, jnp.float32))

    def _matmul_transposed(self, x_refs, shape, operands, more=()):
        """wgmmas into one float32 accumulator ``shape`` with the SMEM tiles ``x_refs`` transposed,
        ``operands(xᵀs)`` giving their ``(a, b)`` pairs: each ``xᵀ`` is a transposed view of its tile, or,
        where the interpreter has no such view (``copy_transposed``), a transposed copy in SMEM. ``more``:
        further ``(a, b)`` pairs whose products the same accumulator adds."""
        mgpu = self.mgpu

        def run(acc, *copies):
            if copies:
                for x_ref, x_t in zip(x_refs, copies):
                    x_t[...] = x_ref[...].T
                mgpu.commit_smem()
            else:
                copies = [x_ref.transpose((1, 0)) for x_ref in x_refs]  # views, as plgpu.transpose_ref made
            for a, b in (*operands(copies), *more):
                mgpu.wgmma(acc, a, b)
            return acc[...]

        if self.copy_transposed:  # an accumulator cannot share one scoped allocation with SMEM
            types = [mgpu.SMEM(x_ref.shape[::-1], x_ref.dtype) for x_ref in x_refs]
            return pl.run_scoped(lambda *copies: pl.run_scoped(lambda acc: run(acc, *copies),
                                                               mgpu.ACC(shape, jnp.float32)), *types)
        return pl.run_scoped(run, mgpu.ACC(shape, jnp.float32))

    def matmul_nt(self, a_ref, b_ref, shape, more=()):
        """``a_ref @ b_refᵀ`` (SMEM tiles ``[M, K]`` and ``[N, K]``) as one wgmma, float32 ``[M, N]``, plus
        ``c @ d`` for each pair of ``more`` in the same accumulator."""
        return self._matmul_transposed([b_ref], shape, lambda b_t: [(a_ref, b_t[0])], more)

    def matmul_nt_blocks(self, pairs, shape, more=()):
        """``Σ a @ bᵀ`` over the ``(a, b)`` of ``pairs`` (SMEM tiles ``[M, 64]`` and ``[N, 64]``, the key blocks
        of a contraction over ``K``), plus ``c @ d`` for each pair of ``more``: wgmmas into one float32
        ``[M, N]`` accumulator."""
        return self._matmul_transposed([b for _, b in pairs], shape,
                                       lambda b_ts: [(a, b_t) for (a, _), b_t in zip(pairs, b_ts)], more)

    def matmul_tn(self, a_ref, b_ref, shape, lo=None):
        """``a_refᵀ @ b_ref`` (SMEM tiles ``[C, M]`` and ``[C, N]``) as one wgmma, float32 ``[M, N]``; ``lo`` as
        for :meth:`matmul`."""
        parts = (b_ref,) if lo is None else (b_ref, lo)
        return self._matmul_transposed([a_ref], shape, lambda a_t: [(a_t[0], b) for b in parts])


def two_parts(x, dtype):
    """A float32 ``x`` as two operands of the input dtype, ``hi = x`` rounded and ``lo = x − hi`` rounded: the
    wgmmas of both into one accumulator multiply by ``x`` to about 2⁻¹⁶ of it, ``hi`` alone to 2⁻⁹ (bf16)."""
    hi = x.astype(dtype)
    return hi, (x - hi.astype(jnp.float32)).astype(dtype)


def _score_iotas(ops, C):
    """``(srow, scol)``: the query and the key of every element of a ``[C, C]`` score tile, in the WGMMA layout."""
    W = ops.mgpu.Layout.WGMMA
    return tuple(ops.cast(lax.broadcasted_iota(jnp.int32, (C, C), a), W) for a in (0, 1))


def causal(ops, x):
    """A ``[C, C]`` score tile ``x`` with 0 above the diagonal (keys after their query)."""
    srow, scol = _score_iotas(ops, x.shape[0])
    return jnp.where(srow >= scol, x, 0.0)


def triangle_ones(ops, C, dtype, upper=True):
    """``U [C, C]``, ones on and above the diagonal: ``U x`` sums ``x`` over the rows ``s ≥ t`` of a chunk; or, not
    ``upper``, ``L``, ones on and below it, which sums over ``s ≤ t``."""
    srow, scol = _score_iotas(ops, C)
    inside = scol >= srow if upper else scol <= srow
    return jnp.where(inside, ops.cast(jnp.ones((C, C), jnp.float32), ops.mgpu.Layout.WGMMA), 0.0).astype(dtype)


def per_key(b, K):
    """``(b, scalar)``: a scalar gate's ``b [B, H, T, 1]`` broadcast to the ``K`` key columns the kernels read
    (their tiles and TMA copies are ``[C, K]``; a 4-byte ``[C, 1]`` column is below TMA's 16-byte rows), or
    GLA's ``b`` as it is."""
    if b.shape[-1] == 1:
        return jnp.broadcast_to(b, b.shape[:-1] + (K,)), True
    return b, False


def gate_width(x, scalar):
    """A scalar gate's gradient terms from the kernels' per-key-column ones: their sum over the key columns
    (every column carries the same gate, so its gradient is the sum of theirs)."""
    return x.sum(-1, keepdims=True) if scalar else x
