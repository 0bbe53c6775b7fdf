"""Fused chunk GLA, backward: states recomputed on chip, never stored (paper Alg. 6).

Every gradient is a sum over one dimension of the state: dq and dk over the values, dv over the
keys. A program holding that whole dimension finishes its tile and writes it once, in the
gradient's dtype, so no per-block float32 partial is allocated while V ≤ 256 (K ≤ 256 always).
Hence three kernels, with ``dP = dO Vᵀ`` (i ≥ j) and b, b_C as in the forward:

1. :func:`_bwd_dq_kernel`, grid ``(⌈K/BK⌉, B·H, ⌈V/256⌉)``, the whole V up to 256 values: a forward
   sweep rebuilds the state S entering each chunk and writes

       dq_i = scale · [ (dO Sᵀ)_i ⊙ exp b_i  +  Σ_{j ≤ i} dP_ij k_j ⊙ exp(b_i − b_j) ];

2. :func:`_bwd_dk_kernel`, same grid: a reverse sweep carries dS, the gradient of the state leaving
   the chunk, from the final-state cotangent back to ``dh0 = dS_0``:

       dk_j = scale · Σ_{i ≥ j} dP_ij q_i ⊙ exp(b_i − b_j)  +  (V dSᵀ)_j ⊙ exp(b_C − b_j)
       dS  ← diag(exp b_C) dS  +  scale · (Q ⊙ exp b)ᵀ dO

   and the gate gradient. With ``B_t = Σ_{s ≤ t} g_s`` every term of o and of S_T depends on B
   through ``exp(+B_t)`` next to q_t or ``exp(−B_t)`` next to k_t, except S_T's own ``exp(B_T)``:

       dB_t = q_t ⊙ dq_t − k_t ⊙ dk_t  (+ Σ_v S_T ⊙ dS_T at t = T),   dg_t = Σ_{s ≥ t} dB_s,

   a reverse cumulative sum inside the chunk (one matmul with the upper-triangular ones,
   :func:`~gla_ref.triton.common.tiles.reverse_cumsum_dot`) plus a running total of the later chunks. That
   total is restarted every :data:`RESTART` tokens from ``Σ_v S ⊙ dS`` at that boundary (chapter 6's
   identity: the later tokens reach the gates before it only through the state there), with S parked
   by kernel 1. Without the restarts the TF32 errors of the large, nearly cancelling q ⊙ dq and
   k ⊙ dk add up over every later token: in bf16 dg drifted from float64 as T grew (relative RMSE
   5.7e-3 at T = 4096, 1.0e-2 at 16384 on an H200; ``benchmarks/fused_dg_error_model.py`` models it);

3. :func:`_bwd_dv_kernel`, grid ``(⌈V/BV⌉, B·H)``, the whole K: the same reverse sweep of dS for
   its value columns, and ``dV = Pᵀ dO + (K ⊙ exp(b_C − b)) dS``, where dS enters the matmul in the input
   dtype, as S enters the forward's (:func:`~gla_ref.triton.fused_chunk.forward.state_dot`); kernels 1
   and 2 keep float32 operands, for dg.

V above 256 (:data:`~gla_ref.triton.fused_chunk.forward.WHOLE_V`) is cut into slices of 256 values on
the third grid axis of kernels 1 and 2, so their state tiles stay ``BK × 256``. Every term of dq, dk
and dB (the final-state term ``Σ_v S_T ⊙ dS_T`` included) is a sum over values, so each slice's
program writes float32 partials of dq, dk and dg (``[⌈V/256⌉, B, T, H, K]`` each, the same
in-place q ⊙ dq hand-over per slice) and the launcher adds them up; dv and dh0 stay complete per
program. HBM traffic of kernels 1 and 2 then reads q, k, g once per slice and writes the partials.

The dg and dv outputs double as the only intermediates: kernel 1 stores ``q ⊙ dq`` in dg (from the
float32 dq, before dq is rounded to its dtype; in g's dtype, float32 for float32 gates) and kernel 2
reads it back and overwrites it with dg, after a block-wide barrier that lets every thread finish
reading first (:func:`~gla_ref.triton.common.tiles.synced`, a PTX ``bar.sync`` that, unlike
``tl.debug_barrier``, leaves the chunk loop pipelined). Kernel 1 also parks its state tile at every
RESTART-th token in dv's buffer (:func:`park_state`: K rows of float32, 2K rows of a 16-bit dv, at
the start of the RESTART tokens it closes), which kernel 2 reads and kernel 3 then overwrites with
dv. The backward allocates dq, dk, dv, dg and dh0 and, for V ≤ 256, nothing else.

The intra-chunk sums (dq's over j ≤ i, dk's over i ≥ j, and dv's P) have the forward's two forms,
picked per program and chunk by :func:`~gla_ref.triton.fused_chunk.forward.gentle_chunk` (for kernels 1
and 2 on the gates of their own keys). The exact form runs one key j (dq) or one query i (dk, P) at a
time, that token's rows taken from the chunk's tiles in registers, so every exponent is ≤ 0. Where the
chunk decays by at most SAFE_DECAY (64 nats) from its start, the fast form splits every exponent
there, one matmul each with float32 operands and the mask M first:

    dQ = ((dP ⊙ M) (K ⊙ exp(−b))) ⊙ exp b,     dK = ((dP ⊙ M)ᵀ (Q ⊙ exp b)) ⊙ exp(−b)

and P as in the forward; ``exp(−b) ≤ e^64`` fits float32, and each product is still a term
``dP_ij k_j exp(b_i − b_j)`` (or with q_i) of the exact sums, so they are as accurate as any matmul.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton.common.host import autotune
from gla_ref.triton.common.launch_cache import cache_launches
from gla_ref.triton.common.precision import fast_grad_dot_precision
from gla_ref.triton.common.tiles import reverse_cumsum_dot, sequence_tokens, synced, token_bases
from gla_ref.triton.fused_chunk.forward import (
    causal,
    chunk_gates,
    col,
    configs,
    decay_from,
    decay_to,
    dot,
    fast_scores,
    gentle_chunk,
    launch_meta,
    load_state,
    load_tile,
    row,
    state_block,
    state_dot,
    state_step,
    store_tile,
)


@triton.jit
def query_decays(b_q, b, i, C: tl.constexpr):
    """Query i of the chunk against its keys j: ``q_i ⊙ exp(b_i − b_j)`` for j ≤ i, 0 for j > i
    (``[C, BK]``), from the chunk's (scaled) query tile and its gates b."""
    return row(b_q, i, C)[None, :] * decay_to(b, row(b, i, C), i, C)


