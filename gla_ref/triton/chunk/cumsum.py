"""Step 1 of chunk GLA: chunk-local cumulative log-gates in float32.

For a chunk of C tokens (0-based rows i = 0..C−1), ``b[i] = Σ_{t ≤ i} g_t`` with the sum
restarted at the chunk start: log Λ of book/notation.md (the log of the paper's cumulative gate,
taken relative to the chunk; not Γ, which is the keys' decay to the chunk end). b is ≤ 0 and decreasing inside a
chunk, so ``b[i] − b[j]`` is ≤ 0 whenever i ≥ j: every later step exponentiates only such
differences. The last row ``b[C−1] = log γ`` is the log-decay of the whole chunk.

GLA's forward (:func:`chunk_gates_and_operands`, ``DECAY``) also writes, from the same tile, the two
operands its state and output kernels multiply, in q's dtype (the dtype those kernels round them to
for their matmuls, so they get the same bits as if they formed them themselves):

    kt = K ⊙ Γ = K ⊙ exp(b_last − b),        qt = scale · Q ⊙ Λ = scale · Q ⊙ exp(b),

with b_last the chunk's last real row (exponents ≤ 0). The state kernel then reads kt and one b
row per chunk instead of k and the float32 b tile, and the output kernel qt instead of q and b.

Grid ``(⌈D/BD⌉, ⌈T/C⌉, B·H)``: a program owns one chunk's ``C × BD`` gate tile, reads g once and
writes b once (float32); with ``DECAY`` it also reads the matching tiles of q and k and writes qt
and kt once (2·itemsize more bytes read and written an element). The same kernel serves the GLA gate
``[B, T, H, K]`` and the scalar gate ``[B, T, H]`` (D = 1, no ``DECAY``). Packed batch (``varlen``):
grid ``(⌈D/BD⌉, NT, H)`` over the NT chunks of all sequences, each program reading its row of the
chunk table (8 bytes) and cu_seqlens (16 bytes); a chunk never crosses a sequence end, so b
restarts at every sequence's first token.

This is the one kernel of chunk GLA (and of chunk_simple_gla) that reads g, so it is where an
invalid log-gate (NaN, > 0, -inf; :mod:`gla_ref._validate`) becomes NaN
(:func:`gla_ref.triton.common.gates.valid_gate`): every later step then carries it to o, the states and
the gradients, at no extra traffic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref import specs
from gla_ref.triton.common.host import block, cdiv, num_chunks, varlen_args
from gla_ref.triton.common.gates import valid_gate
from gla_ref.triton.common.launch_cache import cache_launches
from gla_ref.triton.common.tiles import program_chunk, token_base


@cache_launches
@triton.jit
def chunk_cumsum_kernel(g, b, q, k, qt, kt, scale, cu_seqlens, chunk_indices, T, H: tl.constexpr, D: tl.constexpr,
                        C: tl.constexpr, BD: tl.constexpr, DECAY: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_d, i_t, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    i_n, bos, T = program_chunk(i_t, i_b, T, cu_seqlens, chunk_indices, IS_VARLEN)
    t = i_n * C + tl.arange(0, C)
    o_d = i_d * BD + tl.arange(0, BD)
    offs = token_base(bos, i_h, H, D) + t[:, None] * (H * D) + o_d[None, :]
    mask = (t < T)[:, None] & (o_d < D)[None, :]
    b_g = valid_gate(tl.load(g + offs, mask=mask, other=0.0).to(tl.float32))  # invalid gates: NaN
    b_g = tl.cumsum(b_g, axis=0)
    tl.store(b + offs, b_g, mask=mask)
    if DECAY:
        t_last = tl.minimum(i_n * C + C, T) - 1
        g_last = tl.sum(tl.where((t == t_last)[:, None], b_g, 0.0), axis=0)  # b's last real row, exactly
        b_q = tl.load(q + offs, mask=mask, other=0.0)
        b_k = tl.load(k + offs, mask=mask, other=0.0)
        tl.store(qt + offs, (b_q * (tl.exp(b_g) * scale)).to(qt.dtype.element_ty), mask=mask)
        tl.store(kt + offs, (b_k * tl.exp(g_last[None, :] - b_g)).to(kt.dtype.element_ty), mask=mask)


def chunk_local_cumsum(g: torch.Tensor, chunk_size: int, varlen=None) -> torch.Tensor:
    """b = log Λ: the cumulative sum of the log-gate ``g`` restarted at every chunk, in float32.

    ``g`` is ``[B, T, H, K]`` (GLA) or ``[B, T, H]`` (scalar gate), contiguous; the result has its shape.
    ``varlen`` (:class:`gla_ref.triton.common.host.Varlen`): chunks of each packed sequence, or None.
    """
    b = torch.empty(g.shape, dtype=torch.float32, device=g.device)
    _launch(g, b, None, None, None, None, 1.0, chunk_size, varlen)
    return b


def chunk_gates_and_operands(q, k, g, scale: float, chunk_size: int, varlen=None):
    """``(b, qt, kt)``: b as :func:`chunk_local_cumsum` gives it (to float32 rounding: the compiled kernels
    may sum a chunk in another order) and the decayed operands ``qt = scale·Q ⊙ Λ`` and ``kt = K ⊙ Γ``
    ``[B, T, H, K]`` in q's dtype, rounded as the output and state kernels round them for their matmuls.
    q, k, g ``[B, T, H, K]`` contiguous; ``varlen``: chunks of each packed sequence, or None."""
    b = torch.empty(g.shape, dtype=torch.float32, device=g.device)
    qt, kt = torch.empty_like(q), torch.empty_like(k)
    _launch(g, b, q, k, qt, kt, scale, chunk_size, varlen)
    return b, qt, kt


def _launch(g, b, q, k, qt, kt, scale, chunk_size, varlen):
    """``chunk_cumsum_kernel`` over every chunk and ``BD``-column block of the gate; writes qt, kt when q is given."""
    B, T, H = g.shape[:3]
    D = g.shape[3] if g.dim() == 4 else 1
    BD = min(specs.CUMSUM_BLOCK_D, block(D, least=1))
    grid = (cdiv(D, BD), num_chunks(T, chunk_size, varlen), B * H)
    chunk_cumsum_kernel[grid](g, b, q, k, qt, kt, scale, T=T, H=H, D=D, C=chunk_size, BD=BD, DECAY=q is not None,
                              **varlen_args(varlen))
