"""Device functions shared by the Triton kernels: where a program's tokens are, and tile loads.

Layouts: token tensors ``[B, T, H, D]`` (row stride ``H·D`` between tokens), chunk states
``[B, H, NT, K, V]``. Out-of-range rows and columns load as 0 and are never stored.

**Where a program's tokens are** (the one home of this rule). Every kernel addresses a sequence
through ``bos``, the row of its first token on the flattened ``B·T`` token axis, and its length
``T_n``; tokens are then counted from the sequence start (``t = 0 … T_n − 1``), chunks likewise,
so the rest of a kernel is the same for both layouts:

* fixed length (``IS_VARLEN`` off): sequence i is batch row i, ``bos = i·T``, ``T_n = T``;
* packed (``IS_VARLEN``, FLA's ``cu_seqlens``, B = 1): ``bos = cu_seqlens[i]``,
  ``T_n = cu_seqlens[i + 1] − bos``. Chunk-parallel programs find their chunk in the host-built
  table ``chunk_indices`` (:func:`gla_ref.triton.common.host.prepare_packed`): row p holds (sequence, chunk in
  that sequence) of chunk program p, so chunks never straddle two sequences.

``IS_VARLEN`` is a constexpr: the fixed-length kernels compile without any of the packed code.
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
def sequence_tokens(i_s, T, cu_seqlens, IS_VARLEN: tl.constexpr):
    """Sequence i_s on the token axis: ``(bos, T_n)``, the row of its first token in the flattened
    ``B·T`` axis (int64) and its length. Packed: two scalar loads of cu_seqlens."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_s).to(tl.int64)
        T_n = (tl.load(cu_seqlens + i_s + 1) - bos).to(tl.int32)
    else:
        bos = i_s.to(tl.int64) * T
        T_n = T
    return bos, T_n


@triton.jit
def program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN: tl.constexpr):
    """The chunk owned by program i_t of a chunk-parallel grid (batch row i_b): ``(i_n, bos, T_n)``,
    the chunk's index inside its sequence and the sequence's ``bos`` and length. Fixed length:
    chunk i_t of row i_b; packed: row i_t of ``chunk_indices`` (int32 ``[NT, 2]``)."""
    if IS_VARLEN:
        i_s = tl.load(chunk_indices + 2 * i_t)
        i_n = tl.load(chunk_indices + 2 * i_t + 1)
    else:
        i_s, i_n = i_b, i_t
    bos, T_n = sequence_tokens(i_s, T, cu_seqlens, IS_VARLEN)
    return i_n, bos, T_n


@triton.jit
def chunk_state_offset(i_bh, i_t, T, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                       IS_VARLEN: tl.constexpr):
    """Offset of the state entering chunk program i_t's chunk in ``h [B, H, NT, K, V]``: NT is
    ``⌈T/C⌉`` a row, or every chunk of the packed batch (the grid's axis 1) when packed."""
    if IS_VARLEN:
        NT = tl.num_programs(1)
    else:
        NT = tl.cdiv(T, C)
    return (i_bh.to(tl.int64) * NT + i_t) * K * V


@triton.jit
def sequence_chunks(i_s, i_h, T, cu_seqlens, chunk_offsets, H: tl.constexpr, C: tl.constexpr,
                    IS_VARLEN: tl.constexpr):
    """For a program that walks sequence i_s chunk by chunk (grid axis 2 = N·H): ``(bos, T_n,
    first)``, ``first`` being the row of its first chunk's state in h viewed as ``[B·H·NT, K, V]``.
    Packed: ``i_h · NT + chunk_offsets[i_s]``, NT = ``chunk_offsets[N]`` (int32 ``[N + 1]``)."""
    bos, T_n = sequence_tokens(i_s, T, cu_seqlens, IS_VARLEN)
    if IS_VARLEN:
        NT = tl.load(chunk_offsets + tl.num_programs(2) // H)
        first = i_h.to(tl.int64) * NT + tl.load(chunk_offsets + i_s)
    else:
        first = (i_s * H + i_h).to(tl.int64) * tl.cdiv(T, C)
    return bos, T_n, first


@triton.jit
def token_base(bos, i_h, H: tl.constexpr, D: tl.constexpr):
    """int64 offset of (token row bos, head i_h) in a ``[B, T, H, D]`` tensor."""
    return (bos * H + i_h) * D


@triton.jit
def token_bases(bos, i_h, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """int64 offsets of (token row bos, head i_h) in ``[B, T, H, K]`` and ``[B, T, H, V]``."""
    return token_base(bos, i_h, H, K), token_base(bos, i_h, H, V)


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
def load_causal_A(A, bos, i_h, t, m_t, o_t, H: tl.constexpr, C: tl.constexpr):
    """Chunk n's ``C × C`` tile of A ``[B, T, H, C]`` with the causal mask M applied (by tl.where)."""
    p_A = A + token_base(bos, i_h, H, C) + t[:, None] * (H * C) + o_t[None, :]
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


@triton.jit
def reverse_cumsum_dot(x, C: tl.constexpr):
    """Σ_{r' ≥ r} x[r'] over the C rows of a float32 tile, as one IEEE float32 matmul with the upper-triangular
    ones matrix U (``U_rs = 1`` for s ≥ r): every product is exact (1·x or 0·x), so only the order of the
    additions differs from :func:`reverse_cumsum`. Measured, not explained: in ``fused_chunk_gla``'s dk kernel,
    whose sequential chunk loop forms one per chunk, on the H200 (B = 8, H = 16, bf16, T = 4096, with
    :func:`synced` in place of ``tl.debug_barrier``) the kernel took 3.17 ms instead of 3.98 with the scan
    (4.32 before either change) at K × V = 128 × 256 and 13.3 instead of 16.0 (15.9) at 256 × 512
    (benchmarks/results/fused_dk_sync_nvidia_h200.json)."""
    o_c = tl.arange(0, C)
    U = tl.where(o_c[:, None] <= o_c[None, :], 1.0, 0.0)
    return tl.dot(U, x, input_precision="ieee")


@triton.jit
def synced(x, PTX: tl.constexpr):
    """``x`` (float32) itself, passed on only once every thread of the program has reached this point.

    A program that reads a buffer and then overwrites it with a value computed from what every thread read
    (a sum over rows, say) needs every read done before any write: Triton gives no such order between the
    threads of a program for global memory. ``tl.debug_barrier`` gives it, but Triton 3.6 then no longer
    software-pipelines the loop around it (the dk kernel of ``fused_chunk_gla`` took the same time with one
    stage as with three). With ``PTX`` this is a ``bar.sync`` of the whole block in inline PTX, once per
    element a thread holds (every thread holds as many): the PTX barrier orders every memory access a
    thread made before it ahead of those any thread makes after it, x depends on the values read, and what
    is written depends on the value returned here, so the compiler can move neither across it. Without
    ``PTX`` (Triton's CPU interpreter, which runs a program as one thread, or another GPU) it is
    ``tl.debug_barrier``."""
    if PTX:
        return tl.inline_asm_elementwise("bar.sync 0;\n\tmov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=False, pack=1)
    else:
        tl.debug_barrier()
        return x
