"""Chunkwise simple GLA: one scalar log-gate per token and head (``[B, T, H]``, Mamba-2 style) or a
constant decay per head (``g_gamma`` ``[H]``, RetNet style), states materialised as in chunk GLA.

A scalar gate factors out of the key dimension, so the intra-chunk matrix needs no sub-chunks:

    A = (Q Kᵀ) ⊙ D,    D[i, j] = exp(b_i − b_j) for j ≤ i, else 0,

with b = log Λ the chunk-local cumulative log-gate (one number per token; book/notation.md), b_last
its last row (log γ), S_[i] = ``h[:, :, i]`` the state entering the chunk at 0-based index i and
dS_[i+1] the gradient of the state leaving it,

one matmul with raw (unscaled) operands and a C × C decay mask whose exponents are all ≤ 0.
The state recurrence and its reverse twin are those of :mod:`chunk_state` (scalar-gate layout).

Kernels (all parallel over chunks):

* output, grid ``(⌈V/BV⌉, ⌈T/C⌉, B·H)``: O = scale · (exp b ⊙ (Q S_[i]) + A V); reads q, k, b, v
  and a ``K × BV`` slice of S_[i], writes O. A is rebuilt on chip and never stored.
* dv, same grid: dV = scale · Aᵀ dO + exp(b_last − b) ⊙ (K dS_[i+1]); A rebuilt on chip.
* dq/dk/dg, grid ``(⌈K/BK⌉, ⌈T/C⌉, B·H)``: dA = dO Vᵀ on chip, then dq = scale·exp b ⊙ (dO S_[i]ᵀ)
  + (dA ⊙ D) K, dk = exp(b_last − b) ⊙ (V dS_[i+1]ᵀ) + (dA ⊙ D)ᵀ Q, and the gate gradient of the
  closed form (paper §4.3) summed over the K block: each block writes a float32 partial
  ``[⌈K/BK⌉, B, T, H]`` that the launcher adds up. The gradient of ``g_gamma`` is that gate
  gradient summed over every batch row and token (it enters every token's gate).

Packed batches (``cu_seqlens``, B = 1): as in :mod:`gla_ref.triton.chunk` — every chunk-parallel
grid runs over the NT chunks of all sequences ``(·, NT, H)``, each program reading its row of the
host-built chunk table and its sequence's two offsets; the state recurrences run per sequence.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from gla_ref import device, specs
from gla_ref._validate import check_flag, check_scale
from gla_ref.triton.common.host import (
    autotune,
    autotune_configs,
    block,
    block_configs,
    cdiv,
    check_chunk_size,
    check_values,
    num_chunks,
    prepare_packed,
    refuse_interpreted_bf16,
    varlen_args,
)
from gla_ref.triton.common.gates import invalid_to_nan
from gla_ref.triton.common.ops import FamilyOp
from gla_ref.triton.common.precision import dot_precision
from gla_ref.triton.common.tiles import (
    block_range,
    chunk_state_offset,
    chunk_tokens,
    inter_chunk_dqk,
    load_rows,
    program_chunk,
    reverse_cumsum,
    store_rows,
    token_base,
    token_bases,
)
from gla_ref.triton.chunk.cumsum import chunk_local_cumsum
from gla_ref.triton.chunk.state import chunk_state_bwd, chunk_state_fwd


def _dqkg_configs():
    # BK ≥ 64: see chunk_backward._dqkg_configs (triton-lang/triton#11366)
    # the two configs that won at the measured head shapes (benchmarks/results/config_timings_nvidia_h200.json)
    return autotune_configs([triton.Config({"BK": bk}, num_warps=w, num_stages=s)
                             for bk, w, s in ((64, 4, 2), (128, 8, 2))])


@triton.jit
def _decay_mask(b_g, o_t, TRANSPOSED: tl.constexpr):
    """D[r, s] = exp(b_r − b_s) for s ≤ r (its transpose if TRANSPOSED), exponent masked before exp."""
    if TRANSPOSED:
        causal = o_t[None, :] >= o_t[:, None]
        diff = b_g[None, :] - b_g[:, None]
    else:
        causal = o_t[:, None] >= o_t[None, :]
        diff = b_g[:, None] - b_g[None, :]
    return tl.where(causal, tl.exp(tl.where(causal, diff, 0.0)), 0.0)


@autotune(block_configs("BV"), ["K", "V", "C", "IS_VARLEN"], BV="V")
@triton.jit
def simple_output_kernel(q, k, v, b, h, o, cu_seqlens, chunk_indices, scale, T, H: tl.constexpr,
                         K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                         BV: tl.constexpr, PREC: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    p_h = h + chunk_state_offset(i_bh, i_t, T, K, V, C, IS_VARLEN)
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    o_t, t, m_t = chunk_tokens(i_n, T, C)
    o_v, m_v = block_range(i_v, BV, V)
    base_k, base_v = token_bases(bos, i_h, H, K, V)

    b_o = tl.zeros([C, BV], dtype=tl.float32)
    b_A = tl.zeros([C, C], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k, m_k = block_range(i_k, BK, K)
        p_tk = base_k + t[:, None] * (H * K) + o_k[None, :]
        b_q = tl.load(q + p_tk, mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_k = tl.load(k + p_tk, mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_h = load_rows(p_h, o_k, m_k, o_v, m_v, V)
        b_o += tl.dot(b_q, b_h.to(b_q.dtype), input_precision=PREC)
        b_A += tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
    b_g = tl.load(b + token_base(bos, i_h, H, 1) + tl.minimum(t, T - 1) * H)
    b_A *= _decay_mask(b_g, o_t, False)
    b_v = load_rows(v + base_v, t, m_t, o_v, m_v, H * V)
    b_o = (b_o * tl.exp(b_g)[:, None] + tl.dot(b_A.to(b_v.dtype), b_v, input_precision=PREC)) * scale
    store_rows(o + base_v, b_o, t, m_t, o_v, m_v, H * V)


@autotune(block_configs("BV"), ["K", "V", "C", "IS_VARLEN"], BV="V")
@triton.jit
def simple_bwd_dv_kernel(q, k, b, dh, do, dv, cu_seqlens, chunk_indices, scale, T, H: tl.constexpr,
                         K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                         BV: tl.constexpr, PREC: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    p_dh = dh + chunk_state_offset(i_bh, i_t, T, K, V, C, IS_VARLEN)
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    o_t, t, m_t = chunk_tokens(i_n, T, C)
    o_v, m_v = block_range(i_v, BV, V)
    base_k, base_v = token_bases(bos, i_h, H, K, V)

    b_At = tl.zeros([C, C], dtype=tl.float32)      # Aᵀ before the decay mask: k_s · q_r
    b_dv = tl.zeros([C, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k, m_k = block_range(i_k, BK, K)
        p_tk = base_k + t[:, None] * (H * K) + o_k[None, :]
        b_q = tl.load(q + p_tk, mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_k = tl.load(k + p_tk, mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_dh = load_rows(p_dh, o_k, m_k, o_v, m_v, V)
        b_At += tl.dot(b_k, tl.trans(b_q), input_precision=PREC)
        b_dv += tl.dot(b_k, b_dh.to(b_k.dtype), input_precision=PREC)
    g_base = b + token_base(bos, i_h, H, 1)
    b_g = tl.load(g_base + tl.minimum(t, T - 1) * H)
    g_last = tl.load(g_base + (tl.minimum(i_n * C + C, T) - 1) * H)
    b_At *= _decay_mask(b_g, o_t, True) * scale
    b_do = load_rows(do + base_v, t, m_t, o_v, m_v, H * V)
    b_dv = b_dv * tl.exp(g_last - b_g)[:, None] + tl.dot(b_At.to(b_do.dtype), b_do, input_precision=PREC)
    store_rows(dv + base_v, b_dv, t, m_t, o_v, m_v, H * V)


@autotune(_dqkg_configs(), ["K", "V", "C", "IS_VARLEN"], BK="K")
@triton.jit
def simple_bwd_dqkg_kernel(q, k, v, b, h, dh, do, dq, dk, dg, cu_seqlens, chunk_indices, scale, T,
                           B: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           STORE_DG: tl.constexpr, PREC: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_k, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    p_state = chunk_state_offset(i_bh, i_t, T, K, V, C, IS_VARLEN)
    part = i_k.to(tl.int64) * B * T * H          # this key block's partial [B, T, H] of dg
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    o_t, t, m_t = chunk_tokens(i_n, T, C)
    o_k, m_k = block_range(i_k, BK, K)
    m_tk = m_t[:, None] & m_k[None, :]
    base_k, base_v = token_bases(bos, i_h, H, K, V)
    p_tk = base_k + t[:, None] * (H * K) + o_k[None, :]

    b_q = tl.load(q + p_tk, mask=m_tk, other=0.0)
    b_k = tl.load(k + p_tk, mask=m_tk, other=0.0)
    g_base = b + token_base(bos, i_h, H, 1)
    b_g = tl.load(g_base + tl.minimum(t, T - 1) * H)
    g_last = tl.load(g_base + (tl.minimum(i_n * C + C, T) - 1) * H)

    b_dA, b_dq, b_dk, b_hdh = inter_chunk_dqk(v, do, h, dh, base_v, p_state, t, m_t, o_k, m_k,
                                              H, V, C, BK, BV, PREC, WITH_DA=True)
    b_dq *= (tl.exp(b_g) * scale)[:, None]
    b_dk *= tl.exp(g_last - b_g)[:, None]
    # γ, the chunk's total decay, collects the state terms (see chunk_backward); its dk term is dk_inter
    b_dgamma = tl.sum(b_hdh, axis=0) * tl.exp(g_last) + tl.sum(tl.sum(b_k.to(tl.float32) * b_dk, axis=1), axis=0)
    b_dA *= _decay_mask(b_g, o_t, False) * scale
    b_dq += tl.dot(b_dA.to(b_k.dtype), b_k, input_precision=PREC)
    b_dk += tl.dot(tl.trans(b_dA).to(b_q.dtype), b_q, input_precision=PREC)
    tl.store(dq + p_tk, b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + p_tk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    if STORE_DG:
        b_dG = tl.sum(b_q.to(tl.float32) * b_dq - b_k.to(tl.float32) * b_dk, axis=1)   # db_r = Σ_d (q dq − k dk)
        b_dg = reverse_cumsum(b_dG) + b_dgamma
        tl.store(dg + part + token_base(bos, i_h, H, 1) + t * H, b_dg, mask=m_t)


def total_gate(g, g_gamma, q) -> torch.Tensor:
    """The scalar log-gate the kernels read, ``[B, T, H]`` float32: g, g_gamma (broadcast over batch and tokens), or
    their sum (zeros with neither). Invalid gates become NaN in the cumsum kernel; before the sum, g_gamma (H
    values) and, when both are given, g are made NaN here, so an invalid one cannot hide in a valid sum
    (0.05 - 0.1)."""
    B, T, H, _ = q.shape
    g_total = torch.zeros(B, T, H, dtype=torch.float32, device=q.device)
    if g is not None:
        g_total = g_total + (g if g_gamma is None else invalid_to_nan(g))
    if g_gamma is not None:
        g_total = g_total + invalid_to_nan(g_gamma.float())
    return g_total


def simple_forward(q, k, v, g_total, h0, scale, output_final_state, chunk_size, states_in_fp32, varlen=None):
    """The forward on contiguous inputs and the total gate: ``(o, final state or None, b)``, b (its chunk-local
    cumulative sums, float32) kept for the backward."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    b = chunk_local_cumsum(g_total, chunk_size, varlen)
    h, ht = chunk_state_fwd(k, v, b, h0, output_final_state, chunk_size, varlen, states_in_fp32=states_in_fp32)
    o = torch.empty_like(v, dtype=q.dtype)
    grid = lambda meta: (cdiv(V, meta["BV"]), num_chunks(T, chunk_size, varlen), B * H)
    simple_output_kernel[grid](q, k, v, b, h, o, scale=scale, T=T, H=H,
                               K=K, V=V, C=chunk_size, BK=min(specs.SIMPLE_OUTPUT_BLOCK_K, block(K)),
                               PREC=dot_precision(q), **varlen_args(varlen))
    return o, ht, b


