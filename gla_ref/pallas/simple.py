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
from gla_ref.pallas.chunk import check_head_dims, check_options, check_values, make_plan, run, valid_gate

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
        g: scalar log-gates ``[B, T, H]`` (finite, ≤ 0), or None.
        g_gamma: one constant log-decay per head ``[H]`` (finite, ≤ 0), or None. As in
            :func:`gla_ref.triton.chunk_simple_gla`, both may be given (they add, each checked
            before the sum) and with neither it is plain causal linear attention.
            An invalid value (NaN, > 0, -inf) of either makes o and the final state NaN; under
            ``gla_ref.device.debug(True)``, outside jit, a ValueError naming its position.
        mode: ``"auto"`` (fused without initial/final state, else non-fused), ``"fused"``, ``"chunk"``.
        scale, initial_state, output_final_state, chunk_size, launcher, interpret: as in chunk_gla, except
            that ``launcher=None`` on a Hopper GPU keeps the Triton backend: with these gates Mosaic GPU
            took 1.2-1.7x its time on the H200 (:func:`gla_ref.pallas.chunk.make_plan`).

    Returns:
        ``(o, final_state)``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    dims = check_inputs(q, k, v, g, initial_state, gate_ranks=(None, 3))
    check_head_dims(dims.K, dims.V)
    if g_gamma is not None:
        _check_g_gamma(g_gamma, dims.H)
    scale, chunk_size, output_final_state = check_options(q, k, v, scale, chunk_size, output_final_state)
    check_values(q=q, k=k, v=v, g=g, g_gamma=g_gamma, initial_state=initial_state)
    fused = mode == "fused" or (mode == "auto" and initial_state is None and not output_final_state)
    plan = make_plan(launcher, interpret, chunk_size=chunk_size, scale=scale, K=dims.K, fused=fused,
                     want_final=output_final_state, dtype=q.dtype, scalar_gate=True)
    return run(q, k, v, _scalar_gate(g, g_gamma, dims)[..., None], initial_state, plan)


def _scalar_gate(g, g_gamma, dims):
    """The per-token log-gate the kernels read, ``[B, T, H]`` float32: g, g_gamma broadcast over
    tokens (autodiff then sums its gradient over them), their sum, or zeros (no decay). When both are
    given each is made NaN where invalid before the sum, so a positive g cannot hide in a valid total."""
    if g_gamma is None:
        return jnp.zeros((dims.B, dims.T, dims.H), jnp.float32) if g is None else g
    gamma = jnp.broadcast_to(g_gamma.astype(jnp.float32)[None, None, :], (dims.B, dims.T, dims.H))
    return gamma if g is None else valid_gate(g.astype(jnp.float32)) + valid_gate(gamma)
