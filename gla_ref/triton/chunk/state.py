"""Step 2 of the chunk GLA forward, the chunk-state recurrence, and step 3 of its backward, the
reverse twin for dh.

Forward (paper Alg. 3, first loop). With b = log Λ the chunk-local cumulative log-gate of a chunk
and b_last = log γ its last row, so that Λ = exp b, Γ = exp(b_last − b), γ = exp b_last
(book/notation.md), and chunk indices 0-based (the chunk at index i is chunk [i+1] of the math):

    S_[0] = h0,      S_[i+1] = diag(γ_{i+1}) S_[i] + (K_[i+1] ⊙ Γ_[i+1])ᵀ V_[i+1]

``h[:, :, i]`` holds S_[i], the state *entering* the chunk at index i, in k's dtype (FLA's choice for
its forward) or, with ``states_in_fp32``, in float32 (the backward's recomputation, which dq and dk
read); the running sum ``b_h`` stays float32 on chip either way, only the stored copy is rounded.
The final state S_[N] is float32.

Backward (Alg. 4, first loop, with Q ⊙ Λ where the paper prints Q ⊙ Γ: chapter 6 checks which is
right). With dS_[N] the cotangent of the final state (zero if none):

    dS_[i] = diag(γ_{i+1}) dS_[i+1] + scale · (Q_[i+1] ⊙ Λ_[i+1])ᵀ dO_[i+1]

``dh[:, :, i]`` holds dS_[i+1], the gradient of the state *leaving* the chunk at index i (what its dk
and dv need); the recurrence ends at dS_[0] = dh0.

Both exponents are ≤ 0: b_last − b (keys against the chunk end) and b (queries against the chunk
start). GLA's forward passes ``decayed=True`` with k replaced by K ⊙ Γ from step 1
(:func:`~gla_ref.triton.chunk.cumsum.chunk_gates_and_operands`, already in k's dtype): the kernel then
reads only the last b row of each chunk (log γ) instead of the float32 b tile, which weighs as much
as its k and v tiles together when BK = BV: fewer bytes for the one loop that waits on its loads.
The backward's recomputation reads k and b.

Grid ``(⌈K/BK⌉, ⌈V/BV⌉, B·H)``: a program owns one ``BK × BV`` block of one head's state and walks
the chunks in order (the only sequential loop of chunk GLA). HBM: k, v (or q, dO) and b read once
(the forward's ``decayed``: K ⊙ Γ, v and one b row per chunk);
one ``BK × BV`` block written per chunk, in h's dtype (2 bytes an element for bf16/fp16 inputs,
4 with ``states_in_fp32``). ``GATE_K`` picks the gate layout: per key
``[B, T, H, K]`` (GLA) or one scalar per token ``[B, T, H]`` (simple GLA).

Packed batch (``varlen``, B = 1, N sequences): grid ``(⌈K/BK⌉, ⌈V/BV⌉, N·H)``, a program walks the
chunks of one sequence, from its own initial state ``h0[n]`` to its own final state ``ht[n]``;
h is ``[1, H, NT, K, V]`` over the NT chunks of all sequences (sequence n's from row
``chunk_offsets[n]``). Extra HBM: four scalars of cu_seqlens and chunk_offsets a program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref import specs
from gla_ref._validate import check_flag
from gla_ref.triton.common.host import autotune, autotune_configs, cdiv, num_chunks, num_sequences
from gla_ref.triton.common.precision import dot_precision
from gla_ref.triton.common.tiles import load_rows, sequence_chunks, token_base, token_bases


def _configs():
    # the configs that won for per-key and scalar gates at the measured head shapes (benchmarks/results/config_timings_nvidia_h200.json),
    # the forward's 32 × 256 for V ≥ 256 (H200, 256 × 512: 0.2 ms off a 17.4 ms step), and two that beat them all with
    # per-key gates (state_configs_nvidia_h200.json: 64 × 128 on 8 warps from K = 128, 0.93–1.00× the old best; 32 × 64
    # at 64 × 64, 0.97×)
    return autotune_configs([triton.Config({"BK": bk, "BV": bv}, num_warps=w, num_stages=s)
                             for bk, bv, w, s in ((64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (32, 256, 8, 2),
                                                  (64, 128, 8, 2), (32, 64, 4, 3))])


def _fwd_configs():
    # The chunk loop is sequential: each step waits for its loads. Measured (benchmarks/results/config_timings_nvidia_h200.json), a
    # 32 × 128 block beat every smaller one by 1.4–2.9× with per-key gates (one k and gate tile serves
    # 128 value columns), 64 × 64 won with scalar gates; the two wider blocks are candidates for large V. A third
    # pipeline stage (loads of the next chunks in flight while this one's matmul runs) then took the forward's
    # decayed path to 0.78–0.96× of those at every head shape (state_configs_nvidia_h200.json), and 32 × 64 the
    # backward's recomputation at 64 × 64 to 0.82× (twice the programs: 256 for 128 heads, on 132 SMs).
    return autotune_configs([triton.Config({"BK": bk, "BV": bv}, num_warps=w, num_stages=s)
                             for bk, bv, w, s in ((*specs.STATE_FWD_BLOCKS, 4, 2), (64, 64, 4, 2), (64, 128, 8, 2),
                                                  (32, 256, 8, 2), (64, 64, 4, 3), (64, 128, 8, 3), (32, 64, 4, 2))])


@triton.jit
def _last_gate_row(b, base_g, t_last, o_k, m_k, HK: tl.constexpr, H: tl.constexpr, GATE_K: tl.constexpr):
    """The last b row of a chunk, log γ (``[BK]`` per key, a scalar for scalar gates)."""
    if GATE_K:
        g_last = tl.load(b + base_g + t_last * HK + o_k, mask=m_k, other=0.0)
    else:
        g_last = tl.load(b + base_g + t_last * H)
    return g_last


@triton.jit
def _chunk_gates(b, base_g, t_c, t_last, o_k, m_k, HK: tl.constexpr, H: tl.constexpr,
                 GATE_K: tl.constexpr):
    """b rows of one chunk and its last row log γ (rows past T repeat the last real row)."""
    if GATE_K:
        b_g = tl.load(b + base_g + t_c[:, None] * HK + o_k[None, :], mask=m_k[None, :], other=0.0)
    else:
        b_g = tl.load(b + base_g + t_c * H)
    return b_g, _last_gate_row(b, base_g, t_last, o_k, m_k, HK, H, GATE_K)


@triton.jit
def _decay(b_h, g_last, GATE_K: tl.constexpr):
    """A state block multiplied by the chunk decay γ = exp(log γ), along its key rows."""
    gamma = tl.exp(g_last)
    if GATE_K:
        gamma = gamma[:, None]
    return b_h * gamma


@triton.jit
def _state_block(i_k, i_v, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Key/value indices of this program's ``BK × BV`` state block, their masks, and offsets in a K × V state."""
    o_k, o_v = i_k * BK + tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    return o_k, o_v, m_k, m_v, m_kv, o_kv


