"""The first GLA forward in Triton ("chunked fuse", chunks of 16): a forward-only teaching artefact.

The original implementation that came with the GLA paper ran its forward in five steps, four
Triton kernels and a PyTorch sum. Each step is a function here, callable on its own so that a
chapter can run the pipeline stage by stage and check what passes between the stages:

====  =================================  ==================================================
step  original                           here
====  =================================  ==================================================
1     ``fwd_decay_cumsum``               :func:`historical_decay_cumsum`  (b, log₂, float32)
2     ``prepare_qg_kg``                  :func:`historical_prepare_qg_kg` (q_g, k_g)
3     ``fused_chunk_gla_fwd_kernel``     :func:`historical_inter_chunk`   (O_inter, S_T)
4     ``fwd_inner_chunk``                :func:`historical_intra_chunk`   (A)
5     the combine in PyTorch             :func:`historical_combine`       (O)
====  =================================  ==================================================

:func:`fused_chunk_gla_historical` runs the five in order. What the modern kernels
(:func:`gla_ref.triton.chunk_gla`, :func:`gla_ref.triton.fused_chunk_gla`) changed:

* natural-log gates and ``exp`` throughout, instead of a conversion to ``log₂`` for ``exp2``;
* no decayed copies of q and k in HBM: the decay is applied to tiles in registers, so step 2's
  extra write and read of q and k are gone;
* chunks of 64 with secondary chunking into sub-chunks of 16 (paper §4.3): only the diagonal
  sub-chunk tiles are summed in float32, the rest are tensor-core matmuls — instead of a fixed chunk
  of 16 whose whole intra-chunk part avoids the tensor cores;
* ``chunk_gla`` materialises the state entering every chunk, so everything but one state recurrence
  is parallel over chunks, where step 3 walks the whole sequence inside each program;
* a backward: both modern kernels are autograd functions with gradients for q, k, v, g and h0.

Forward only. This module has no backward, and it refuses to pretend otherwise: with gradient
mode on, an input that requires grad is a ValueError (step 5 alone would silently give v a partial
gradient). Call it under ``torch.no_grad()``; its outputs never require grad. bfloat16 inputs run
on a GPU only: on a CPU, Triton's interpreter computes bf16 matmuls wrongly, so every step refuses
them there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gla_ref import device, specs
from gla_ref._validate import check_flag, check_gate_values, check_scale
from gla_ref.triton.common.host import (
    MAX_K,
    MAX_V,
    block,
    check_values,
    prepare,
    refuse_interpreted_bf16,
)
from gla_ref.teaching.historical.decay_cumsum import launch_decay_cumsum
from gla_ref.teaching.historical.fused_chunk import launch_fused_chunk
from gla_ref.teaching.historical.inner_chunk import launch_inner_chunk
from gla_ref.teaching.historical.prepare_qg_kg import launch_prepare_qg_kg

__all__ = ["CHUNK", "fused_chunk_gla_historical", "historical_combine", "historical_decay_cumsum",
           "historical_inter_chunk", "historical_intra_chunk", "historical_prepare_qg_kg"]

CHUNK = specs.HISTORICAL_CHUNK
"""C, the chunk size: fixed, as in the original (tl.dot's smallest tile)."""

MAX_BLOCK = specs.HISTORICAL_MAX_BLOCK
"""BK and BV are at most 64, as in the original: larger K or V is split over programs."""

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _blocks(K: int, V: int) -> tuple[int, int]:
    """(BK, BV): powers of two covering K and V, at most 64 (masks handle the rest)."""
    return min(MAX_BLOCK, block(K)), min(MAX_BLOCK, block(V))


def _forward_only(**tensors) -> None:
    """No backward exists: an input asking for gradients is an error, not a silent detach."""
    if not torch.is_grad_enabled():
        return
    for name, x in tensors.items():
        if isinstance(x, torch.Tensor) and x.requires_grad:
            raise ValueError(f"{name} requires grad, but the historical GLA forward has no backward: "
                             "call it under torch.no_grad(), or train with gla_ref.triton.fused_chunk_gla")


def _lead(name: str, x, max_dim: int = MAX_K) -> tuple:
    """The first input of a stage: a ``[B, T, H, D]`` tensor the kernels can read, D at most ``max_dim``
    (MAX_K for q, k, g and their copies, MAX_V for v); returns its shape."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4 or x.shape[1] < 1:
        raise ValueError(f"{name} must have shape [B, T, H, D] with T >= 1, got {tuple(x.shape)}")
    if x.shape[-1] > max_dim:
        raise ValueError(f"{name}: head dim {x.shape[-1]} must be at most {max_dim} for this kernel")
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
    if x.device.type != "cuda" and not device.triton_interpret():
        raise ValueError(f"{name} is on {x.device}: Triton kernels need CUDA tensors when a GPU is present")
    if device.triton_interpret():
        refuse_interpreted_bf16({name: x})
    return tuple(x.shape)


def _like(name: str, x, shape: tuple, dtypes: tuple, lead: torch.Tensor) -> None:
    """``x`` has the expected shape (spelled out in the message), one of ``dtypes``, and lead's device."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(str(d)[6:] for d in dtypes)}, got {x.dtype}")
    if x.device != lead.device:
        raise ValueError(f"{name} is on {x.device} but the first input is on {lead.device}")


def _check_b(b) -> None:
    """b (log₂ cumulative gate) is finite and ≤ 0, like a log-gate: a device sync, so only in debug mode."""
    if device.is_debug():
        check_gate_values("b", b, what="cumulative log2-gates <= 0 (finite)", advice=False)


def _check_qkb(q, k, b, scale):
    """Checks of the stages that take (q, k, b): shapes, dtypes, device, no autograd, b in debug mode;
    returns q's shape and the resolved scale."""
    shape = _lead("q", q)
    _like("k", k, shape, (q.dtype,), q)
    _like("b", b, shape, (torch.float32,), q)
    scale = check_scale(scale, shape[-1])
    _forward_only(q=q, k=k, b=b)
    _check_b(b)
    return shape, scale


# ----------------------------------------------------------------------------- the five steps

def historical_decay_cumsum(g: torch.Tensor) -> torch.Tensor:
    """Step 1, mirrors ``fwd_decay_cumsum``: chunk-local cumulative log-gates in base 2.

    Args:
        g: natural-log forget gates ``[B, T, H, K]`` (finite, ≤ 0; float32, float16 or bfloat16).
            An invalid gate (NaN, > 0, -inf) becomes NaN in b (a ValueError under debug).

    Returns:
        b ``[B, T, H, K]`` float32: ``b[t] = Σ g_s / ln 2`` over the tokens s ≤ t of t's chunk of 16,
        so ``2^b[t]`` is the decay from the chunk start through token t.
    """
    _lead("g", g)
    _forward_only(g=g)
    if device.is_debug():
        check_values({"g": g})
    return launch_decay_cumsum(g.contiguous(), CHUNK, _blocks(g.shape[-1], 1)[0])


def historical_prepare_qg_kg(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor, *, scale=None):
    """Step 2, mirrors ``prepare_qg_kg``: decayed copies ``q_g = scale·q ⊙ 2^b``, ``k_g = k ⊙ 2^(b_last − b)``.

    ``b_last`` is b at the last token of each chunk of 16 (the last real token in a short final
    chunk), so both factors are ≤ 1.

    Args:
        q, k: ``[B, T, H, K]`` (float32, float16 or bfloat16, one dtype).
        b: step 1's ``[B, T, H, K]`` float32 log₂ cumulative gate.
        scale: multiplies q; default ``K ** -0.5``.

    Returns:
        ``(q_g, k_g)``, both ``[B, T, H, K]`` in q's dtype.
    """
    shape, scale = _check_qkb(q, k, b, scale)
    return launch_prepare_qg_kg(q.contiguous(), k.contiguous(), b.contiguous(), scale, CHUNK,
                                _blocks(shape[-1], 1)[0])


def historical_inter_chunk(q_g: torch.Tensor, k_g: torch.Tensor, v: torch.Tensor, b: torch.Tensor, *,
                           initial_state=None, output_final_state=False):
    """Step 3, mirrors ``fused_chunk_gla_fwd_kernel``: what the state entering each chunk contributes.

    One program per (head of a batch, key block, value block) carries its ``BK × BV`` block of the
    state across all chunks on chip: ``O_inter = q_g S``, then ``S ← diag(2^b_last) S + k_gᵀ V``.

    Args:
        q_g, k_g: step 2's ``[B, T, H, K]``; v: ``[B, T, H, V]`` in their dtype.
        b: step 1's ``[B, T, H, K]`` float32 (only each chunk's last row is read).
        initial_state: ``[B, H, K, V]`` float32 S_0, or None (zeros).
        output_final_state: also return the float32 state after the last token.

    Returns:
        ``(o_inter, final_state)``: o_inter ``[NK, B, T, H, V]`` float32, one partial per key block
        of 64 (``NK = ⌈K/64⌉``; step 5 sums them); final_state ``[B, H, K, V]`` or None.
    """
    B, T, H, K = _lead("q_g", q_g)
    _like("k_g", k_g, (B, T, H, K), (q_g.dtype,), q_g)
    V = _lead("v", v, MAX_V)[-1]
    _like("v", v, (B, T, H, V), (q_g.dtype,), q_g)
    _like("b", b, (B, T, H, K), (torch.float32,), q_g)
    if initial_state is not None:
        _like("initial_state", initial_state, (B, H, K, V), (torch.float32,), q_g)
    _forward_only(q_g=q_g, k_g=k_g, v=v, b=b, initial_state=initial_state)
    _check_b(b)
    h0 = None if initial_state is None else initial_state.contiguous()
    return launch_fused_chunk(q_g.contiguous(), k_g.contiguous(), v.contiguous(), b.contiguous(), h0,
                              check_flag("output_final_state", output_final_state), CHUNK, *_blocks(K, V))


def historical_intra_chunk(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor, *, scale=None) -> torch.Tensor:
    """Step 4, mirrors ``fwd_inner_chunk``: the causal attention matrix inside each chunk of 16, in float32.

    ``A[i, j] = scale · Σ_d q_id k_jd 2^(b_id − b_jd)`` for j ≤ i (exponents ≤ 0), 0 above the diagonal.

    Args:
        q, k: ``[B, T, H, K]`` (the raw inputs, not step 2's copies).
        b: step 1's ``[B, T, H, K]`` float32 log₂ cumulative gate.
        scale: multiplies q; default ``K ** -0.5``.

    Returns:
        A ``[NK, B, H, N, 16, 16]`` float32 with ``N = ⌈T/16⌉``: one partial per key block of 64
        (step 5 sums them); rows and columns past T are zero.
    """
    shape, scale = _check_qkb(q, k, b, scale)
    return launch_inner_chunk(q.contiguous(), k.contiguous(), b.contiguous(), scale, CHUNK,
                              _blocks(shape[-1], 1)[0])


def historical_combine(o_inter: torch.Tensor, A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Step 5, the original's PyTorch epilogue: ``O = Σ_k O_inter + (Σ_k A) V`` chunk by chunk.

    Args:
        o_inter: step 3's ``[NK, B, T, H, V]`` float32.
        A: step 4's ``[NK', B, H, N, 16, 16]`` float32 (``N = ⌈T/16⌉``).
        v: ``[B, T, H, V]``.

    Returns:
        o ``[B, T, H, V]`` in v's dtype (summed in float32).
    """
    B, T, H, V = _lead("v", v, MAX_V)
    N = -(-T // CHUNK)
    if not isinstance(o_inter, torch.Tensor) or o_inter.dim() != 5:
        raise ValueError(f"o_inter must have shape [NK, B, T, H, V], got {getattr(o_inter, 'shape', None)}")
    if not isinstance(A, torch.Tensor) or A.dim() != 6:
        raise ValueError(f"A must have shape [NK, B, H, N, 16, 16], got {getattr(A, 'shape', None)}")
    _like("o_inter", o_inter, (o_inter.shape[0], B, T, H, V), (torch.float32,), v)
    _like("A", A, (A.shape[0], B, H, N, CHUNK, CHUNK), (torch.float32,), v)
    _forward_only(o_inter=o_inter, A=A, v=v)
    return _combine(o_inter, A, v)


def _combine(o_inter, A, v):
    B, T, H, V = v.shape
    N = A.shape[3]
    # v in chunks, heads first: [B, H, N, 16, V] (padded tokens are zeros)
    v_c = F.pad(v.float(), (0, 0, 0, 0, 0, N * CHUNK - T)).view(B, N, CHUNK, H, V).permute(0, 3, 1, 2, 4)
    o_intra = (A.sum(0) @ v_c).permute(0, 2, 3, 1, 4).reshape(B, N * CHUNK, H, V)[:, :T]
    return (o_inter.sum(0) + o_intra).to(v.dtype)


# ----------------------------------------------------------------------------- the pipeline

def fused_chunk_gla_historical(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False):
    """GLA forward as the first Triton implementation ran it: five steps, chunks of 16, no backward.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; K ≤ 256, V ≤ 4096. float32, float16 or bfloat16 on a
            GPU; float32 or float16 on a CPU (Triton's interpreter computes bf16 wrongly: refused).
        g: natural-log forget gates ``[B, T, H, K]`` (finite, ≤ 0); required (the original was GLA
            only). An invalid gate (NaN, > 0, -inf) makes o and the final state NaN; under
            ``gla_ref.device.debug(True)`` a ValueError naming its position.
        scale: multiplies q; default ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` float32 state S_0, or None (zeros).
        output_final_state: also return the float32 state after the last token.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype; final_state ``[B, H, K, V]`` or None.

    Raises:
        ValueError: with gradient mode on, for an input that requires grad (there is no backward).
    """
    dims = prepare(q, k, v, g, initial_state, gate_ranks=(4,))
    scale = check_scale(scale, dims.K)
    output_final_state = check_flag("output_final_state", output_final_state)
    _forward_only(q=q, k=k, v=v, g=g, initial_state=initial_state)
    q, k, v, g = (x.contiguous() for x in (q, k, v, g))
    h0 = None if initial_state is None else initial_state.contiguous()
    BK, BV = _blocks(dims.K, dims.V)
    b = launch_decay_cumsum(g, CHUNK, BK)                                       # 1
    q_g, k_g = launch_prepare_qg_kg(q, k, b, scale, CHUNK, BK)                  # 2
    o_inter, ht = launch_fused_chunk(q_g, k_g, v, b, h0, output_final_state, CHUNK, BK, BV)  # 3
    A = launch_inner_chunk(q, k, b, scale, CHUNK, BK)                           # 4
    return _combine(o_inter, A, v), ht                                          # 5