@triton.jit
def fast_dq(dP, b_k, b, C: tl.constexpr, PREC: tl.constexpr):
    """``Σ_{j ≤ i} dP_ij k_j ⊙ exp(b_i − b_j)`` in the fast form, from dP [query i, key j]:
    ``((dP ⊙ M) (K ⊙ exp(−b))) ⊙ exp b``."""
    return tl.dot(causal(dP, C), b_k * tl.exp(-b), input_precision=PREC) * tl.exp(b)


@triton.jit
def fast_dk(dPT, b_q, b, C: tl.constexpr, PREC: tl.constexpr):
    """``Σ_{i ≥ j} dP_ij q_i ⊙ exp(b_i − b_j)`` in the fast form, from ``dPᵀ`` [key j, query i]:
    ``((dP ⊙ M)ᵀ (Q ⊙ exp b)) ⊙ exp(−b)``."""
    o_c = tl.arange(0, C)
    dPT = tl.where(o_c[:, None] <= o_c[None, :], dPT, 0.0)  # (dP ⊙ M)ᵀ: j ≤ i
    return tl.dot(dPT, b_q * tl.exp(b), input_precision=PREC) * tl.exp(-b)


@triton.jit
def state_grad_step(dS, b_q, b, b_last, b_do, scale, PREC: tl.constexpr):
    """The state gradient one chunk earlier: ``diag(exp b_C) dS + scale · (Q ⊙ exp b)ᵀ dO``."""
    return dS * tl.exp(b_last)[:, None] + dot(tl.trans(b_q * scale * tl.exp(b)), b_do, tl.float32, PREC)


