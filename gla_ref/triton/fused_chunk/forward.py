"""Fused chunk GLA, forward: FlashLinearAttention without materialisation (paper Alg. 5).

Grid ``(⌈V/BV⌉, B·H)``: a program owns a ``K × BV`` slice of one head's state S — every key row,
K padded to a power of two — and walks the chunks of C tokens in order, the state never leaving
the chip. Holding the whole key dimension is what lets a program finish its ``C × BV`` tile of o
(a sum over keys) and write it once, in o's dtype. Per chunk, with ``b_i = g_1 + … + g_i`` from
the chunk start (≤ 0, decreasing) and ``b_C`` its last row:

    O   = (Q ⊙ exp b) S  +  P V,      P_ij = scale · Σ_c q_ic k_jc exp(b_ic − b_jc)  (i ≥ j)
    S  ← diag(exp b_C) S  +  (K ⊙ exp(b_C − b))ᵀ V

b comes from the chunk's gate tile, loaded once with q, k and v (:func:`chunk_gates`). P has two
forms. The *exact form* builds it one key column j at a time (k_j and b_j taken from the tiles in
registers), so every exponent is ``b_i − b_j ≤ 0``: stable for any gate, with no ``K / Λ`` to
overflow, but C·C·BK exponentials in a loop of C steps, whose work grows with C: that is why C = 16
is the default. Where the chunk is *gentle*, every key decaying by at most SAFE_DECAY
(64 nats) from the chunk start (``−b_C ≤ 64``, b = 0 there), the *fast form* splits every exponent
at the chunk start, one matmul with the causal mask M (i ≥ j) applied after it:

    P = ((Q ⊙ exp b) (K ⊙ exp(−b))ᵀ) ⊙ M

``exp b ≤ 1`` and ``exp(−b) ≤ e^64 ≈ 6e27`` fit float32 (up to e^88; fp16 overflows past e^11), and
each product is still ``q_i k_j exp(b_i − b_j)``, at most ``|q_i k_j|`` inside the mask: P is as
accurate as any matmul. A program picks the form per chunk from its own gates (:func:`gentle_chunk`,
one scalar branch, no sync); a NaN of an invalid gate reaches P in either, through exp b in the fast
form. The ``⌈V/BV⌉`` programs of a head each rebuild P. The fast form's matmul takes float32 operands
(its decayed operands would overflow fp16; TF32 costs no more than P's own rounding to the input dtype
for P V). The state update ``(K ⊙ exp(b_C − b))ᵀ V`` takes float32 operands too (IEEE for fp32 inputs; TF32
for 16-bit inputs), so S is summed in float32 and never stored rounded; where S enters the output's matmul
it is rounded to q's dtype (:func:`state_dot`; not with ``states_in_fp32``), as chunk_gla's output kernel reads
bf16 states. P V takes the input dtype too.

HBM traffic: q, k, g read ``⌈V/BV⌉`` times, v once, o written once, the final state when asked.
Nothing else is allocated or stored.

Packed batch (``cu_seqlens``, B = 1, N sequences): grid ``(⌈V/BV⌉, N·H)``, a program walks the
chunks of one sequence (two offsets read from cu_seqlens), cut from its own first token, from its
initial state ``h0[n]`` to its final state ``ht[n]``. The backward kernels do the same.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref import specs
from gla_ref.triton.common.host import autotune, autotune_configs, block, cdiv, num_sequences, sm_count
from gla_ref.triton.common.gates import at_most_zero, gentle, valid_gate
from gla_ref.triton.common.precision import dot_precision
from gla_ref.triton.common.tiles import sequence_tokens, token_bases

STATE_ELEMENTS = specs.FUSED_STATE_ELEMENTS
"""Float32 state elements a program holds: 32 KiB, 64 registers a thread at 4 warps (of 255).

