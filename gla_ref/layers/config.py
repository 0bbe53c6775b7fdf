"""What the PyTorch and Flax layers share, without a framework: argument checks, sizes,
parameter counts and FLA's parameter names.

Symbols: d the model width (``hidden_size``), H heads, d_k = H·K and d_v = H·V the key and value
widths of all heads together (K, V per head), r the rank of the gate projection, τ its temperature.
Both frameworks build their layers from :func:`gla_sizes` / :func:`simple_sizes`, so they accept
and refuse the same arguments with the same messages.
"""

from __future__ import annotations

import math
import sys
from typing import Mapping, NamedTuple

from gla_ref._validate import MAX_K, MAX_V

GATES = ("gla", "scalar", "const", "none")
"""Forget gates of :class:`GatedLinearAttention`: per key channel (GLA), one scalar per head
(data-dependent), one constant per head (RetNet's γ_h), none (linear attention)."""

NORMS = ("rms", "layer")
TORCH_BACKENDS = ("auto", "reference", "chunk", "fused_chunk", "fused_recurrent")
FLAX_BACKENDS = ("auto", "reference", "chunk", "fused_chunk")
SIMPLE_BACKENDS = ("auto", "reference", "chunk")
"""Backends by layer family. ``"auto"`` (every layer's default) is resolved at each call from where the
input lives: the kernels for a CUDA tensor (a JAX array on a GPU or TPU for Flax), the reference
everywhere else, so a CPU run never touches Triton's interpreter and a model moved to the GPU after
it was built uses the kernels."""

MODES = ("chunk", "fused_recurrent", "fused_chunk")
"""FLA's ``mode``: the kernel ``backend="auto"`` runs on a GPU (FLA itself, and so ``"auto"``, takes
``fused_recurrent`` for sequences of at most 64 tokens)."""

ACTIVATIONS = ("relu", "sigmoid", "logsigmoid", "silu", "swish", "sqrelu", "gelu")
"""The names of FLA's ``ACT2FN`` that the layers reproduce, for ``feature_map`` and ``gate_fn``:
``silu`` = ``swish`` (x·σ(x)), ``sqrelu`` (relu(x)²), ``gelu`` (the tanh approximation FLA uses).
FLA's ``bias_gelu`` takes a second argument a feature map never gets, so it is refused."""

FLA_LAYER_DEFAULTS = dict(mode="chunk", hidden_size=1024, expand_k=0.5, expand_v=1.0, num_heads=4,
                          num_kv_heads=None, feature_map=None, use_short_conv=False, conv_size=4,
                          conv_bias=False, use_output_gate=True, gate_fn="swish", elementwise_affine=True,
                          norm_eps=1e-5, gate_logit_normalizer=16, gate_low_rank_dim=16, clamp_min=None,
                          fuse_norm=True, layer_idx=None)
"""The constructor of FLA 0.6.0's ``fla.layers.GatedLinearAttention``: every argument and its default."""

FLA_SPEED_SETTINGS = ("mode", "fuse_norm", "layer_idx")
"""FLA layer arguments that change which kernels run or where the state is cached, not the function."""

FLA_RENAMES = {"g_norm_swish_gate.weight": "g_norm.weight"}
"""FLA's names that differ from ours. FLA fuses the per-head RMSNorm (a weight, no bias) and the Swish
gate into one module named ``g_norm_swish_gate`` when ``gate_fn="swish"``, ``fuse_norm`` and
``use_output_gate`` (``g_norm`` otherwise); every other name is the same. Our layers keep ``g_norm``
and take either name when loading."""


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
    Hkv: int = 0  # key/value heads (FLA's num_kv_heads); 0 means H
    feature_map: str | None = None
    gate_fn: str = "swish"
    use_output_gate: bool = True
    affine: bool = True  # FLA's elementwise_affine: the output norm has a weight
    clamp_min: float | None = None
    conv_bias: bool = False
    fuse_norm: bool = True
    mode: str = "chunk"
    layer_idx: int | None = None

    @property
    def key_dim(self) -> int:
        return self.H * self.K

    @property
    def value_dim(self) -> int:
        return self.H * self.V

    @property
    def kv_heads(self) -> int:
        return self.Hkv or self.H

    @property
    def groups(self) -> int:
        """Query heads per key/value head (FLA's ``num_kv_groups``)."""
        return self.H // self.kv_heads

    @property
    def fused_gate(self) -> bool:
        """Whether FLA fuses the output norm and the Swish gate (and names it ``g_norm_swish_gate``):
        ``gate_fn == "swish"``, ``fuse_norm`` and ``use_output_gate``, exactly FLA's condition."""
        return self.gate_fn == "swish" and self.fuse_norm and self.use_output_gate


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