@triton.jit
def _token_bases(bos, i_h, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, GATE_K: tl.constexpr):
    """Offsets of (token row bos, head i_h) in ``[B, T, H, K]``, ``[B, T, H, V]`` and b (per key or scalar)."""
    base_k, base_v = token_bases(bos, i_h, H, K, V)
    base_g = base_k
    if not GATE_K:
        base_g = token_base(bos, i_h, H, 1)
    return base_k, base_v, base_g


@autotune(_fwd_configs(), ["K", "V", "GATE_K", "DECAYED", "IS_VARLEN"], BK="K", BV="V")
@triton.jit
def chunk_state_fwd_kernel(k, v, b, h0, h, ht, cu_seqlens, chunk_offsets, T, H: tl.constexpr,
                           K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                           BV: tl.constexpr, GATE_K: tl.constexpr, DECAYED: tl.constexpr, USE_H0: tl.constexpr,
                           STORE_HT: tl.constexpr, PREC: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    bos, T, first = sequence_chunks(i_b, i_h, T, cu_seqlens, chunk_offsets, H, C, IS_VARLEN)
    NT = tl.cdiv(T, C)
    o_k, o_v, m_k, m_v, m_kv, o_kv = _state_block(i_k, i_v, K, V, BK, BV)
    base_k, base_v, base_g = _token_bases(bos, i_h, H, K, V, GATE_K)
    p_h = h + first * K * V + o_kv

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_bh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.0)
    for i_n in range(NT):
        tl.store(p_h + i_n * K * V, b_h.to(h.dtype.element_ty), mask=m_kv)  # only the stored copy is rounded
        t = i_n * C + tl.arange(0, C)
        m_t = t < T
        t_c, t_last = tl.minimum(t, T - 1), tl.minimum(i_n * C + C, T) - 1
        b_k = load_rows(k + base_k, t, m_t, o_k, m_k, H * K)
        b_v = load_rows(v + base_v, t, m_t, o_v, m_v, H * V)
        if DECAYED:    # k holds K ⊙ Γ already (per-key gates): only the chunk decay γ is read
            g_last = _last_gate_row(b, base_g, t_last, o_k, m_k, H * K, H, GATE_K)
            b_kt = b_k
        else:
            b_g, g_last = _chunk_gates(b, base_g, t_c, t_last, o_k, m_k, H * K, H, GATE_K)
            if GATE_K:
                b_kt = b_k * tl.exp(g_last[None, :] - b_g)
            else:
                b_kt = b_k * tl.exp(g_last - b_g)[:, None]
        b_h = _decay(b_h, g_last, GATE_K)
        b_h += tl.dot(tl.trans(b_kt.to(b_v.dtype)), b_v, input_precision=PREC)
    if STORE_HT:
        tl.store(ht + i_bh.to(tl.int64) * K * V + o_kv, b_h, mask=m_kv)


