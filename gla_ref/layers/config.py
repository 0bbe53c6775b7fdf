"""What the PyTorch and Flax layers share, without a framework: argument checks, sizes,
parameter counts and FLA's parameter names.

Symbols: d the model width (``hidden_size``), H heads, d_k = H·K and d_v = H·V the key and value
widths of all heads together (K, V per head), r the rank of the gate projection, τ its temperature.
Both frameworks build their layers from :func:`gla_sizes` / :func:`simple_sizes`, so they accept
and refuse the same arguments with the same messages.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

from gla_ref._validate import MAX_K, MAX_V

GATES = ("gla", "scalar", "const", "none")
"""Forget gates of :class:`GatedLinearAttention`: per key channel (GLA), one scalar per head
(data-dependent), one constant per head (RetNet's γ_h), none (linear attention)."""

NORMS = ("rms", "layer")
TORCH_BACKENDS = ("reference", "chunk", "fused_chunk", "fused_recurrent")
FLAX_BACKENDS = ("reference", "chunk", "fused_chunk")
SIMPLE_BACKENDS = ("reference", "chunk")

FLA_RENAMES = {"g_norm_swish_gate.weight": "g_norm.weight"}
"""FLA's names that differ from ours. FLA fuses the per-head RMSNorm (a weight, no bias) and the Swish
gate into one module named ``g_norm_swish_gate`` (``g_norm`` when ``fuse_norm=False``); every other
name is the same."""


class GLASizes(NamedTuple):
    d: int
    H: int
    K: int  # key width per head
    V: int  # value width per head
    r: int
    tau: float
    gate: str
    norm: str
    eps: float
    backend: str
    use_short_conv: bool = False
    conv_size: int = 4  # W, the width of each short convolution (used only with use_short_conv)

    @property
    def key_dim(self) -> int:
        return self.H * self.K

    @property
    def value_dim(self) -> int:
        return self.H * self.V


class SimpleSizes(NamedTuple):
    d: int
    H: int
    D: int  # head width (K = V = D)
    groups: int
    use_qk_norm: bool
    eps: float
    backend: str
    decay_scale: float  # g_gamma = −decay_scale · ALiBi slopes

    @property
    def inner(self) -> int:
        return self.H * self.D


# ----------------------------------------------------------------------------- argument checks

def positive_int(name, x) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name} must be a positive int, got {x!r}")
    return x