def _head_dim(name, d, expand, H, expand_name) -> int:
    """FLA 0.6.0's rule: ``d × expand`` must be a whole number (rounded, then checked), and a multiple of H."""
    exact = d * expand
    width = round(exact)
    if not math.isclose(exact, width):
        raise ValueError(f"{name} = hidden_size × {expand_name} = {exact:g} must be a whole number")
    if width < H or width % H:
        raise ValueError(f"{name} = {width} (hidden_size × {expand_name}) must be a positive multiple of "
                         f"num_heads = {H}")
    return width // H


def flag(name, x) -> bool:
    if not isinstance(x, bool):
        raise TypeError(f"{name} must be a bool, got {x!r}")
    return x


def activation(name, x, optional=False):
    """An activation name of :data:`ACTIVATIONS` (None too when ``optional``)."""
    if x is None and optional:
        return None
    if x == "bias_gelu":
        raise ValueError(f"{name}='bias_gelu' is not reproduced: FLA's bias_gelu needs a bias argument "
                         f"that a {name} never gets (FLA itself fails when it calls it)")
    return choice(name, x, ACTIVATIONS + ((None,) if optional else ()))


def _check_kernel_dims(backend, K, V) -> None:
    """The kernels' head-size limits (:data:`gla_ref._validate.MAX_K`, :data:`~gla_ref._validate.MAX_V`),
    checked when the layer is built rather than at its first call."""
    for name, n, most in (("K", K, MAX_K), ("V", V, MAX_V)):
        if backend not in ("reference", "auto") and n > most:  # "auto" runs the reference past the limits
            raise ValueError(f"{name} = {n} per head exceeds {most}, the most the {backend!r} "
                             f"kernels take; use backend='reference' or more heads")


# ----------------------------------------------------------------------------- GLA layer

