"""GLA layers in PyTorch: the paper's layer (FLA's interface), the RFC's simple GLA layer, and a tiny LM.

* :class:`GatedLinearAttention` — §4.4 of the GLA paper, a drop-in for FLA 0.6.0's
  ``fla.layers.GatedLinearAttention``: FLA's constructor (every argument, FLA's defaults), FLA's
  ``forward(hidden_states, attention_mask, past_key_values, use_cache)``, FLA's weights
  (:meth:`~GatedLinearAttention.from_fla`, :meth:`~GatedLinearAttention.load_fla_state_dict`).
* :class:`SimpleGatedLinearAttention` — the Pallas RFC's layer: a constant per-head decay from
  ALiBi slopes, :class:`GroupRMSNorm`, a sigmoid output gate.
* :class:`GLABlock`, :class:`GLALM` — pre-norm blocks (mixer + SwiGLU) and a small model made of them,
  whose ``mixer`` picks the gate family: ``"gla"``, ``"scalar"``, ``"retnet"``/``"const"``,
  ``"linear"``, or ``"simple"`` (the RFC layer). The MQAR chapter trains these. FLA's causal LM, with
  FLA's config, checkpoints, loss and ``generate()``, is :class:`gla_ref.models.torch.GLAForCausalLM`.

Two interfaces, one function. FLA's: ``layer(hidden_states, attention_mask=None, past_key_values=None,
use_cache=False)`` returns FLA's ``(o, None, past_key_values)``; a padding mask packs the tokens
(left padding runs as if the padding were not there; outputs at padding are 0), and the states live in
an FLA-format cache (:class:`gla_ref.layers.cache.Cache` or FLA's own): recurrent ``[B, H, V, K]``,
convolutions ``[B, D, W]``. Ours: ``forward(x, initial_state=None, output_final_state=False,
cu_seqlens=None) -> (y, state)`` over a whole sequence, taken when ``initial_state=`` or
``output_final_state=`` is given (by keyword; the simple layer also positionally), and
``step(x_t, state) -> (y_t, state)`` for one token; our states are ``[B, H, K, V]`` float32.
Prefill with ``forward``, then decode with ``step``: a one-token call applies the closed-form update
``S ← Diag(α_t) S + k_tᵀ v_t``, ``o_t = scale · q_t S`` in PyTorch (no kernel launch for a [K, V]
rank-one update). Shapes: x ``[B, T, d]``, x_t ``[B, d]``.

Backends: ``"auto"`` (the default) runs the reference (:func:`gla_ref.reference.torch.chunk_gla`)
unless the input is a CUDA tensor, where it runs FLA's choice of :mod:`gla_ref.triton` kernel (``mode``,
``fused_recurrent`` up to 64 tokens) — decided at each call, so a model built on the CPU and moved to
the GPU uses the kernels, and the reference path never imports Triton. An explicit backend
(``"reference"``, ``"chunk"``, ``"fused_chunk"``, ``"fused_recurrent"``) always runs; a kernel on a CPU
runs in Triton's interpreter (slow: for tests), even when Triton was imported first
(:func:`gla_ref.device.interpret_imported_triton`).

Short convolutions: ``use_short_conv=True, conv_size=4`` runs q, k and v through FLA's causal
depthwise convolution + SiLU (:mod:`gla_ref.layers.short_conv`). On our path the state is then a
:class:`~gla_ref.layers.config.ShortConvState` (the recurrent state and the last W − 1 inputs of each
convolution) instead of the bare tensor.

Packed sequences: ``cu_seqlens``, FLA's int32 or int64 offsets ``[N + 1]`` of N sequences packed into one
row (B = 1; a tensor on x's device or a NumPy array, empty sequences allowed), in every forward. Each
sequence is mixed from its own first token and its own state, states being ``[N, H, K, V]``, as if it
ran alone; everything else acts on one token at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gla_ref._validate import MAX_K, MAX_V, check_flag
from gla_ref.layers import config, fla_torch
from gla_ref.layers.cache import Cache
from gla_ref.layers.config import ShortConvState
from gla_ref.layers.fla_torch import FLALayerInterface, check_tensor
from gla_ref.layers.short_conv import ShortConvolution
from gla_ref.reference import torch as torch_ref
from gla_ref.reference.gates import build_slope_tensor, retnet_log_gammas, slopes_to_g_gamma

__all__ = ["GatedLinearAttention", "SimpleGatedLinearAttention", "GroupRMSNorm", "NormSwishGate",
           "GLABlock", "GLALM", "MIXERS", "recurrent_step", "ShortConvolution", "ShortConvState", "Cache",
           "TokenMixer"]

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


def token_gate(g):
    """The log-gate of a one-token sequence (``[B,1,H,K]``, ``[B,1,H]``, ``[H]`` or None), broadcastable to
    ``[B, H, K]``."""
    if g is None:
        return None
    if g.dim() == 1:
        return g[:, None]  # [H] → [H, 1]
    return g[:, 0] if g.dim() == 4 else g[:, 0, :, None]


class TokenMixer(config.ShortConvStateRules, nn.Module):
    """``forward`` (a chunkwise form) and ``step`` (the recurrence), shared by both layers.

    A subclass sets ``self.dims = (d, H, K, V)`` and defines ``_heads(x) -> (q, k, v, g)`` (g in any
    rank of the API contract), ``_mix(q, k, v, g, **kw) -> (o, state)`` and ``_out(x, o) -> y``; a
    layer with short convolutions also overrides ``_short_conv`` (and its state is a
    :class:`ShortConvState`), one with grouped heads or feature maps ``_expand``.
    """

    def forward(self, x, initial_state=None, output_final_state=False, cu_seqlens=None):
        """x ``[B, T, d]`` → ``(y [B, T, d], final_state [B, H, K, V] float32 or None)``.

        ``initial_state`` ``[B, H, K, V]`` float32 (e.g. from an earlier call) or None for zeros.
        ``cu_seqlens``: None, or int32/int64 ``[N + 1]`` offsets of N sequences packed into one row (x
        ``[1, T, d]``, FLA's convention), 0 = cu_seqlens[0] ≤ … ≤ cu_seqlens[N] = T; each sequence is
        mixed from its own first token and its own row of ``initial_state``, and both states are then
        ``[N, H, K, V]`` float32. Every backend takes it. The projections and norms act per token, so
        only the mixer (and the short convolutions, which restart at each sequence) see the offsets.
        A bad cu_seqlens is a ValueError or TypeError naming it. With ``use_short_conv`` both states
        are :class:`ShortConvState` s (None: zeros).
        """
        check_tensor("x", x, "[B, T, d]", 3, self.dims[0], self._dtype())
        check_flag("output_final_state", output_final_state)
        S0, conv = self._split_state("initial_state", initial_state)
        y, state, conv = self._run(x, S0, conv, cu_seqlens, output_final_state)
        return y, (self._join_state(state, conv) if output_final_state else None)

    def step(self, x_t, state=None):
        """Decode one token: x_t ``[B, d]``, state ``[B, H, K, V]`` float32 (a :class:`ShortConvState`
        with ``use_short_conv``; None: zeros) → ``(y_t [B, d], new state)``. Same result as ``forward``
        on the whole sequence."""
        check_tensor("x_t", x_t, "[B, d]", 2, self.dims[0], self._dtype())
        S, conv = self._split_state("state", state)
        y, S, conv = self._run(x_t[:, None], S, conv, None, True)
        return y[:, 0], self._join_state(S, conv)

    def _run(self, x, S0, conv, cu_seqlens, want_state, conv_keep=None):
        """The layer on x ``[B, T, d]`` from state S0 (ours, ``[N, H, K, V]``) and conv caches:
        ``(y, final state or None, conv caches)``. One token without offsets: the closed-form update."""
        q, k, v, g = self._heads(x)
        q, k, v, conv = self._short_conv(q, k, v, conv, cu_seqlens, conv_keep)
        q, k, v, g = self._expand(q, k, v, g)
        if q.shape[1] == 1 and cu_seqlens is None:
            S = self._start_state(S0, q.shape[0], q.device)
            o, S = recurrent_step(q[:, 0], k[:, 0], v[:, 0], token_gate(g), S, q.shape[-1] ** -0.5)
            o = o[:, None]
        else:
            o, S = self._mix(q, k, v, g, initial_state=S0, output_final_state=want_state, cu_seqlens=cu_seqlens)
        return self._out(x, o), (S if want_state else None), conv

    def _short_conv(self, q, k, v, conv, cu_seqlens, keep=None):
        return q, k, v, None

    def _expand(self, q, k, v, g):
        return q, k, v, g

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
    """Per-head normalisation of the outputs, then the output gate: ``norm(o_t^h) ⊙ Swish(r_t^h)``.

    ``norm="rms"``: RMSNorm with a weight (FLA's ``FusedRMSNormGated``); ``"layer"``: LayerNorm with
    weight and bias (the paper's LN). The ``[V]`` parameters are shared by all heads; with
    ``elementwise_affine=False`` there are none. ``fused`` (FLA's fused norm + Swish) multiplies in
    float32 before rounding to o's dtype; otherwise (FLA's ``g_norm`` then ``gate_fn``, any of
    :data:`gla_ref.layers.config.ACTIVATIONS`) the normalised o is rounded first and multiplied by
    ``gate_fn(r)``. ``forward(o, r=None)``: o, r ``[..., H, V]``; without r (FLA's
    ``use_output_gate=False``) only the norm. Float32 normalisation; returns o's dtype.
    """

    def __init__(self, V, norm="rms", eps=1e-5, *, elementwise_affine=True, gate_fn="swish", fused=True):
        super().__init__()
        self.norm, self.eps = config.choice("norm", norm, config.NORMS), eps
        self.gate_fn, self.fused = config.activation("gate_fn", gate_fn), config.flag("fused", fused)
        affine = config.flag("elementwise_affine", elementwise_affine)
        self.weight = nn.Parameter(torch.ones(V)) if affine else None
        self.bias = nn.Parameter(torch.zeros(V)) if affine and norm == "layer" else None

    def forward(self, o, r=None):
        x = o.float()
        if self.norm == "layer":
            x = x - x.mean(-1, keepdim=True)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            x = x * self.weight.float()
        if self.bias is not None:
            x = x + self.bias.float()
        if r is None:
            return x.to(o.dtype)
        if self.fused:
            return (x * F.silu(r.float())).to(o.dtype)
        return x.to(o.dtype) * fla_torch.ACTIVATIONS[self.gate_fn](r)


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


def _accept_fla_names(module, state_dict, prefix, *args):
    """Load-state-dict pre-hook: FLA's ``g_norm_swish_gate.*`` is our ``g_norm.*`` (FLA checkpoints load as they are)."""
    head = prefix + "g_norm_swish_gate."
    for key in [key for key in state_dict if key.startswith(head)]:
        state_dict[prefix + "g_norm." + key[len(head):]] = state_dict.pop(key)


class GatedLinearAttention(FLALayerInterface, TokenMixer):
    """The GLA layer of the paper (§4.4), per head h::

        S_t^h = Diag(α_t^h) S_{t−1}^h + k_t^hᵀ v_t^h,   o_t^h = scale · q_t^h S_t^h
        o'_t  = concat_h norm(o_t^h),   r_t = Swish(x_t W_r),   y_t = (r_t ⊙ o'_t) W_O
        log α_t = logsigmoid(x_t W_α¹ W_α² + b_α) / τ      (τ = gate_logit_normalizer)

    Widths: d = hidden_size, d_k = d·expand_k, d_v = d·expand_v (whole numbers), per head K = d_k/H and
    V = d_v/H; scale = K^−½. Parameters, named as FLA's ``fla.layers.GatedLinearAttention`` names them:
    ``q_proj``, ``k_proj`` [d_k, d]; ``v_proj``, ``g_proj`` (W_r) [d_v, d]; ``gk_proj.0`` [r, d] and
    ``gk_proj.1`` [d_k, r] with bias [d_k] (W_α¹, W_α², b_α; r = gate_low_rank_dim); ``o_proj`` [d, d_v];
    ``g_norm.weight`` [V] (FLA's ``g_norm_swish_gate``; loading takes either name; and ``g_norm.bias``
    for ``norm="layer"``). As in FLA, W_r has no bias b_r. Exactly ``2·d·d_k + 3·d·d_v + r·(d + d_k) +
    d_k + V`` parameters (``+V`` more for LayerNorm): ``4d² + 3rd/2 + d/2 + d/H`` at the paper's
    d_k = d/2, d_v = d (:func:`config.gla_num_params`).

    FLA's arguments, all taken with FLA's defaults (by keyword; our positional order is ``hidden_size,
    num_heads, expand_k, expand_v, gate_low_rank_dim, gate_logit_normalizer, norm, backend``):
    ``num_kv_heads`` (grouped heads: k, v and the gate are computed for H_kv heads and shared by H/H_kv
    query heads each); ``feature_map`` (applied to q and k after the convolutions); ``use_output_gate``
    (False: no W_r, ``y_t = o'_t W_O``); ``gate_fn`` (the output gate's activation); ``clamp_min``
    (log α floored at it); ``elementwise_affine`` (False: the norm has no weight); ``use_short_conv``,
    ``conv_size``, ``conv_bias`` (FLA's short convolution + SiLU on q, k, v after their projections,
    ``{q,k,v}_conv1d.weight`` [D, 1, W] and with conv_bias ``.bias`` [D]; the gates still read x);
    ``norm_eps``; ``mode`` (the kernel ``backend="auto"`` runs on a GPU); ``fuse_norm`` (FLA's fused
    norm + gate kernel: speed only, it changes nothing here but the name FLA gives the norm);
    ``layer_idx`` (the layer's entry in ``past_key_values``).

    Ours: ``gate`` swaps the forget gate, keeping the rest: ``"gla"`` (above; FLA's), ``"scalar"``
    (one α per head and token: ``gk_proj.1`` maps r → H), ``"const"`` (RetNet's fixed γ_h = 1 − 2^(−5−h),
    a buffer ``g_gamma``), ``"none"`` (linear attention); ``norm="layer"``; ``backend`` (see the module).
    Weights from FLA: :meth:`from_fla`, :meth:`load_fla_state_dict`; to FLA: :meth:`fla_state_dict`.
    """

    def __init__(self, hidden_size=1024, num_heads=4, expand_k=0.5, expand_v=1.0, gate_low_rank_dim=16,
                 gate_logit_normalizer=16, norm="rms", backend="auto", *, mode="chunk", num_kv_heads=None,
                 feature_map=None, use_short_conv=False, conv_size=4, conv_bias=False, use_output_gate=True,
                 gate_fn="swish", elementwise_affine=True, norm_eps=1e-5, clamp_min=None, fuse_norm=True,
                 layer_idx=None, gate="gla"):
        super().__init__()
        if isinstance(hidden_size, str):
            raise TypeError(f"GatedLinearAttention's first positional argument is hidden_size, FLA's is mode; got "
                            f"{hidden_size!r}: pass FLA's arguments by keyword (mode={hidden_size!r}, hidden_size=...)")
        s = self.sizes = config.gla_sizes(
            hidden_size, num_heads, expand_k, expand_v, gate_low_rank_dim, gate_logit_normalizer, norm, gate,
            norm_eps, backend, config.TORCH_BACKENDS, use_short_conv, conv_size, num_kv_heads=num_kv_heads,
            feature_map=feature_map, gate_fn=gate_fn, use_output_gate=use_output_gate,
            elementwise_affine=elementwise_affine, clamp_min=clamp_min, conv_bias=conv_bias, fuse_norm=fuse_norm,
            mode=mode, layer_idx=layer_idx)
        fla_torch.import_kernels(s.backend)
        self.dims = (s.d, s.H, s.K, s.V)
        self.layer_idx = s.layer_idx
        kv_k, kv_v = s.kv_heads * s.K, s.kv_heads * s.V
        self.q_proj = nn.Linear(s.d, s.key_dim, bias=False)
        self.k_proj = nn.Linear(s.d, kv_k, bias=False)
        self.v_proj = nn.Linear(s.d, kv_v, bias=False)
        if s.use_output_gate:
            self.g_proj = nn.Linear(s.d, s.value_dim, bias=False)
        if s.use_short_conv:
            self.q_conv1d = ShortConvolution(s.key_dim, s.conv_size, s.conv_bias)
            self.k_conv1d = ShortConvolution(kv_k, s.conv_size, s.conv_bias)
            self.v_conv1d = ShortConvolution(kv_v, s.conv_size, s.conv_bias)
        if s.gate in ("gla", "scalar"):
            self.gk_proj = nn.Sequential(nn.Linear(s.d, s.r, bias=False),
                                         nn.Linear(s.r, kv_k if s.gate == "gla" else s.kv_heads, bias=True))
        if s.gate == "const":
            self.register_buffer("g_gamma", torch.tensor(retnet_log_gammas(s.H), dtype=torch.float32),
                                 persistent=False)
        self.g_norm = NormSwishGate(s.V, s.norm, s.eps, elementwise_affine=s.affine, gate_fn=s.gate_fn,
                                    fused=s.fused_gate)
        self.o_proj = nn.Linear(s.value_dim, s.d, bias=False)
        self.register_load_state_dict_pre_hook(_accept_fla_names)

    # ------------------------------------------------------------------ the function

    def _kv_log_gate(self, x):
        """log α per key/value head: ``[B, T, H_kv, K]`` ("gla"), ``[B, T, H_kv]`` ("scalar"), ``[H]``
        ("const") or None ("none"); float32, floored at ``clamp_min``."""
        s = self.sizes
        if s.gate in ("const", "none"):
            return self.g_gamma if s.gate == "const" else None
        g = F.logsigmoid(self.gk_proj(x).float()) / s.tau
        if s.clamp_min is not None:
            g = torch.clamp_min(g, s.clamp_min)
        return g.unflatten(-1, (s.kv_heads, s.K)) if s.gate == "gla" else g

    def log_gate(self, x):
        """log α for x ``[B, T, d]``: float32 ``[B, T, H, K]`` ("gla"), ``[B, T, H]`` ("scalar"),
        ``[H]`` ("const") or None ("none")."""
        g = self._kv_log_gate(x)
        return g if g is None or g.dim() == 1 else g.repeat_interleave(self.sizes.groups, dim=2)

    def _heads(self, x):
        s = self.sizes
        q = self.q_proj(x).unflatten(-1, (s.H, s.K))
        k = self.k_proj(x).unflatten(-1, (s.kv_heads, s.K))
        v = self.v_proj(x).unflatten(-1, (s.kv_heads, s.V))
        return q, k, v, self._kv_log_gate(x)

    def _short_conv(self, q, k, v, conv, cu_seqlens, keep=None):
        if not self.sizes.use_short_conv:
            return q, k, v, None
        conv = (None, None, None) if conv is None else conv
        out = [layer(x.flatten(-2), cache, cu_seqlens, keep)
               for layer, x, cache in zip((self.q_conv1d, self.k_conv1d, self.v_conv1d), (q, k, v), conv)]
        (q2, cq), (k2, ck), (v2, cv) = out
        return q2.view_as(q), k2.view_as(k), v2.view_as(v), (cq, ck, cv)

    def _expand(self, q, k, v, g):
        """Key/value heads shared by their groups of query heads (FLA repeats each one), then the feature map."""
        s = self.sizes
        if s.groups > 1:
            k, v = k.repeat_interleave(s.groups, dim=2), v.repeat_interleave(s.groups, dim=2)
            if g is not None and g.dim() > 1:
                g = g.repeat_interleave(s.groups, dim=2)
        if s.feature_map is not None:
            q, k = fla_torch.ACTIVATIONS[s.feature_map](q), fla_torch.ACTIVATIONS[s.feature_map](k)
        return q, k, v, g

    def _mix(self, q, k, v, g, **kw):
        s = self.sizes
        backend = fla_torch.resolve_backend(s.backend, s.mode, q, q.shape[1], s.K, s.V)
        if backend == "reference":
            return torch_ref.chunk_gla(q, k, v, g, chunk_size=REFERENCE_CHUNK_SIZE, **kw)
        if g is None or g.dim() != 4:
            g = torch_ref.expand_gate(g, *q.shape, device=q.device)
        return fla_torch.kernel(KERNELS[backend])(q, k, v, g, **kw)

    def _out(self, x, o):
        s = self.sizes
        r = self.g_proj(x).unflatten(-1, (s.H, s.V)) if s.use_output_gate else None
        return self.o_proj(self.g_norm(o, r).flatten(-2))


class SimpleGatedLinearAttention(TokenMixer):
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
    ``backend``: ``"reference"`` (:func:`gla_ref.reference.torch.chunk_gla` with g of shape [H]),
    ``"chunk"`` (:func:`gla_ref.triton.chunk_simple_gla` with ``g_gamma``) or ``"auto"`` (the default:
    ``"chunk"`` for CUDA inputs, the reference otherwise, decided at each call).
    """

    def __init__(self, hidden_size, num_heads=4, head_dim=None, group_norm_size=1, use_qk_norm=False,
                 layer_idx=0, num_layers=1, backend="auto", norm_eps=1e-5):
        super().__init__()
        s = self.sizes = config.simple_sizes(hidden_size, num_heads, head_dim, group_norm_size, use_qk_norm,
                                             layer_idx, num_layers, norm_eps, backend)
        fla_torch.import_kernels(s.backend)
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

    def _heads(self, x):
        s = self.sizes
        q, k, v = self.query_key_value(x).unflatten(-1, (3, s.H, s.D)).unbind(-3)
        if s.use_qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        return q, k, v, self.g_gamma

    def _mix(self, q, k, v, g, **kw):
        s = self.sizes
        kernel = s.backend == "chunk" or (s.backend == "auto" and q.is_cuda and s.D <= min(MAX_K, MAX_V))
        if not kernel:
            return torch_ref.chunk_gla(q, k, v, g, chunk_size=REFERENCE_CHUNK_SIZE, **kw)
        return fla_torch.kernel("chunk_simple_gla")(q, k, v, g_gamma=g, **kw)

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


def make_mixer(mixer, hidden_size, num_heads=4, backend="auto", *, layer_idx=0, num_layers=1,
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

    def __init__(self, hidden_size, mixer="gla", num_heads=4, backend="auto", *, intermediate_size=None,
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
        """x ``[B, T, d]`` → ``(x' [B, T, d], the mixer's final state or None)`` (our path; FLA's block
        interface is :class:`gla_ref.models.torch.GLABlock`).

        ``initial_state``: the mixer's, ``[B, H, K, V]`` float32 or None. ``cu_seqlens``: None, or
        int32/int64 ``[N + 1]`` offsets of N sequences packed into one row (B = 1, FLA's convention); the
        states are then ``[N, H, K, V]``. Only the mixer mixes tokens (the norms and the SwiGLU act on
        each token alone; a mixer's short convolutions restart at every sequence start), so passing
        the offsets to the mixer keeps every sequence apart. With ``use_short_conv`` the states are
        :class:`ShortConvState` s.
        """
        y, state = self.attn(self.attn_norm(x), initial_state=initial_state, output_final_state=output_final_state,
                             cu_seqlens=cu_seqlens)
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
    ``norm``, ``lm_head``. With ``tie_embeddings`` the head is the embedding matrix (one parameter), and
    ``load_state_dict`` refuses a checkpoint whose ``lm_head.weight`` differs from its
    ``embeddings.weight`` (an untied model's), naming the key; untied, it refuses one without
    ``lm_head.weight`` (a tied model's). Its defaults (tied, a ⌈8d/3⌉ SwiGLU, eps 1e−5) are the MQAR
    chapter's; FLA's model, config and defaults are :class:`gla_ref.models.torch.GLAForCausalLM`.
    ``mixer`` (see :data:`MIXERS`) and ``backend`` apply to every block; ``mixer_kwargs`` go to the mixers
    (e.g. ``use_short_conv=True``, whose per-layer states are then :class:`ShortConvState` s).
    The embedding starts as N(0, 0.02²), so the first logits are small.
    """

    def __init__(self, vocab_size, hidden_size=64, num_layers=2, num_heads=4, mixer="gla", backend="auto",
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
        self.tie_embeddings = tie_embeddings
        if tie_embeddings:
            self.lm_head.weight = self.embeddings.weight
        self.register_load_state_dict_pre_hook(
            lambda module, sd, prefix, *_: fla_torch.check_tied_weights(sd, prefix, "embeddings.weight", "lm_head.weight",
                                                                        module.tie_embeddings, "tie_embeddings"))

    def forward(self, input_ids, states=None, output_final_state=False, cu_seqlens=None):
        """input_ids ``[B, T]`` (integers) → ``(logits [B, T, vocab_size], states)``.

        ``states``: None or one ``[B, H, K, V]`` state per layer (a list, as returned with
        ``output_final_state=True``); the returned states are None unless asked for.
        ``cu_seqlens``: None, or int32/int64 ``[N + 1]`` offsets of N sequences packed into one row
        (input_ids ``[1, T]``, FLA's convention): 0 = cu_seqlens[0] ≤ … ≤ cu_seqlens[N] = T, sequence n
        holding tokens cu_seqlens[n] to cu_seqlens[n+1] − 1. Every layer then runs each sequence from
        its own state, so the logits are those of each sequence run alone, and each per-layer state
        (given or returned) is ``[N, H, K, V]``; :meth:`step` can go on decoding the N sequences as a
        batch of N. A bad cu_seqlens raises a ValueError or TypeError naming it.
        """
        self._check_ids("input_ids", input_ids, 2, "[B, T]")
        x, new_states = self.embeddings(input_ids), []
        for layer, state in zip(self.layers, self._states(states)):
            x, state = layer(x, initial_state=state, output_final_state=output_final_state, cu_seqlens=cu_seqlens)
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