def simple_backward(q, k, v, b, h0, do, dht, scale, chunk_size, store_dg, varlen=None):
    """The backward on contiguous inputs: ``(dq, dk, dv, dg, dh0)``, dg the total gate's gradient ``[B, T, H]``
    float32 (None unless ``store_dg``)."""
    C = chunk_size
    B, T, H, K = q.shape
    V = v.shape[-1]
    h, _ = chunk_state_fwd(k, v, b, h0, False, C, varlen, states_in_fp32=True)  # dq, dk read it: float32
    dh, dh0 = chunk_state_bwd(q, b, do, dht, scale, h0 is not None, C, varlen)
    meta = {"T": T, "H": H, "K": K, "V": V, "C": C,
            "PREC": dot_precision(q), **varlen_args(varlen)}
    dv = torch.empty_like(do, dtype=v.dtype)
    grid = lambda m: (cdiv(V, m["BV"]), num_chunks(T, C, varlen), B * H)
    simple_bwd_dv_kernel[grid](q, k, b, dh, do, dv, scale=scale, BK=min(64, block(K)), **meta)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dg = dg_partials(B, T, H, K, q.device) if store_dg else None
    launched = {}

    def grid(m):  # called for every launch: the last one is the launch whose partials count
        launched["BK"] = m["BK"]
        return cdiv(K, m["BK"]), num_chunks(T, C, varlen), B * H

    simple_bwd_dqkg_kernel[grid](q, k, v, b, h, dh, do, dq, dk, dg, scale=scale, B=B,
                                 BV=min(64, block(V)), STORE_DG=store_dg, **meta)
    dg = dg[: cdiv(K, launched["BK"])].sum(0) if store_dg else None
    return dq, dk, dv, dg, dh0


class ChunkSimpleGLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, g_gamma, scale, initial_state, output_final_state, chunk_size, varlen=None,
                states_in_fp32=False):
        q, k, v = (x.contiguous() for x in (q, k, v))
        g_total = total_gate(g, None if g_gamma is None else g_gamma.detach(), q)
        h0 = None if initial_state is None else initial_state.contiguous()
        o, ht, b = simple_forward(q, k, v, g_total, h0, scale, output_final_state, chunk_size, states_in_fp32,
                                  varlen)
        ctx.save_for_backward(q, k, v, b, h0)
        ctx.scale, ctx.chunk_size, ctx.varlen = scale, chunk_size, varlen
        ctx.gate_dtypes = tuple(None if x is None else x.dtype for x in (g, g_gamma))
        return o, ht

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dht):
        q, k, v, b, h0 = ctx.saved_tensors
        dht = None if dht is None else dht.contiguous()
        store_dg = ctx.needs_input_grad[3] or ctx.needs_input_grad[4]
        dq, dk, dv, dg, dh0 = simple_backward(q, k, v, b, h0, do.contiguous(), dht, ctx.scale, ctx.chunk_size,
                                              store_dg, ctx.varlen)
        g_dtype, gamma_dtype = ctx.gate_dtypes
        dg_g = dg.to(g_dtype) if ctx.needs_input_grad[3] else None
        dg_gamma = dg.sum((0, 1)).to(gamma_dtype) if ctx.needs_input_grad[4] else None
        return dq, dk, dv, dg_g, dg_gamma, None, dh0, None, None, None, None


