"""Step 3 of the chunk GLA forward: the intra-chunk matrix A by secondary-level chunking (paper §4.3, Fig. 3).

Inside one chunk (query row i, key row j = 0..C−1; b = log Λ the chunk-local cumulative log-gate
(book/notation.md: Λ = exp b, Γ = exp(b_last − b), γ = exp b_last)),

    A[i, j] = scale · Σ_d q_id k_jd exp(b_id − b_jd)      for j ≤ i,   0 above the diagonal.

The chunk is cut into sub-chunks of c tokens. For a query sub-chunk [s] and an earlier key
sub-chunk [u], u < s, the exponent splits at ``b_p``, the first row p of sub-chunk [s]:

    A[i∈[s], j∈[u]] = (q_i ⊙ exp(b_i − b_p)) · (k_j ⊙ exp(b_p − b_j))    i ≥ p > j, exponents ≤ 0,

one c × c tensor-core matmul over K with half-precision operands (the orange tiles of Fig. 3); the
query factor is computed once and serves every [u]. Pairs inside sub-chunk [s] (the pink diagonal
tiles) have no split point; they are summed in float32 one key column j at a time, from j = p+c−1
down to p, with the decay matrix kept as a running product,

    E_j[i] = exp(b_i − b_j) = E_{j+1}[i] · exp(b_{j+1} − b_j)   (i > j),     E_j[j] = 1,

so a column costs K exps (of single log-gates, ≤ 0) instead of c·K, and the tile work is
multiplications: every factor is ≤ 1, nothing overflows, and a product of at most c − 1 rounded
factors stays within a few c ulps of exp(b_i − b_j) (or underflows where that is below float32).
(In the kernel's code, ``s`` is the loop's key column and ``j`` its column within the tile.)
That is the *exact form*. Where the sub-chunk's gates are gentle, every b_p − b_j ≤ SAFE_DECAY
(64 nats; the paper's gates decay about one nat per sub-chunk), the diagonal tile is the split tile
again with [u] = [s] and the causal mask applied after: the key factor exp(b_p − b_j) ≥ 1 is at
most e^64, so the *fast form* is one c × c matmul with float32 operands (a half operand could overflow
there; IEEE for float32 inputs, TF32 for 16-bit ones, whose 10-bit operands cost A no more than its own
rounding to the input dtype), and each product is still q_i k_j exp(b_i − b_j).
The program decides between the two on its own gates (:func:`_gates.gentle`, one branch, no sync).

Before any of that, the program checks its whole chunk: where every b_0 − b_j ≤ SAFE_DECAY (b_0 its
first row; b falls along the chunk, so its last row decides), all of A splits at b_0 at once,

    A = scale · ((Q ⊙ exp(b − b_0)) (K ⊙ exp(b_0 − b))ᵀ) ⊙ M,

one C × C matmul over K (in blocks of :data:`WHOLE_CHUNK_KEYS`) with float32 operands at the fast
form's precision: the *whole-chunk form*, taken by any chunk whose keys decay by at most 64 nats (the
paper's gates decay a few nats a chunk). Steeper chunks are built by sub-chunks as above.

Grid ``(⌈T/C⌉, B·H)``: a program owns one chunk's C × C tile of A (by sub-chunk strips: c × C rows of
one query sub-chunk at a time, its tiles left of the diagonal, the diagonal tile, zeros right of it),
with the whole K (≤ 256, padded to a power of two) in one block of the sub-chunk forms: every entry of
A is a sum over all K, and A does not involve V. HBM: the chunk's q, k and b rows read (the
sub-chunk forms read earlier key sub-chunks again, from L2), A written once in q's dtype with zeros
above the diagonal (its two readers, the output kernel and the backward's dv kernel, round it to that
dtype for their dots anyway, so a float32 A would only double its bytes and change no result). Packed
batch (``varlen``): grid ``(NT, H)`` over the NT chunks of all sequences, each program reading
its row of the chunk table and the two offsets of its sequence; rows past a sequence's end are
neither read nor written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref import specs
from gla_ref.triton.common.host import (
    autotune,
    autotune_configs,
    block,
    num_chunks,
    varlen_args,
)
from gla_ref.triton.common.gates import gentle
from gla_ref.triton.common.precision import dot_precision
from gla_ref.triton.common.tiles import load_rows, program_chunk, store_rows, token_base

SUB_CHUNK = specs.SUB_CHUNK
"""c: the sub-chunk size (tl.dot's smallest tile)."""

WHOLE_CHUNK_KEYS = specs.WHOLE_CHUNK_KEYS
"""Keys per step of the whole-chunk form's loop over K: two C × 64 float32 operand tiles at a time."""


def _configs():
    # 2 warps won up to K = 128, 4 warps and 3 stages at K = 256 (benchmarks/results/config_timings_nvidia_h200.json)
    return autotune_configs([triton.Config({}, num_warps=w, num_stages=s) for w, s in ((2, 2), (4, 3))])


@triton.jit
def _split_tile(k, b, b_qt, g_p, s0, T, o_c, o_k, m_k, HK: tl.constexpr, PREC: tl.constexpr):
    """A[i∈[s], j∈[u]] / scale for the key sub-chunk [u] starting at token s0 ≤ p: the split-at-b_p matmul,
    its operands in ``b_qt``'s dtype (float32 for the fast diagonal, s0 = p)."""
    s = s0 + o_c
    b_k = load_rows(k, s, s < T, o_k, m_k, HK)
    b_gk = load_rows(b, s, s < T, o_k, m_k, HK)
    b_kt = (b_k * tl.exp(g_p[None, :] - b_gk)).to(b_qt.dtype)
    return tl.dot(b_qt, tl.trans(b_kt), input_precision=PREC)


@triton.jit
def _diagonal_tile(k, b, b_q, p, T, o_c, o_k, m_k, HK: tl.constexpr, c: tl.constexpr):
    """D[r, j] = A[p+r, p+j] / scale (j ≤ r, else 0) in float32, the decay E by a running product."""
    b_D = tl.zeros([c, c], dtype=tl.float32)
    b_E = tl.zeros_like(b_q)                     # E[r] = exp(b_r − b_s) for rows r ≥ s, 0 above
    g_next = tl.load(b + tl.minimum(p + c - 1, T - 1) * HK + o_k, mask=m_k, other=0.0)
    for jj in tl.static_range(c):                # unrolled: the row loads can all go out early
        j = c - 1 - jj
        s = tl.minimum(p + j, T - 1)             # keys past T only meet rows past T, never stored
        b_ks = tl.load(k + s * HK + o_k, mask=m_k, other=0.0).to(tl.float32)
        g_s = tl.load(b + s * HK + o_k, mask=m_k, other=0.0)
        b_E = b_E * tl.exp(g_next - g_s)[None, :] + (o_c[:, None] == j).to(tl.float32)  # row s was 0
        b_a = tl.sum(b_q * b_E * b_ks[None, :], axis=1)
        b_D = tl.where((o_c[None, :] == j) & (o_c[:, None] >= j), b_a[:, None], b_D)
        g_next = g_s
    return b_D


@triton.jit
def _strip(q, k, b, p_A, scale, i_i, i_n, T, o_k, m_k, HK: tl.constexpr, HC: tl.constexpr, C: tl.constexpr,
           c: tl.constexpr, PREC: tl.constexpr):
    """The c × C row strip of A of query sub-chunk ``i_i``: split tiles left of the diagonal, the diagonal
    tile in its fast or exact form, zeros right of it. Rows past T are neither read nor written."""
    p = i_n * C + i_i * c                    # first token of query sub-chunk i_i
    if p < T:
        o_c, o_C = tl.arange(0, c), tl.arange(0, C)
        t = p + o_c
        m_t = t < T
        b_q = load_rows(q, t, m_t, o_k, m_k, HK).to(tl.float32)
        b_g = tl.load(b + tl.minimum(t, T - 1)[:, None] * HK + o_k[None, :], mask=m_k[None, :], other=0.0)
        g_p = tl.load(b + p * HK + o_k, mask=m_k, other=0.0)
        b_qt = b_q * tl.exp(b_g - g_p[None, :])         # rows past T repeat b row T−1
        b_qh = b_qt.to(k.dtype.element_ty)
        for j in range(i_i):
            b_a = _split_tile(k, b, b_qh, g_p, i_n * C + j * c, T, o_c, o_k, m_k, HK, PREC)
            store_rows(p_A, b_a * scale, t, m_t, j * c + o_c, o_c < c, HC)
        if gentle(b_g, g_p):                             # fast form: the split tile of [s] with itself
            b_D = _split_tile(k, b, b_qt, g_p, p, T, o_c, o_k, m_k, HK, PREC)
            b_D = tl.where(o_c[None, :] <= o_c[:, None], b_D, 0.0)
        else:
            b_D = _diagonal_tile(k, b, b_q, p, T, o_c, o_k, m_k, HK, c)
        store_rows(p_A, b_D * scale, t, m_t, i_i * c + o_c, o_c < c, HC)
        store_rows(p_A, tl.zeros([c, C], dtype=tl.float32), t, m_t, o_C, o_C >= i_i * c + c, HC)


@triton.jit
def _whole_chunk(q, k, b, p_A, scale, s0, T, K: tl.constexpr, HK: tl.constexpr, HC: tl.constexpr,
                 C: tl.constexpr, BKI: tl.constexpr, PREC: tl.constexpr):
    """The chunk's whole C × C tile of A as one matmul split at its first row s0, over K in blocks of BKI:
    ``((Q ⊙ exp(b − b_s0)) (K ⊙ exp(b_s0 − b))ᵀ ⊙ M)``, float32 operands (the key factor reaches e^64)."""
    o_C = tl.arange(0, C)
    t = s0 + o_C
    m_t = t < T
    t_c = tl.minimum(t, T - 1)
    b_A = tl.zeros([C, C], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BKI)):
        o_k = i_k * BKI + tl.arange(0, BKI)
        m_k = o_k < K
        b_g = tl.load(b + t_c[:, None] * HK + o_k[None, :], mask=m_k[None, :], other=0.0)
        g_0 = tl.load(b + s0 * HK + o_k, mask=m_k, other=0.0)
        b_qt = load_rows(q, t, m_t, o_k, m_k, HK).to(tl.float32) * tl.exp(b_g - g_0[None, :])
        b_kt = load_rows(k, t, m_t, o_k, m_k, HK).to(tl.float32) * tl.exp(g_0[None, :] - b_g)
        b_A += tl.dot(b_qt, tl.trans(b_kt), input_precision=PREC)
    b_A = tl.where(o_C[None, :] <= o_C[:, None], b_A * scale, 0.0)
    store_rows(p_A, b_A, t, m_t, o_C, o_C < C, HC)


