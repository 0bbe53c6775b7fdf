"""Hand-written backward passes of linear attention and GLA (chapter 6).

Everything here is plain PyTorch in the book's layout: q, k ``[B, T, H, K]``, v and the output
cotangent do ``[B, T, H, V]``, log-gates g ``[B, T, H, K]`` (≤ 0), states ``[B, H, K, V]``. The loss
whose gradients are computed is ``scale·Σ_t ⟨q_t S_t, do_t⟩ + ⟨S_T, dht⟩`` with the recurrence
``S_t = Diag(exp g_t) S_{t-1} + k_tᵀ v_t`` (``dht`` None means no cotangent on the final state).
The functions are teaching code checked against autograd of :mod:`gla_ref.reference.torch`; the fast
backward is :mod:`gla_ref.triton.chunk`.
"""

from __future__ import annotations

import torch

from gla_ref._validate import check_chunk_sizes, check_inputs, check_scale, dtype_name

__all__ = [
    "gate_grad_closed_form",
    "gate_grad_from_states",
    "gla_bwd_chunk",
    "gla_bwd_recurrent",
    "gla_state_grads",
    "gla_states",
    "intra_chunk_dqk_two_level",
    "linear_attention_bwd",
    "reverse_cumsum",
]


# ----------------------------------------------------------------------------- checks and layout

def _check_tensor(name, x, shape, names):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {names}, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {names} = {tuple(shape)}, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {dtype_name(x)}")


def _check_cotangents(dims, do, dht):
    _check_tensor("do", do, (dims.B, dims.T, dims.H, dims.V), "[B, T, H, V]")
    if dht is not None:
        _check_tensor("dht", dht, (dims.B, dims.H, dims.K, dims.V), "[B, H, K, V]")


def _heads_first(x, dtype):
    """``[B, T, H, D]`` → ``[B, H, T, D]`` in the math dtype."""
    return x.transpose(1, 2).to(dtype)


