"""Forget gates of gated linear attention: how they are made, stored and accumulated.

Chapter 2 of the book. Notation: ``α`` is a gate in (0, 1], ``g = log α ≤ 0`` its natural log,
``b_t = α_1 ⋯ α_t`` the cumulative gate (``log b_t = g_1 + … + g_t``). Time is axis 0 of the small
teaching arrays here (``[T]`` or ``[T, K]``) unless a ``dim`` argument says otherwise.

* :func:`lowrank_log_gate` — the GLA paper's low-rank gate with temperature τ, in log space.
* :func:`build_slope_tensor`, :func:`slopes_to_g_gamma`, :func:`retnet_log_gammas` — constant
  per-head decays (ALiBi slopes as used for ``g_gamma``; RetNet's γ).
* :func:`decay_matrix` — the causal ``[T, T]`` matrix of decays ``exp(b_i − b_j)``.
* :func:`cumulative_gate`, :func:`underflow_steps` — the naive running product and where it fails.
* :func:`log2_cumsum` — the older kernels' base-2 cumulative sum, used with ``exp2``.
* :func:`memory_horizon` — how many steps until the memory fades to a fraction.
* :data:`SAFE_DECAY` — how far a gate may decay inside a sub-chunk or chunk for the kernels' fast and
  whole-chunk forms.
"""

from __future__ import annotations

import math

import sys

import numpy as np

LN2 = math.log(2.0)

SAFE_DECAY = 64.0
"""Largest decay ``b_p − b_j`` (nats) from the first token p of a 16-token sub-chunk to any of its tokens j
for which the chunked kernels form the sub-chunk's diagonal tile by one matmul (the *fast form*): its key
operand ``k_j e^{b_p − b_j}`` then stays below ``e^64 ≈ 6e27`` times ``|k_j|`` (float32 and bf16 reach
``e^88``), its query operand ``q_i e^{b_i − b_p}`` is at most ``|q_i|``, and each product of the two is
``q_i k_j e^{b_i − b_j}``, at most ``|q_i k_j|`` inside the causal mask. Steeper sub-chunks take the exact
form, one key at a time with every exponent ≤ 0. The same bound, from a chunk's first token p to its last,
lets chunk_gla build a whole chunk's A (and dq, dk) and fused_chunk_gla its P by one matmul (the *whole-chunk
form*). (Paper's gates, ``logsigmoid(x)/16``, decay ~1 nat per sub-chunk, a few per 64-token chunk.)"""


def _is_tensor(x) -> bool:
    """Whether ``x`` is a torch.Tensor (without importing torch: none can exist before it is imported)."""
    return "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor)


def _as_tensor(name, x):
    import torch

    if _is_tensor(x):
        return x
    if isinstance(x, (int, float, np.ndarray, np.floating, list, tuple)):
        return torch.as_tensor(np.asarray(x, dtype=np.float64))
    raise TypeError(f"{name} must be a torch.Tensor, NumPy array or float, got {type(x).__name__}")


def _check_log_gate(name, g):
    import torch

    if not torch.is_floating_point(g):
        raise TypeError(f"{name} must be a floating tensor of log-gates, got dtype {g.dtype}")
    if torch.isnan(g).any() or (g > 0).any():
        raise ValueError(f"{name} must hold log-gates g = log α <= 0 (no NaN)")


def lowrank_log_gate(x, W1, W2, b, tau=16.0):
    """GLA's low-rank gate in log space: ``g = logsigmoid(x W1 W2 + b) / τ``.

    This is ``log α`` for the paper's ``α = sigmoid(x W1 W2 + b)^(1/τ)`` (§4.4), computed without
    ever forming α, so slow gates (α close to 1) keep their precision.
    Shapes: x ``[..., d]``, W1 ``[d, r]``, W2 ``[r, K]``, b ``[K]`` → g ``[..., K]``.
    """
    import torch

    for name, t in (("x", x), ("W1", W1), ("W2", W2), ("b", b)):
        if not isinstance(t, torch.Tensor) or not torch.is_floating_point(t):
            raise TypeError(f"{name} must be a floating torch.Tensor")
    d = x.shape[-1]
    if W1.dim() != 2 or W1.shape[0] != d:
        raise ValueError(f"W1 must have shape [d, r] with d = {d} (last dim of x), got {tuple(W1.shape)}")
    r = W1.shape[1]
    if W2.dim() != 2 or W2.shape[0] != r:
        raise ValueError(f"W2 must have shape [r, K] with r = {r} (columns of W1), got {tuple(W2.shape)}")
    if tuple(b.shape) != (W2.shape[1],):
        raise ValueError(f"b must have shape [K] = [{W2.shape[1]}], got {tuple(b.shape)}")
    if not (isinstance(tau, (int, float)) and tau > 0):
        raise ValueError(f"tau must be a positive number, got {tau!r}")
    return torch.nn.functional.logsigmoid(x @ W1 @ W2 + b) / tau