def positive_number(name, x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0 or x == float("inf"):
        raise ValueError(f"{name} must be a positive finite number, got {x!r}")
    return float(x)


def choice(name, x, options) -> str:
    if x not in options:
        raise ValueError(f"{name} must be one of {options}, got {x!r}")
    return x


def _head_dim(name, width, H, expand_name) -> int:
    if width < H or width % H:
        raise ValueError(f"{name} = {width} (hidden_size × {expand_name}) must be a positive multiple of "
                         f"num_heads = {H}")
    return width // H


def _check_kernel_dims(backend, K, V) -> None:
    """The kernels' head-size limits (:data:`gla_ref._validate.MAX_K`, :data:`~gla_ref._validate.MAX_V`),
    checked when the layer is built rather than at its first call."""
    for name, n, most in (("K", K, MAX_K), ("V", V, MAX_V)):
        if backend != "reference" and n > most:
            raise ValueError(f"{name} = {n} per head exceeds {most}, the most the {backend!r} "
                             f"kernels take; use backend='reference' or more heads")


# ----------------------------------------------------------------------------- GLA layer

def gla_sizes(hidden_size, num_heads, expand_k, expand_v, gate_low_rank_dim, gate_logit_normalizer,
              norm, gate, norm_eps, backend, backends, use_short_conv=False, conv_size=4) -> GLASizes:
    """Check the arguments of ``GatedLinearAttention`` and return its sizes.

    d_k = int(d·expand_k) and d_v = int(d·expand_v) must be multiples of H; ``backends`` lists the
    backends of the calling framework; ``use_short_conv`` a bool, ``conv_size`` a positive int.
    Raises ValueError (TypeError for a non-bool flag) naming the bad argument.
    """
    if not isinstance(use_short_conv, bool):
        raise TypeError(f"use_short_conv must be a bool, got {use_short_conv!r}")
    W = positive_int("conv_size", conv_size)
    d = positive_int("hidden_size", hidden_size)
    H = positive_int("num_heads", num_heads)
    K = _head_dim("key_dim", int(d * positive_number("expand_k", expand_k)), H, "expand_k")
    V = _head_dim("value_dim", int(d * positive_number("expand_v", expand_v)), H, "expand_v")
    choice("backend", backend, backends)
    _check_kernel_dims(backend, K=K, V=V)
    return GLASizes(d, H, K, V, positive_int("gate_low_rank_dim", gate_low_rank_dim),
                    positive_number("gate_logit_normalizer", gate_logit_normalizer),
                    choice("gate", gate, GATES), choice("norm", norm, NORMS),
                    positive_number("norm_eps", norm_eps), backend, use_short_conv, W)


def gla_num_params(hidden_size, num_heads=4, expand_k=0.5, expand_v=1.0, gate_low_rank_dim=16,
                   norm="rms", gate="gla", use_short_conv=False, conv_size=4) -> int:
    """Parameters of one ``GatedLinearAttention`` layer, in closed form.

    ``2·d·d_k`` (W_Q, W_K) ``+ 3·d·d_v`` (W_V, W_r, W_O) ``+ r·(d + d_k) + d_k`` (the low-rank gate
    W_α¹, W_α², b_α; ``r·(d + H) + H`` for ``gate="scalar"``, 0 for ``"const"``/``"none"``)
    ``+ V`` (RMSNorm weight, shared by the heads; ``2·V`` for LayerNorm's weight and bias).
    With the paper's d_k = d/2, d_v = d: ``4d² + 3rd/2 + d/2 + d/H`` — the "≈ 4d²" of §4.4.
    ``use_short_conv`` adds the three depthwise convolutions of width W = ``conv_size``:
    ``W·(2·d_k + d_v)`` (``2Wd`` at the paper's widths).
    """
    s = gla_sizes(hidden_size, num_heads, expand_k, expand_v, gate_low_rank_dim, 16, norm, gate, 1e-5,
                  "reference", ("reference",), use_short_conv, conv_size)
    conv = s.conv_size * (2 * s.key_dim + s.value_dim) if s.use_short_conv else 0
    projections = 2 * s.d * s.key_dim + 3 * s.d * s.value_dim
    gate_params = {"gla": s.r * (s.d + s.key_dim) + s.key_dim, "scalar": s.r * (s.d + s.H) + s.H,
                   "const": 0, "none": 0}[s.gate]
    return projections + gate_params + conv + (s.V if s.norm == "rms" else 2 * s.V)


# ----------------------------------------------------------------------------- simple GLA layer (RFC)

def decay_scale(layer_idx, num_layers) -> float:
    """The layer-dependent factor on the ALiBi slopes: ``1 − layer_idx/(num_layers − 1) + 1e−5``.

    The first layer decays fastest; the last keeps only 1e−5 of the slopes, so its memory barely
    fades. A model of one layer gets ``1 + 1e−5``.
    """
    L = positive_int("num_layers", num_layers)
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < L:
        raise ValueError(f"layer_idx must be an int in [0, num_layers) = [0, {L}), got {layer_idx!r}")
    return (1.0 - layer_idx / (L - 1) if L > 1 else 1.0) + 1e-5


def simple_sizes(hidden_size, num_heads, head_dim, group_norm_size, use_qk_norm, layer_idx, num_layers,
                 norm_eps, backend) -> SimpleSizes:
    """Check the arguments of ``SimpleGatedLinearAttention`` and return its sizes.

    ``head_dim`` defaults to d / H; ``group_norm_size`` groups of whole heads share one RMS
    (so it must divide H). Raises ValueError naming the bad argument.
    """
    d = positive_int("hidden_size", hidden_size)
    H = positive_int("num_heads", num_heads)
    if head_dim is None and d % H:
        raise ValueError(f"hidden_size = {d} must be a multiple of num_heads = {H} when head_dim is None")
    D = d // H if head_dim is None else positive_int("head_dim", head_dim)
    G = positive_int("group_norm_size", group_norm_size)
    if H % G:
        raise ValueError(f"group_norm_size = {G} must divide num_heads = {H} (a group is whole heads)")
    if not isinstance(use_qk_norm, bool):
        raise TypeError(f"use_qk_norm must be a bool, got {use_qk_norm!r}")
    choice("backend", backend, SIMPLE_BACKENDS)
    _check_kernel_dims(backend, K=D, V=D)  # simple GLA: K = V = head_dim
    return SimpleSizes(d, H, D, G, use_qk_norm, positive_number("norm_eps", norm_eps), backend,
                       decay_scale(layer_idx, num_layers))


def simple_num_params(hidden_size, num_heads=4, head_dim=None, use_qk_norm=False) -> int:
    """Parameters of one ``SimpleGatedLinearAttention`` layer: with d_i = H·D,
    ``3·d·d_i`` (fused W_QKV) ``+ 2·d·d_i`` (gate, output) ``+ d_i`` (GroupRMSNorm) ``+ 2·D`` with QK norm.
    For D = d/H that is ``5d² + d`` (``+ 2d/H``)."""
    s = simple_sizes(hidden_size, num_heads, head_dim, 1, use_qk_norm, 0, 1, 1e-5, "reference")
    return 5 * s.d * s.inner + s.inner + (2 * s.D if s.use_qk_norm else 0)


# ----------------------------------------------------------------------------- the state with short convolutions

class ShortConvState(NamedTuple):
    """The state a ``GatedLinearAttention`` layer built with ``use_short_conv=True`` passes from
    ``forward`` to ``step`` (and from ``step`` to ``step``): the recurrent state and, for each short
    convolution, its last W − 1 inputs (W = ``conv_size``), which the next token's window needs.

    ``recurrent`` ``[B, H, K, V]`` float32; ``q``, ``k`` ``[B, W − 1, d_k]`` and ``v`` ``[B, W − 1, d_v]``
    in the layer's dtype, oldest input first (zeros before a sequence's first token). With
    ``cu_seqlens`` every leading B is N, one row per sequence. Without short convolutions a layer's
    state stays a bare ``[B, H, K, V]`` array.
    """

    recurrent: object
    q: object
    k: object
    v: object


class ShortConvStateRules:
    """The state rules both frameworks' token mixers share (a plain mixin, no framework): whether the
    layer has short convolutions, the identity ``_short_conv`` of a layer without them (GLA's layer
    overrides it), and splitting or joining a state with :func:`split_state` / :func:`join_state`."""

    def _uses_conv(self):
        return getattr(self.sizes, "use_short_conv", False)

    def _short_conv(self, q, k, v, conv, cu_seqlens):
        """q, k, v after the short convolutions, and their caches (None without them)."""
        return q, k, v, None

    def _split_state(self, name, state):
        """``(recurrent state, conv caches or None)`` of a state given to the layer."""
        return split_state(name, state, self._uses_conv())

    def _join_state(self, S, conv):
        return join_state(S, conv, self._uses_conv())


def split_state(name: str, state, use_short_conv: bool):
    """``(recurrent state, (q, k, v) conv caches or None)`` of a state given to a layer's forward or
    step (the torch and Flax layers share this rule). A layer with ``use_short_conv`` takes a
    :class:`ShortConvState` or None; raises TypeError naming ``name`` otherwise."""
    if not use_short_conv or state is None:
        return state, None
    if not isinstance(state, ShortConvState):
        raise TypeError(f"{name} of a layer built with use_short_conv=True must be a ShortConvState "
                        f"(recurrent, q, k, v) or None, got {type(state).__name__}")
    return state.recurrent, (state.q, state.k, state.v)


def join_state(S, conv, use_short_conv: bool):
    """The state a layer returns: S alone, or with its conv caches as a :class:`ShortConvState`."""
    return ShortConvState(S, *conv) if use_short_conv else S


# ----------------------------------------------------------------------------- state dicts

def from_fla_names(state_dict: Mapping) -> dict:
    """A copy of an FLA ``GatedLinearAttention`` state dict under our names (:data:`FLA_RENAMES`)."""
    return {FLA_RENAMES.get(name, name): value for name, value in state_dict.items()}


def check_state_dict(state_dict: Mapping, expected: Mapping) -> None:
    """The state dict has exactly the expected names, each with its expected shape.

    ``expected``: name → shape tuple. Raises ValueError listing missing and unexpected names (e.g.
    an FLA layer built with short convolutions loaded into one without, or one without an output
    gate), or the
    first name whose shape differs (e.g. FLA's ``num_kv_heads < num_heads``).
    """
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise ValueError(f"state_dict does not match the layer: missing {missing}, unexpected {unexpected}")
    for name, shape in expected.items():
        if not hasattr(state_dict[name], "shape"):
            raise TypeError(f"state_dict[{name!r}] must be an array or tensor, got {type(state_dict[name]).__name__}")
        got = tuple(state_dict[name].shape)
        if got != tuple(shape):
            raise ValueError(f"state_dict[{name!r}] must have shape {tuple(shape)}, got {got}")
