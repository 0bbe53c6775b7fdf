"""The forms a chunk's scores and gradients take in the per-chunk kernels, and the choice among them.

Why the chunk math is not called directly: :mod:`gla_ref.pallas.chunk_math` builds a chunk from 16-row
sub-chunk values and ``dot_general``; on Mosaic GPU every matmul is a ``wgmma`` on SMEM tiles with at least
64 rows, and a register array has a fixed layout. So the kernels write the same formulas over the whole
chunk, in one of three forms:

* the *whole-chunk form* (per-key gates where every key of every chunk decays by at most
  :data:`SAFE_DECAY` from the chunk's first row, :func:`whole_chunk_gates`; the paper's gates): the
  chunk's scores split at its first row ``b_0``, ``A = mask((Q ⊙ e^{b − b_0}) (K ⊙ e^{b_0 − b})ᵀ)``, one
  wgmma accumulation over the chunk, its operands formed :data:`WHOLE_CHUNK_KEYS` key columns at a time
  (:func:`key_blocks`), as the Triton kernels' ``gla_ref.triton.chunk.intra`` does;
* the *sub-chunk forms* (:class:`ChunkTile`): the off-diagonal ``16 × 16`` tiles from one masked wgmma per
  reference row ``r_I`` (the masks select exactly the tiles ``J < I`` that
  :func:`chunk_math.intra_scores` builds one by one), every exponent ≤ 0, masked with ``where`` before
  ``exp``. The diagonal tiles are formed ``exact``: float32 loops over keys, whose results agree with the
  Triton-backend launcher's to float32 rounding; or, where every 16-token decay is at most
  :data:`SAFE_DECAY` (:func:`gentle_gates`), in the *fast form*: the same masked wgmma with the key
  operand also taking sub-chunk I's own tokens (exponents up to SAFE_DECAY there), one bf16 rounding more.
  On the H200 the exact form's output kernel took 7.5 times as long as the fast form's at K=128 and 11
  times at K=64;
* scalar gates (``Kg = 1``): ``b`` is broadcast to the ``K`` key columns the tiles have (``common.per_key``),
  and the chunk's scores are ``(Q Kᵀ) ⊙ D`` with the ``[C, C]`` decay matrix ``D = e^{b_i − b_j}``
  (:meth:`ChunkTile.decay`): one wgmma over the whole chunk.

The forms of a per-key gate are all compiled and chosen on the device by ``lax.cond`` (:func:`by_forms`,
:func:`by_gates`; no sync); the fused kernels keep the two sub-chunk forms.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from gla_ref.reference.gates import SAFE_DECAY
from gla_ref.pallas import compat
from gla_ref.pallas.launchers.mosaic_gpu.common import CHUNK_SIZE, Ops, transforms

WHOLE_CHUNK_KEYS = 64
"""``BK``: key columns per step of the whole-chunk form (as :data:`gla_ref.triton.chunk.intra.WHOLE_CHUNK_KEYS`):
its ``q, k, b`` and state tiles are held as ``K / BK`` SMEM blocks of ``[C, BK]`` (a 128-byte swizzled
bfloat16 row), so that only ``[C, BK]`` float32 arrays are live in registers and every wgmma of the
contraction over ``K`` reads whole blocks (no SMEM slicing inside a swizzled tile)."""


def whole_chunk_dims(d, interpret):
    """What both whole-chunk kernels start from: ``(ops, mgpu, WGMMA layout, C, K, BV, BK, nk)``, with the key
    block ``BK`` = :data:`WHOLE_CHUNK_KEYS` and ``nk = K / BK`` blocks."""
    ops = Ops(interpret)
    return ops, ops.mgpu, ops.mgpu.Layout.WGMMA, d.C, d.K, d.BV, WHOLE_CHUNK_KEYS, d.K // WHOLE_CHUNK_KEYS


def key_blocks(nk, rows, BK, dtype):
    """SMEM of a ``[rows, K]`` tile as ``nk`` swizzled key blocks ``[rows, BK]`` (``BK = 64``), each a wgmma operand."""
    return compat.mosaic_gpu().SMEM((nk, rows, BK), dtype, transforms=transforms(dtype, BK))


def whole_chunk_inputs(nk, C, BK, dtype):
    """The first SMEM of both whole-chunk kernels: the chunk's q, k and b as key blocks, and b_0, its first row."""
    f32 = jnp.float32
    return [key_blocks(nk, C, BK, dtype), key_blocks(nk, C, BK, dtype), key_blocks(nk, C, BK, f32),
            compat.mosaic_gpu().SMEM((nk, BK), f32)]