@autotune(_configs(), ["K", "C", "IS_VARLEN"])
@triton.jit
def chunk_intra_kernel(q, k, b, A, cu_seqlens, chunk_indices, scale, T, H: tl.constexpr,
                       K: tl.constexpr, C: tl.constexpr, c: tl.constexpr, BK: tl.constexpr,
                       BKI: tl.constexpr, PREC: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    s0 = i_n * C                             # first token of the chunk
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    base = token_base(bos, i_h, H, K)
    q, k, b = q + base, k + base, b + base
    p_A = A + token_base(bos, i_h, H, C)
    g_0 = tl.load(b + s0 * (H * K) + o_k, mask=m_k, other=0.0)
    g_last = tl.load(b + tl.minimum(s0 + C - 1, T - 1) * (H * K) + o_k, mask=m_k, other=0.0)
    if gentle(g_last[None, :], g_0):                 # b falls along the chunk: its last row decays the most
        _whole_chunk(q, k, b, p_A, scale, s0, T, K, H * K, H * C, C, BKI, PREC)
    else:
        for i_i in range(C // c):
            _strip(q, k, b, p_A, scale, i_i, i_n, T, o_k, m_k, H * K, H * C, C, c, PREC)


def chunk_intra_attention(q, k, b, scale: float, chunk_size: int, varlen=None) -> torch.Tensor:
    """A ``[B, T, H, C]`` in q's dtype: row t holds A[t, ·] of its chunk (scale included); chunks of
    each packed sequence with ``varlen``."""
    B, T, H, K = q.shape
    A = torch.empty(B, T, H, chunk_size, dtype=q.dtype, device=q.device)
    grid = (num_chunks(T, chunk_size, varlen), B * H)
    chunk_intra_kernel[grid](q, k, b, A, scale=scale, T=T, H=H, K=K, C=chunk_size, c=min(SUB_CHUNK, chunk_size),
                             BK=block(K), BKI=min(block(K), WHOLE_CHUNK_KEYS), PREC=dot_precision(q),
                             **varlen_args(varlen))
    return A