A program keeps one dimension of the state whole (≤ 256 padded) and splits the other into blocks
of ``STATE_ELEMENTS // whole`` (at least 16, for tl.dot): K = V = 128 gives 128 × 64 tiles, and
K = 256 gives 256 × 32. V above :data:`WHOLE_V` is first cut into slices (see :func:`launch_meta`).
The programs that hold every key may take :data:`WIDE_STATE_ELEMENTS` instead (:func:`value_block`)."""

WIDE_STATE_ELEMENTS = 16384
"""Float32 state elements a program that holds every key (the forward, dv) takes instead of
:data:`STATE_ELEMENTS` when the grid still gives every streaming multiprocessor a program with them
(:func:`value_block`): twice the value columns, so half as many programs rebuild each chunk's gates
and P and re-read its q, k and g. On the H200 (benchmarks/results/fused_tiles_nvidia_h200.json;
B = 8, H = 16, bf16, results bit-identical) it takes a fifth off the forward and a tenth off the
forward + backward at 128 × 256, a quarter and a sixth at 256 × 512. At 128 × 128 that batch would
keep 128 programs for 132 SMs; there a one-off trial on an H100 was slower with it (forward 1.54 →
2.03 ms at T = 4096), so it is not taken. In the same trial the dq and dk programs (every value)
were slower with it too (dk 4.3 → 6.4 ms at 128 × 256): they keep :data:`STATE_ELEMENTS`. Taken only
at :data:`WIDE_CHUNK_SIZE`, where it was measured."""

WIDE_CHUNK_SIZE = 16
"""The chunk size (the default) at which :data:`WIDE_STATE_ELEMENTS` is taken. At C = 64 and K = 256 the
dv kernel's wide tile needs 232 KiB of shared memory in its leanest config, over a Hopper block's 227
(tests/triton/test_triton_shared_memory.py)."""

WHOLE_V = 256
"""Most values a program of the dq/dk kernels holds. K ≤ 256 is always held whole; a larger V is
cut into ``⌈V/256⌉`` slices of 256, one per program on the grid's third axis, so a state tile stays
within :data:`STATE_ELEMENTS` (V = 1024 whole would take 16 × 1024); those programs' sums over
values (dq, dk, dg) are then float32 partials, one per slice, that the launcher adds up."""

CHUNK_SIZES = (16, 32, 64)
"""Chunk sizes the kernels accept: C × C tiles feed tl.dot (≥ 16); the exact form's loop costs O(C) a token."""


def configs():
    """Warps and stages (no 2-warp config: 8192 state elements would take 128 registers a thread). One stage
    for the widest tiles: at C = 64 and K = 256 the forward and dv kernels' two stages of q, k and gate tiles
    take 252 KiB of shared memory, over a Hopper block's 227 KiB (tests/triton/test_triton_shared_memory.py)."""
    return autotune_configs([triton.Config({}, num_warps=w, num_stages=s)
                             for w, s in ((4, 2), (8, 2), (4, 3), (4, 1))])