class ChunkTile:
    """Register-level helpers of the per-chunk kernels: one chunk ``[C, K]`` in the ``WGMMA`` layout.

    ``scalar``: the gate is one number per token (``b``'s columns are equal, ``common.per_key``), so the
    chunk's decay is the ``[C, C]`` matrix ``D`` of :meth:`decay` and its scores ``(Q Kᵀ) ⊙ D`` are one wgmma
    of the SMEM tiles ``q_s, k_s`` (bf16) for the whole chunk: no sub-chunks, no loop over keys.

    ``exact``: how the diagonal ``16 × 16`` tiles of a per-key gate are formed. True: one key at a time in
    float32 (every exponent ≤ 0, any valid gate). False (the fast form, :func:`gentle_gates`): inside the
    masked wgmma of their sub-chunk I, whose key operand then also takes I's own tokens, scaled by
    ``e^{r_I − b_j} ≥ 1``, at most ``e^{SAFE_DECAY}`` (the causal mask drops ``j > i`` afterwards)."""

    def __init__(self, ops, C, K, dtype, q_s, k_s, b_s, scalar=False, exact=True, hold=False):
        self.ops, self.C, self.K, self.dtype = ops, C, K, dtype
        self.q_s, self.k_s, self.b_s, self.scalar, self.exact = q_s, k_s, b_s, scalar, exact
        self.held = None
        if hold:
            self.held = {name: getattr(self, name) for name in ("q", "k", "b")}
        W = ops.mgpu.Layout.WGMMA
        self.row = ops.cast(lax.broadcasted_iota(jnp.int32, (C, K), 0), W)  # token of each element
        self.col = ops.cast(lax.broadcasted_iota(jnp.int32, (C, K), 1), W)  # key column of each element
        self.srow = ops.cast(lax.broadcasted_iota(jnp.int32, (C, C), 0), W)  # query of a score
        self.scol = ops.cast(lax.broadcasted_iota(jnp.int32, (C, C), 1), W)  # key of a score

    # q, k, b as float32 [C, K] arrays. Three are 192 registers a thread at K = 128 (a warpgroup thread has
    # 255), so by default each use reads them from their SMEM tiles again; ``hold`` loads them once and
    # keeps them. Measured on the H200 (B=8, H=16, T=4096, K=V=128): the output kernel 5.8 ms held,
    # 4.8 ms re-read; the gradient kernel 27.5 ms held, 31.0 ms re-read (so the gradients hold them).
    def _load(self, name):
        if self.held is not None:
            return self.held[name]
        x = self.ops.load(getattr(self, name + "_s"), self.ops.mgpu.Layout.WGMMA)
        return x if name == "b" else x.astype(jnp.float32)

    q = property(lambda self: self._load("q"))
    k = property(lambda self: self._load("k"))
    b = property(lambda self: self._load("b"))

    def rows(self, x):
        """A ``[K]`` row broadcast to every token, ``[C, K]``."""
        return lax.broadcast_in_dim(x, (self.C, self.K), [1])

    def pick(self, x, j):
        """Row ``j`` of ``x [C, K]`` as ``[K]``, by a one-hot sum (exact)."""
        return jnp.sum(jnp.where(self.row == j, x, 0.0), axis=0)

    def sub_chunks(self):
        """The sub-chunks I whose masked wgmma runs: those with keys before them (I ≥ 1), and in the
        fast form also the first, whose only tile is its diagonal one."""
        return range(1 if self.exact else 0, self.C // 16)

    def key_end(self, I):
        """The first key outside sub-chunk I's wgmma: ``16 I`` (tiles J < I), or in the fast form
        ``16 I + 16`` (its diagonal tile too)."""
        return 16 * I + (0 if self.exact else 16)

    def masks(self, I):
        """Tokens of sub-chunk I (the queries of its wgmma), and the keys of its wgmma (:meth:`key_end`)."""
        return (self.row >= 16 * I) & (self.row < 16 * I + 16), self.row < self.key_end(I)

    def same_tile(self, j):
        """Tokens ``i ≥ j`` in key ``j``'s sub-chunk (the rows of its diagonal tile)."""
        return (self.row >= j) & (self.row < (j // 16) * 16 + 16)

    def ref_operands(self, I, r):
        """``Q_I ⊙ e^{b − r_I}`` (rows of sub-chunk I, else 0) and ``K ⊙ e^{r_I − b}`` (the keys of
        :meth:`masks`, else 0), float32: the operands of the tiles ``A_IJ``; exponents ≤ 0, except
        ``r_I − b_j`` for I's own keys in the fast form (at most SAFE_DECAY)."""
        mine, before = self.masks(I)
        return (jnp.where(mine, self.q * jnp.exp(jnp.where(mine, self.b - r, 0.0)), 0.0),
                jnp.where(before, self.k * jnp.exp(jnp.where(before, r - self.b, 0.0)), 0.0))

    def ref_rows(self, r_s=None):
        """``I ↦ r_I [K]``, the first row of sub-chunk I: loaded from ``r_s`` (row I, copied by TMA), or
        picked out of ``b``'s registers (exact) where no such copy was made."""
        if r_s is None:
            return lambda I: self.pick(self.b, 16 * I)
        return lambda I: self.ops.load(r_s.at[I], self.ops.mgpu.Layout.WGMMA.reduce(0))

    def decay(self):
        """Scalar gates: ``D[i, j] = e^{b_i − b_j}`` for ``i ≥ j``, else 0 (float32 ``[C, C]``; exponents ≤ 0),
        from ``b [C, K]`` (equal columns): its first column gives ``b_i`` down the rows, and the diagonal of
        that column broadcast gives ``b_j`` along them (one-hot sums, exact; no transpose of a register array)."""
        C = self.C
        b_i = jnp.sum(jnp.where(self.col == 0, self.b, 0.0), axis=1)
        square = lax.broadcast_in_dim(b_i, (C, C), [0])
        b_j = jnp.sum(jnp.where(self.srow == self.scol, square, 0.0), axis=0)
        causal = self.srow >= self.scol
        return jnp.where(causal, jnp.exp(jnp.where(causal, square - lax.broadcast_in_dim(b_j, (C, C), [1]), 0.0)), 0.0)

    def scores(self, ref_row, x_s, y_s):
        """The chunk's causal scores without the scale, float32 ``[C, C]``: one masked wgmma per reference row
        (``ref_row``, :meth:`ref_rows`) for the tiles of :meth:`masks`, then the diagonal tiles one key column
        at a time (``exact``) or the causal mask (the fast form, whose wgmmas made them); for a scalar gate
        ``(Q Kᵀ) ⊙ D``, one wgmma."""
        ops, mgpu, C = self.ops, self.ops.mgpu, self.C
        if self.scalar:
            return ops.matmul_nt(self.q_s, self.k_s, (C, C)) * self.decay()
        A = ops.cast(jnp.zeros((C, C), jnp.float32), mgpu.Layout.WGMMA)
        for I in self.sub_chunks():
            xq, xk = self.ref_operands(I, self.rows(ref_row(I)))
            x_s[...] = xq.astype(self.dtype)
            y_s[...] = xk.astype(self.dtype)
            mgpu.commit_smem()
            A = A + ops.matmul_nt(x_s, y_s, (C, C))
        if not self.exact:
            return jnp.where(self.srow >= self.scol, A, 0.0)
        return self.diagonal_scores(A)

    def diagonal_scores(self, A):
        """``A`` plus the diagonal tiles ``Σ_d q_id k_jd e^{b_id − b_jd}`` (``i ≥ j``), one key column at a time
        in float32 (the exact form)."""
        C = self.C

        def column(j, A):
            same = self.same_tile(j)
            b = self.b
            e = jnp.exp(jnp.where(same, b - self.rows(self.pick(b, j)), 0.0))
            a = jnp.sum(jnp.where(same, self.q * self.rows(self.pick(self.k, j)) * e, 0.0), axis=1)
            return A + jnp.where(self.scol == j, lax.broadcast_in_dim(a, (C, C), [0]), 0.0)  # a is 0 off j's tile

        return lax.fori_loop(0, C, column, A)


def whole_chunk_gates(b, chunk_size=CHUNK_SIZE):
    """True (a traced boolean, no sync) when in every chunk of ``chunk_size`` tokens of the chunk-local gates
    ``b [B, H, T, K]`` every key column decays by at most :data:`SAFE_DECAY` from the chunk's first row to its
    last (``b`` falls along a chunk, so the last row decides for all of them): the per-chunk kernels'
    whole-chunk forms (in :mod:`~gla_ref.pallas.launchers.mosaic_gpu.output` and
    :mod:`~gla_ref.pallas.launchers.mosaic_gpu.gradients`) then hold every exponent. NaN gates are not (a
    comparison with NaN is False)."""
    return _spans_decay_safely(b, chunk_size)


def _spans_decay_safely(b, span):
    """Whether every run of ``span`` tokens of ``b [B, H, T, K]`` (T a multiple of ``span``) decays by at most
    :data:`SAFE_DECAY` from its first row to its last, in every key column (False where either is NaN)."""
    B, H, T, K = b.shape
    runs = b.reshape(B, H, T // span, span, K)
    return jnp.all(runs[:, :, :, 0] - runs[:, :, :, span - 1] <= SAFE_DECAY)


def gentle_gates(b):
    """True (a traced boolean, no sync) when every 16-token sub-chunk of the chunk-local gates ``b [B, H, T, K]``
    decays by at most :data:`SAFE_DECAY`: the kernels then form the diagonal tiles in their wgmmas (the fast
    form); otherwise, and for NaN gates, one key at a time in float32 (``exact``), correct for any gate."""
    return _spans_decay_safely(b, 16)


def by_gates(b, scalar, call, exact=None):
    """``call(exact)``: the form a caller named (``exact`` True or False), or for ``None`` and a per-key gate's
    ``b`` the fast form where :func:`gentle_gates`, the exact one elsewhere, chosen on the device by
    ``lax.cond`` (both compiled); scalar gates have one form."""
    if scalar:
        return call(True)
    if exact is not None:
        return call(exact)
    return lax.cond(gentle_gates(b), lambda: call(False), lambda: call(True))


def by_forms(b, scalar, chunk_size, call, exact=None, whole_chunk=None):
    """``call(exact, whole)`` for the per-chunk kernels of the non-fused path: the whole-chunk form where
    :func:`whole_chunk_gates`, else the sub-chunk forms by :func:`by_gates`, chosen on the device by
    ``lax.cond`` (all compiled, no sync). Forced: ``whole_chunk=True`` (the whole-chunk form, whatever the
    gates: only for gates that satisfy :func:`whole_chunk_gates`), or ``exact`` True or False (that sub-chunk
    form); ``whole_chunk=False`` with ``exact=None``: the sub-chunk forms by :func:`gentle_gates`. Scalar
    gates have one form."""
    if scalar or whole_chunk is False or (whole_chunk is None and exact is not None):
        return by_gates(b, scalar, lambda exact: call(exact, False), exact)
    if whole_chunk:
        return call(False, True)
    return lax.cond(whole_chunk_gates(b, chunk_size), lambda: call(False, True),
                    lambda: by_gates(b, scalar, lambda exact: call(exact, False)))