RESTART = 1024
"""Tokens between the restarts of dg's running sum (a multiple of every chunk size). The dq kernel parks its
state there in dv's buffer: 2K rows of a 16-bit dv (K rows of a float32 one) of each such block of tokens."""


@triton.jit
def parked_blocks(T, C: tl.constexpr, RESTART: tl.constexpr):
    """The chunk loop as blocks of RESTART tokens: the chunk count, the chunks per block and the block count.
    The state leaving every block but the last is parked (dq kernel) and restarts dg's running sum (dk kernel);
    an inner loop over a block's chunks keeps that step out of the pipelined loop."""
    NT = tl.cdiv(T, C)
    PER: tl.constexpr = RESTART // C
    return NT, PER, tl.cdiv(NT, PER)


@triton.jit
def closes_early(blk, T, RESTART: tl.constexpr):
    """Whether block ``blk`` of RESTART tokens ends before T: its state is parked (dq kernel) and restarts dg's
    running sum (dk kernel). One test for both kernels, so they agree on every block."""
    return (blk + 1) * RESTART < T


@triton.jit
def reverse_tiles(q, k, g, rows, o_k, T, H: tl.constexpr, K: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                  USE_G: tl.constexpr):
    """What both reverse sweeps (dk and dv kernels) read of the chunk of ``rows`` over the keys ``o_k``: its
    gates b and b_C, and its q and k tiles (float32)."""
    b, b_last = chunk_gates(g, rows, o_k, T, K, H * K, C, BK, USE_G)
    return b, b_last, load_tile(q, rows, o_k, T, K, H * K), load_tile(k, rows, o_k, T, K, H * K)


@triton.jit
def parked(dv, row0, o_k, o_v, K: tl.constexpr, HV: tl.constexpr, V: tl.constexpr):
    """Pointers and mask of a parked state tile: key ``o_k`` at row ``row0 + o_k`` of dv's ``[T, H, V]`` slab."""
    return dv + (row0 + o_k.to(tl.int64))[:, None] * HV + o_v[None, :], (o_k < K)[:, None] & (o_v < V)[None, :]


@triton.jit
def park_state(dv, S, row0, o_k, o_v, K: tl.constexpr, V: tl.constexpr, HV: tl.constexpr, HALVES: tl.constexpr):
    """Write this program's float32 state tile into dv's buffer, which the dv kernel fills only later: as it is
    in a float32 dv; in a 16-bit dv as the high and the low halves of its bits, rows ``row0 + key`` and
    ``row0 + K + key``."""
    ptr, mask = parked(dv, row0, o_k, o_v, K, HV, V)
    if HALVES:
        bits = S.to(tl.uint32, bitcast=True)
        tl.store(ptr, (bits >> 16).to(tl.uint16).to(dv.dtype.element_ty, bitcast=True), mask=mask)
        tl.store(ptr + K * HV, (bits & 0xFFFF).to(tl.uint16).to(dv.dtype.element_ty, bitcast=True), mask=mask)
    else:
        tl.store(ptr, S, mask=mask)


@triton.jit
def parked_state(dv, row0, o_k, o_v, K: tl.constexpr, V: tl.constexpr, HV: tl.constexpr, HALVES: tl.constexpr):
    """The state tile :func:`park_state` wrote, bit for bit."""
    ptr, mask = parked(dv, row0, o_k, o_v, K, HV, V)
    if HALVES:
        hi = tl.load(ptr, mask=mask, other=0.0).to(tl.uint16, bitcast=True).to(tl.uint32)
        lo = tl.load(ptr + K * HV, mask=mask, other=0.0).to(tl.uint16, bitcast=True).to(tl.uint32)
        return ((hi << 16) | lo).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)