@autotune(_configs(), ["K", "V", "GATE_K", "IS_VARLEN"], BK="K", BV="V")
@triton.jit
def chunk_state_bwd_kernel(q, b, do, dht, dh, dh0, cu_seqlens, chunk_offsets, scale, T,
                           H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                           BK: tl.constexpr, BV: tl.constexpr, GATE_K: tl.constexpr,
                           USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, PREC: tl.constexpr,
                           IS_VARLEN: tl.constexpr):
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    bos, T, first = sequence_chunks(i_b, i_h, T, cu_seqlens, chunk_offsets, H, C, IS_VARLEN)
    NT = tl.cdiv(T, C)
    o_k, o_v, m_k, m_v, m_kv, o_kv = _state_block(i_k, i_v, K, V, BK, BV)
    base_k, base_v, base_g = _token_bases(bos, i_h, H, K, V, GATE_K)
    p_dh = dh + first * K * V + o_kv

    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += tl.load(dht + i_bh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.0)
    for i_r in range(NT):
        i_n = NT - 1 - i_r
        tl.store(p_dh + i_n * K * V, b_dh, mask=m_kv)
        t = i_n * C + tl.arange(0, C)
        m_t = t < T
        t_c, t_last = tl.minimum(t, T - 1), tl.minimum(i_n * C + C, T) - 1
        b_q = load_rows(q + base_k, t, m_t, o_k, m_k, H * K)
        b_do = load_rows(do + base_v, t, m_t, o_v, m_v, H * V)
        b_g, g_last = _chunk_gates(b, base_g, t_c, t_last, o_k, m_k, H * K, H, GATE_K)
        b_dh = _decay(b_dh, g_last, GATE_K)
        if GATE_K:
            b_qt = b_q * (tl.exp(b_g) * scale)
        else:
            b_qt = b_q * (tl.exp(b_g) * scale)[:, None]
        b_dh += tl.dot(tl.trans(b_qt.to(b_do.dtype)), b_do, input_precision=PREC)
    if STORE_DH0:
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + o_kv, b_dh, mask=m_kv)


def _varlen_kwargs(varlen):
    """The packed-path arguments of the two state kernels (the chunk offsets, not the chunk table)."""
    if varlen is None:
        return dict(cu_seqlens=None, chunk_offsets=None, IS_VARLEN=False)
    return dict(cu_seqlens=varlen.cu_seqlens, chunk_offsets=varlen.chunk_offsets, IS_VARLEN=True)


def chunk_state_fwd(k, v, b, initial_state, output_final_state: bool, chunk_size: int, varlen=None, *,
                    states_in_fp32: bool = False, decayed: bool = False):
    """States entering each chunk ``h [B, H, NT, K, V]`` and the final state ``[N, H, K, V]`` (float32,
    or None). N = B, NT = ⌈T/C⌉; packed (``varlen``, B = 1): N sequences, NT chunks of them all.

    h is stored in k's dtype (half the bytes written here and read by the output kernel, for bf16 or
    fp16 inputs), or in float32 with ``states_in_fp32`` (what the backward recomputes: dq and dk
    read h). The recurrence itself runs in float32 either way. ``decayed``: k is K ⊙ Γ already (per-key
    b only), so only each chunk's last b row is read."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT, N = num_chunks(T, chunk_size, varlen), num_sequences(B, varlen)
    state_dtype = torch.float32 if check_flag("states_in_fp32", states_in_fp32) else k.dtype
    h = torch.empty(B, H, NT, K, V, dtype=state_dtype, device=k.device)
    ht = torch.empty(N, H, K, V, dtype=torch.float32, device=k.device) if output_final_state else None
    grid = lambda meta: (cdiv(K, meta["BK"]), cdiv(V, meta["BV"]), N * H)
    chunk_state_fwd_kernel[grid](
        k, v, b, initial_state, h, ht, T=T, H=H, K=K, V=V,
        C=chunk_size, GATE_K=b.dim() == 4, DECAYED=decayed, USE_H0=initial_state is not None,
        STORE_HT=output_final_state, PREC=dot_precision(k), **_varlen_kwargs(varlen))
    return h, ht


def chunk_state_bwd(q, b, do, dht, scale: float, need_dh0: bool, chunk_size: int, varlen=None):
    """``dh [B, H, NT, K, V]`` (gradient of the state leaving each chunk, float32) and dh0 ``[N, H, K, V]``
    (or None), laid out as in :func:`chunk_state_fwd`."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT, N = num_chunks(T, chunk_size, varlen), num_sequences(B, varlen)
    dh = torch.empty(B, H, NT, K, V, dtype=torch.float32, device=q.device)
    dh0 = torch.empty(N, H, K, V, dtype=torch.float32, device=q.device) if need_dh0 else None
    grid = lambda meta: (cdiv(K, meta["BK"]), cdiv(V, meta["BV"]), N * H)
    chunk_state_bwd_kernel[grid](
        q, b, do, dht, dh, dh0, scale=scale, T=T, H=H, K=K, V=V,
        C=chunk_size, GATE_K=b.dim() == 4, USE_DHT=dht is not None, STORE_DH0=need_dh0,
        PREC=dot_precision(q), **_varlen_kwargs(varlen))
    return dh, dh0