def launch_meta(q, v, chunk_size, whole, varlen=None):
    """Grid and shape arguments for programs that hold the ``whole`` dimension ("K" or "V") of the
    state and split the other: grid ``(⌈V/BV⌉, N·H)`` for "K" (K ≤ 256 is always whole; BV from
    :func:`value_block`), ``(⌈K/BK⌉, N·H, ⌈V/BV⌉)`` for "V", the third axis over the slices of
    :data:`WHOLE_V` values (one slice when V ≤ 256). N = B or the packed sequences."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    heads = num_sequences(B, varlen) * H
    if whole == "K":
        BK = block(K)
        BV = value_block(BK, V, heads, sm_count(q) if chunk_size == WIDE_CHUNK_SIZE else None)
        grid = (cdiv(V, BV), heads)
    else:
        BV = min(block(V), WHOLE_V)
        BK = min(block(K), max(16, STATE_ELEMENTS // BV))
        grid = (cdiv(K, BK), heads, cdiv(V, BV))
    meta = dict(T=T, H=H, K=K, V=V, C=chunk_size, BK=BK, BV=BV,
                PREC=dot_precision(q),
                cu_seqlens=None if varlen is None else varlen.cu_seqlens, IS_VARLEN=varlen is not None)
    return grid, meta


def value_block(BK: int, V: int, heads: int, sms: int | None) -> int:
    """Value columns of a program holding all ``BK`` keys: :data:`WIDE_STATE_ELEMENTS` worth when the
    ``⌈V/BV⌉ · heads`` programs that leaves are at least ``sms`` (the device's streaming
    multiprocessors; None, off CUDA or at a chunk size other than :data:`WIDE_CHUNK_SIZE`, never), else
    :data:`STATE_ELEMENTS` worth; at least 16."""
    narrow, wide = (min(block(V), max(16, n // BK)) for n in (STATE_ELEMENTS, WIDE_STATE_ELEMENTS))
    return wide if sms is not None and cdiv(V, wide) * heads >= sms else narrow


# ----------------------------------------------------------------------------- on-chip helpers

@triton.jit
def load_tile(ptr, rows, cols, T, D: tl.constexpr, HD: tl.constexpr):
    """Tile ``[rows, cols]`` of a ``[T, H, D]`` slab (ptr at its head), float32, zeros outside."""
    mask = (rows < T)[:, None] & (cols < D)[None, :]
    return tl.load(ptr + rows[:, None] * HD + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_tile(ptr, rows, cols, T, D: tl.constexpr, HD: tl.constexpr, x):
    mask = (rows < T)[:, None] & (cols < D)[None, :]
    tl.store(ptr + rows[:, None] * HD + cols[None, :], x.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def state_block(ptr, i_bh, o_k, o_v, K: tl.constexpr, V: tl.constexpr):
    """Pointers and mask of this program's ``[BK, BV]`` block of a ``[B, H, K, V]`` state."""
    return ptr + i_bh * K * V + o_k[:, None] * V + o_v[None, :], (o_k < K)[:, None] & (o_v < V)[None, :]


@triton.jit
def load_state(ptr, i_bh, o_k, o_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
               USE: tl.constexpr):
    """This program's ``[BK, BV]`` block of a float32 ``[B, H, K, V]`` state; zeros when ``USE`` is off
    (no state given)."""
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE:
        p_s, m_s = state_block(ptr, i_bh, o_k, o_v, K, V)
        S += tl.load(p_s, mask=m_s, other=0.0)
    return S


@triton.jit
def chunk_gates(g, rows, o_k, T, K: tl.constexpr, HK: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                USE_G: tl.constexpr):
    """``b_i = g_1 + … + g_i`` over the chunk of ``rows`` (float32, ≤ 0, decreasing) and its last row ``b_C``.

    One tile load, then one float32 matmul with the lower-triangular ones matrix L (``L_ij = 1`` for
    j ≤ i). ``input_precision="ieee"`` makes it an FMA loop over j in token order, every product exact
    (1·g or 0·g), so on a GPU row i is the running sum g_1 + … + g_i bit for bit: ``b_i − b_j`` is
    exactly 0 on the diagonal and ≤ 0 below it (adding a g ≤ 0 never rounds up). ``tl.cumsum`` sums
    in a tree order instead, which moved float32 gate gradients of steep chunks by up to 2.5e-5 on the
    H200; the C-step loop of row loads this replaces held the forward at K = V = 64, T = 4096 to
    2.5 ms (now 0.7). An invalid gate (NaN, > 0, -inf) becomes NaN
    (:func:`~gla_ref.triton.common.gates.valid_gate`), and its ``0 · NaN`` products make every row of the
    chunk NaN. Tokens past T load g = 0: b_C, and the final state, are exact.
    """
    if USE_G:
        o_c = tl.arange(0, C)
        L = tl.where(o_c[:, None] >= o_c[None, :], 1.0, 0.0)
        b = tl.dot(L, valid_gate(load_tile(g, rows, o_k, T, K, HK)), input_precision="ieee")
    else:
        b = tl.zeros([C, BK], dtype=tl.float32)
    return b, row(b, C - 1, C)


@triton.jit
def row(x, i, C: tl.constexpr):
    """Row i of a ``[C, D]`` register tile, as ``[D]`` (the other rows add exact zeros; a NaN of row i stays)."""
    return tl.sum(tl.where((tl.arange(0, C) == i)[:, None], x, 0.0), axis=0)


@triton.jit
def col(x, j, C: tl.constexpr):
    """Column j of a ``[C, C]`` register tile, as ``[C]``."""
    return tl.sum(tl.where((tl.arange(0, C) == j)[None, :], x, 0.0), axis=1)


