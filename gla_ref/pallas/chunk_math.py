"""The chunk math shared by every Pallas launcher: pure ``jnp`` functions on blocks.

One chunk of ``C`` tokens of one head arrives as lists of ``n = C / c`` sub-chunks of ``c`` rows
(the launcher loads them from its refs): ``q[I], k[I]`` are ``[c, K]`` in the input dtype,
``v[I], do[I]`` are ``[c, BV]`` (a block of value columns), ``b[I]`` is the chunk-local
cumulative log-gate ``b_t = g_{start} + … + g_t`` in float32, ``[c, K]`` for GLA or ``[c, 1]``
for a scalar gate. States are held transposed, ``Sᵀ`` as ``[BV, K]`` float32, so that the
per-key decay ``e^{b_C}`` (a ``[1, K]`` row) scales columns and no value needs a transpose.

Notation (paper §4.2, with logs): ``b_C`` is the last row (decay over the whole chunk),
``r_I`` the first row of sub-chunk I. Every exponent below is ≤ 0 because ``b`` never increases:

* inter-chunk:       ``O += scale (Q ⊙ e^{b}) S``,   ``S' = e^{b_C}ᵀ ⊙ S + (K ⊙ e^{b_C − b})ᵀ V``
* off-diagonal tile: ``A_IJ = scale (Q_I ⊙ e^{b_I − r_I}) (K_J ⊙ e^{r_I − b_J})ᵀ``  (J < I, a matmul)
* diagonal tile:     ``A_II[i, j] = scale Σ_d q_id k_jd e^{b_id − b_jd}`` for i ≥ j, in float32.

Only operations that both Pallas backends lower are used: elementwise math, ``where``,
``iota``, sums along an axis, 2-D matmuls and loops. No value is sliced (Triton has no slicing
of register tensors): a row is picked out with a one-hot sum, which is exact.
Matmul operands take the input dtype (bf16 tensor cores, fp32 accumulation); fp32 operands use
full fp32 precision.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from gla_ref import specs

F32 = jnp.float32
SUB = specs.PALLAS_SUB_CHUNK
"""Sub-chunk length ``c``: the tile of the two-level intra-chunk scores (16 = Triton's smallest dot)."""


# ---------------------------------------------------------------- small portable helpers

def _dot(a, b, contract):
    precision = lax.Precision.HIGHEST if a.dtype == F32 else lax.Precision.DEFAULT
    return lax.dot_general(a, b, (contract, ((), ())), precision=precision, preferred_element_type=F32)


def mm(a, b):
    """``a @ b`` with float32 accumulation."""
    return _dot(a, b, ((1,), (0,)))


def mm_nt(a, b):
    """``a @ bᵀ``."""
    return _dot(a, b, ((1,), (1,)))


def mm_tn(a, b):
    """``aᵀ @ b``."""
    return _dot(a, b, ((0,), (0,)))


def _iota(shape, axis):
    return lax.broadcasted_iota(jnp.int32, shape, axis)


def row(x, i):
    """Row ``i`` of ``x`` as ``[1, D]`` (float32), by a one-hot sum: exact, no slicing."""
    x = x.astype(F32)
    return jnp.sum(jnp.where(_iota(x.shape, 0) == i, x, 0.0), axis=0, keepdims=True)


def col(x, j):
    """Column ``j`` of ``x`` as ``[R, 1]`` (float32)."""
    x = x.astype(F32)
    return jnp.sum(jnp.where(_iota(x.shape, 1) == j, x, 0.0), axis=1, keepdims=True)


def as_row(c):
    """A ``[D, 1]`` column as a ``[1, D]`` row (its diagonal embedding summed), without a transpose."""
    D = c.shape[0]
    square = jnp.broadcast_to(c, (D, D))
    return jnp.sum(jnp.where(_iota((D, D), 0) == _iota((D, D), 1), square, 0.0), axis=0, keepdims=True)


def _causal(c):
    return _iota((c, c), 0) >= _iota((c, c), 1)


def chunk_end(b):
    """``b_C``: the cumulative log-gate at the chunk's last row, ``[1, K]``."""
    last = b[-1]
    return row(last, last.shape[0] - 1)


def _lowp(x, like):
    return x.astype(like.dtype)


# ---------------------------------------------------------------- intra-chunk scores

def _decay_tile(b):
    """Scalar gates only: ``D[i, j] = e^{b_i − b_j}`` for i ≥ j (else 0), ``[c, c]``."""
    mask = _causal(b.shape[0])
    return jnp.where(mask, jnp.exp(jnp.where(mask, b - as_row(b), 0.0)), 0.0)


def _diag_scores(q, k, b, scale):
    """The diagonal tile ``A_II`` (float32, zero above the diagonal)."""
    c = q.shape[0]
    if b.shape[1] == 1:  # scalar gate: the decay factorises into a [c, c] matrix
        return scale * mm_nt(q, k) * _decay_tile(b)
    qf, kf = q.astype(F32), k.astype(F32)
    rows, cols = _iota((c, 1), 0), _iota((c, c), 1)

    def column(j, A):  # column j: Σ_d q_id k_jd e^{b_id − b_jd} for rows i ≥ j
        e = jnp.exp(jnp.where(rows >= j, b - row(b, j), 0.0))
        a = jnp.sum(qf * row(kf, j) * e, axis=1, keepdims=True)
        return jnp.where((cols == j) & (rows >= j), a, A)

    return scale * lax.fori_loop(0, c, column, jnp.zeros((c, c), F32))


def intra_scores(q, k, b, scale):
    """``A[I][J]`` for J ≤ I: the chunk's causal scores as a lower triangle of ``[c, c]`` tiles."""
    A = []
    for I in range(len(q)):
        r = row(b[I], 0)
        q_ref = _lowp(q[I] * jnp.exp(b[I] - r), q[I])  # exponent ≤ 0: rows of I are after r
        tiles = [scale * mm_nt(q_ref, _lowp(k[J] * jnp.exp(r - b[J]), k[J]))  # ≤ 0: J is before r
                 for J in range(I)]
        A.append(tiles + [_diag_scores(q[I], k[I], b[I], scale)])
    return A


# ---------------------------------------------------------------- forward

def chunk_output(q, v, b, St, A, scale):
    """``O_I = scale (Q_I ⊙ e^{b_I}) S + Σ_{J ≤ I} A_IJ V_J`` for each sub-chunk, float32."""
    out = []
    for I in range(len(q)):
        o = scale * mm_nt(_lowp(q[I] * jnp.exp(b[I]), q[I]), _lowp(St, q[I]))
        for J in range(I + 1):
            o = o + mm(_lowp(A[I][J], v[J]), v[J])
        out.append(o)
    return out


def state_update(k, v, b, St):
    """The state leaving the chunk: ``S' = e^{b_C}ᵀ ⊙ S + Σ_J (K_J ⊙ e^{b_C − b_J})ᵀ V_J`` (as ``S'ᵀ``)."""
    bC = chunk_end(b)
    St = St * jnp.exp(bC)
    for kJ, vJ, bJ in zip(k, v, b):
        St = St + mm_tn(vJ, _lowp(kJ * jnp.exp(bC - bJ), kJ))
    return St


# ---------------------------------------------------------------- backward

def state_grad_update(q, b, do, dSt, scale):
    """Gradient w.r.t. the state entering the chunk from the one leaving it (transposed, like states):
    ``dS_in = e^{b_C}ᵀ ⊙ dS_out + scale Σ_I (Q_I ⊙ e^{b_I})ᵀ dO_I``."""
    dSt = dSt * jnp.exp(chunk_end(b))
    for qI, bI, doI in zip(q, b, do):
        dSt = dSt + scale * mm_tn(doI, _lowp(qI * jnp.exp(bI), doI))
    return dSt


def _masked_grad_scores(doI, vI):
    return jnp.where(_causal(doI.shape[0]), mm_nt(doI, vI), 0.0)


def _loop_keys(x, b, body):
    """``fori_loop`` over the keys ``j`` of one diagonal tile, starting from zeros shaped like ``x``:
    ``acc = body(j, acc, x (float32), rows, e)`` with ``e_i = e^{b_i − b_j}`` for rows i ≥ j (else 1)."""
    c, xf = x.shape[0], x.astype(F32)
    rows = _iota((c, 1), 0)

    def step(j, acc):
        return body(j, acc, xf, rows, jnp.exp(jnp.where(rows >= j, b - row(b, j), 0.0)))

    return lax.fori_loop(0, c, step, jnp.zeros(x.shape, F32))


def _diag_dq(dA, k, b, scale):
    """``dq_i = scale Σ_{j ≤ i} dA_ij k_j ⊙ e^{b_i − b_j}`` inside one diagonal tile."""
    if b.shape[1] == 1:
        return scale * mm(_lowp(dA * _decay_tile(b), k), k)

    def add_key(j, dq, kf, rows, e):
        return dq + col(dA, j) * row(kf, j) * e  # col(dA, j) is 0 above the diagonal

    return scale * _loop_keys(k, b, add_key)


def _diag_dk(dA, q, b, scale):
    """``dk_j = scale Σ_{i ≥ j} dA_ij q_i ⊙ e^{b_i − b_j}`` inside one diagonal tile."""
    if b.shape[1] == 1:
        return scale * mm_tn(_lowp(dA * _decay_tile(b), q), q)

    def key_row(j, dk, qf, rows, e):
        dkj = jnp.sum(col(dA, j) * qf * e, axis=0, keepdims=True)
        return jnp.where(rows == j, dkj, dk)

    return scale * _loop_keys(q, b, key_row)


def chunk_dq(q, k, v, b, do, St, scale):
    """``dQ`` of one chunk (float32) given the state ``S`` entering it (as ``Sᵀ``):
    ``dQ_I = scale (dO_I Sᵀ) ⊙ e^{b_I} + (intra-chunk part through dA = dO Vᵀ)``."""
    out = []
    for I in range(len(q)):
        dq = scale * mm(do[I], _lowp(St, do[I])) * jnp.exp(b[I])
        r = row(b[I], 0)
        for J in range(I):
            k_ref = _lowp(k[J] * jnp.exp(r - b[J]), k[J])
            dq = dq + scale * mm(_lowp(mm_nt(do[I], v[J]), k_ref), k_ref) * jnp.exp(b[I] - r)
        out.append(dq + _diag_dq(_masked_grad_scores(do[I], v[I]), k[I], b[I], scale))
    return out


def _reverse_rows(x):
    """``Σ_{s ≥ t} x_s`` down the rows of one sub-chunk ``x [c, D]`` (float32): for ``D = 1`` by a masked
    sum (a matmul needs 16 columns on Triton), else a full-precision matmul by a triangle of ones."""
    c = x.shape[0]
    upper = _iota((c, c), 1) >= _iota((c, c), 0)
    if x.shape[1] == 1:
        return jnp.sum(jnp.where(upper, as_row(x), 0.0), axis=1, keepdims=True)
    return mm(upper.astype(F32), x)


def chunk_gate_grad(q, k, dq, dk, b, dgamma):
    """Gate gradient of one chunk (float32, per sub-chunk, width ``Kg`` of ``b``), chunk-local (§4.3):

    ``dg_t = Σ_{s ≥ t in the chunk} (q_s ⊙ dq_s − k_s ⊙ dk_s) + dγ``, where ``dγ`` (``[1, Kg]``) is the
    gradient of the chunk's total log-decay ``b_C`` through the state it carries on (see
    :func:`chunk_dkv`). Equal in exact arithmetic to the reverse cumulative sum over the whole
    sequence, but nothing is summed across chunks: the sequence-wide sum adds up every later
    chunk's rounding errors of ``q ⊙ dq − k ⊙ dk``, whose exact chunk totals largely cancel.
    Linear in ``dq, dk, dγ``, so value blocks may each give a partial.
    """
    running, out = dgamma, [None] * len(q)
    for I in reversed(range(len(q))):
        x = q[I].astype(F32) * dq[I] - k[I].astype(F32) * dk[I]
        if b[I].shape[1] == 1:  # a scalar gate scales every key column alike
            x = jnp.sum(x, axis=1, keepdims=True)
        out[I] = _reverse_rows(x) + running
        running = running + jnp.sum(x, axis=0, keepdims=True)
    return out


def _width(x, b):
    """``x [1, K]`` summed to ``[1, 1]`` for a scalar gate (it scales every key column alike)."""
    return jnp.sum(x, axis=1, keepdims=True) if b[0].shape[1] == 1 else x


def state_in_term(q, b, do, St, scale):
    """``Σ_v S_in ⊙ G`` (``[1, Kg]``) with ``G = scale Σ_I (Q_I ⊙ e^{b_I})ᵀ dO_I``, the chunk's own term of
    :func:`state_grad_update`, for the fused backward's forward loop (it holds ``S_in``).

    With ``c`` of :func:`state_out_term`, ``a − c = F_in − F_out`` where ``F = Σ_v S ⊙ dS`` at the chunk's
    two boundaries (``S_out = e^{b_C} S_in + U``, ``dS_in = e^{b_C} dS_out + G``), so the sums of ``a − c``
    over later chunks give each chunk's ``dγ = F_out`` of :func:`chunk_gate_grad` to float32 accuracy
    without a state and its gradient ever meeting in one kernel."""
    G = sum(scale * mm_tn(doI, _lowp(qI * jnp.exp(bI), doI)) for qI, bI, doI in zip(q, b, do))
    return _width(jnp.sum(St * G, axis=0, keepdims=True), b)


def state_out_term(k, v, b, dSt):
    """``c = Σ_v dS_out ⊙ U`` (``[1, Kg]``) with ``U = Σ_J (K_J ⊙ e^{b_C − b_J})ᵀ V_J``, the chunk's own term
    of :func:`state_update`, for the fused backward's reverse loop (it holds ``dS_out``).

    The fused gate gradient takes ``dγ = F_out − c + κ``, ``κ`` the keys' share of :func:`chunk_dkv`
    (``key_term=True``): ``F_out − c = e^{b_C} ⊙ Σ_v S_in ⊙ dS_out`` exactly, and ``κ``, which equals ``c``
    but for rounding, is rounded as the chunk's ``k ⊙ dk`` terms are (``dS`` a bf16 operand), so the two
    cancel as in the non-fused kernel."""
    bC = chunk_end(b)
    U = sum(mm_tn(vJ, _lowp(kJ * jnp.exp(bC - bJ), kJ)) for kJ, vJ, bJ in zip(k, v, b))
    return _width(jnp.sum(dSt * U, axis=0, keepdims=True), b)


def chunk_dkv(q, k, v, b, do, dSt, A, scale, St=None, key_term=False):
    """``dK, dV`` of one chunk (float32) given ``dS``, the gradient of the state leaving it (as ``dSᵀ``):
    ``dK_J = (V_J dSᵀ) ⊙ e^{b_C − b_J} + intra``, ``dV_J = (K_J ⊙ e^{b_C − b_J}) dS + Σ_{I ≥ J} A_IJᵀ dO_I``.

    Given ``St``, the state entering the chunk (as ``Sᵀ``), also returns ``dγ [1, Kg]``, the gradient
    of the chunk's total log-decay ``b_C`` where it enters explicitly: through ``e^{b_C} S`` and the
    keys' ``e^{b_C − b_J}``, ``dγ = e^{b_C} ⊙ Σ_v S ⊙ dS + Σ_J Σ_rows K_J ⊙ (V_J dSᵀ) ⊙ e^{b_C − b_J}``
    (for :func:`chunk_gate_grad`). With ``key_term`` and no ``St``, returns the second sum alone, the
    keys' share ``κ`` (the fused backward, which has no ``S``; see :func:`state_out_term`)."""
    bC = chunk_end(b)
    dk_out, dv_out = [], []
    dgamma = jnp.zeros((1, k[0].shape[1]), F32) if key_term else None
    if St is not None:
        dgamma = jnp.exp(bC) * jnp.sum(St * dSt, axis=0, keepdims=True)
    for J in range(len(k)):
        decay = jnp.exp(bC - b[J])
        dk = mm(v[J], _lowp(dSt, v[J])) * decay
        if dgamma is not None:
            dgamma = dgamma + jnp.sum(k[J].astype(F32) * dk, axis=0, keepdims=True)
        dv = mm_nt(_lowp(k[J] * decay, k[J]), _lowp(dSt, k[J]))
        for I in range(J + 1, len(q)):
            r = row(b[I], 0)
            q_ref = _lowp(q[I] * jnp.exp(b[I] - r), q[I])
            dk = dk + scale * mm_tn(_lowp(mm_nt(do[I], v[J]), q_ref), q_ref) * jnp.exp(r - b[J])
            dv = dv + mm_tn(_lowp(A[I][J], do[I]), do[I])
        dk = dk + _diag_dk(_masked_grad_scores(do[J], v[J]), q[J], b[J], scale)
        dv = dv + mm_tn(_lowp(A[J][J], do[J]), do[J])
        dk_out.append(dk)
        dv_out.append(dv)
    if dgamma is None:
        return dk_out, dv_out
    if b[0].shape[1] == 1:
        dgamma = jnp.sum(dgamma, axis=1, keepdims=True)
    return dk_out, dv_out, dgamma
