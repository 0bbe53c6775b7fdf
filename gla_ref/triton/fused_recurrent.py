"""Fused recurrent GLA: the recurrence token by token with the state on chip (the decoding kernel).

    S_t = diag(α_t) S_{t−1} + k_tᵀ v_t,   o_t = scale · q_t S_t,   α_t = exp(g_t)

Grid ``(⌈V/BV⌉, B·H)``: a program owns the columns ``BV`` of one head's state, ``S ∈ R^{K×BV}``
in registers (all of K, so each output column is complete), and walks the tokens in order.
HBM traffic: q, k, v, g read once, o written once; no intermediate state is ever stored.

Backward, two kernels on the same grid (a state column block never leaves the chip):

1. a forward replay rebuilds ``S_t`` and writes ``dq_t = scale · S_t do_tᵀ`` (this block's part);
2. a reverse sweep carries ``dS_t`` (the gradient of S_t, seeded by the final-state cotangent),
   ``dS_{t−1} = diag(α_t) dS_t + scale · q_{t−1}ᵀ do_{t−1}``, and reads off
   ``dk_t = dS_t v_tᵀ``, ``dv_t = k_t dS_t``, ``dh0 = dS_0`` and the gate gradient

       dg_t = Σ_{s ≥ t} (q_s ⊙ dq_s − k_s ⊙ dk_s) + Σ_v (S_T ⊙ dS_T)

   (the paper's closed form for d log α, plus the final state's own dependence on b_T = Σ g).

dq, dk and dg are sums over value blocks: each program writes its part in float32 and the
launcher adds them up; dv and dh0 are complete per program.

Packed batch (``cu_seqlens``, B = 1, N sequences): grid ``(⌈V/BV⌉, N·H)``, a program walks the
tokens of one sequence (two offsets read from cu_seqlens) from its initial state ``h0[n]`` to
its final state ``ht[n]``; no other traffic changes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref import specs
from gla_ref._validate import check_flag, check_scale
from gla_ref.triton.common.host import (
    autotune,
    autotune_configs,
    block,
    cdiv,
    num_sequences,
    prepare_packed,
    stateful_function,
)
from gla_ref.triton.common.ops import Door, FamilyOp
from gla_ref.triton.common.gates import valid_gate
from gla_ref.triton.common.tiles import sequence_tokens, token_bases

__all__ = ["fused_recurrent_gla"]

STATE_BUDGET = specs.RECURRENT_STATE_BUDGET
"""Most float32 state entries a program keeps in registers: BV = STATE_BUDGET // BK (≥ 16)."""


def _configs():
    return autotune_configs([triton.Config({}, num_warps=w) for w in (4, 2, 8)])