def _op_backward(q, k, v, g_total, h0, ht, b, do, dht, scale, chunk_size, states_in_fp32, varlen=None):
    """:func:`simple_backward` as the custom operator calls it: the total gate's gradient always (autograd then
    takes g's and g_gamma's from it)."""
    return simple_backward(q, k, v, b, h0, do, dht, scale, chunk_size, True, varlen)


ChunkSimpleGLAOp = FamilyOp("chunk_simple_gla", simple_forward, _op_backward, option_types=(int, bool),
                            residuals=lambda q, k, v, g_total, *options: (torch.empty_like(g_total),))
"""gla_ref::chunk_simple_gla_fwd/_bwd, on the total gate (:func:`total_gate`): what torch.compile traces."""


def dg_partials(B, T, H, K, device) -> torch.Tensor:
    """Room for one float32 partial of dg ``[B, T, H]`` per key block, for the smallest BK of the configs.

    Only the rows of the config that ran last are summed (its block size is read by the grid
    function, called last for the launch that counts): while autotuning, Triton launches every
    config on the same buffer, and a smaller BK leaves rows that the chosen one never overwrites
    (on an H200 they made the bf16 dg wrong by 57 % at K = 100)."""
    return torch.empty(cdiv(K, 32), B, T, H, dtype=torch.float32, device=device)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, *, scale=None, initial_state=None,
                     output_final_state=False, chunk_size=64, cu_seqlens=None, states_in_fp32=False):
    """Simple GLA (scalar gates), chunkwise with materialised states (Triton; differentiable).

    q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; ``g`` ``[B, T, H]`` data-dependent log-gates (≤ 0) or
    None; ``g_gamma`` ``[H]`` a constant log-decay per head (≤ 0) or None; both may be given (they
    add) and with neither it is plain causal linear attention. ``initial_state`` ``[B, H, K, V]``
    float32 or None; ``chunk_size`` in 16/32/64; ``cu_seqlens`` None or int32/int64 ``[N + 1]`` offsets
    of a packed batch (B = 1, states ``[N, H, K, V]``). Dtypes, packed batches and the returned
    ``(o, final_state)`` are as in :func:`gla_ref.triton.chunk.chunk_gla`. Gradients flow to q, k,
    v, g, g_gamma (the gate gradient summed over batch and tokens) and initial_state. Valid g and
    g_gamma are finite and ≤ 0: an invalid value (NaN, > 0, or -inf, a hard reset: split the
    sequences with cu_seqlens) makes o and the final state NaN, or, under
    ``gla_ref.device.debug(True)``, raises a ValueError naming its position. g_gamma, though tiny,
    is not checked on the host without debug (a device sync on every call): it follows g's NaN rule.
    ``states_in_fp32`` (bool): the forward's chunk states in float32 instead of q's dtype, as in
    :func:`gla_ref.triton.chunk.chunk_gla` (o is the same either way; the default halves their bytes
    for bf16/fp16 inputs).
    """
    chunk_size = check_chunk_size(chunk_size)
    dims, varlen = prepare_packed(q, k, v, g, initial_state, gate_ranks=(None, 3), cu_seqlens=cu_seqlens,
                                  chunk_size=chunk_size)
    if g_gamma is not None:
        _check_g_gamma(g_gamma, q, dims.H)
    output_final_state = check_flag("output_final_state", output_final_state)
    states_in_fp32 = check_flag("states_in_fp32", states_in_fp32)
    if torch.compiler.is_compiling():  # the custom operators; the gates' sum traced, so autograd splits dg
        return ChunkSimpleGLAOp.apply(q, k, v, total_gate(g, g_gamma, q), initial_state, check_scale(scale, dims.K),
                                      output_final_state, (chunk_size, states_in_fp32), varlen)
    return ChunkSimpleGLAFunction.apply(q, k, v, g, g_gamma, check_scale(scale, dims.K),
                                        initial_state, output_final_state, chunk_size, varlen, states_in_fp32)


def _check_g_gamma(g_gamma, q, H: int) -> None:
    """g_gamma: a float16/bfloat16/float32 tensor ``[H]`` on q's device (values under debug)."""
    if not isinstance(g_gamma, torch.Tensor):
        raise TypeError(f"g_gamma must be a torch.Tensor or None, got {type(g_gamma).__name__}")
    if tuple(g_gamma.shape) != (H,):
        raise ValueError(f"g_gamma must have shape [H] = [{H}], got {tuple(g_gamma.shape)}")
    if not g_gamma.is_floating_point() or g_gamma.dtype == torch.float64:
        raise TypeError(f"g_gamma must be float16, bfloat16 or float32, got {g_gamma.dtype}")
    if g_gamma.device != q.device:
        raise ValueError(f"g_gamma is on {g_gamma.device} but q is on {q.device}")
    if torch.compiler.is_compiling():  # traced: the operator's launch checks read g_gamma's sum
        return
    if device.triton_interpret():
        refuse_interpreted_bf16({"g_gamma": g_gamma})
    if device.is_debug():
        check_values({"g_gamma": g_gamma})