@autotune(configs(), ["BK", "BV", "C", "IS_VARLEN"])
@triton.jit
def _bwd_dq_kernel(q, k, v, g, do, dq, dg, dv, h0, cu_seqlens, scale, part_stride, T,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, FPREC: tl.constexpr,
                   USE_G: tl.constexpr, USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr,
                   RESTART: tl.constexpr, HALVES: tl.constexpr):
    i_k, i_bh, i_v = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    DT = k.dtype.element_ty
    o_c = tl.arange(0, C)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)  # this program's slice of values: every value when V ≤ 256
    part = i_v.to(tl.int64) * part_stride  # its float32 partials of dq and dg when V is sliced
    bos, T = sequence_tokens(i_b, T, cu_seqlens, IS_VARLEN)
    base_k, base_v = token_bases(bos, i_h, H, K, V)
    q, k, dq, v, do, dv = q + base_k, k + base_k, dq + part + base_k, v + base_v, do + base_v, dv + base_v
    if USE_G:
        g += base_k
        dg += part + base_k
    S = load_state(h0, i_bh, o_k, o_v, K, V, BK, BV, USE_H0)
    NT, PER, NB = parked_blocks(T, C, RESTART)
    for blk in range(NB):
        for n in range(blk * PER, tl.minimum(NT, blk * PER + PER)):
            rows = (n * C + o_c).to(tl.int64)
            b, b_last = chunk_gates(g, rows, o_k, T, K, H * K, C, BK, USE_G)
            b_k = load_tile(k, rows, o_k, T, K, H * K)
            b_v = load_tile(v, rows, o_v, T, V, H * V)
            b_do = load_tile(do, rows, o_v, T, V, H * V)
            dP = dot(b_do, tl.trans(b_v), DT, PREC)
            b_dq = dot(b_do, tl.trans(S), tl.float32, PREC) * tl.exp(b)
            if gentle_chunk(b_last):
                b_dq += fast_dq(dP, b_k, b, C, FPREC)
            else:  # the exact form
                for j in range(C):  # key j reaches the queries i ≥ j with decay exp(b_i − b_j)
                    b_dq += col(dP, j, C)[:, None] * row(b_k, j, C)[None, :] * decay_from(b, row(b, j, C), j, C)
            b_dq *= scale
            store_tile(dq, rows, o_k, T, K, H * K, b_dq)
            if USE_G:  # q ⊙ dq, the first term of dB, kept in dg's buffer for kernel 2
                store_tile(dg, rows, o_k, T, K, H * K, load_tile(q, rows, o_k, T, K, H * K) * b_dq)
            S = state_step(S, b_k, b_v, b, b_last, PREC)
        if USE_G:
            if closes_early(blk, T, RESTART):  # for the dk kernel's restart of dg's running sum
                park_state(dv, S, blk * RESTART, o_k, o_v, K, V, H * V, HALVES)