@triton.jit
def decay_from(b, b_j, j, C: tl.constexpr):
    """Key j's decay to every query: ``exp(b_i − b_j)`` for i ≥ j, 0 above the diagonal.

    The exponent is capped at 0 before exp (only the rows above the diagonal, where it is positive,
    are touched; :func:`~gla_ref.triton.common.gates.at_most_zero` keeps a NaN of an invalid gate); the
    where then zeroes those rows.
    """
    return tl.where((tl.arange(0, C) >= j)[:, None], tl.exp(at_most_zero(b - b_j[None, :])), 0.0)


@triton.jit
def decay_to(b, b_i, i, C: tl.constexpr):
    """Query i's decay from every key: ``exp(b_i − b_j)`` for j ≤ i, 0 below (masked like decay_from)."""
    return tl.where((tl.arange(0, C) <= i)[:, None], tl.exp(at_most_zero(b_i[None, :] - b)), 0.0)


@triton.jit
def gentle_chunk(b_last):
    """Whether every key decays by at most SAFE_DECAY from the chunk start (b = 0 there) to its last row
    ``b_C``, the lowest of b (:func:`~gla_ref.triton.common.gates.gentle`): the chunk may take the fast form."""
    return gentle(b_last[None, :], tl.zeros_like(b_last))


@triton.jit
def causal(x, C: tl.constexpr):
    """``x ⊙ M`` for a ``[C, C]`` tile [query i, key j]: the entries j > i zeroed (a NaN or inf of the
    fast form's products there too)."""
    o_c = tl.arange(0, C)
    return tl.where(o_c[:, None] >= o_c[None, :], x, 0.0)


@triton.jit
def fast_scores(b_q, b_k, b, C: tl.constexpr, PREC: tl.constexpr):
    """P in the fast form (gentle chunk): ``((Q ⊙ exp b) (K ⊙ exp(−b))ᵀ) ⊙ M``, float32 operands."""
    return causal(tl.dot(b_q * tl.exp(b), tl.trans(b_k * tl.exp(-b)), input_precision=PREC), C)


@triton.jit
def dot(a, b, DT: tl.constexpr, PREC: tl.constexpr):
    """``a @ b`` with operands cast to DT, float32 accumulation."""
    return tl.dot(a.to(DT), b.to(DT), input_precision=PREC)


@triton.jit
def state_dot(a, S, DT: tl.constexpr, STATE_FP32: tl.constexpr, PREC: tl.constexpr):
    """``a @ S`` for a state tile S in a program's output matmul, the forward's ``(Q ⊙ exp b) S`` and the dv
    kernel's ``(K ⊙ exp(b_C − b)) dS``: both operands in the input dtype DT (bf16 or fp16 operands, float32 sums;
    float32 inputs keep IEEE float32), the state rounded to it; in float32 (TF32 for 16-bit inputs) with
    ``STATE_FP32``, fused_chunk_gla's ``states_in_fp32``, the kernels' numerics before 2026-11-28.

    A float32 state there is a TF32 operand, and its copy in a 16-row matmul's operand layout costs each thread as
    many registers as the tile itself. On the H200 (benchmarks/results/fused_state_operands_nvidia_h200.json: one
    process, B = 8, H = 16, bf16, T = 4096) the forward took 13.1 instead of 15.1 ms at K × V = 256 × 512, 2.19
    instead of 2.43 at 128 × 256 and 1.42 instead of 1.55 at 128 × 128, the dv kernel 14.9 instead of 16.3, 2.00
    instead of 2.40 and 1.39 instead of 1.54: the forward and backward 0.94, 0.94 and 0.96 of its time before.
    o and dv then carry the state's rounding, as chunk_gla's do, whose output and dv kernels read bf16 states
    (bf16 relative RMSE against float64 3.9e-3 for both at the realistic shape, from 3.7e-3 and 3.6e-3). The
    state updates keep float32 operands: rounding theirs too was faster still (forward 12.2 ms at 256 × 512) but
    put the rounding into the final state, and through its term of the gate gradient took bf16 dg to 6.9e-3. The
    dq and dk kernels keep float32 operands too: dg subtracts their nearly equal q ⊙ dq and k ⊙ dk
    (:mod:`~gla_ref.triton.fused_chunk.backward`)."""
    SDT: tl.constexpr = tl.float32 if STATE_FP32 else DT
    return dot(a, S, SDT, PREC)