def _slopes_power_of_2(n):
    # geometric sequence with first term and ratio 2^(-8/n) (Press et al., ALiBi)
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]


def build_slope_tensor(H):
    """ALiBi's per-head slopes ``m_h`` as a float64 NumPy array of shape ``[H]``.

    For ``H`` a power of two, ``m_h = 2^(-8h/H)``, h = 1…H. Otherwise the slopes of the largest
    power of two ``n < H`` come first, then every other slope of the ``2n``-head sequence fills the rest.
    """
    if not isinstance(H, int) or isinstance(H, bool) or H < 1:
        raise ValueError(f"H must be a positive int (number of heads), got {H!r}")
    n = 2 ** int(math.floor(math.log2(H)))
    slopes = _slopes_power_of_2(n)
    if n < H:
        slopes += _slopes_power_of_2(2 * n)[0::2][: H - n]
    return np.asarray(slopes, dtype=np.float64)


def slopes_to_g_gamma(slopes, scale=1.0):
    """Constant per-head log-decay ``g_gamma = −scale · slopes`` (shape ``[H]``, negative).

    The head decays by ``γ_h = exp(−scale · m_h)`` per token, so ``γ^(i−j) = exp(−scale·m_h (i−j))``:
    ALiBi's linear bias, applied as a factor. ``scale`` is a layer-dependent multiplier in
    models that use it (1 by default). Returns a torch tensor for a tensor input, else NumPy.
    """
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    s = slopes if _is_tensor(slopes) else np.asarray(slopes, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"slopes must have shape [H], got {tuple(s.shape)}")
    if not bool((s > 0).all()):
        raise ValueError("slopes must all be positive")
    return -scale * s


def retnet_log_gammas(H):
    """RetNet's per-head decays in log space: ``log(1 − 2^(−5−h))``, h = 0…H−1 (float64 NumPy)."""
    if not isinstance(H, int) or isinstance(H, bool) or H < 1:
        raise ValueError(f"H must be a positive int (number of heads), got {H!r}")
    return np.log1p(-(2.0 ** (-5.0 - np.arange(H))))


def decay_matrix(g, T):
    """Causal matrix of cumulative decays ``D[i, j] = exp(log b_i − log b_j)`` for i ≥ j, else 0.

    ``D[i, j] = α_{j+1} ⋯ α_i`` is how much of token j's write is left in the state at step i.
    ``g``: a scalar (constant decay, ``log b_t = t·g``), ``[T]`` (one gate per step) or ``[T, K]``
    (one per step and key channel, giving ``[T, T, K]``). Computed in log space, masked by ``where``.
    """
    import torch

    g = _as_tensor("g", g)
    _check_log_gate("g", g)
    if not isinstance(T, int) or isinstance(T, bool) or T < 1:
        raise ValueError(f"T must be a positive int, got {T!r}")
    if g.dim() == 0:
        g = g.expand(T)
    elif g.dim() > 2 or g.shape[0] != T:
        raise ValueError(f"g must be a scalar, [T] or [T, K] with T = {T}, got {tuple(g.shape)}")
    b = torch.cumsum(g, dim=0)
    diff = b[:, None] - b[None, :]  # [T, T] or [T, T, K]
    i = torch.arange(T)
    causal = (i[:, None] >= i[None, :]).reshape((T, T) + (1,) * (g.dim() - 1))
    return torch.where(causal, torch.exp(torch.where(causal, diff, torch.zeros_like(diff))),
                       torch.zeros_like(diff))