@cache_launches
@triton.jit  # not autotuned: it overwrites its input dg, so an autotuner's rerun would read dg for q ⊙ dq
def _bwd_dk_kernel(q, k, v, g, do, dk, dg, dv, ht, dht, dh0, cu_seqlens, scale, part_stride, T,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr, FPREC: tl.constexpr,
                   USE_G: tl.constexpr, USE_DHT: tl.constexpr, USE_H0: tl.constexpr, IS_VARLEN: tl.constexpr,
                   PTX: tl.constexpr, RESTART: tl.constexpr, HALVES: tl.constexpr):
    i_k, i_bh, i_v = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    DT = q.dtype.element_ty
    o_c = tl.arange(0, C)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)  # this program's slice of values: every value when V ≤ 256
    part = i_v.to(tl.int64) * part_stride  # its float32 partials of dk and dg when V is sliced
    bos, T = sequence_tokens(i_b, T, cu_seqlens, IS_VARLEN)
    base_k, base_v = token_bases(bos, i_h, H, K, V)
    q, k, dk, v, do, dv = q + base_k, k + base_k, dk + part + base_k, v + base_v, do + base_v, dv + base_v
    if USE_G:
        g += base_k
        dg += part + base_k
    dS = load_state(dht, i_bh, o_k, o_v, K, V, BK, BV, USE_DHT)
    dg_acc = tl.zeros([BK], dtype=tl.float32)  # Σ of dB over the later chunks (+ the final-state term)
    if USE_DHT:
        if USE_G:  # Σ_v S_T ⊙ dS_T over this program's values (the slices' partials add up)
            dg_acc += tl.sum(load_state(ht, i_bh, o_k, o_v, K, V, BK, BV, True) * dS, axis=1)
    NT, PER, NB = parked_blocks(T, C, RESTART)
    for i_blk in range(NB):
        blk = NB - 1 - i_blk
        if USE_G:
            if closes_early(blk, T, RESTART):  # Σ of dB over every later token, from the state parked at its end
                dg_acc = tl.sum(parked_state(dv, blk * RESTART, o_k, o_v, K, V, H * V, HALVES) * dS, axis=1)
        first, last = blk * PER, tl.minimum(NT, blk * PER + PER)
        for i_n in range(last - first):
            n = last - 1 - i_n
            rows = (n * C + o_c).to(tl.int64)
            b, b_last, b_q, b_k = reverse_tiles(q, k, g, rows, o_k, T, H, K, C, BK, USE_G)
            b_v = load_tile(v, rows, o_v, T, V, H * V)
            b_do = load_tile(do, rows, o_v, T, V, H * V)
            dPT = dot(b_v, tl.trans(b_do), DT, PREC)  # dPᵀ: [key j, query i]
            if gentle_chunk(b_last):
                b_dk = fast_dk(dPT, b_q * scale, b, C, FPREC)
            else:  # the exact form
                b_dk = tl.zeros([C, BK], dtype=tl.float32)
                b_qs = b_q * scale
                for i in range(C):  # query i reaches the keys j ≤ i
                    b_dk += col(dPT, i, C)[:, None] * query_decays(b_qs, b, i, C)
            b_dk += dot(b_v, tl.trans(dS), tl.float32, PREC) * tl.exp(b_last[None, :] - b)
            store_tile(dk, rows, o_k, T, K, H * K, b_dk)
            if USE_G:
                dB = load_tile(dg, rows, o_k, T, K, H * K) - b_k * b_dk  # dg holds q ⊙ dq (kernel 1)
                dB = synced(dB, PTX)  # every thread has read its q ⊙ dq before dg overwrites any of them
                store_tile(dg, rows, o_k, T, K, H * K, dg_acc[None, :] + reverse_cumsum_dot(dB, C))
                dg_acc += tl.sum(dB, axis=0)
            dS = state_grad_step(dS, b_q, b, b_last, b_do, scale, PREC)
    if USE_H0:
        p_s, m_s = state_block(dh0, i_bh, o_k, o_v, K, V)
        tl.store(p_s, dS, mask=m_s)