@triton.jit
def state_step(S, b_k, b_v, b, b_last, PREC: tl.constexpr):
    """The state one chunk later: ``diag(exp b_C) S + (K ⊙ exp(b_C − b))ᵀ V``, each key decayed to
    the chunk end (exponents ≤ 0)."""
    return S * tl.exp(b_last)[:, None] + dot(tl.trans(b_k * tl.exp(b_last[None, :] - b)), b_v, tl.float32, PREC)


# ----------------------------------------------------------------------------- the kernel

@autotune(configs(), ["BK", "BV", "C", "IS_VARLEN", "STATE_FP32"])
@triton.jit
def _fwd_kernel(q, k, v, g, o, h0, ht, cu_seqlens, scale, T,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                USE_G: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_VARLEN: tl.constexpr,
                STATE_FP32: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    DT = q.dtype.element_ty
    o_c = tl.arange(0, C)
    o_k = tl.arange(0, BK)  # every key (BK ≥ K)
    o_v = i_v * BV + tl.arange(0, BV)
    bos, T = sequence_tokens(i_b, T, cu_seqlens, IS_VARLEN)
    base_k, base_v = token_bases(bos, i_h, H, K, V)
    q, k, v, o = q + base_k, k + base_k, v + base_v, o + base_v
    if USE_G:
        g += base_k
    S = load_state(h0, i_bh, o_k, o_v, K, V, BK, BV, USE_H0)
    for n in range(tl.cdiv(T, C)):
        rows = (n * C + o_c).to(tl.int64)
        b, b_last = chunk_gates(g, rows, o_k, T, K, H * K, C, BK, USE_G)
        b_q = load_tile(q, rows, o_k, T, K, H * K) * scale
        b_k = load_tile(k, rows, o_k, T, K, H * K)
        b_v = load_tile(v, rows, o_v, T, V, H * V)
        if gentle_chunk(b_last):
            P = fast_scores(b_q, b_k, b, C, PREC)
        else:  # the exact form
            P = tl.zeros([C, C], dtype=tl.float32)
            for j in range(C):  # key column j: P_ij = q_i · (k_j ⊙ exp(b_i − b_j))
                P_j = tl.sum(b_q * decay_from(b, row(b, j, C), j, C) * row(b_k, j, C)[None, :], axis=1)
                P += tl.where((o_c == j)[None, :], P_j[:, None], 0.0)
        b_o = state_dot(b_q * tl.exp(b), S, DT, STATE_FP32, PREC) + dot(P, b_v, DT, PREC)
        store_tile(o, rows, o_v, T, V, H * V, b_o)  # the sum over every key: o's final value
        S = state_step(S, b_k, b_v, b, b_last, PREC)
    if STORE_HT:
        p_s, m_s = state_block(ht, i_bh, o_k, o_v, K, V)
        tl.store(p_s, S, mask=m_s)


def fused_chunk_forward(q, k, v, g, h0, scale, output_final_state, chunk_size, states_in_fp32=False, varlen=None):
    """Launch the forward; returns ``(o, final_state or None)``, the only tensors it allocates. ``states_in_fp32``:
    the state enters the output matmul in float32 (TF32 for 16-bit inputs) instead of q's dtype (:func:`state_dot`)."""
    B, _, H, K = q.shape
    grid, meta = launch_meta(q, v, chunk_size, "K", varlen)
    o = torch.empty_like(v)
    N = num_sequences(B, varlen)
    ht = q.new_empty(N, H, K, v.shape[-1], dtype=torch.float32) if output_final_state else None
    _fwd_kernel[grid](q, k, v, g, o, h0, ht, scale=scale, **meta, USE_G=g is not None, USE_H0=h0 is not None,
                      STORE_HT=output_final_state, STATE_FP32=states_in_fp32)
    return o, ht
