"""Ground truth for every test: the GLA recurrence in plain NumPy float64, token by token.

Written independently of the rest of gla_ref (this module imports nothing from it), so a bug in
the library cannot hide in its own reference.
"""

from __future__ import annotations

import numpy as np


def gate_bthk(g, B, T, H, K):
    """The log-gate as a float64 ``[B, T, H, K]`` array from None, [H], [B,T,H] or [B,T,H,K]."""
    if g is None:
        return np.zeros((B, T, H, K))
    g = np.asarray(g, dtype=np.float64)
    if g.ndim == 1:
        return np.broadcast_to(g[None, None, :, None], (B, T, H, K))
    if g.ndim == 3:
        return np.broadcast_to(g[..., None], (B, T, H, K))
    return g


def recurrence64(q, k, v, g=None, *, scale=None, initial_state=None):
    """``S_t = diag(exp g_t) S_{t-1} + k_tᵀ v_t``, ``o_t = scale · q_t S_t``; returns (o, S_T) in float64."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    alpha = np.exp(gate_bthk(g, B, T, H, K))
    S = np.zeros((B, H, K, V)) if initial_state is None else np.array(initial_state, dtype=np.float64)
    o = np.empty((B, T, H, V))
    for t in range(T):
        S = alpha[:, t, :, :, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        o[:, t] = scale * np.einsum("bhk,bhkv->bhv", q[:, t], S)
    return o, S


def recurrence64_grads(q, k, v, g=None, *, scale=None, initial_state=None, do, dS):
    """Gradients of ``Σ o·do + Σ S_T·dS`` by the recurrence run backwards, in float64.

    Returns ``{"q", "k", "v", "g", "initial_state"}``: dg summed to g's own shape, and None
    for g or initial_state when that input is None.
    """
    q, k, v, do, dS = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do, dS))
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    alpha = np.exp(gate_bthk(g, B, T, H, K))
    S = np.zeros((B, H, K, V)) if initial_state is None else np.array(initial_state, dtype=np.float64)
    states = [S]  # S_0 ... S_T
    for t in range(T):
        S = alpha[:, t, :, :, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        states.append(S)
    dq, dk, dv, dg = (np.zeros_like(x) for x in (q, k, v, alpha))
    dS_t = dS.copy()  # gradient reaching S_t from later tokens and the final state
    for t in reversed(range(T)):
        S_t = states[t + 1]
        dq[:, t] = scale * np.einsum("bhv,bhkv->bhk", do[:, t], S_t)
        dS_t = dS_t + scale * q[:, t, :, :, None] * do[:, t, :, None, :]
        dk[:, t] = np.einsum("bhkv,bhv->bhk", dS_t, v[:, t])
        dv[:, t] = np.einsum("bhkv,bhk->bhv", dS_t, k[:, t])
        # d/d(g_t) of alpha_t ⊙ S_{t-1} is alpha_t · S_{t-1}
        dg[:, t] = alpha[:, t] * np.einsum("bhkv,bhkv->bhk", dS_t, states[t])
        dS_t = alpha[:, t, :, :, None] * dS_t
    if g is not None and np.ndim(g) == 1:
        dg = dg.sum(axis=(0, 1, 3))
    elif g is not None and np.ndim(g) == 3:
        dg = dg.sum(axis=3)
    return {"q": dq, "k": dk, "v": dv, "g": None if g is None else dg,
            "initial_state": None if initial_state is None else dS_t}
