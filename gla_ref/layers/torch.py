"""GLA layers in PyTorch: the paper's layer, the RFC's simple GLA layer, and a tiny language model.

* :class:`GatedLinearAttention` — §4.4 of the GLA paper, with FLA's parameter names.
* :class:`SimpleGatedLinearAttention` — the Pallas RFC's layer: a constant per-head decay from
  ALiBi slopes, :class:`GroupRMSNorm`, a sigmoid output gate.
* :class:`GLABlock`, :class:`GLALM` — pre-norm blocks (mixer + SwiGLU) and a model made of them,
  whose ``mixer`` picks the gate family: ``"gla"``, ``"scalar"``, ``"retnet"``/``"const"``,
  ``"linear"``, or ``"simple"`` (the RFC layer).

Every layer has ``forward(x, initial_state=None, output_final_state=False) -> (y, state)`` over a
whole sequence (a chunkwise form: ``backend`` picks :func:`gla_ref.reference.torch.chunk_gla` or a
:mod:`gla_ref.triton` kernel) and ``step(x_t, state) -> (y_t, state)`` for one token, which applies
the closed-form update ``S ← Diag(α_t) S + k_tᵀ v_t``, ``o_t = scale · q_t S`` in PyTorch directly
(no kernel launch for a [K, V] rank-one update). Prefill with ``forward``, then decode with ``step``.
Shapes: x ``[B, T, d]``, x_t ``[B, d]``, states ``[B, H, K, V]`` float32.

Short convolutions: ``GatedLinearAttention(..., use_short_conv=True, conv_size=4)`` runs q, k and v
through FLA's causal depthwise convolution + SiLU (:mod:`gla_ref.layers.short_conv`), as FLA's layer
and the Zoology MQAR models do. Its state is then a :class:`~gla_ref.layers.config.ShortConvState`
(the recurrent state and the last W − 1 inputs of each convolution) instead of the bare tensor.

Packed sequences: ``forward`` of the layers, of :class:`GLABlock` and of :class:`GLALM` takes
``cu_seqlens``, FLA's int64 offsets ``[N + 1]`` of N sequences packed into one row (B = 1). Each
sequence is then mixed from its own first token and its own state, states being ``[N, H, K, V]``
float32, as if it ran alone; everything else acts on one token at a time, so nothing crosses a
sequence boundary.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from torch import nn

from gla_ref.reference import torch as torch_ref
from gla_ref.reference.gates import build_slope_tensor, retnet_log_gammas, slopes_to_g_gamma
from gla_ref.layers import config
from gla_ref.layers.config import ShortConvState
from gla_ref.layers.short_conv import ShortConvolution

__all__ = ["GatedLinearAttention", "SimpleGatedLinearAttention", "GroupRMSNorm", "NormSwishGate",
           "GLABlock", "GLALM", "MIXERS", "recurrent_step", "ShortConvolution", "ShortConvState"]

KERNELS = {"chunk": "chunk_gla", "fused_chunk": "fused_chunk_gla", "fused_recurrent": "fused_recurrent_gla"}
"""Backend name → :mod:`gla_ref.triton` function."""

MIXERS = {"gla": "gla", "scalar": "scalar", "retnet": "const", "const": "const", "linear": "none",
          "simple": None}
"""Token mixers of :class:`GLALM` → the ``gate`` of their :class:`GatedLinearAttention`
(``"simple"`` is :class:`SimpleGatedLinearAttention`)."""


REFERENCE_CHUNK_SIZE = 16
"""Chunk size of the ``"reference"`` backend (:func:`gla_ref.reference.torch.chunk_gla`). Its intra-chunk part
builds a ``[C, C, K]`` log-space tensor per chunk, so on a CPU C = 16 trains a small model about six
times faster than C = 64 (same function, other rounding)."""


def _triton(name):
    """A :mod:`gla_ref.triton` function, imported on first use (Triton is only needed by kernel backends)."""
    return getattr(importlib.import_module("gla_ref.triton"), name)


def recurrent_step(q, k, v, g, S, scale):
    """One token of the recurrence: ``S ← Diag(exp g) S + kᵀ v``, ``o = scale · q S``.

    q, k ``[B, H, K]``; v ``[B, H, V]``; g a log-gate broadcastable to ``[B, H, K]`` (``[B, H, K]``,
    ``[B, H, 1]``, ``[H, 1]``) or None; S ``[B, H, K, V]`` float32. Float32 math. Returns
    ``(o [B, H, V] in q's dtype, S)``.
    """
    if g is not None:
        S = torch.exp(g.float())[..., None] * S
    S = S + k.float()[..., :, None] * v.float()[..., None, :]
    o = scale * (q.float()[..., None, :] @ S)[..., 0, :]
    return o.to(q.dtype), S


def _token_gate(g):
    """The log-gate of a one-token sequence (``[B,1,H,K]``, ``[B,1,H]``, ``[H]`` or None), broadcastable to
    ``[B, H, K]``."""
    if g is None:
        return None
    if g.dim() == 1:
        return g[:, None]  # [H] → [H, 1]
    return g[:, 0] if g.dim() == 4 else g[:, 0, :, None]


def _check_tensor(name, x, shape_doc, ndim, last, dtype):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim or x.shape[-1] != last:
        raise ValueError(f"{name} must have shape {shape_doc} with d = {last}, got {tuple(x.shape)}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have the layer's dtype {dtype}, got {x.dtype}")


class _TokenMixer(config.ShortConvStateRules, nn.Module):
    """``forward`` (a chunkwise form) and ``step`` (the recurrence), shared by both layers.

    A subclass sets ``self.dims = (d, H, K, V)`` and defines ``_heads(x) -> (q, k, v, g)`` (g in any
    rank of the API contract), ``_mix(q, k, v, g, **kw) -> (o, state)`` and ``_out(x, o) -> y``; a
    layer with short convolutions also overrides ``_short_conv`` (and its state is a
    :class:`ShortConvState`).
    """

    def forward(self, x, initial_state=None, output_final_state=False, cu_seqlens=None):
        """x ``[B, T, d]`` → ``(y [B, T, d], final_state [B, H, K, V] float32 or None)``.

        ``initial_state`` ``[B, H, K, V]`` float32 (e.g. from an earlier call) or None for zeros.
        ``cu_seqlens``: None, or int64 ``[N + 1]`` offsets of N sequences packed into one row (x
        ``[1, T, d]``, FLA's convention), 0 = cu_seqlens[0] < … < cu_seqlens[N] = T; each sequence is
        mixed from its own first token and its own row of ``initial_state``, and both states are then
        ``[N, H, K, V]`` float32. Every backend takes it. The projections and norms act per token, so
        only the mixer (and the short convolutions, which restart at each sequence) see the offsets.
        A bad cu_seqlens is a ValueError or TypeError naming it. With ``use_short_conv`` both states
        are :class:`ShortConvState` s (None: zeros).
        """
        d = self.dims[0]
        _check_tensor("x", x, "[B, T, d]", 3, d, self._dtype())
        S0, conv = self._split_state("initial_state", initial_state)
        q, k, v, g = self._heads(x)
        q, k, v, conv = self._short_conv(q, k, v, conv, cu_seqlens)
        o, state = self._mix(q, k, v, g, initial_state=S0, output_final_state=output_final_state,
                             cu_seqlens=cu_seqlens)
        return self._out(x, o), (self._join_state(state, conv) if output_final_state else None)

    def step(self, x_t, state=None):
        """Decode one token: x_t ``[B, d]``, state ``[B, H, K, V]`` float32 (a :class:`ShortConvState`
        with ``use_short_conv``; None: zeros) → ``(y_t [B, d], new state)``. Same result as ``forward``
        on the whole sequence."""
        d, H, K, V = self.dims
        _check_tensor("x_t", x_t, "[B, d]", 2, d, self._dtype())
        S, conv = self._split_state("state", state)
        x = x_t[:, None]
        q, k, v, g = self._heads(x)
        q, k, v, conv = self._short_conv(q, k, v, conv, None)
        o, S = recurrent_step(q[:, 0], k[:, 0], v[:, 0], _token_gate(g),
                              self._start_state(S, x_t.shape[0], x_t.device), K ** -0.5)
        return self._out(x, o[:, None])[:, 0], self._join_state(S, conv)

    def _dtype(self):
        return next(self.parameters()).dtype

    def _start_state(self, state, B, device):
        _, H, K, V = self.dims
        if state is None:
            return torch.zeros(B, H, K, V, dtype=torch.float32, device=device)
        if not isinstance(state, torch.Tensor):
            raise TypeError(f"state must be a torch.Tensor or None, got {type(state).__name__}")
        if tuple(state.shape) != (B, H, K, V):
            raise ValueError(f"state must have shape [B, H, K, V] = {(B, H, K, V)}, got {tuple(state.shape)}")
        if state.dtype != torch.float32:
            raise TypeError(f"state must be float32, got {state.dtype}")
        return state


class NormSwishGate(nn.Module):
    """Per-head normalisation of the outputs, then the Swish output gate: ``norm(o_t^h) ⊙ Swish(r_t^h)``.

    ``norm="rms"``: RMSNorm with a weight (FLA's ``FusedRMSNormGated``); ``"layer"``: LayerNorm with
    weight and bias (the paper's LN). The ``[V]`` parameters are shared by all heads. o, r
    ``[..., H, V]``; float32 math; returns o's dtype.
    """

    def __init__(self, V, norm="rms", eps=1e-5):
        super().__init__()
        self.norm, self.eps = config.choice("norm", norm, config.NORMS), eps
        self.weight = nn.Parameter(torch.ones(V))
        self.bias = nn.Parameter(torch.zeros(V)) if norm == "layer" else None

    def forward(self, o, r):
        x = o.float()
        if self.norm == "layer":
            x = x - x.mean(-1, keepdim=True)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        if self.bias is not None:
            x = x + self.bias.float()
        return (x * F.silu(r.float())).to(o.dtype)


class GroupRMSNorm(nn.Module):
    """RMSNorm over ``num_groups`` equal groups of the last dimension, each with its own RMS (the RFC's).

    x ``[..., hidden_size]`` → same shape; weight ``[hidden_size]``; float32 math, x's dtype out.
    With groups of whole heads the heads of one group share their RMS; one group is a plain RMSNorm.
    """

    def __init__(self, hidden_size, num_groups=1, eps=1e-5):
        super().__init__()
        n = config.positive_int("hidden_size", hidden_size)
        self.num_groups = config.positive_int("num_groups", num_groups)
        if n % num_groups:
            raise ValueError(f"num_groups = {num_groups} must divide hidden_size = {n}")
        self.eps = config.positive_number("eps", eps)
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        y = x.float().unflatten(-1, (self.num_groups, -1))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y.flatten(-2) * self.weight.float()).to(x.dtype)


class GatedLinearAttention(_TokenMixer):
    """The GLA layer of the paper (§4.4), per head h::

        S_t^h = Diag(α_t^h) S_{t−1}^h + k_t^hᵀ v_t^h,   o_t^h = scale · q_t^h S_t^h
        o'_t  = concat_h norm(o_t^h),   r_t = Swish(x_t W_r),   y_t = (r_t ⊙ o'_t) W_O
        log α_t = logsigmoid(x_t W_α¹ W_α² + b_α) / τ      (τ = gate_logit_normalizer)

    Widths: d = hidden_size, d_k = int(d·expand_k), d_v = int(d·expand_v), per head K = d_k/H and
    V = d_v/H; scale = K^−½. Parameters, named as FLA's ``fla.layers.GatedLinearAttention`` names them:
    ``q_proj``, ``k_proj`` [d_k, d]; ``v_proj``, ``g_proj`` (W_r) [d_v, d]; ``gk_proj.0`` [r, d] and
    ``gk_proj.1`` [d_k, r] with bias [d_k] (W_α¹, W_α², b_α; r = gate_low_rank_dim); ``o_proj`` [d, d_v];
    ``g_norm.weight`` [V] (and ``g_norm.bias`` for ``norm="layer"``). As in FLA, W_r has no bias b_r.
    Exactly ``2·d·d_k + 3·d·d_v + r·(d + d_k) + d_k + V`` parameters (``+V`` more for LayerNorm):
    ``4d² + 3rd/2 + d/2 + d/H`` at the paper's d_k = d/2, d_v = d (:func:`config.gla_num_params`).

    ``gate`` swaps the forget gate, keeping the rest: ``"gla"`` (above), ``"scalar"`` (one α per head
    and token: ``gk_proj.1`` maps r → H), ``"const"`` (RetNet's fixed γ_h = 1 − 2^(−5−h), a buffer
    ``g_gamma``), ``"none"`` (linear attention). ``backend``: ``"reference"``
    (:func:`gla_ref.reference.torch.chunk_gla`) or a Triton kernel, ``"chunk"``, ``"fused_chunk"``,
    ``"fused_recurrent"`` (for gates other than ``"gla"`` it gets the gate expanded to [B, T, H, K]).
    ``use_short_conv`` puts FLA's short convolution (:class:`ShortConvolution`, width ``conv_size``)
    with SiLU on q, k and v after their projections, parameters ``q_conv1d.weight``,
    ``k_conv1d.weight`` [d_k, 1, W] and ``v_conv1d.weight`` [d_v, 1, W]; the gates still read x.
    The layer's state is then a :class:`ShortConvState`. Weights from FLA: :meth:`load_fla_state_dict`.
    """

    def __init__(self, hidden_size, num_heads=4, expand_k=0.5, expand_v=1.0, gate_low_rank_dim=16,
                 gate_logit_normalizer=16, norm="rms", backend="chunk", *, gate="gla", norm_eps=1e-5,
                 use_short_conv=False, conv_size=4):
        super().__init__()
        s = self.sizes = config.gla_sizes(hidden_size, num_heads, expand_k, expand_v, gate_low_rank_dim,
                                          gate_logit_normalizer, norm, gate, norm_eps, backend,
                                          config.TORCH_BACKENDS, use_short_conv, conv_size)
        self.dims = (s.d, s.H, s.K, s.V)
        self.q_proj = nn.Linear(s.d, s.key_dim, bias=False)
        self.k_proj = nn.Linear(s.d, s.key_dim, bias=False)
        self.v_proj = nn.Linear(s.d, s.value_dim, bias=False)
        self.g_proj = nn.Linear(s.d, s.value_dim, bias=False)
        if s.use_short_conv:
            self.q_conv1d = ShortConvolution(s.key_dim, s.conv_size)
            self.k_conv1d = ShortConvolution(s.key_dim, s.conv_size)
            self.v_conv1d = ShortConvolution(s.value_dim, s.conv_size)
        if s.gate in ("gla", "scalar"):
            self.gk_proj = nn.Sequential(nn.Linear(s.d, s.r, bias=False),
                                         nn.Linear(s.r, s.key_dim if s.gate == "gla" else s.H, bias=True))
        if s.gate == "const":
            self.register_buffer("g_gamma", torch.tensor(retnet_log_gammas(s.H), dtype=torch.float32),
                                 persistent=False)
        self.g_norm = NormSwishGate(s.V, s.norm, s.eps)
        self.o_proj = nn.Linear(s.value_dim, s.d, bias=False)
        self._kernel = None if backend == "reference" else _triton(KERNELS[backend])

    def log_gate(self, x):
        """log α for x ``[B, T, d]``: float32 ``[B, T, H, K]`` ("gla"), ``[B, T, H]`` ("scalar"),
        ``[H]`` ("const") or None ("none")."""
        s = self.sizes
        if s.gate in ("const", "none"):
            return self.g_gamma if s.gate == "const" else None
        g = F.logsigmoid(self.gk_proj(x).float()) / s.tau
        return g.unflatten(-1, (s.H, s.K)) if s.gate == "gla" else g

    def _heads(self, x):
        s = self.sizes
        q = self.q_proj(x).unflatten(-1, (s.H, s.K))
        k = self.k_proj(x).unflatten(-1, (s.H, s.K))
        v = self.v_proj(x).unflatten(-1, (s.H, s.V))
        return q, k, v, self.log_gate(x)

    def _short_conv(self, q, k, v, conv, cu_seqlens):
        if not self.sizes.use_short_conv:
            return q, k, v, None
        conv = (None, None, None) if conv is None else conv
        out = [layer(x.flatten(-2), cache, cu_seqlens)
               for layer, x, cache in zip((self.q_conv1d, self.k_conv1d, self.v_conv1d), (q, k, v), conv)]
        (q, cq), (k, ck), (v, cv) = out
        s = self.sizes
        return q.unflatten(-1, (s.H, s.K)), k.unflatten(-1, (s.H, s.K)), v.unflatten(-1, (s.H, s.V)), (cq, ck, cv)

    def _mix(self, q, k, v, g, **kw):
        if self._kernel is None:
            return torch_ref.chunk_gla(q, k, v, g, chunk_size=REFERENCE_CHUNK_SIZE, **kw)
        if g is None or g.dim() != 4:
            g = torch_ref.expand_gate(g, *q.shape, device=q.device)
        return self._kernel(q, k, v, g, **kw)

    def _out(self, x, o):
        s = self.sizes
        o = self.g_norm(o, self.g_proj(x).unflatten(-1, (s.H, s.V)))
        return self.o_proj(o.flatten(-2))

    def load_fla_state_dict(self, state_dict):
        """Load the ``state_dict()`` of an FLA ``GatedLinearAttention`` layer.

        FLA's names are ours except ``g_norm_swish_gate`` → ``g_norm`` (:data:`config.FLA_RENAMES`).
        Build this layer with FLA's sizes (hidden_size, num_heads, expand_k, expand_v,
        gate_low_rank_dim) and options (gate_logit_normalizer, norm_eps; FLA's norm is RMS; FLA's
        ``use_short_conv``, ``conv_size``, with ``conv_bias=False``). Raises ValueError before loading
        anything when names or shapes differ (e.g. short convolutions on one side only;
        ``num_kv_heads < num_heads``, ``use_output_gate=False`` have no counterpart here).
        """
        renamed = config.from_fla_names(state_dict)
        config.check_state_dict(renamed, {name: tuple(p.shape) for name, p in self.state_dict().items()})
        self.load_state_dict(renamed)


class SimpleGatedLinearAttention(_TokenMixer):
    """The simple GLA layer of the Pallas RFC (maxtext's ``BailingMoeV2LinearAttention``), per head h::

        [q, k, v] = x W_QKV  (optionally RMS-normalised per head: query_layernorm, key_layernorm)
        S_t^h = γ_h S_{t−1}^h + k_t^hᵀ v_t^h,   o_t^h = scale · q_t^h S_t^h,   log γ_h = g_gamma[h]
        y_t = (GroupRMSNorm(concat_h o_t^h) ⊙ sigmoid(x_t W_g)) W_dense

    ``g_gamma = −decay_scale · m_h`` with m_h the ALiBi slopes (:func:`gla_ref.reference.gates.build_slope_tensor`)
    and ``decay_scale = 1 − layer_idx/(num_layers − 1) + 1e−5`` (:func:`config.decay_scale`): a fixed
    buffer, not a parameter. K = V = head_dim (default d/H), d_i = H·head_dim. Parameters (names as in
    the RFC's layer): ``query_key_value`` [3·d_i, d], ``g_proj`` [d_i, d], ``dense`` [d, d_i],
    ``g_norm.weight`` [d_i] (:class:`GroupRMSNorm` over ``group_norm_size`` groups of whole heads),
    ``query_layernorm.weight``, ``key_layernorm.weight`` [head_dim] with ``use_qk_norm``;
    ``5·d·d_i + d_i (+ 2·head_dim)`` in all (:func:`config.simple_num_params`). The RFC's rotary
    embedding of q and k is left out: positions reach this layer only through the decay.
    ``backend``: ``"reference"`` (:func:`gla_ref.reference.torch.chunk_gla` with g of shape [H]) or
    ``"chunk"`` (:func:`gla_ref.triton.chunk_simple_gla` with ``g_gamma``).
    """

    def __init__(self, hidden_size, num_heads=4, head_dim=None, group_norm_size=1, use_qk_norm=False,
                 layer_idx=0, num_layers=1, backend="chunk", norm_eps=1e-5):
        super().__init__()
        s = self.sizes = config.simple_sizes(hidden_size, num_heads, head_dim, group_norm_size, use_qk_norm,
                                             layer_idx, num_layers, norm_eps, backend)
        self.dims = (s.d, s.H, s.D, s.D)
        self.query_key_value = nn.Linear(s.d, 3 * s.inner, bias=False)
        if s.use_qk_norm:
            self.query_layernorm = nn.RMSNorm(s.D, eps=s.eps)
            self.key_layernorm = nn.RMSNorm(s.D, eps=s.eps)
        self.g_proj = nn.Linear(s.d, s.inner, bias=False)
        self.g_norm = GroupRMSNorm(s.inner, s.groups, s.eps)
        self.dense = nn.Linear(s.inner, s.d, bias=False)
        g_gamma = slopes_to_g_gamma(build_slope_tensor(s.H), scale=s.decay_scale)
        self.register_buffer("g_gamma", torch.tensor(g_gamma, dtype=torch.float32), persistent=False)
        self._kernel = None if backend == "reference" else _triton("chunk_simple_gla")

    def _heads(self, x):
        s = self.sizes
        q, k, v = self.query_key_value(x).unflatten(-1, (3, s.H, s.D)).unbind(-3)
        if s.use_qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        return q, k, v, self.g_gamma

    def _mix(self, q, k, v, g, **kw):
        if self._kernel is None:
            return torch_ref.chunk_gla(q, k, v, g, chunk_size=REFERENCE_CHUNK_SIZE, **kw)
        return self._kernel(q, k, v, g_gamma=g, **kw)

    def _out(self, x, o):
        return self.dense(self.g_norm(o.flatten(-2)) * torch.sigmoid(self.g_proj(x)))


# ----------------------------------------------------------------------------- a tiny language model

class SwiGLU(nn.Module):
    """The paper's SwiGLU ``(Swish(z W₁) ⊙ z W₂) W₃``, with LLaMA/FLA names ``gate_proj`` (W₁),
    ``up_proj`` (W₂) and ``down_proj`` (W₃)."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, z):
        return self.down_proj(F.silu(self.gate_proj(z)) * self.up_proj(z))


def make_mixer(mixer, hidden_size, num_heads=4, backend="reference", *, layer_idx=0, num_layers=1,
               norm_eps=1e-5, **kwargs):
    """The token mixer named ``mixer`` (a key of :data:`MIXERS`); ``kwargs`` go to its constructor."""
    config.choice("mixer", mixer, tuple(MIXERS))
    if mixer == "simple":
        return SimpleGatedLinearAttention(hidden_size, num_heads, backend=backend, layer_idx=layer_idx,
                                          num_layers=num_layers, norm_eps=norm_eps, **kwargs)
    return GatedLinearAttention(hidden_size, num_heads, backend=backend, gate=MIXERS[mixer],
                                norm_eps=norm_eps, **kwargs)


class GLABlock(nn.Module):
    """Pre-norm block: ``x ← x + mixer(RMSNorm(x))``, then ``x ← x + SwiGLU(RMSNorm(x))``.

    Names follow FLA's ``GLABlock``: ``attn_norm``, ``attn``, ``mlp_norm``, ``mlp``. ``intermediate_size``
    defaults to 8d/3 rounded up to a multiple of 8 (a SwiGLU with about the weights of a 4d MLP).
    ``mixer_kwargs`` go to the mixer (e.g. ``expand_k``, ``gate_low_rank_dim``).
    """

    def __init__(self, hidden_size, mixer="gla", num_heads=4, backend="reference", *, intermediate_size=None,
                 norm_eps=1e-5, layer_idx=0, num_layers=1, **mixer_kwargs):
        super().__init__()
        d = config.positive_int("hidden_size", hidden_size)
        inner = (8 * -(-d // 3) if intermediate_size is None  # ⌈8d/3⌉ rounded up to a multiple of 8
                 else config.positive_int("intermediate_size", intermediate_size))
        self.attn_norm = nn.RMSNorm(d, eps=norm_eps)
        self.attn = make_mixer(mixer, d, num_heads, backend, layer_idx=layer_idx, num_layers=num_layers,
                               norm_eps=norm_eps, **mixer_kwargs)
        self.mlp_norm = nn.RMSNorm(d, eps=norm_eps)
        self.mlp = SwiGLU(d, inner)

    def forward(self, x, initial_state=None, output_final_state=False, cu_seqlens=None):
        """x ``[B, T, d]`` → ``(x' [B, T, d], the mixer's final state or None)``.

        ``initial_state``: the mixer's, ``[B, H, K, V]`` float32 or None. ``cu_seqlens``: None, or
        int64 ``[N + 1]`` offsets of N sequences packed into one row (B = 1, FLA's convention); the
        states are then ``[N, H, K, V]``. Only the mixer mixes tokens (the norms and the SwiGLU act on
        each token alone; a mixer's short convolutions restart at every sequence start), so passing
        the offsets to the mixer keeps every sequence apart. With ``use_short_conv`` the states are
        :class:`ShortConvState` s.
        """
        y, state = self.attn(self.attn_norm(x), initial_state, output_final_state, cu_seqlens=cu_seqlens)
        x = x + y
        return x + self.mlp(self.mlp_norm(x)), state

    def step(self, x_t, state=None):
        """One token: x_t ``[B, d]`` → ``(x_t' [B, d], the mixer's new state)``."""
        y, state = self.attn.step(self.attn_norm(x_t), state)
        x = x_t + y
        return x + self.mlp(self.mlp_norm(x)), state


class GLALM(nn.Module):
    """A small causal language model: embedding, ``num_layers`` :class:`GLABlock` s, RMSNorm, LM head.

    Names follow FLA's ``GLAForCausalLM`` without its ``model.`` prefix: ``embeddings``, ``layers``,
    ``norm``, ``lm_head``. With ``tie_embeddings`` the head is the embedding matrix (one parameter).
    ``mixer`` (see :data:`MIXERS`) and ``backend`` apply to every block; ``mixer_kwargs`` go to the mixers
    (e.g. ``use_short_conv=True``, whose per-layer states are then :class:`ShortConvState` s).
    The embedding starts as N(0, 0.02²), so the first logits are small.
    """

    def __init__(self, vocab_size, hidden_size=64, num_layers=2, num_heads=4, mixer="gla", backend="reference",
                 *, tie_embeddings=True, intermediate_size=None, norm_eps=1e-5, **mixer_kwargs):
        super().__init__()
        V = config.positive_int("vocab_size", vocab_size)
        L = config.positive_int("num_layers", num_layers)
        if not isinstance(tie_embeddings, bool):
            raise TypeError(f"tie_embeddings must be a bool, got {tie_embeddings!r}")
        self.embeddings = nn.Embedding(V, hidden_size)
        nn.init.normal_(self.embeddings.weight, std=0.02)
        self.layers = nn.ModuleList(
            GLABlock(hidden_size, mixer, num_heads, backend, intermediate_size=intermediate_size,
                     norm_eps=norm_eps, layer_idx=i, num_layers=L, **mixer_kwargs) for i in range(L))
        self.norm = nn.RMSNorm(hidden_size, eps=norm_eps)
        self.lm_head = nn.Linear(hidden_size, V, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.embeddings.weight

    def forward(self, input_ids, states=None, output_final_state=False, cu_seqlens=None):
        """input_ids ``[B, T]`` (integers) → ``(logits [B, T, vocab_size], states)``.

        ``states``: None or one ``[B, H, K, V]`` state per layer (a list, as returned with
        ``output_final_state=True``); the returned states are None unless asked for.
        ``cu_seqlens``: None, or int64 ``[N + 1]`` offsets of N sequences packed into one row
        (input_ids ``[1, T]``, FLA's convention): 0 = cu_seqlens[0] < … < cu_seqlens[N] = T, sequence n
        holding tokens cu_seqlens[n] to cu_seqlens[n+1] − 1. Every layer then runs each sequence from
        its own state, so the logits are those of each sequence run alone, and each per-layer state
        (given or returned) is ``[N, H, K, V]``; :meth:`step` can go on decoding the N sequences as a
        batch of N. A bad cu_seqlens raises a ValueError or TypeError naming it.
        """
        self._check_ids("input_ids", input_ids, 2, "[B, T]")
        x, new_states = self.embeddings(input_ids), []
        for layer, state in zip(self.layers, self._states(states)):
            x, state = layer(x, state, output_final_state, cu_seqlens=cu_seqlens)
            new_states.append(state)
        return self.lm_head(self.norm(x)), (new_states if output_final_state else None)

    def step(self, token, states=None):
        """One token per sequence: token ``[B]`` → ``(logits [B, vocab_size], the new states)``."""
        self._check_ids("token", token, 1, "[B]")
        x, new_states = self.embeddings(token), []
        for layer, state in zip(self.layers, self._states(states)):
            x, state = layer.step(x, state)
            new_states.append(state)
        return self.lm_head(self.norm(x)), new_states

    @staticmethod
    def _check_ids(name, ids, ndim, shape_doc):
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64) or ids.dim() != ndim:
            raise TypeError(f"{name} must be an int64 or int32 torch.Tensor of shape {shape_doc}, got "
                            f"{getattr(ids, 'dtype', type(ids).__name__)} {tuple(getattr(ids, 'shape', ()))}")

    def _states(self, states):
        if states is None:
            return [None] * len(self.layers)
        if not isinstance(states, (list, tuple)) or len(states) != len(self.layers):
            raise ValueError(f"states must be None or a list of {len(self.layers)} per-layer states, got "
                             f"{type(states).__name__} of length {len(states) if hasattr(states, '__len__') else '?'}")
        return states
