"""Device functions shared by the chunk kernels (chunk GLA and chunk simple GLA).

Layouts: token tensors ``[B, T, H, D]`` (row stride ``H·D`` between tokens), states
``[B·H, NT, K, V]``. Out-of-range rows and columns load as 0 and are never stored.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_tokens(i_n, T, C: tl.constexpr):
    """Chunk n's rows: offsets o_t in the chunk, tokens t, and the mask t < T."""
    o_t = tl.arange(0, C)
    t = i_n * C + o_t
    m_t = t < T
    return o_t, t, m_t


@triton.jit
def block_range(i, BD: tl.constexpr, D: tl.constexpr):
    """Indices of block i of size BD along a dimension of size D, and their mask."""
    o = i * BD + tl.arange(0, BD)
    return o, o < D


@triton.jit
def token_bases(i_b, i_h, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """int64 offsets of token 0 of (batch i_b, head i_h) in ``[B, T, H, K]`` and ``[B, T, H, V]``."""
    base_k = (i_b.to(tl.int64) * T * H + i_h) * K
    base_v = (i_b.to(tl.int64) * T * H + i_h) * V
    return base_k, base_v


@triton.jit
def load_rows(ptr, rows, m_rows, cols, m_cols, stride):
    """The tile ``ptr[rows · stride + cols]``, zeros outside the row and column masks."""
    return tl.load(ptr + rows[:, None] * stride + cols[None, :], mask=m_rows[:, None] & m_cols[None, :], other=0.0)


@triton.jit
def store_rows(ptr, x, rows, m_rows, cols, m_cols, stride):
    """Stores ``x`` (cast to ``ptr``'s type) at ``ptr[rows · stride + cols]`` inside the masks."""
    tl.store(ptr + rows[:, None] * stride + cols[None, :], x.to(ptr.dtype.element_ty),
             mask=m_rows[:, None] & m_cols[None, :])


@triton.jit
def load_causal_A(A, i_b, i_h, t, m_t, o_t, T, H: tl.constexpr, C: tl.constexpr):
    """Chunk n's ``C × C`` tile of A ``[B, T, H, C]`` with the causal mask M applied (by tl.where)."""
    p_A = A + (i_b.to(tl.int64) * T * H + i_h) * C + t[:, None] * (H * C) + o_t[None, :]
    b_A = tl.load(p_A, mask=m_t[:, None], other=0.0)
    return tl.where(o_t[:, None] >= o_t[None, :], b_A, 0.0)


@triton.jit
def inter_chunk_dqk(v, do, h, dh, base_v, p_state, t, m_t, o_k, m_k, H: tl.constexpr, V: tl.constexpr,
                    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                    WITH_DA: tl.constexpr):
    """The V loop of the dq/dk/dg kernels: dO S_nᵀ and V dS_{n+1}ᵀ (before their gate factors),
    Σ_v S_n ⊙ dS_{n+1} per key (for the chunk-decay gradient dγ), and with ``WITH_DA`` dA = dO Vᵀ
    (unmasked) from the same tiles (zeros otherwise)."""
    b_dA = tl.zeros([C, C], dtype=tl.float32)
    b_dq = tl.zeros([C, BK], dtype=tl.float32)
    b_dk = tl.zeros([C, BK], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        p_tv = base_v + t[:, None] * (H * V) + o_v[None, :]
        b_v = tl.load(v + p_tv, mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_do = tl.load(do + p_tv, mask=m_t[:, None] & m_v[None, :], other=0.0)
        p_kv = p_state + o_k[:, None] * V + o_v[None, :]
        b_h = tl.load(h + p_kv, mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_dh = tl.load(dh + p_kv, mask=m_k[:, None] & m_v[None, :], other=0.0)
        if WITH_DA:
            b_dA += tl.dot(b_do, tl.trans(b_v), input_precision=PREC)
        b_dq += tl.dot(b_do, tl.trans(b_h.to(b_do.dtype)), input_precision=PREC)
        b_dk += tl.dot(b_v, tl.trans(b_dh.to(b_v.dtype)), input_precision=PREC)
        b_hdh += tl.sum(b_h * b_dh, axis=1)
    return b_dA, b_dq, b_dk, b_hdh


@triton.jit
def reverse_cumsum(x):
    """Σ_{r' ≥ r} x[r'] along axis 0 (inside one chunk), as total − inclusive cumsum + x."""
    return tl.sum(x, axis=0) - tl.cumsum(x, axis=0) + x