def cumulative_gate(g, dtype, dim=0):
    """The naive cumulative gate ``b_t = α_1 ⋯ α_t`` as a running product carried in ``dtype``.

    ``α = exp(g)`` is rounded to ``dtype``, then ``b_t = b_{t−1} · α_t`` is rounded at every step,
    as a loop in that precision would do. It underflows, stalls or reaches 0 for long sequences —
    compare with ``exp(cumsum(g))`` in float64.
    """
    import torch

    g = _as_tensor("g", g)
    _check_log_gate("g", g)
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"dtype must be a torch floating dtype, got {dtype!r}")
    alpha = torch.exp(g.double()).to(dtype).movedim(dim, 0)
    b = torch.empty_like(alpha)
    run = torch.ones_like(alpha[0])
    for t in range(alpha.shape[0]):
        run = run * alpha[t]
        b[t] = run
    return b.movedim(0, dim)


def underflow_steps(log_alpha, dtype, T, rel_tol=0.5):
    """Where the naive product of a constant gate fails in ``dtype``, for each gate strength.

    ``log_alpha``: ``[n]`` constant log-gates. Runs :func:`cumulative_gate` for T steps and returns
    ``(lost, zero)``, two int64 arrays ``[n]``: the first step t (1-based) at which the relative error
    against the exact ``α^t`` exceeds ``rel_tol`` ("all precision lost"), and the first step at which
    ``b_t == 0``; −1 where it does not happen within T steps.
    """
    import torch

    g = _as_tensor("log_alpha", log_alpha).double()
    if g.dim() != 1:
        raise ValueError(f"log_alpha must have shape [n], got {tuple(g.shape)}")
    if not isinstance(T, int) or isinstance(T, bool) or T < 1:
        raise ValueError(f"T must be a positive int, got {T!r}")
    if not (isinstance(rel_tol, (int, float)) and rel_tol > 0):
        raise ValueError(f"rel_tol must be a positive number, got {rel_tol!r}")
    b = cumulative_gate(g.expand(T, -1), dtype).double()
    t = torch.arange(1, T + 1, dtype=torch.float64)[:, None]
    exact = torch.exp(t * g)  # float64 underflows only past 1e-308
    lost = (b - exact).abs() > rel_tol * exact
    return _first_step(lost), _first_step(b == 0)


def _first_step(mask):
    import torch

    hit = mask.any(dim=0)
    return torch.where(hit, mask.double().argmax(dim=0) + 1, -1).numpy()


def log2_cumsum(g, chunk_size=None, dim=0):
    """Cumulative sum of ``g / ln 2`` along ``dim``: ``log2 b_t``, for use with ``exp2``.

    ``exp2(log2_cumsum(g)) == exp(cumsum(g))``, since ``exp(x) = 2^(x / ln 2)``: the 1/ln 2 factor is
    paid once here instead of at every exponential. With ``chunk_size`` the sum restarts every
    ``chunk_size`` steps, as the older kernel (``fwd_decay_cumsum``, chunks of 16) did.
    """
    import torch

    g = _as_tensor("g", g)
    _check_log_gate("g", g)
    g2 = (g / LN2).movedim(dim, 0)
    if chunk_size is None:
        return torch.cumsum(g2, dim=0).movedim(0, dim)
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    pieces = [torch.cumsum(c, dim=0) for c in torch.split(g2, chunk_size, dim=0)]
    return torch.cat(pieces, dim=0).movedim(0, dim)


def memory_horizon(log_alpha, fraction=math.exp(-1.0)):
    """Steps n after which a gate ``α = exp(g)`` leaves ``fraction`` of the memory: ``α^n = fraction``.

    ``n = log(fraction) / g``; the default (1/e) gives ``n = −1/g``. ``g = 0`` (no decay) gives ``inf``.
    Works on floats, NumPy arrays and torch tensors alike.
    """
    if not (isinstance(fraction, (int, float)) and 0 < fraction < 1):
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    g = log_alpha if _is_tensor(log_alpha) else np.asarray(log_alpha, dtype=np.float64)
    if bool((g > 0).any()) or bool((g != g).any()):
        raise ValueError("log_alpha must hold log-gates g = log α <= 0 (no NaN)")
    if _is_tensor(g):
        import torch

        return torch.where(g < 0, math.log(fraction) / torch.where(g < 0, g, -1.0), math.inf)
    out = np.where(g < 0, math.log(fraction) / np.where(g < 0, g, -1.0), np.inf)
    return float(out) if out.ndim == 0 else out