def _chunked(x, C):
    """``[B, H, T, D]`` → ``[B, H, N, C, D]``, zero-padded to N·C tokens (a zero log-gate is α = 1)."""
    B, H, T, D = x.shape
    N = -(-T // C)
    x = torch.nn.functional.pad(x, (0, 0, 0, N * C - T))
    return x.reshape(B, H, N, C, D)


def _unchunk(x, T):
    """``[B, H, N, C, D]`` → ``[B, T, H, D]`` (padding dropped)."""
    B, H, N, C, D = x.shape
    return x.reshape(B, H, N * C, D)[:, :, :T].transpose(1, 2)


def _math_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def reverse_cumsum(x, dim=1):
    """``y_t = Σ_{i ≥ t} x_i`` along ``dim``: the backward of a cumulative sum."""
    return x.flip(dim).cumsum(dim).flip(dim)


# ----------------------------------------------------------------------------- linear attention

def linear_attention_bwd(q, k, v, do, *, scale=None, initial_state=None, dht=None, chunk_size=16,
                         materialize=True):
    """Gradients of (ungated) linear attention by the chunkwise backward of paper Alg. 2.

    Chunks n = 1..N as in book/notation.md: S_[n] is the state at the end of chunk n (S_[0] the
    initial state), chunk n reads S_[n-1], and dS_[n] is the gradient of S_[n],
    ``dS_[n] = dht + scale·Σ_{m>n} Q_[m]ᵀ dO_[m]`` (a reverse recurrence), so per chunk n

        dQ = scale·(dO S_[n-1]ᵀ + (dO Vᵀ ⊙ M) K)
        dK = V dS_[n]ᵀ + scale·(V dOᵀ ⊙ Mᵀ) Q
        dV = K dS_[n] + scale·(Q Kᵀ ⊙ M)ᵀ dO

    and dh0 = dS_[0]. In the code chunks are 0-based: index i is chunk [i+1], ``S[:, :, i]`` is
    S_[i] (entering it) and ``dS[:, :, i]`` is dS_[i+1] (leaving it).
    ``materialize=True`` stores all of them (``[B, H, N, K, V]`` each) and then treats the
    chunks in parallel; ``materialize=False`` keeps one running state: a forward pass for dQ, then a
    reverse pass for dK and dV (the states are recomputed, not stored). Returns
    ``(dq, dk, dv, dh0)`` in q's layout and dtype; dh0 ``[B, H, K, V]`` or None without initial_state.
    """
    dims = check_inputs(q, k, v, None, initial_state, gate_ranks=(None,))
    check_chunk_sizes(chunk_size)
    _check_cotangents(dims, do, dht)
    if not isinstance(materialize, bool):
        raise TypeError(f"materialize must be a bool, got {materialize!r}")
    scale, dt = check_scale(scale, dims.K), _math_dtype(q)
    Q, K, V, dO = (_chunked(_heads_first(x, dt), chunk_size) for x in (q, k, v, do))
    S0 = q.new_zeros(dims.B, dims.H, dims.K, dims.V, dtype=dt) if initial_state is None else initial_state.to(dt)
    dST = torch.zeros_like(S0) if dht is None else dht.to(dt)
    M = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    P = (Q @ K.transpose(-1, -2)).masked_fill(~M, 0.0)     # Q Kᵀ ⊙ M, per chunk
    dP = (dO @ V.transpose(-1, -2)).masked_fill(~M, 0.0)   # dO Vᵀ ⊙ M, per chunk
    if materialize:
        KV, QdO = K.transpose(-1, -2) @ V, Q.transpose(-1, -2) @ dO  # [B, H, N, K, V]
        S = S0[:, :, None] + KV.cumsum(2) - KV                          # S_[n]: entering 0-based chunk n
        dS = dST[:, :, None] + scale * (reverse_cumsum(QdO, 2) - QdO)    # dS_[n+1]: leaving it
        dQ = scale * (dO @ S.transpose(-1, -2) + dP @ K)
        dK = V @ dS.transpose(-1, -2) + scale * dP.transpose(-1, -2) @ Q
        dV = K @ dS + scale * P.transpose(-1, -2) @ dO
        dh0 = dS[:, :, 0] + scale * QdO[:, :, 0]
    else:
        N = Q.shape[2]
        dQ, dK, dV = torch.empty_like(Q), torch.empty_like(K), torch.empty_like(dO)
        S = S0
        for n in range(N):  # forward: dQ needs the state entering the chunk
            dQ[:, :, n] = scale * (dO[:, :, n] @ S.transpose(-1, -2) + dP[:, :, n] @ K[:, :, n])
            S = S + K[:, :, n].transpose(-1, -2) @ V[:, :, n]
        dS = dST
        for n in reversed(range(N)):  # reverse: dK, dV need the gradient of the state leaving it
            dK[:, :, n] = V[:, :, n] @ dS.transpose(-1, -2) + scale * dP[:, :, n].transpose(-1, -2) @ Q[:, :, n]
            dV[:, :, n] = K[:, :, n] @ dS + scale * P[:, :, n].transpose(-1, -2) @ dO[:, :, n]
            dS = dS + scale * Q[:, :, n].transpose(-1, -2) @ dO[:, :, n]
        dh0 = dS
    dq, dk, dv = (_unchunk(x, dims.T).to(q.dtype) for x in (dQ, dK, dV))
    return dq, dk, dv, (None if initial_state is None else dh0.to(initial_state.dtype))


# ----------------------------------------------------------------------------- GLA, token by token

def _check_gla(q, k, v, g, initial_state, do, dht):
    dims = check_inputs(q, k, v, g, initial_state, gate_ranks=(4,))
    _check_cotangents(dims, do, dht)
    return dims


def gla_states(k, v, g, initial_state=None):
    """Every state of the recurrence, ``S_t = Diag(exp g_t) S_{t-1} + k_tᵀ v_t`` for t = 0..T.

    Returns ``[B, T+1, H, K, V]`` (index 0 is the initial state, zeros if None) in float64 for
    float64 inputs, float32 otherwise: the T·K·V tensor the closed-form gate gradient avoids.
    """
    dims = check_inputs(k, k, v, g, initial_state, gate_ranks=(4,))
    dt = _math_dtype(k)
    out = k.new_empty(dims.B, dims.T + 1, dims.H, dims.K, dims.V, dtype=dt)  # written in place: one copy
    out[:, 0] = 0.0 if initial_state is None else initial_state.to(dt)
    for t in range(dims.T):
        decay, kv = g[:, t, :, :, None].to(dt).exp(), k[:, t, :, :, None].to(dt) * v[:, t, :, None, :].to(dt)
        out[:, t + 1] = decay * out[:, t] + kv
    return out


def gla_state_grads(q, g, do, *, scale=None, dht=None):
    """Gradient of every state S_t (t = 1..T) by the reverse recurrence

        dS_T = dht + scale·q_Tᵀ do_T,      dS_{t-1} = Diag(exp g_t) dS_t + scale·q_{t-1}ᵀ do_{t-1}.

    q ``[B, T, H, K]``, g ``[B, T, H, K]``, do ``[B, T, H, V]``, dht ``[B, H, K, V]`` or None.
    Returns ``[B, T, H, K, V]`` (float64 for float64 q, else float32).
    """
    if isinstance(do, torch.Tensor) and isinstance(q, torch.Tensor) and do.dim() == 4:
        _check_tensor("do", do, (*q.shape[:3], do.shape[-1]), "[B, T, H, V]")
    dims = check_inputs(q, q, do, g, None, gate_ranks=(4,))
    _check_cotangents(dims, do, dht)
    scale, dt = check_scale(scale, dims.K), _math_dtype(q)
    out = q.new_empty(dims.B, dims.T, dims.H, dims.K, dims.V, dtype=dt)  # written in place: one copy
    dS = q.new_zeros(dims.B, dims.H, dims.K, dims.V, dtype=dt) if dht is None else dht.to(dt)
    for t in reversed(range(dims.T)):
        if t < dims.T - 1:  # carry dS_{t+1} back through the gate of step t+1
            dS = g[:, t + 1, :, :, None].to(dt).exp() * out[:, t + 1]
        out[:, t] = dS + scale * q[:, t, :, :, None].to(dt) * do[:, t, :, None, :].to(dt)
    return out


def gla_bwd_recurrent(q, k, v, g, do, *, scale=None, initial_state=None, dht=None):
    """GLA gradients from the materialised states (the T·K·V way the paper avoids).

    With all S_t and dS_t (:func:`gla_states`, :func:`gla_state_grads`):
    ``dq_t = scale·do_t S_tᵀ``, ``dk_t = (dS_t v_tᵀ)ᵀ`` i.e. ``dS_t v_t``, ``dv_t = k_t dS_t``,
    ``d log α_t = α_t ⊙ Σ_v (S_{t-1} ⊙ dS_t)`` and ``dh0 = Diag(α_1) dS_1``.
    Returns a dict with dq, dk, dv, dg (q's dtype) and dh0 (None without initial_state).
    """
    dims = _check_gla(q, k, v, g, initial_state, do, dht)
    scale, dt = check_scale(scale, dims.K), _math_dtype(q)
    S = gla_states(k, v, g, initial_state)             # [B, T+1, H, K, V]
    dS = gla_state_grads(q, g, do, scale=scale, dht=dht)  # [B, T, H, K, V]
    grads = {
        "dq": scale * torch.einsum("bthv,bthkv->bthk", do.to(dt), S[:, 1:]),
        "dk": torch.einsum("bthkv,bthv->bthk", dS, v.to(dt)),
        "dv": torch.einsum("bthk,bthkv->bthv", k.to(dt), dS),
        "dg": gate_grad_from_states(g, S, dS),
    }
    grads = {n: x.to(q.dtype) for n, x in grads.items()}
    alpha0 = g[:, 0, :, :, None].to(dt).exp()
    grads["dh0"] = None if initial_state is None else (alpha0 * dS[:, 0]).to(initial_state.dtype)
    return grads


def gate_grad_from_states(g, states, state_grads):
    """``d log α_t = α_t ⊙ Σ_v (S_{t-1} ⊙ dS_t)``: the gate gradient read off the stored states.

    g ``[B, T, H, K]``; states ``[B, T+1, H, K, V]`` from :func:`gla_states` (S_0 … S_T); state_grads
    ``[B, T, H, K, V]`` from :func:`gla_state_grads`. Returns ``[B, T, H, K]`` in the states' dtype.
    The inputs alone are 2·T·K·V numbers per head, and the product is one more such tensor.
    """
    B, T, H, K = g.shape
    _check_tensor("states", states, (B, T + 1, H, K, states.shape[-1]), "[B, T+1, H, K, V]")
    _check_tensor("state_grads", state_grads, (B, T, H, K, states.shape[-1]), "[B, T, H, K, V]")
    return g.to(states.dtype).exp() * (states[:, :-1] * state_grads).sum(-1)


# ----------------------------------------------------------------------------- the closed-form gate gradient

def gate_grad_closed_form(q, k, dq, dk, *, final_state=None, dht=None):
    """``d log α`` without states (paper §4.3), plus the final-state term:

        d log b_t = q_t ⊙ dq_t − k_t ⊙ dk_t,     d log α_t = Σ_{i ≥ t} d log b_i + Σ_v (S_T ⊙ dS_T).

    b_t = Π_{i≤t} α_i, so log α_i enters every log b_t with t ≥ i (a reverse cumsum); S_T carries
    b_T as a factor, so a cotangent dht on it adds Σ_v S_T ⊙ dht to every position. q, k, dq, dk
    ``[B, T, H, K]``; final_state and dht ``[B, H, K, V]`` (both or neither). Returns ``[B, T, H, K]``.
    """
    B, T, H, K = q.shape
    for name, x in (("q", q), ("k", k), ("dq", dq), ("dk", dk)):
        _check_tensor(name, x, (B, T, H, K), "[B, T, H, K]")
    if (final_state is None) != (dht is None):
        raise ValueError("final_state and dht must be given together (both [B, H, K, V]) or not at all")
    dg = reverse_cumsum(q * dq - k * dk, dim=1)
    if dht is not None:
        _check_tensor("final_state", final_state, (B, H, K, final_state.shape[-1]), "[B, H, K, V]")
        _check_tensor("dht", dht, final_state.shape, "[B, H, K, V]")
        dg = dg + (final_state * dht).sum(-1).to(dg.dtype)[:, None]
    return dg


# ----------------------------------------------------------------------------- GLA, chunk by chunk

def gla_bwd_chunk(q, k, v, g, do, *, scale=None, initial_state=None, dht=None, chunk_size=16):
    """GLA gradients chunk by chunk: inter-chunk terms through the states, intra-chunk terms in log space.

    In chunk n (1-based, book/notation.md: chunk n reads S_[n-1] and leaves S_[n]), with log Λ the
    chunk-local cumsum of g, Λ, Γ, γ its decays (Λ_i = e^{log Λ_i}, Γ_j = γ / Λ_j), query row i, key
    row j, A_ij = scale·Σ_d q_id k_jd e^{log Λ_id − log Λ_jd} (j ≤ i) and dA = (dO Vᵀ) ⊙ M:

        dS_[n-1] = Diag(γ_n) dS_[n] + scale·(Q_[n] ⊙ Λ)ᵀ dO_[n]
        dq_i = scale·Λ_i ⊙ (do_i S_[n-1]ᵀ)  +  scale·Σ_j dA_ij k_j ⊙ e^{log Λ_i − log Λ_j}
        dk_j = Γ_j ⊙ (v_j dS_[n]ᵀ)          +  scale·Σ_i dA_ij q_i ⊙ e^{log Λ_i − log Λ_j}
        dV = (K ⊙ Γ) dS_[n]                 +  Aᵀ dO

    and dg by :func:`gate_grad_closed_form`. Returns a dict: dq, dk, dv, dg, dh0 = dS_[0] (q's
    layout), the intra-chunk parts dq_intra, dk_intra, dA ``[B, H, N, C, C]`` and dS
    ``[B, H, N, K, V]``, where ``dS[:, :, i]`` is dS_[i+1], the gradient of the state leaving the
    chunk at 0-based index i.
    """
    dims = _check_gla(q, k, v, g, initial_state, do, dht)
    check_chunk_sizes(chunk_size)
    scale, dt, T = check_scale(scale, dims.K), _math_dtype(q), dims.T
    Q, K, V, dO, G = (_chunked(_heads_first(x, dt), chunk_size) for x in (q, k, v, do, g))
    G = G.cumsum(3)                      # log Λ inside each chunk
    gam = G[:, :, :, -1]                 # log γ_n  [B, H, N, K]
    N = Q.shape[2]
    S = q.new_zeros(dims.B, dims.H, dims.K, dims.V, dtype=dt) if initial_state is None else initial_state.to(dt)
    Kt = K * (gam[:, :, :, None] - G).exp()   # keys decayed to the chunk end
    Qt = Q * G.exp()                          # queries decayed from the chunk start
    S_in = []
    for n in range(N):
        S_in.append(S)
        S = gam[:, :, n, :, None].exp() * S + Kt[:, :, n].transpose(-1, -2) @ V[:, :, n]
    S_in, S_T = torch.stack(S_in, 2), S
    dS = torch.zeros_like(S) if dht is None else dht.to(dt)
    dS_out = [None] * N
    for n in reversed(range(N)):
        dS_out[n] = dS
        dS = gam[:, :, n, :, None].exp() * dS + scale * Qt[:, :, n].transpose(-1, -2) @ dO[:, :, n]
    dS_out, dh0 = torch.stack(dS_out, 2), dS
    M = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    D = (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~M[..., None], 0.0).exp() * M[..., None]
    A = scale * torch.einsum("bhnrd,bhnsd,bhnrsd->bhnrs", Q, K, D)
    dA = (dO @ V.transpose(-1, -2)).masked_fill(~M, 0.0)
    dQ_intra = scale * torch.einsum("bhnrs,bhnsd,bhnrsd->bhnrd", dA, K, D)
    dK_intra = scale * torch.einsum("bhnrs,bhnrd,bhnrsd->bhnsd", dA, Q, D)
    dQ = scale * G.exp() * (dO @ S_in.transpose(-1, -2)) + dQ_intra
    dK = (gam[:, :, :, None] - G).exp() * (V @ dS_out.transpose(-1, -2)) + dK_intra
    dV = Kt @ dS_out + A.transpose(-1, -2) @ dO
    dq, dk, dv, dq_i, dk_i = (_unchunk(x, T) for x in (dQ, dK, dV, dQ_intra, dK_intra))
    dg = gate_grad_closed_form(_unchunk(Q, T), _unchunk(K, T), dq, dk,
                               final_state=None if dht is None else S_T, dht=None if dht is None else dht.to(dt))
    out = {n: x.to(q.dtype) for n, x in (("dq", dq), ("dk", dk), ("dv", dv), ("dg", dg),
                                          ("dq_intra", dq_i), ("dk_intra", dk_i))}
    out["dg"] = out["dg"].to(g.dtype)
    out.update(dA=dA, dS=dS_out,
               dh0=None if initial_state is None else dh0.to(initial_state.dtype))
    return out


def intra_chunk_dqk_two_level(q, k, v, g, do, *, scale=None, chunk_size=16, sub_chunk_size=4):
    """The intra-chunk dq, dk of :func:`gla_bwd_chunk` by secondary chunking (step 6 of the kernel).

    dA = (dO Vᵀ) ⊙ M; G = log Λ, the chunk-local cumsum of g. For a key sub-chunk [u] and a later
    query sub-chunk [s], the exponent G_i − G_j of query row i and key row j is split at the
    reference row e (the last row of [u]) into (G_i − G_e) + (G_e − G_j), both ≤ 0, so

        dq_i += scale·e^{G_i − G_e} ⊙ Σ_{j∈[u]} dA_ij (k_j ⊙ e^{G_e − G_j})    (a matmul)
        dk_j += scale·e^{G_e − G_j} ⊙ Σ_{i∈[s]} dA_ij (q_i ⊙ e^{G_i − G_e})    (a matmul)

    and the diagonal c × c tiles are summed in log space. Returns ``(dq_intra, dk_intra)``
    ``[B, T, H, K]`` in q's dtype.
    """
    dims = _check_gla(q, k, v, g, None, do, None)
    check_chunk_sizes(chunk_size, sub_chunk_size)
    scale, dt, c = check_scale(scale, dims.K), _math_dtype(q), sub_chunk_size
    Q, K, V, dO, G = (_chunked(_heads_first(x, dt), chunk_size) for x in (q, k, v, do, g))
    G = G.cumsum(3)
    m = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    M = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    dA = (dO @ V.transpose(-1, -2)).masked_fill(~M, 0.0)
    dQ, dK = torch.zeros_like(Q), torch.zeros_like(K)
    for i in range(chunk_size // c):
        ri = slice(i * c, (i + 1) * c)
        for j in range(i):  # key sub-chunk j before query sub-chunk i: split at its last row e
            rj = slice(j * c, (j + 1) * c)
            G_e = G[..., j * c + c - 1, None, :]
            f_q, f_k = (G[..., ri, :] - G_e).exp(), (G_e - G[..., rj, :]).exp()
            dQ[..., ri, :] += f_q * (dA[..., ri, rj] @ (K[..., rj, :] * f_k))
            dK[..., rj, :] += f_k * (dA[..., ri, rj].transpose(-1, -2) @ (Q[..., ri, :] * f_q))
        G_i = G[..., ri, :]  # diagonal tile: exact log-space sum
        D = (G_i[..., :, None, :] - G_i[..., None, :, :]).masked_fill(~m[..., None], 0.0).exp() * m[..., None]
        dQ[..., ri, :] += torch.einsum("bhnrs,bhnsd,bhnrsd->bhnrd", dA[..., ri, ri], K[..., ri, :], D)
        dK[..., ri, :] += torch.einsum("bhnrs,bhnrd,bhnrsd->bhnsd", dA[..., ri, ri], Q[..., ri, :], D)
    return tuple(_unchunk(scale * x, dims.T).to(q.dtype) for x in (dQ, dK))