def gla_sizes(hidden_size, num_heads, expand_k, expand_v, gate_low_rank_dim, gate_logit_normalizer,
              norm, gate, norm_eps, backend, backends, use_short_conv=False, conv_size=4, *,
              num_kv_heads=None, feature_map=None, gate_fn="swish", use_output_gate=True,
              elementwise_affine=True, clamp_min=None, conv_bias=False, fuse_norm=True, mode="chunk",
              layer_idx=None) -> GLASizes:
    """Check the arguments of ``GatedLinearAttention`` and return its sizes.

    d_k = d·expand_k and d_v = d·expand_v must be whole numbers (FLA 0.6.0's rule) and multiples of H;
    ``backends`` lists the backends of the calling framework; ``use_short_conv`` a bool, ``conv_size``
    a positive int. FLA's arguments: ``num_kv_heads`` None or a divisor of H; ``feature_map`` None or
    one of :data:`ACTIVATIONS`, ``gate_fn`` one of them; ``clamp_min`` None or a finite number ≤ 0
    (a floor on the log-gates; above 0 a gate would exceed 1); ``elementwise_affine`` a bool or None
    (None = False, as FLA's ``if``); flags ``use_output_gate``, ``conv_bias``, ``fuse_norm``; ``mode``
    one of :data:`MODES`; ``layer_idx`` None or an int ≥ 0. Raises ValueError (TypeError for a
    non-bool flag) naming the bad argument.
    """
    flag("use_short_conv", use_short_conv)
    W = positive_int("conv_size", conv_size)
    d = positive_int("hidden_size", hidden_size)
    H = positive_int("num_heads", num_heads)
    Hkv = H if num_kv_heads is None else positive_int("num_kv_heads", num_kv_heads)
    if H % Hkv:
        raise ValueError(f"num_kv_heads = {Hkv} must divide num_heads = {H}")
    K = _head_dim("key_dim", d, positive_number("expand_k", expand_k), H, "expand_k")
    V = _head_dim("value_dim", d, positive_number("expand_v", expand_v), H, "expand_v")
    choice("backend", backend, backends)
    _check_kernel_dims(backend, K=K, V=V)
    if clamp_min is not None:
        if isinstance(clamp_min, bool) or not isinstance(clamp_min, (int, float)) or not math.isfinite(clamp_min) \
                or clamp_min > 0:
            raise ValueError(f"clamp_min must be None or a finite number <= 0 (a floor on the log-gates), "
                             f"got {clamp_min!r}")
        clamp_min = float(clamp_min)
    if elementwise_affine is None:
        elementwise_affine = False
    if layer_idx is not None and (isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0):
        raise ValueError(f"layer_idx must be None or an int >= 0, got {layer_idx!r}")
    return GLASizes(d, H, K, V, positive_int("gate_low_rank_dim", gate_low_rank_dim),
                    positive_number("gate_logit_normalizer", gate_logit_normalizer),
                    choice("gate", gate, GATES), choice("norm", norm, NORMS),
                    positive_number("norm_eps", norm_eps), backend, use_short_conv, W, Hkv,
                    activation("feature_map", feature_map, optional=True), activation("gate_fn", gate_fn),
                    flag("use_output_gate", use_output_gate), flag("elementwise_affine", elementwise_affine),
                    clamp_min, flag("conv_bias", conv_bias), flag("fuse_norm", fuse_norm),
                    choice("mode", mode, MODES), layer_idx)


def gla_num_params(hidden_size, num_heads=4, expand_k=0.5, expand_v=1.0, gate_low_rank_dim=16,
                   norm="rms", gate="gla", use_short_conv=False, conv_size=4, *, num_kv_heads=None,
                   use_output_gate=True, elementwise_affine=True, conv_bias=False) -> int:
    """Parameters of one ``GatedLinearAttention`` layer, in closed form.

    ``2·d·d_k`` (W_Q, W_K) ``+ 3·d·d_v`` (W_V, W_r, W_O) ``+ r·(d + d_k) + d_k`` (the low-rank gate
    W_α¹, W_α², b_α; ``r·(d + H) + H`` for ``gate="scalar"``, 0 for ``"const"``/``"none"``)
    ``+ V`` (RMSNorm weight, shared by the heads; ``2·V`` for LayerNorm's weight and bias).
    With the paper's d_k = d/2, d_v = d: ``4d² + 3rd/2 + d/2 + d/H`` — the "≈ 4d²" of §4.4.
    ``use_short_conv`` adds the three depthwise convolutions of width W = ``conv_size``:
    ``W·(2·d_k + d_v)`` (``2Wd`` at the paper's widths; ``+ 2·d_k + d_v`` with ``conv_bias``).
    FLA's ``num_kv_heads`` = H_kv < H shrinks k, v, the gate's second matrix and the convolutions of k
    and v by H_kv/H; ``use_output_gate=False`` drops W_r (``d·d_v``); ``elementwise_affine=False``
    drops the norm's parameters.
    """
    s = gla_sizes(hidden_size, num_heads, expand_k, expand_v, gate_low_rank_dim, 16, norm, gate, 1e-5,
                  "reference", ("reference",), use_short_conv, conv_size, num_kv_heads=num_kv_heads,
                  use_output_gate=use_output_gate, elementwise_affine=elementwise_affine, conv_bias=conv_bias)
    kv_k, kv_v = s.kv_heads * s.K, s.kv_heads * s.V
    conv = (s.conv_size + s.conv_bias) * (s.key_dim + kv_k + kv_v) if s.use_short_conv else 0
    projections = s.d * (s.key_dim + kv_k + kv_v) + s.d * s.value_dim * (1 + s.use_output_gate)
    gate_params = {"gla": s.r * (s.d + kv_k) + kv_k, "scalar": s.r * (s.d + s.kv_heads) + s.kv_heads,
                   "const": 0, "none": 0}[s.gate]
    norm_params = (s.V if s.norm == "rms" else 2 * s.V) if s.affine else 0
    return projections + gate_params + conv + norm_params


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


