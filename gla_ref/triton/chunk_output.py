"""Step 5 of chunk GLA: the output of each chunk from its entering state and its matrix A.

    O_n = scale · (Q_n ⊙ exp Γ_n) S_n  +  (A_n ⊙ M) V_n

The first term is the inter-chunk part (exponent Γ ≤ 0: the reference row is the chunk start,
where S_n was taken); the second is the intra-chunk part, with A from :mod:`chunk_intra` (scale
included) and M the causal mask, applied again with tl.where.

Grid ``(⌈V/BV⌉, ⌈T/C⌉, B·H)``: a program owns one chunk's ``C × BV`` tile of O and loops over K
blocks. HBM: q, Γ, A, the ``K × BV`` slice of S_n, the ``C × BV`` tile of V read; O written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref.triton._common import autotune_configs, block
from gla_ref.triton.chunk_state import _precision, prune_blocks


def _configs():
    return autotune_configs([triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                             for bv, w, s in ((32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 8, 2), (64, 8, 2))])


@triton.autotune(configs=_configs(), key=["K", "V", "T_BUCKET", "C"],
                 prune_configs_by=prune_blocks(BV="V"))
@triton.jit
def chunk_output_kernel(q, v, gc, h, A, o, scale, T, T_BUCKET, H: tl.constexpr,
                        K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                        BV: tl.constexpr, PREC: tl.constexpr):
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, C)
    o_t = tl.arange(0, C)
    t = i_n * C + o_t
    m_t = t < T
    t_c = tl.minimum(t, T - 1)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    base_k = (i_b.to(tl.int64) * T * H + i_h) * K
    base_v = (i_b.to(tl.int64) * T * H + i_h) * V
    p_h = h + (i_bh.to(tl.int64) * NT + i_n) * K * V

    b_o = tl.zeros([C, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(q + base_k + t[:, None] * (H * K) + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_g = tl.load(gc + base_k + t_c[:, None] * (H * K) + o_k[None, :], mask=m_k[None, :], other=0.0)
        b_h = tl.load(p_h + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_qt = (b_q * tl.exp(b_g)).to(b_q.dtype)
        b_o += tl.dot(b_qt, b_h.to(b_q.dtype), input_precision=PREC)

    p_A = A + (i_b.to(tl.int64) * T * H + i_h) * C + t[:, None] * (H * C) + o_t[None, :]
    b_A = tl.load(p_A, mask=m_t[:, None], other=0.0)
    b_A = tl.where(o_t[:, None] >= o_t[None, :], b_A, 0.0)
    b_v = tl.load(v + base_v + t[:, None] * (H * V) + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    b_o = b_o * scale + tl.dot(b_A.to(b_v.dtype), b_v, input_precision=PREC)
    tl.store(o + base_v + t[:, None] * (H * V) + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


def chunk_output(q, v, gc, h, A, scale: float, chunk_size: int) -> torch.Tensor:
    """O ``[B, T, H, V]`` in q's dtype."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.empty(B, T, H, V, dtype=q.dtype, device=q.device)
    grid = lambda meta: (triton.cdiv(V, meta["BV"]), triton.cdiv(T, chunk_size), B * H)
    chunk_output_kernel[grid](q, v, gc, h, A, o, scale, T, T_BUCKET=triton.next_power_of_2(T), H=H,
                              K=K, V=V, C=chunk_size, BK=min(64, block(K)), PREC=_precision(q))
    return o
