"""``chunk_simple_gla``: GLA with one gate per token and head (scalar ``g``) or per head
(constant ``g_gamma``, e.g. ALiBi slopes as in RetNet-style models).

A scalar gate makes the intra-chunk decay a ``[c, c]`` matrix ``e^{b_i − b_j}``, so the diagonal
tiles are plain matmuls; the rest is the chunk math of GLA with a gate of width 1. As in the
RFC's simple-GLA path, ``mode="auto"`` takes the fused kernel when there is neither an initial
state nor a requested final state, and the non-fused one otherwise. Unlike a forward-only
decay, ``g_gamma`` gets its true gradient: the gate gradient summed over every batch and position.
"""

from __future__ import annotations

import jax.numpy as jnp

from gla_ref._validate import check_inputs, dtype_name
from gla_ref.pallas.chunk import check_head_dims, check_options, check_values, make_plan, run

__all__ = ["chunk_simple_gla"]

MODES = ("auto", "fused", "chunk")


def _check_g_gamma(g_gamma, H):
    if len(g_gamma.shape) != 1 or g_gamma.shape[0] != H:
        raise ValueError(f"g_gamma must have shape [H] = ({H},), got {tuple(g_gamma.shape)}")
    if dtype_name(g_gamma) not in ("float16", "bfloat16", "float32", "float64"):
        raise TypeError(f"g_gamma must have a floating dtype, got {dtype_name(g_gamma)}")


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, *, scale=None, initial_state=None,
                     output_final_state=False, chunk_size=64, mode="auto", launcher=None,
                     interpret=None):
    """Simple GLA with Pallas kernels.

    Args:
        q, k, v: as in :func:`gla_ref.pallas.chunk_gla`.
        g: scalar log-gates ``[B, T, H]`` (finite, ≤ 0), or
        g_gamma: one constant log-decay per head ``[H]`` (finite, ≤ 0); exactly one of the two.
            An invalid value (NaN, > 0, -inf) of either makes o and the final state NaN; under
            ``gla_ref.device.debug(True)``, outside jit, a ValueError naming its position.
        mode: ``"auto"`` (fused without initial/final state, else non-fused), ``"fused"``, ``"chunk"``.
        scale, initial_state, output_final_state, chunk_size, launcher, interpret: as in chunk_gla.

    Returns:
        ``(o, final_state)``.
    """
    if (g is None) == (g_gamma is None):
        raise ValueError("pass exactly one of g ([B, T, H] log-gates) and g_gamma ([H] log-decays)")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    dims = check_inputs(q, k, v, g, initial_state, gate_ranks=(3,) if g is not None else (None,))
    check_head_dims(dims.K, dims.V)
    if g_gamma is not None:
        _check_g_gamma(g_gamma, dims.H)
    scale, chunk_size, output_final_state = check_options(q, k, v, scale, chunk_size, output_final_state)
    check_values(q=q, k=k, v=v, g=g, g_gamma=g_gamma, initial_state=initial_state)
    fused = mode == "fused" or (mode == "auto" and initial_state is None and not output_final_state)
    plan = make_plan(launcher, interpret, chunk=chunk_size, scale=scale, K=dims.K, fused=fused,
                     want_final=output_final_state)
    if g is None:  # the same decay at every position; autodiff sums its gradient over them
        g = jnp.broadcast_to(g_gamma.astype(jnp.float32)[None, None, :], (dims.B, dims.T, dims.H))
    return run(q, k, v, g[..., None], initial_state, plan)