def _blocks(K, V):
    BK = block(K)
    return BK, min(block(V), max(16, STATE_BUDGET // BK))


@triton.jit
def _state_block(i_v, i_bh, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Key/value indices of this program's state block (all K, values from i_v·BV), masks, offsets in S."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_s = m_k[:, None] & m_v[None, :]
    p_s = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    return o_k, o_v, m_k, m_v, m_s, p_s


@triton.jit
def _first_token(bos, i_h, T, o_k, o_v, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 FROM_END: tl.constexpr):
    """Offsets of this head's q/k/g row and v/o row at the sequence's first token (its last when
    FROM_END: the walk then steps back one token at a time)."""
    base_k, base_v = token_bases(bos, i_h, H, K, V)
    t0 = (T - 1) if FROM_END else 0
    return base_k + t0 * H * K + o_k, base_v + t0 * H * V + o_v


@autotune(_configs(), ["BK", "BV", "IS_VARLEN"])
@triton.jit
def _fwd_kernel(q, k, v, g, o, h0, ht, cu_seqlens, scale, T,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                USE_G: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, REVERSE: tl.constexpr,
                IS_VARLEN: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    bos, T = sequence_tokens(i_b, T, cu_seqlens, IS_VARLEN)
    o_k, o_v, m_k, m_v, m_s, p_s = _state_block(i_v, i_bh, K, V, BK, BV)
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + p_s, mask=m_s, other=0.0)
    p_qk, p_vo = _first_token(bos, i_h, T, o_k, o_v, H, K, V, REVERSE)
    step = -1 if REVERSE else 1
    for _ in range(T):
        b_q = tl.load(q + p_qk, mask=m_k, other=0.0).to(tl.float32) * scale
        b_k = tl.load(k + p_qk, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + p_vo, mask=m_v, other=0.0).to(tl.float32)
        if USE_G:
            S *= tl.exp(valid_gate(tl.load(g + p_qk, mask=m_k, other=0.0).to(tl.float32)))[:, None]
        S += b_k[:, None] * b_v[None, :]
        b_o = tl.sum(S * b_q[:, None], axis=0)
        tl.store(o + p_vo, b_o.to(o.dtype.element_ty), mask=m_v)
        p_qk += step * H * K
        p_vo += step * H * V
    if STORE_HT:
        tl.store(ht + p_s, S, mask=m_s)


@autotune(_configs(), ["BK", "BV", "IS_VARLEN"])
@triton.jit
def _bwd_dq_kernel(k, v, g, do, dq, h0, cu_seqlens, scale, B, T,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   USE_G: tl.constexpr, USE_H0: tl.constexpr, REVERSE: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Forward replay: rebuild S_t and write this value block's part of dq_t = scale · S_t do_tᵀ."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    dq += i_v.to(tl.int64) * B * T * H * K  # this value block's slice of the partial sums
    bos, T = sequence_tokens(i_b, T, cu_seqlens, IS_VARLEN)
    o_k, o_v, m_k, m_v, m_s, p_s = _state_block(i_v, i_bh, K, V, BK, BV)
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + p_s, mask=m_s, other=0.0)
    p_qk, p_vo = _first_token(bos, i_h, T, o_k, o_v, H, K, V, REVERSE)
    step = -1 if REVERSE else 1
    for _ in range(T):
        b_k = tl.load(k + p_qk, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + p_vo, mask=m_v, other=0.0).to(tl.float32)
        b_do = tl.load(do + p_vo, mask=m_v, other=0.0).to(tl.float32)
        if USE_G:
            S *= tl.exp(valid_gate(tl.load(g + p_qk, mask=m_k, other=0.0).to(tl.float32)))[:, None]
        S += b_k[:, None] * b_v[None, :]
        tl.store(dq + p_qk, tl.sum(S * b_do[None, :], axis=1) * scale, mask=m_k)
        p_qk += step * H * K
        p_vo += step * H * V


@autotune(_configs(), ["BK", "BV", "IS_VARLEN"])
@triton.jit
def _bwd_dkv_kernel(q, k, v, g, do, dq, dk, dv, dg, ht, dht, dh0, cu_seqlens, scale, B, T,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                    USE_G: tl.constexpr, USE_DHT: tl.constexpr, USE_H0: tl.constexpr, REVERSE: tl.constexpr,
                    IS_VARLEN: tl.constexpr):
    """Reverse sweep: carry dS_t back from dS_T, write dk, dv, dg (this block's part) and dh0."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    i_b, i_h = i_bh // H, i_bh % H
    part = i_v.to(tl.int64) * B * T * H * K
    bos, T = sequence_tokens(i_b, T, cu_seqlens, IS_VARLEN)
    o_k, o_v, m_k, m_v, m_s, p_s = _state_block(i_v, i_bh, K, V, BK, BV)
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    dg_acc = tl.zeros([BK], dtype=tl.float32)  # Σ_{s ≥ t} (q ⊙ dq − k ⊙ dk) + Σ_v S_T ⊙ dS_T
    if USE_DHT:
        dS += tl.load(dht + p_s, mask=m_s, other=0.0)
        if USE_G:
            dg_acc += tl.sum(tl.load(ht + p_s, mask=m_s, other=0.0) * dS, axis=1)
    p_qk, p_vo = _first_token(bos, i_h, T, o_k, o_v, H, K, V, not REVERSE)  # the recurrence's last token
    step = 1 if REVERSE else -1
    for _ in range(T):
        b_q = tl.load(q + p_qk, mask=m_k, other=0.0).to(tl.float32)
        b_k = tl.load(k + p_qk, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + p_vo, mask=m_v, other=0.0).to(tl.float32)
        b_do = tl.load(do + p_vo, mask=m_v, other=0.0).to(tl.float32)
        dS += (b_q * scale)[:, None] * b_do[None, :]  # now the full gradient of S_t
        b_dk = tl.sum(dS * b_v[None, :], axis=1)
        tl.store(dk + part + p_qk, b_dk, mask=m_k)
        tl.store(dv + p_vo, tl.sum(dS * b_k[:, None], axis=0).to(dv.dtype.element_ty), mask=m_v)
        if USE_G:
            b_dq = tl.load(dq + part + p_qk, mask=m_k, other=0.0)
            dg_acc += b_q * b_dq - b_k * b_dk
            tl.store(dg + part + p_qk, dg_acc, mask=m_k)
            dS *= tl.exp(valid_gate(tl.load(g + p_qk, mask=m_k, other=0.0).to(tl.float32)))[:, None]
        p_qk += step * H * K
        p_vo += step * H * V
    if USE_H0:
        tl.store(dh0 + p_s, dS, mask=m_s)


def _grid_args(q, v, varlen):
    """Grid ``(⌈V/BV⌉, N·H)`` (N = B, or the packed sequences) and the kernels' shape arguments."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BK, BV = _blocks(K, V)
    meta = dict(T=T, H=H, K=K, V=V, BK=BK, BV=BV,
                cu_seqlens=None if varlen is None else varlen.cu_seqlens, IS_VARLEN=varlen is not None)
    return (cdiv(V, BV), num_sequences(B, varlen) * H), meta


def _forward(q, k, v, g, h0, scale, output_final_state, reverse, varlen):
    H, K = q.shape[2:]
    grid, meta = _grid_args(q, v, varlen)
    o = torch.empty_like(v)
    N = num_sequences(q.shape[0], varlen)
    ht = q.new_empty(N, H, K, v.shape[-1], dtype=torch.float32) if output_final_state else None
    _fwd_kernel[grid](q, k, v, g, o, h0, ht, scale=scale, **meta, USE_G=g is not None, USE_H0=h0 is not None,
                      STORE_HT=output_final_state, REVERSE=reverse)
    return o, ht


def _backward(q, k, v, g, h0, ht, do, dht, scale, reverse, varlen):
    B, T, H, K = q.shape
    grid, meta = _grid_args(q, v, varlen)
    NV = grid[0]
    dq = q.new_empty(NV, B, T, H, K, dtype=torch.float32)
    dk = torch.empty_like(dq)
    dg = torch.empty_like(dq) if g is not None else None
    dv = torch.empty_like(v)
    dh0 = torch.empty_like(h0) if h0 is not None else None
    flags = dict(USE_G=g is not None, USE_H0=h0 is not None, REVERSE=reverse)
    _bwd_dq_kernel[grid](k, v, g, do, dq, h0, scale=scale, B=B, **meta, **flags)
    _bwd_dkv_kernel[grid](q, k, v, g, do, dq, dk, dv, dg, ht, dht, dh0, scale=scale, B=B, **meta,
                          USE_DHT=dht is not None, **flags)
    dg = None if g is None else dg.sum(0).to(g.dtype)
    return dq.sum(0).to(q.dtype), dk.sum(0).to(k.dtype), dv, dg, dh0


FusedRecurrentGLA = Door(stateful_function(
    "FusedRecurrentGLA", _forward, _backward,
    "Autograd wrapper: the forward keeps only its inputs (and the final state when returned)."),
    FamilyOp("fused_recurrent_gla", _forward, _backward, option_types=(bool,)))


def fused_recurrent_gla(q, k, v, g=None, *, scale=None, initial_state=None, output_final_state=False,
                        reverse=False, cu_seqlens=None):
    """GLA by its recurrence, one token at a time, the state held on chip (decoding, short T).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; K ≤ 256, V ≤ 4096. float32, float16 or bfloat16 on a
            GPU; float32 or float16 on a CPU (Triton's interpreter computes bf16 wrongly: refused).
        g: log forget gates ``[B, T, H, K]`` (finite, ≤ 0), or None for plain linear attention. An
            invalid gate (NaN, > 0, or -inf, a hard reset: split the sequences with cu_seqlens)
            makes o and the final state NaN; under ``gla_ref.device.debug(True)`` a ValueError
            naming its position.
        scale: multiplies ``q``; default ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` (``[N, H, K, V]`` packed) float32 state S_0, or None (zeros).
        output_final_state: also return the float32 state after the last token.
        reverse: run the recurrence from the last token to the first (of each sequence).
        cu_seqlens: None, or int32/int64 ``[N + 1]`` offsets of N sequences packed in a batch with B = 1
            (FLA's convention, as in :func:`gla_ref.triton.chunk.chunk_gla`; read on the host, one
            sync), each run from its own initial state.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype; final_state ``[B, H, K, V]``
        (``[N, H, K, V]`` packed) or None.
    """
    dims, varlen = prepare_packed(q, k, v, g, initial_state, gate_ranks=(None, 4), cu_seqlens=cu_seqlens)
    scale = check_scale(scale, dims.K)
    return FusedRecurrentGLA.apply(q, k, v, g, initial_state, scale,
                                   check_flag("output_final_state", output_final_state),
                                   (check_flag("reverse", reverse),), varlen)
