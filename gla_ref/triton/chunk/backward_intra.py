"""The intra-chunk part of the chunk GLA dq and dk, by secondary-level chunking (paper §4.3, Fig. 3).

Step 6 of the chunk GLA backward (numbered as in :mod:`chunk`). Inside one chunk, with dA = scale · (dO
Vᵀ) ⊙ M from :func:`chunk_backward.chunk_bwd_dA` (step 5) and b = log Λ the chunk-local cumulative
log-gate (book/notation.md: Λ = exp b, Γ = exp(b_last − b), γ = exp b_last), the intra-chunk gradients
are (query row i, key row j)

    dq_i = Σ_{j ≤ i} dA[i, j] · k_j ⊙ exp(b_i − b_j),
    dk_j = Σ_{i ≥ j} dA[i, j] · q_i ⊙ exp(b_i − b_j).

The chunk is cut into sub-chunks of c tokens. For a query sub-chunk [s] and an earlier key sub-chunk
[u] the exponent splits at b_f, f the first row of [s] (both factors ≤ 0):

    dQ_[s] += (dA_[s][u] (K_[u] ⊙ exp(b_f − b_[u]))) ⊙ exp(b_[s] − b_f),

one c × c by c × BK tensor-core matmul per [u]; dk of a key sub-chunk from a later query sub-chunk
splits at b_e, e the last row of the key sub-chunk. The diagonal c × c tile of each sub-chunk has no
split point: it runs in float32, one column j at a time, with the decays kept as running products
(as the forward's :func:`chunk_intra._diagonal_tile` does): the dq side walks its columns down,
E_j = E_{j+1} · exp(b_{j+1} − b_j), the dk side walks its rows up, F_j = F_{j−1} · exp(b_j − b_{j−1}),
every factor ≤ 1, so the tile costs 2·c·BK exponentials instead of c²·BK (the *exact form*). Where
the sub-chunk's gates are gentle (every b_f − b_j ≤ SAFE_DECAY, as in the forward's fast form) the
diagonal tile splits at b_f too, with float32 operands (:func:`precision.fast_grad_dot_precision`):
dQ_[s] += (dA_[s][s] (K_[s] ⊙ exp(b_f − b_[s]))) ⊙ exp(b_[s] − b_f), and dK_[s] the same with dA
transposed, Q and the two factors swapped; the key factor is at most e^64, and dA is masked above
the diagonal first. The program picks the form from its own gates (one branch, no sync). (In the code,
``i_i`` is a sub-chunk of the program's chunk.)

Before any of that, the program checks its whole chunk's ``C × BK`` gate block: where every
b_0 − b_j ≤ SAFE_DECAY (b_0 its first row), every pair splits at b_0 at once (the *whole-chunk
form*, as in the forward's :mod:`chunk_intra`): dQ = (dA (K ⊙ exp(b_0 − b))) ⊙ exp(b − b_0) and
dK = (dAᵀ (Q ⊙ exp(b − b_0))) ⊙ exp(b_0 − b), two C × C by C × BK matmuls at the fast form's
precision, dA masked above the diagonal first. Steeper chunks go sub-chunk by sub-chunk as above.

Grid ``(⌈K/BK⌉, ⌈T/C⌉, B·H)``: a program owns one chunk and one key block, i.e. the ``C × BK``
tiles of dq and dk (by sub-chunks of c rows in the sub-chunk forms). HBM: the chunk's dA rows and
q, k, b of its ``C × BK`` block read (the sub-chunk forms read other sub-chunks' rows again, from
L2); dq, dk written once in float32 for the inter-chunk kernel to add to. Packed batch (``varlen``):
grid ``(⌈K/BK⌉, NT, H)`` over the NT chunks of all sequences, a program reading its row of the chunk
table and its sequence's two offsets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.specs import SUB_CHUNK
from gla_ref.triton.common.host import (
    autotune,
    autotune_configs,
    block,
    cdiv,
    num_chunks,
    varlen_args,
)
from gla_ref.triton.common.gates import gentle
from gla_ref.triton.common.precision import dot_precision, fast_grad_dot_precision
from gla_ref.triton.common.tiles import (
    block_range,
    load_rows,
    program_chunk,
    store_rows,
    token_base,
)


def _configs():
    # UNROLL: how far the diagonal loop is unrolled (more independent loads in flight, more registers).
    # Kept: the configs within 1.16x of the best at every measured head shape (benchmarks/results/config_timings_nvidia_h200.json, H200)
    # with 4 warps; UNROLL = 16 was never better and took the longest to compile. 2 warps, close before the
    # whole-chunk form, take 5x as long as 4 warps with it (0.83 against 4.2 ms at K = V = 128 on the H200).
    return autotune_configs([triton.Config({"UNROLL": u}, num_warps=4, num_stages=2) for u in (1, 4)])


@triton.jit
def _gate_rows(p_g, t, T, o_k, m_k, HK: tl.constexpr):
    """b at tokens ``t`` (a tile; rows past T repeat the last real row, so exponents stay ≤ 0)."""
    return tl.load(p_g + tl.minimum(t, T - 1)[:, None] * HK + o_k[None, :], mask=m_k[None, :], other=0.0)


@triton.jit
def _dq_earlier(k, b, dA, base_k, base_A, t, m_t, b_g, g_f, i_n, i_i, T, o_k, m_k, H: tl.constexpr,
                K: tl.constexpr, C: tl.constexpr, c: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """dq of sub-chunk i from the key sub-chunks j < i, split at b_f (``g_f``, the gates of f: first row of i)."""
    o_c = tl.arange(0, c)
    b_dq = tl.zeros([c, BK], dtype=tl.float32)
    for j in range(i_i):
        t_j = i_n * C + j * c + o_c
        b_kj = load_rows(k + base_k, t_j, t_j < T, o_k, m_k, H * K)
        b_kt = b_kj * tl.exp(g_f[None, :] - _gate_rows(b + base_k, t_j, T, o_k, m_k, H * K))
        b_dA = tl.load(dA + base_A + t[:, None] * (H * C) + (j * c + o_c)[None, :], mask=m_t[:, None], other=0.0)
        b_dq += tl.dot(b_dA.to(b_kj.dtype), b_kt.to(b_kj.dtype), input_precision=PREC)
    return b_dq * tl.exp(b_g - g_f[None, :])


@triton.jit
def _dk_later(q, b, dA, base_k, base_A, r, b_g, i_n, i_i, T, o_k, m_k, H: tl.constexpr,
              K: tl.constexpr, C: tl.constexpr, c: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """dk of sub-chunk i from the query sub-chunks j > i, split at b_e (e: last real row of i)."""
    o_c = tl.arange(0, c)
    g_e = tl.load(b + base_k + (tl.minimum(i_n * C + i_i * c + c, T) - 1) * (H * K) + o_k, mask=m_k, other=0.0)
    b_dk = tl.zeros([c, BK], dtype=tl.float32)
    for j in range(i_i + 1, C // c):
        t_j = i_n * C + j * c + o_c
        m_j = t_j < T
        b_qj = load_rows(q + base_k, t_j, m_j, o_k, m_k, H * K)
        b_qt = b_qj * tl.exp(_gate_rows(b + base_k, t_j, T, o_k, m_k, H * K) - g_e[None, :])
        # dA_jiᵀ: element [s, p] = dA[p, s], s in sub-chunk i, p in j
        b_dAt = tl.load(dA + base_A + t_j[None, :] * (H * C) + r[:, None], mask=m_j[None, :], other=0.0)
        b_dk += tl.dot(b_dAt.to(b_qj.dtype), b_qt.to(b_qj.dtype), input_precision=PREC)
    return b_dk * tl.exp(g_e[None, :] - b_g)


@triton.jit
def _split_by_dot(q, k, dA, b_g, g_f, base_k, base_A, t, m_t, j0, o_k, m_k, H: tl.constexpr, K: tl.constexpr,
                  C: tl.constexpr, n: tl.constexpr, PREC: tl.constexpr):
    """The fast form of the rows ``t`` against the n keys from column j0 of their chunk, those rows themselves
    (``n × n`` block of dA, masked causal): every pair split at the first row f (gates ``g_f``), two
    n × n by n × BK matmuls with float32 operands, the key-side factor e^{b_f − b} ≤ e^SAFE_DECAY.
    Returns the contributions to dq and dk of those rows."""
    o_n = tl.arange(0, n)
    b_dA = tl.load(dA + base_A + t[:, None] * (H * C) + (j0 + o_n)[None, :], mask=m_t[:, None],
                   other=0.0)                # 0 for rows past T
    b_dA = tl.where(o_n[None, :] <= o_n[:, None], b_dA, 0.0)  # and above the diagonal (the exact form reads none)
    b_q = load_rows(q + base_k, t, m_t, o_k, m_k, H * K).to(tl.float32)
    b_k = load_rows(k + base_k, t, m_t, o_k, m_k, H * K).to(tl.float32)
    b_up = tl.exp(b_g - g_f[None, :])        # ≤ 1
    b_down = tl.exp(g_f[None, :] - b_g)      # ≥ 1, ≤ e^SAFE_DECAY
    return (tl.dot(b_dA, b_k * b_down, input_precision=PREC) * b_up,
            tl.dot(tl.trans(b_dA), b_q * b_up, input_precision=PREC) * b_down)


@triton.jit
def _diagonal_tile(q, k, b, dA, b_dq, b_dk, base_k, base_A, t, m_t, i_n, i_i, T, o_k, m_k,
                   H: tl.constexpr, K: tl.constexpr, C: tl.constexpr, c: tl.constexpr, BK: tl.constexpr,
                   UNROLL: tl.constexpr):
    """Adds the diagonal tile in float32, the decays kept as running products (every factor ≤ 1):

    dq_r += Σ_{j ≤ r} dA[r, j] k_j ⊙ E_j[r],  E_j[r] = exp(b_r − b_j) = E_{j+1}[r] · exp(b_{j+1} − b_j),
    dk_r += Σ_{j ≥ r} dA[j, r] q_j ⊙ F_j[r],  F_j[r] = exp(b_j − b_r) = F_{j−1}[r] · exp(b_j − b_{j−1}),

    with E_j[j] = F_j[j] = 1 and rows outside r ≥ j (E) or r ≤ j (F) zero. One loop of c steps walks
    the dq columns down (j = c−1 … 0) and the dk rows up (j = 0 … c−1) together. A step costs 2·BK
    exponentials (one b difference per side: 2·c·BK for the tile, where exponentiating every
    difference b_r − b_j costs c²·BK), two ``c × BK`` tile updates and two accumulations, and loads
    the rows it consumes: k_j and b_j for the dq side, q_j and b_j for the dk side (contiguous
    BK-wide rows: the b rows were just loaded as the tile ``b_g``, the k and q rows are read only
    here; picking a row out of a register tile instead would cost a masked ``c × BK`` reduction).
    The program's ``c × c`` block of dA is loaded once, as a tile; its column (dq side) and row
    (dk side) are picked out by masked ``c × c`` reductions, c² ≪ c·BK."""
    o_c = tl.arange(0, c)
    p = i_n * C + i_i * c                    # the tile's first token
    b_dA = tl.load(dA + base_A + t[:, None] * (H * C) + (i_i * c + o_c)[None, :], mask=m_t[:, None],
                   other=0.0)                # dA[p + r, p + j]; rows past T are 0
    b_E = tl.zeros([c, BK], dtype=tl.float32)
    b_F = tl.zeros([c, BK], dtype=tl.float32)
    g_hi = tl.load(b + base_k + (tl.minimum(p + c, T) - 1) * (H * K) + o_k, mask=m_k, other=0.0)
    g_lo = tl.load(b + base_k + tl.minimum(p, T - 1) * (H * K) + o_k, mask=m_k, other=0.0)  # meet zero tiles
    for jj in tl.range(c, loop_unroll_factor=UNROLL):
        # dq side, column jd walking down (rows past T: b repeats row T − 1, k is 0)
        jd = c - 1 - jj
        t_d = p + jd
        p_d = base_k + tl.minimum(t_d, T - 1) * (H * K) + o_k
        g_d = tl.load(b + p_d, mask=m_k, other=0.0)
        b_kd = tl.load(k + p_d, mask=m_k & (t_d + 0 * o_k < T), other=0.0).to(tl.float32)
        b_E = b_E * tl.exp(g_hi - g_d)[None, :] + (o_c[:, None] == jd).to(tl.float32)
        dA_col = tl.sum(tl.where(o_c[None, :] == jd, b_dA, 0.0), axis=1)      # dA[p + r, p + jd]
        b_dq += dA_col[:, None] * b_E * b_kd[None, :]
        g_hi = g_d
        # dk side, row ju walking up
        ju = jj
        t_u = p + ju
        p_u = base_k + tl.minimum(t_u, T - 1) * (H * K) + o_k
        g_u = tl.load(b + p_u, mask=m_k, other=0.0)
        b_qu = tl.load(q + p_u, mask=m_k & (t_u + 0 * o_k < T), other=0.0).to(tl.float32)
        b_F = b_F * tl.exp(g_u - g_lo)[None, :] + (o_c[:, None] == ju).to(tl.float32)
        dA_row = tl.sum(tl.where(o_c[:, None] == ju, b_dA, 0.0), axis=0)      # dA[p + ju, p + r]
        b_dk += dA_row[:, None] * b_F * b_qu[None, :]
        g_lo = g_u
    return b_dq, b_dk


@triton.jit
def _sub_chunk(q, k, b, dA, dq, dk, base_k, base_A, i_n, i_i, T, o_k, m_k, H: tl.constexpr, K: tl.constexpr,
               C: tl.constexpr, c: tl.constexpr, BK: tl.constexpr, UNROLL: tl.constexpr, PREC: tl.constexpr,
               FPREC: tl.constexpr):
    """dq, dk of sub-chunk ``i_i``'s ``c × BK`` tile: split tiles against the other sub-chunks, the diagonal
    tile in its fast or exact form; stored in float32."""
    r = i_i * c + tl.arange(0, c)            # this sub-chunk's rows, inside the chunk
    t = i_n * C + r
    m_t = t < T
    b_g = _gate_rows(b + base_k, t, T, o_k, m_k, H * K)
    g_f = tl.load(b + base_k + tl.minimum(i_n * C + i_i * c, T - 1) * (H * K) + o_k, mask=m_k, other=0.0)
    b_dq = _dq_earlier(k, b, dA, base_k, base_A, t, m_t, b_g, g_f, i_n, i_i, T, o_k, m_k, H, K, C, c, BK, PREC)
    b_dk = _dk_later(q, b, dA, base_k, base_A, r, b_g, i_n, i_i, T, o_k, m_k, H, K, C, c, BK, PREC)
    if gentle(b_g, g_f):                     # the diagonal tile in the fast form
        d_q, d_k = _split_by_dot(q, k, dA, b_g, g_f, base_k, base_A, t, m_t, i_i * c, o_k, m_k, H, K, C, c, FPREC)
        b_dq += d_q
        b_dk += d_k
    else:
        b_dq, b_dk = _diagonal_tile(q, k, b, dA, b_dq, b_dk, base_k, base_A, t, m_t, i_n, i_i, T,
                                    o_k, m_k, H, K, C, c, BK, UNROLL)
    store_rows(dq + base_k, b_dq, t, m_t, o_k, m_k, H * K)
    store_rows(dk + base_k, b_dk, t, m_t, o_k, m_k, H * K)


@autotune(_configs(), ["K", "C", "IS_VARLEN"])
@triton.jit
def chunk_bwd_intra_kernel(q, k, b, dA, dq, dk, cu_seqlens, chunk_indices, T, H: tl.constexpr,
                           K: tl.constexpr, C: tl.constexpr, c: tl.constexpr, BK: tl.constexpr,
                           UNROLL: tl.constexpr, PREC: tl.constexpr, FPREC: tl.constexpr,
                           IS_VARLEN: tl.constexpr):
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    o_k, m_k = block_range(i_k, BK, K)
    base_k = token_base(bos, i_h, H, K)
    base_A = token_base(bos, i_h, H, C)
    t = i_n * C + tl.arange(0, C)
    m_t = t < T
    b_g = _gate_rows(b + base_k, t, T, o_k, m_k, H * K)
    g_0 = tl.load(b + base_k + i_n * C * (H * K) + o_k, mask=m_k, other=0.0)
    if gentle(b_g, g_0):                     # the whole chunk's tile in two matmuls
        b_dq, b_dk = _split_by_dot(q, k, dA, b_g, g_0, base_k, base_A, t, m_t, 0, o_k, m_k, H, K, C, C, FPREC)
        store_rows(dq + base_k, b_dq, t, m_t, o_k, m_k, H * K)
        store_rows(dk + base_k, b_dk, t, m_t, o_k, m_k, H * K)
    else:
        for i_i in range(C // c):
            if i_n * C + i_i * c < T:
                _sub_chunk(q, k, b, dA, dq, dk, base_k, base_A, i_n, i_i, T, o_k, m_k, H, K, C, c, BK, UNROLL,
                           PREC, FPREC)


def chunk_bwd_dqk_intra(q, k, b, dA, chunk_size: int, varlen=None):
    """The intra-chunk dq, dk ``[B, T, H, K]`` in float32, from dA ``[B, T, H, C]`` (scale and mask
    included); chunks of each packed sequence with ``varlen``."""
    B, T, H, K = q.shape
    c = min(SUB_CHUNK, chunk_size)
    BK = min(64, block(K))
    dq = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
    dk = torch.empty_like(dq)
    grid = (cdiv(K, BK), num_chunks(T, chunk_size, varlen), B * H)
    chunk_bwd_intra_kernel[grid](q, k, b, dA, dq, dk, T=T, H=H, K=K,
                                 C=chunk_size, c=c, BK=BK, PREC=dot_precision(q),
                                 FPREC=fast_grad_dot_precision(q), **varlen_args(varlen))
    return dq, dk