# ----------------------------------------------------------------------------- FLA's settings

FLA_FUNCTION_SETTINGS = ("hidden_size", "key_dim", "value_dim", "num_heads", "num_kv_heads", "feature_map",
                         "use_short_conv", "conv_size", "conv_bias", "use_output_gate", "gate_fn",
                         "elementwise_affine", "norm_eps", "gate_logit_normalizer", "gate_low_rank_dim",
                         "clamp_min")
"""The settings of an FLA ``GatedLinearAttention`` that change the function its weights compute (the
widths as ``key_dim``/``value_dim``, so that equal widths from other ``expand_*`` floats agree).
``conv_size``/``conv_bias`` count only with short convolutions, ``gate_fn`` only with the output gate."""


def _activation_name(fn, what):
    """The :data:`ACTIVATIONS` name of one of FLA's ``ACT2FN`` functions (FLA keeps the function, not
    its name), looked up in the FLA that made the layer; None for None."""
    if fn is None:
        return None
    table = getattr(sys.modules.get("fla.modules.activations"), "ACT2FN", None) or {}
    for name, f in table.items():
        if f is fn:
            return activation(what, name)
    raise ValueError(f"{what} {fn!r} is not one of FLA's ACT2FN activations {ACTIVATIONS} that gla_ref "
                     f"reproduces")


def _fla_layer_object_settings(layer) -> dict:
    """The constructor arguments of an FLA ``GatedLinearAttention`` object, read back from it."""
    fused = bool(getattr(layer, "fuse_norm_and_gate", False))
    norm = layer.g_norm_swish_gate if fused else layer.g_norm
    if fused and getattr(norm, "activation", "swish") not in ("swish", "silu"):
        raise ValueError(f"g_norm_swish_gate.activation={norm.activation!r} is not reproduced (FLA's layer "
                         f"builds it with 'swish')")
    if getattr(norm, "bias", None) is not None:
        raise ValueError("the FLA layer's output norm has a bias, which FLA's GatedLinearAttention never "
                         "builds: not reproduced")
    if layer.use_short_conv:
        for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
            act = getattr(getattr(layer, name), "activation", "silu")
            if act not in ("silu", "swish"):
                raise ValueError(f"{name}.activation={act!r} is not reproduced (FLA's layer builds 'silu')")
    return dict(mode=layer.mode, hidden_size=layer.hidden_size, expand_k=layer.expand_k, expand_v=layer.expand_v,
                num_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads,
                feature_map=_activation_name(getattr(layer, "feature_map_fn", None), "feature_map"),
                use_short_conv=layer.use_short_conv, conv_size=layer.conv_size, conv_bias=layer.conv_bias,
                use_output_gate=layer.use_output_gate,
                gate_fn="swish" if fused else _activation_name(layer.gate_fn, "gate_fn"),
                elementwise_affine=bool(norm.elementwise_affine), norm_eps=norm.eps,
                gate_logit_normalizer=layer.gate_logit_normalizer,
                gate_low_rank_dim=layer.gk_proj[0].out_features, clamp_min=layer.clamp_min,
                fuse_norm=fused or FLA_LAYER_DEFAULTS["fuse_norm"], layer_idx=layer.layer_idx)


def fla_config_layer_settings(cfg, layer_idx=None) -> dict:
    """The layer arguments FLA's ``GLABlock`` builds from a ``GLAConfig`` (FLA's or ours, or its
    ``to_dict()``): the config's fields, with ``hidden_act`` as ``gate_fn``, ``attn_mode`` as ``mode``,
    and FLA's layer defaults for what the config does not set (gate_low_rank_dim, gate_logit_normalizer,
    conv_bias)."""
    get = cfg.get if isinstance(cfg, Mapping) else (lambda name, default=None: getattr(cfg, name, default))
    settings = dict(FLA_LAYER_DEFAULTS)
    for ours, theirs in (("mode", "attn_mode"), ("gate_fn", "hidden_act")):
        settings[ours] = get(theirs, settings[ours])
    for name in ("hidden_size", "expand_k", "expand_v", "num_heads", "num_kv_heads", "feature_map",
                 "use_short_conv", "conv_size", "use_output_gate", "elementwise_affine", "norm_eps",
                 "clamp_min", "fuse_norm"):
        settings[name] = get(name, settings[name])
    settings["layer_idx"] = layer_idx
    return settings