@autotune(configs(), ["BK", "BV", "C", "IS_VARLEN", "STATE_FP32"])
@triton.jit
def _bwd_dv_kernel(q, k, g, do, dv, dht, cu_seqlens, scale, T,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                   USE_G: tl.constexpr, USE_DHT: tl.constexpr, IS_VARLEN: tl.constexpr, STATE_FP32: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    DT = q.dtype.element_ty
    o_c = tl.arange(0, C)
    o_k = tl.arange(0, BK)  # every key (BK ≥ K)
    o_v = i_v * BV + tl.arange(0, BV)
    bos, T = sequence_tokens(i_b, T, cu_seqlens, IS_VARLEN)
    base_k, base_v = token_bases(bos, i_h, H, K, V)
    q, k, do, dv = q + base_k, k + base_k, do + base_v, dv + base_v
    if USE_G:
        g += base_k
    dS = load_state(dht, i_bh, o_k, o_v, K, V, BK, BV, USE_DHT)
    NT = tl.cdiv(T, C)
    for i_n in range(NT):
        n = NT - 1 - i_n
        rows = (n * C + o_c).to(tl.int64)
        b, b_last, b_q, b_k = reverse_tiles(q, k, g, rows, o_k, T, H, K, C, BK, USE_G)
        b_do = load_tile(do, rows, o_v, T, V, H * V)
        if gentle_chunk(b_last):  # Pᵀ [key j, query i]
            PT = tl.trans(fast_scores(b_q * scale, b_k, b, C, PREC))
        else:  # the exact form, one query column at a time
            PT = tl.zeros([C, C], dtype=tl.float32)
            b_qs = b_q * scale
            for i in range(C):
                P_i = tl.sum(query_decays(b_qs, b, i, C) * b_k, axis=1)  # query i against every key
                PT += tl.where((o_c == i)[None, :], P_i[:, None], 0.0)
        b_kd = b_k * tl.exp(b_last[None, :] - b)  # exp(b_C − b) ≤ 1: key to the end of the chunk
        store_tile(dv, rows, o_v, T, V, H * V, dot(PT, b_do, DT, PREC) + state_dot(b_kd, dS, DT, STATE_FP32, PREC))
        dS = state_grad_step(dS, b_q, b, b_last, b_do, scale, PREC)


def fused_chunk_backward(q, k, v, g, h0, ht, do, dht, scale, chunk_size, states_in_fp32=False, varlen=None):
    """Launch the three kernels; returns ``(dq, dk, dv, dg, dh0)`` (dg, dh0 None without g, h0),
    the only tensors it allocates for V ≤ 256 (above, also the float32 partials of the V slices).
    ``states_in_fp32``: dS enters the dv kernel's output matmul in float32, as the forward's S does."""
    key_grid, key_meta = launch_meta(q, v, chunk_size, "V", varlen)
    NV = key_grid[2]  # slices of values: float32 partials of dq, dk, dg when there are several
    if NV == 1:
        dq, dk = torch.empty_like(q), torch.empty_like(k)
        dg = None if g is None else torch.empty_like(g)
    else:
        dq = q.new_empty(NV, *q.shape, dtype=torch.float32)
        dk = torch.empty_like(dq)
        dg = None if g is None else torch.empty_like(dq)
    dv = torch.empty_like(v)
    dh0 = None if h0 is None else torch.empty_like(h0)
    flags = dict(USE_G=g is not None, USE_DHT=dht is not None)
    key_meta["FPREC"] = fast_grad_dot_precision(q)  # dq and dk from the fast form: float32 sums, dg subtracts them
    parking = dict(RESTART=RESTART, HALVES=dv.element_size() == 2)  # the dq kernel's states, in dv's buffer
    rows = (2 if parking["HALVES"] else 1) * k.shape[-1]
    if RESTART % chunk_size or RESTART < rows:  # a parked state fills rows of the RESTART tokens it closes
        raise RuntimeError(f"fused_chunk_bwd.RESTART is {RESTART}: it must be a multiple of the chunk size "
                           f"({chunk_size}) and hold a parked state ({rows} rows of dv)")
    _bwd_dq_kernel[key_grid](q, k, v, g, do, dq, dg, dv, h0, scale=scale, part_stride=q.numel(), **key_meta,
                             USE_G=g is not None, USE_H0=h0 is not None, **parking)
    # kernel 2 sweeps the same tiles in reverse: it takes kernel 1's config. A sweep of its own (the kernel
    # before its PTX barrier; BK 16/32/64 x warps x stages, H200, 2026-11-27: config_rows of
    # benchmarks/results/fused_dk_sync_nvidia_h200.json) found none faster than dq's pick there
    # (BK 32, 4 warps, 3 stages)
    tuned = _bwd_dq_kernel.best_config
    _bwd_dk_kernel[key_grid](q, k, v, g, do, dk, dg, dv, ht, dht, dh0, scale=scale, part_stride=q.numel(),
                             **key_meta, **flags, USE_H0=h0 is not None, PTX=q.is_cuda and torch.version.hip is None,
                             **parking, num_warps=tuned.num_warps, num_stages=tuned.num_stages)
    value_grid, value_meta = launch_meta(q, v, chunk_size, "K", varlen)
    _bwd_dv_kernel[value_grid](q, k, g, do, dv, dht, scale=scale, **value_meta, **flags, STATE_FP32=states_in_fp32)
    if NV > 1:
        dq, dk = dq.sum(0).to(q.dtype), dk.sum(0).to(k.dtype)
        dg = None if g is None else dg.sum(0).to(g.dtype)
    return dq, dk, dv, dg, dh0
