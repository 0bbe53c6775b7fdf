"""The short convolution of FLA's layers, in PyTorch: a causal depthwise convolution over time, then SiLU.

Each channel c of x ``[B, T, D]`` is filtered on its own by W taps (``weight[c, 0, :]``, W =
``conv_size``, 4 in FLA), looking only backwards::

    y_t[c] = SiLU( Σ_{j<W} weight[c, 0, j] · x_{t−W+1+j}[c] )        (x_s = 0 before the sequence starts,
                                                                      or the cache's inputs)

so the last tap weighs the token itself and the first the token W − 1 steps back. Placed on q, k and v
of a linear-attention layer it lets a token's key or value mix in the few tokens before it, a "token
shift": a value can carry the key it follows, which a recurrence that only sums k_tᵀ v_t otherwise
cannot see. The weight has ``nn.Conv1d``'s layout ``[D, 1, W]``, as FLA's ``ShortConvolution``
(``{q,k,v}_conv1d.weight``), so FLA's weights load unchanged; with FLA's ``conv_bias=True`` a
``bias`` ``[D]`` is added inside the SiLU.

Decoding keeps the last W − 1 inputs of each sequence, a ``cache`` ``[B, W − 1, D]`` (oldest first):
``forward`` over a prompt returns it and ``step`` over one more token (T = 1) continues from it with
the same result as one pass. (FLA's cache holds the last W inputs; ``keep=W`` returns that many.) In a packed batch (``cu_seqlens``, B = 1) each sequence starts from its
own cache row (zeros by default), never from the end of the previous sequence.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gla_ref._validate import check_cu_seqlens, packed_layout, read_offsets
from gla_ref.layers import config

__all__ = ["ShortConvolution", "causal_conv1d"]


def _check_cache(cache, N, W, D, like):
    """The cache ``[N, W − 1, D]`` in x's dtype, zeros when None."""
    if cache is None:
        return like.new_zeros(N, W - 1, D)
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"cache must be a torch.Tensor or None, got {type(cache).__name__}")
    if tuple(cache.shape) != (N, W - 1, D):
        raise ValueError(f"cache must have shape [N, W - 1, D] = {(N, W - 1, D)} (the last W - 1 inputs of "
                         f"each of the N sequences), got {tuple(cache.shape)}")
    return cache.to(like.dtype)


def _slide(src, weight, T, bias=None):
    """The W-tap causal filter over rows that start with their W − 1 earlier inputs:
    src ``[N, W − 1 + T, D]``, weight ``[D, 1, W]`` → SiLU of the filter (+ bias) ``[N, T, D]``, float32 sums."""
    W = weight.shape[-1]
    w = weight[:, 0].float()
    acc = sum(src[:, j:j + T].float() * w[:, j] for j in range(W))
    if bias is not None:
        acc = acc + bias.float()
    return F.silu(acc).to(src.dtype)


def causal_conv1d(x, weight, cache=None, cu_seqlens=None, bias=None, *, keep=None):
    """Causal depthwise convolution + SiLU: x ``[B, T, D]``, weight ``[D, 1, W]`` → ``(y [B, T, D], cache)``.

    ``cache``: the W − 1 inputs before x's first token per row, ``[B, W − 1, D]`` (None: zeros); the
    returned cache is the last W − 1 inputs of each row (the given cache's entries if T < W − 1), or
    the last ``keep`` of them (FLA keeps W; at most W − 1 + T).
    ``cu_seqlens``: None, or int32/int64 ``[N + 1]`` offsets of N sequences packed into x ``[1, T, D]``
    (:func:`gla_ref._validate.read_offsets`: a tensor on x's device or a NumPy array; an empty sequence
    returns its cache row as it came);
    each sequence then runs from its own row of ``cache`` ``[N, W − 1, D]`` and the returned cache is
    ``[N, W − 1, D]``. ``bias``: None or ``[D]``, added before the SiLU (FLA's ``conv_bias``).
    Float32 sums, x's dtype out.
    """
    D, W = weight.shape[0], weight.shape[-1]
    if x.dim() != 3 or x.shape[-1] != D:
        raise ValueError(f"x must have shape [B, T, D] with D = {D}, got {tuple(x.shape)}")
    B, T = x.shape[:2]
    if cu_seqlens is None:
        rows, lengths = x, np.full(B, T)
    else:
        offsets = read_offsets(cu_seqlens, array_type=torch.Tensor, array_name="torch.Tensor", device=x.device)
        check_cu_seqlens(offsets, T, B)
        offsets = offsets.tolist()
        gather, keep_rows, keep_cols = packed_layout(offsets)
        padded = torch.cat([x, x.new_zeros(1, 1, D)], 1)
        rows, lengths = padded[0, torch.as_tensor(gather, device=x.device)], np.diff(offsets)  # [N, L, D]
    N, L = rows.shape[:2]
    src = torch.cat([_check_cache(cache, N, W, D, x), rows], 1)  # [N, W − 1 + L, D]
    y = _slide(src, weight, L, bias)
    S = W - 1 if keep is None else keep
    if not 0 <= S <= W - 1 + int(lengths.min()):
        raise ValueError(f"keep must be in [0, W - 1 + the shortest sequence's length], got {keep!r}")
    start = lengths[:, None] + (W - 1 - S)
    last = torch.as_tensor(start + np.arange(S), device=x.device)  # src index of each kept input
    new_cache = src[torch.arange(N, device=x.device)[:, None], last]
    if cu_seqlens is not None:
        y = y[torch.as_tensor(keep_rows, device=x.device), torch.as_tensor(keep_cols, device=x.device)][None]
    return y, new_cache


class ShortConvolution(nn.Module):
    """FLA's short convolution (a causal depthwise ``nn.Conv1d``, then SiLU) on ``D`` channels of width
    ``conv_size``; ``weight`` ``[D, 1, conv_size]``, initialised as ``nn.Conv1d`` (uniform in
    ±conv_size^−½), and with ``bias=True`` (FLA's ``conv_bias``) a ``bias`` ``[D]`` (same init).
    ``forward(x, cache=None, cu_seqlens=None, keep=None) -> (y, cache)``: see :func:`causal_conv1d`."""

    def __init__(self, D, conv_size=4, bias=False):
        super().__init__()
        D, W = config.positive_int("D", D), config.positive_int("conv_size", conv_size)
        self.weight = nn.Parameter(torch.empty(D, 1, W).uniform_(-W ** -0.5, W ** -0.5))
        self.bias = nn.Parameter(torch.empty(D).uniform_(-W ** -0.5, W ** -0.5)) if config.flag("bias", bias) else None

    def forward(self, x, cache=None, cu_seqlens=None, keep=None):
        return causal_conv1d(x, self.weight, cache, cu_seqlens, self.bias, keep=keep)