def fla_layer_settings(source) -> dict:
    """FLA ``GatedLinearAttention`` constructor arguments, all of them, from ``source``: an FLA layer
    object (read back from its attributes), an FLA or gla_ref ``GLAConfig`` (as FLA's ``GLABlock`` builds
    its layers), or a mapping of constructor arguments (FLA's defaults fill the rest). Raises TypeError
    for anything else."""
    if isinstance(source, Mapping):
        if "num_hidden_layers" in source or "hidden_act" in source or "attn_mode" in source:
            return fla_config_layer_settings(source)
        unknown = sorted(set(source) - set(FLA_LAYER_DEFAULTS))
        if unknown:
            raise ValueError(f"settings has names that are not FLA GatedLinearAttention arguments: {unknown}")
        return {**FLA_LAYER_DEFAULTS, **source}
    if hasattr(source, "gk_proj") and hasattr(source, "gate_logit_normalizer"):
        return _fla_layer_object_settings(source)
    if hasattr(source, "num_hidden_layers") and hasattr(source, "hidden_act"):
        return fla_config_layer_settings(source)
    raise TypeError(f"FLA settings must come from an FLA GatedLinearAttention layer, a GLAConfig or a dict of "
                    f"its constructor arguments, got {type(source).__name__}")


def function_settings(settings: Mapping) -> dict:
    """The :data:`FLA_FUNCTION_SETTINGS` of FLA layer arguments, normalised (widths, ``num_kv_heads``
    None → num_heads, ``silu`` → ``swish``, ``elementwise_affine`` None → False, settings that do not
    apply dropped), so two equal dicts mean the same function."""
    s = {**FLA_LAYER_DEFAULTS, **settings}
    out = dict(hidden_size=s["hidden_size"], key_dim=round(s["hidden_size"] * s["expand_k"]),
               value_dim=round(s["hidden_size"] * s["expand_v"]), num_heads=s["num_heads"],
               num_kv_heads=s["num_heads"] if s["num_kv_heads"] is None else s["num_kv_heads"],
               feature_map="swish" if s["feature_map"] == "silu" else s["feature_map"],
               use_short_conv=bool(s["use_short_conv"]), use_output_gate=bool(s["use_output_gate"]),
               elementwise_affine=bool(s["elementwise_affine"]), norm_eps=float(s["norm_eps"]),
               gate_logit_normalizer=float(s["gate_logit_normalizer"]), gate_low_rank_dim=s["gate_low_rank_dim"],
               clamp_min=None if s["clamp_min"] is None else float(s["clamp_min"]))
    if out["use_short_conv"]:
        out.update(conv_size=s["conv_size"], conv_bias=bool(s["conv_bias"]))
    if out["use_output_gate"]:
        out["gate_fn"] = "swish" if s["gate_fn"] == "silu" else s["gate_fn"]
    return out


def check_fla_settings(ours: Mapping, theirs: Mapping, what="the FLA layer") -> None:
    """Raise ValueError naming the first setting in which ``theirs`` (FLA layer arguments, e.g. from
    :func:`fla_layer_settings`) computes another function than ``ours``: loading its weights would
    silently compute something else."""
    a, b = function_settings(ours), function_settings(theirs)
    for name in FLA_FUNCTION_SETTINGS:
        if a.get(name) != b.get(name):
            raise ValueError(f"{what} has {name}={b.get(name)!r} but this layer has {name}={a.get(name)!r}: "
                             f"its weights would compute another function here; build the layer with the "
                             f"same settings (e.g. GatedLinearAttention.from_fla)")
