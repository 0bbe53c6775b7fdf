"""GLA layers in Flax NNX: the same two layers as :mod:`gla_ref.layers.torch`, weight for weight.

* :class:`GatedLinearAttention` — the GLA paper's layer (§4.4); ``backend`` ``"auto"`` (the default: the
  Pallas ``"chunk"`` kernel for an array on a GPU or TPU, the reference on a CPU, decided at each call), ``"reference"``
  (:func:`gla_ref.reference.jax.chunk_gla`), ``"chunk"`` or ``"fused_chunk"`` (the Pallas kernels of
  :mod:`gla_ref.pallas`; there is no Pallas recurrent kernel, so no ``"fused_recurrent"``).
* :class:`SimpleGatedLinearAttention` — the Pallas RFC's layer; ``"reference"`` or ``"chunk"``
  (:func:`gla_ref.pallas.chunk_simple_gla` with ``g_gamma``).

Parameter names and shapes are PyTorch's (a :class:`Linear` keeps its weight as ``[out, in]``), so
``Layer.from_state_dict(torch_layer.state_dict(), **same_config)`` gives a layer that computes the
same function, and :func:`state_dict` goes back. Constant decays are :class:`Buffer` variables, not
parameters (``nnx.grad`` leaves them alone), as the PyTorch layers keep them in non-persistent buffers.
``__call__(x, initial_state=None, output_final_state=False, cu_seqlens=None) -> (y, state)`` runs a
chunkwise form; ``step(x_t, state) -> (y_t, state)`` applies the closed-form one-token update in
``jax.numpy``. Shapes: x ``[B, T, d]``, x_t ``[B, d]``, states ``[B, H, K, V]`` float32.

Short convolutions (``use_short_conv=True``, ``conv_size``): FLA's causal depthwise convolution + SiLU
on q, k and v (:class:`ShortConvolution`, weights ``{q,k,v}_conv1d.weight`` ``[D, 1, W]``), with a
:class:`~gla_ref.layers.config.ShortConvState` as the layer's state, exactly as in PyTorch.

Packed sequences: ``cu_seqlens``, FLA's offsets ``[N + 1]`` of N sequences packed into one row
(B = 1; int64, or int32 as JAX makes it without x64), runs each sequence as if alone, with states
``[N, H, K, V]``, on the ``"reference"`` backend (:mod:`gla_ref.reference.jax`). The offsets set shapes,
so they must be concrete (close over them in a ``jit``). The Pallas kernels take no packed batch
yet: a Pallas backend given cu_seqlens raises a ValueError that says so.
"""

from __future__ import annotations

import importlib
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from gla_ref.reference import jax as jax_ref
from gla_ref._validate import check_cu_seqlens, packed_layout, read_offsets
from gla_ref.reference.gates import build_slope_tensor, retnet_log_gammas, slopes_to_g_gamma
from gla_ref.layers import config
from gla_ref.layers.config import ShortConvState

__all__ = ["GatedLinearAttention", "SimpleGatedLinearAttention", "GroupRMSNorm", "NormSwishGate", "RMSNorm",
           "Linear", "Buffer", "ShortConvolution", "ShortConvState", "state_dict", "recurrent_step",
           "causal_conv1d", "resolve_backend"]

KERNELS = {"chunk": "chunk_gla", "fused_chunk": "fused_chunk_gla"}
"""Backend name → :mod:`gla_ref.pallas` function."""

_HIGHEST = lax.Precision.HIGHEST


class Buffer(nnx.Variable):
    """A constant of the layer (a decay), kept in its state but not a parameter."""


def _pallas(name):
    """A :mod:`gla_ref.pallas` function, imported on first use."""
    return getattr(importlib.import_module("gla_ref.pallas"), name)


def resolve_backend(backend, x):
    """The backend a call runs: an explicit one as it is; ``"auto"``: ``"chunk"`` when x lives on a GPU or
    TPU (under ``jit``, where x has no device yet, when JAX's default backend is one), else ``"reference"``."""
    if backend != "auto":
        return backend
    try:
        platform = next(iter(x.devices())).platform
    except Exception:  # a tracer, or a NumPy array
        platform = jax.default_backend()
    return "reference" if platform == "cpu" else "chunk"


def recurrent_step(q, k, v, g, S, scale):
    """One token of the recurrence: ``S ← Diag(exp g) S + kᵀ v``, ``o = scale · q S``.

    q, k ``[B, H, K]``; v ``[B, H, V]``; g a log-gate broadcastable to ``[B, H, K]`` or None;
    S ``[B, H, K, V]`` float32. Float32 math. Returns ``(o [B, H, V] in q's dtype, S)``.
    """
    f32 = jnp.float32
    if g is not None:
        S = jnp.exp(g.astype(f32))[..., None] * S
    S = S + k.astype(f32)[..., :, None] * v.astype(f32)[..., None, :]
    o = scale * jnp.einsum("bhk,bhkv->bhv", q.astype(f32), S, precision=_HIGHEST)
    return o.astype(q.dtype), S


def _token_gate(g):
    """The log-gate of a one-token sequence, broadcastable to ``[B, H, K]`` (see the PyTorch twin)."""
    if g is None:
        return None
    if g.ndim == 1:
        return g[:, None]  # [H] → [H, 1]
    return g[:, 0] if g.ndim == 4 else g[:, 0, :, None]


def _check_array(name, x, shape_doc, ndim, last, dtype):
    if not isinstance(x, (jax.Array, np.ndarray)):
        raise TypeError(f"{name} must be a JAX or NumPy array, got {type(x).__name__}")
    if x.ndim != ndim or x.shape[-1] != last:
        raise ValueError(f"{name} must have shape {shape_doc} with d = {last}, got {tuple(x.shape)}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have the layer's dtype {dtype}, got {x.dtype}")


def _params(module):
    """``(name, Param)`` pairs with PyTorch-style dotted names (``gk_proj.0.weight``)."""
    flat = nnx.to_flat_state(nnx.state(module, nnx.Param))
    return [(".".join(map(str, path)), var) for path, var in flat]


def state_dict(module) -> dict:
    """The module's parameters as NumPy arrays under PyTorch's names (the inverse of ``from_state_dict``)."""
    return {name: np.asarray(var[...]) for name, var in _params(module)}


# ----------------------------------------------------------------------------- building blocks

class Linear(nnx.Module):
    """``y = x Wᵀ + b`` with ``weight`` ``[out, in]`` as PyTorch stores it; PyTorch's default init
    (uniform in ±in^−½)."""

    def __init__(self, in_features, out_features, *, bias, rngs):
        bound = in_features ** -0.5
        self.weight = nnx.Param(jax.random.uniform(rngs.params(), (out_features, in_features),
                                                   minval=-bound, maxval=bound))
        self.bias = nnx.Param(jax.random.uniform(rngs.params(), (out_features,), minval=-bound,
                                                 maxval=bound)) if bias else None

    def __call__(self, x):
        y = jnp.matmul(x, self.weight[...].T, precision=_HIGHEST)
        return y if self.bias is None else y + self.bias[...]


def _rms(x, eps):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


class RMSNorm(nnx.Module):
    """RMSNorm over the last dimension with a ``weight`` (PyTorch's ``nn.RMSNorm``); float32 math."""

    def __init__(self, n, eps=1e-5):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((n,)))

    def __call__(self, x):
        return (_rms(x.astype(jnp.float32), self.eps) * self.weight[...]).astype(x.dtype)


class NormSwishGate(nnx.Module):
    """Per-head RMSNorm or LayerNorm of o, then the Swish gate: ``norm(o) ⊙ Swish(r)``; o, r ``[..., H, V]``;
    ``weight`` (and ``bias`` for LayerNorm) ``[V]`` shared by the heads; float32 math."""

    def __init__(self, V, norm="rms", eps=1e-5):
        self.norm, self.eps = config.choice("norm", norm, config.NORMS), eps
        self.weight = nnx.Param(jnp.ones((V,)))
        self.bias = nnx.Param(jnp.zeros((V,))) if norm == "layer" else None

    def __call__(self, o, r):
        x = o.astype(jnp.float32)
        if self.norm == "layer":
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        x = _rms(x, self.eps) * self.weight[...]
        if self.bias is not None:
            x = x + self.bias[...]
        return (x * jax.nn.silu(r.astype(jnp.float32))).astype(o.dtype)


class GroupRMSNorm(nnx.Module):
    """RMSNorm over ``num_groups`` equal groups of the last dimension (the RFC's); ``weight`` ``[hidden_size]``."""

    def __init__(self, hidden_size, num_groups=1, eps=1e-5):
        n = config.positive_int("hidden_size", hidden_size)
        self.num_groups = config.positive_int("num_groups", num_groups)
        if n % num_groups:
            raise ValueError(f"num_groups = {num_groups} must divide hidden_size = {n}")
        self.eps = config.positive_number("eps", eps)
        self.weight = nnx.Param(jnp.ones((n,)))

    def __call__(self, x):
        y = x.astype(jnp.float32).reshape(*x.shape[:-1], self.num_groups, -1)
        return (_rms(y, self.eps).reshape(x.shape) * self.weight[...]).astype(x.dtype)


# ----------------------------------------------------------------------------- the layers

def causal_conv1d(x, weight, cache=None, cu_seqlens=None):
    """Causal depthwise convolution + SiLU, FLA's short convolution: x ``[B, T, D]``, weight ``[D, 1, W]``
    → ``(y [B, T, D], cache [B, W − 1, D])``; the PyTorch twin
    :func:`gla_ref.layers.short_conv.causal_conv1d` documents the arguments. ``cache``: the W − 1
    inputs before each row (None: zeros). With ``cu_seqlens`` (concrete offsets ``[N + 1]`` of a
    packed x ``[1, T, D]``) each sequence starts from its own cache row, caches ``[N, W − 1, D]``."""
    D, W = weight.shape[0], weight.shape[-1]
    if x.ndim != 3 or x.shape[-1] != D:
        raise ValueError(f"x must have shape [B, T, D] with D = {D}, got {tuple(x.shape)}")
    B, T = x.shape[:2]
    if cu_seqlens is None:
        rows, lengths = x, np.full(B, T)
    else:
        offsets = read_offsets(cu_seqlens, array_type=jax.Array, array_name="jax.Array")
        check_cu_seqlens(offsets, T, B)
        offsets = offsets.tolist()
        gather, keep_rows, keep_cols = packed_layout(offsets)
        rows = jnp.concatenate([x, jnp.zeros((1, 1, D), x.dtype)], 1)[0, gather]  # [N, L, D]
        lengths = np.diff(offsets)
    N, L = rows.shape[:2]
    if cache is None:
        cache = jnp.zeros((N, W - 1, D), x.dtype)
    elif tuple(cache.shape) != (N, W - 1, D):
        raise ValueError(f"cache must have shape [N, W - 1, D] = {(N, W - 1, D)} (the last W - 1 inputs of "
                         f"each of the N sequences), got {tuple(cache.shape)}")
    src = jnp.concatenate([cache.astype(x.dtype), rows], 1)  # [N, W − 1 + L, D]
    w = weight[:, 0].astype(jnp.float32)
    y = jax.nn.silu(sum(src[:, j:j + L].astype(jnp.float32) * w[:, j] for j in range(W))).astype(x.dtype)
    new_cache = src[np.arange(N)[:, None], lengths[:, None] + np.arange(W - 1)]
    if cu_seqlens is not None:
        y = y[keep_rows, keep_cols][None]
    return y, new_cache


class ShortConvolution(nnx.Module):
    """FLA's short convolution on D channels of width ``conv_size``: ``weight`` ``[D, 1, conv_size]``
    (PyTorch's ``nn.Conv1d`` layout and init, no bias); ``__call__(x, cache=None, cu_seqlens=None) ->
    (y, cache)``, see :func:`causal_conv1d`."""

    def __init__(self, D, conv_size=4, *, rngs):
        D, W = config.positive_int("D", D), config.positive_int("conv_size", conv_size)
        self.weight = nnx.Param(jax.random.uniform(rngs.params(), (D, 1, W), minval=-W ** -0.5,
                                                   maxval=W ** -0.5))

    def __call__(self, x, cache=None, cu_seqlens=None):
        return causal_conv1d(x, self.weight[...], cache, cu_seqlens)


class _TokenMixer(config.ShortConvStateRules, nnx.Module):
    """``__call__`` (a chunkwise form), ``step`` (the recurrence) and ``from_state_dict``, shared by both
    layers; a subclass sets ``self.dims = (d, H, K, V)`` and defines ``_heads``, ``_mix``, ``_out``."""

    def __call__(self, x, initial_state=None, output_final_state=False, cu_seqlens=None):
        """x ``[B, T, d]`` → ``(y [B, T, d], final_state [B, H, K, V] float32 or None)``.

        ``initial_state`` ``[B, H, K, V]`` float32 or None for zeros. ``cu_seqlens``: None, or
        int64/int32 offsets ``[N + 1]`` of N sequences packed into one row (x ``[1, T, d]``, FLA's
        convention), 0 = cu_seqlens[0] ≤ … ≤ cu_seqlens[N] = T, concrete (a NumPy or JAX array from
        outside ``jit``); each sequence is mixed from its own first token and its own row of
        ``initial_state``, both states being then ``[N, H, K, V]`` float32. The ``"reference"``
        backend takes it; a Pallas backend whose kernel takes no cu_seqlens (none does yet) raises a
        ValueError saying so. A bad cu_seqlens is a ValueError or TypeError naming it.
        """
        _check_array("x", x, "[B, T, d]", 3, self.dims[0], self._dtype())
        kernel = self._kernel_name(x)
        if cu_seqlens is not None and kernel is not None and \
                "cu_seqlens" not in inspect.signature(_pallas(kernel)).parameters:
            raise ValueError(f"cu_seqlens (a packed batch) is not supported by backend={self.sizes.backend!r}: "
                             f"the Pallas kernel gla_ref.pallas.{kernel} takes no cu_seqlens; use "
                             f"backend='reference' for packed sequences, or pad them into a batch")
        S0, conv = self._split_state("initial_state", initial_state)
        q, k, v, g = self._heads(x)
        q, k, v, conv = self._short_conv(q, k, v, conv, cu_seqlens)
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        o, state = self._mix(q, k, v, g, initial_state=S0, output_final_state=output_final_state, **packed)
        return self._out(x, o), (self._join_state(state, conv) if output_final_state else None)

    def step(self, x_t, state=None):
        """Decode one token: x_t ``[B, d]``, state ``[B, H, K, V]`` float32 (a :class:`ShortConvState`
        with ``use_short_conv``; None: zeros) → ``(y_t, state)``."""
        d, H, K, V = self.dims
        _check_array("x_t", x_t, "[B, d]", 2, d, self._dtype())
        S, conv = self._split_state("state", state)
        x = x_t[:, None]
        q, k, v, g = self._heads(x)
        q, k, v, conv = self._short_conv(q, k, v, conv, None)
        o, S = recurrent_step(q[:, 0], k[:, 0], v[:, 0], _token_gate(g),
                              self._start_state(S, x_t.shape[0]), K ** -0.5)
        return self._out(x, o[:, None])[:, 0], self._join_state(S, conv)

    @classmethod
    def from_state_dict(cls, state_dict, **kwargs):
        """A layer built with ``kwargs`` (as for the constructor, ``rngs`` optional) holding the arrays
        of ``state_dict`` (name → NumPy array, e.g. a PyTorch layer's ``state_dict()``; FLA's names are
        accepted too). Raises ValueError when names or shapes differ from the layer's."""
        layer = cls(**{"rngs": nnx.Rngs(0), **kwargs})
        renamed = config.from_fla_names(state_dict)
        params = _params(layer)
        config.check_state_dict(renamed, {name: tuple(var.shape) for name, var in params})
        for name, var in params:
            var[...] = jnp.asarray(np.asarray(renamed[name]), dtype=var.dtype)
        return layer

    def _dtype(self):
        return _params(self)[0][1].dtype

    def _start_state(self, state, B):
        _, H, K, V = self.dims
        if state is None:
            return jnp.zeros((B, H, K, V), jnp.float32)
        if not isinstance(state, (jax.Array, np.ndarray)):
            raise TypeError(f"state must be a JAX array or None, got {type(state).__name__}")
        if tuple(state.shape) != (B, H, K, V):
            raise ValueError(f"state must have shape [B, H, K, V] = {(B, H, K, V)}, got {tuple(state.shape)}")
        if state.dtype != jnp.float32:
            raise TypeError(f"state must be float32, got {state.dtype}")
        return state


class GatedLinearAttention(_TokenMixer):
    """The GLA layer of the paper (§4.4); see :class:`gla_ref.layers.torch.GatedLinearAttention` for the
    equations, the parameters (same names and shapes) and their count, short convolutions
    (``use_short_conv``, ``conv_size``; state a :class:`ShortConvState`) included. ``rngs``
    initialises the weights."""

    def __init__(self, hidden_size, num_heads=4, expand_k=0.5, expand_v=1.0, gate_low_rank_dim=16,
                 gate_logit_normalizer=16, norm="rms", backend="auto", *, gate="gla", norm_eps=1e-5,
                 use_short_conv=False, conv_size=4, rngs):
        s = self.sizes = config.gla_sizes(hidden_size, num_heads, expand_k, expand_v, gate_low_rank_dim,
                                          gate_logit_normalizer, norm, gate, norm_eps, backend,
                                          config.FLAX_BACKENDS, use_short_conv, conv_size)
        self.dims = (s.d, s.H, s.K, s.V)
        self.q_proj = Linear(s.d, s.key_dim, bias=False, rngs=rngs)
        self.k_proj = Linear(s.d, s.key_dim, bias=False, rngs=rngs)
        self.v_proj = Linear(s.d, s.value_dim, bias=False, rngs=rngs)
        self.g_proj = Linear(s.d, s.value_dim, bias=False, rngs=rngs)
        if s.use_short_conv:
            self.q_conv1d = ShortConvolution(s.key_dim, s.conv_size, rngs=rngs)
            self.k_conv1d = ShortConvolution(s.key_dim, s.conv_size, rngs=rngs)
            self.v_conv1d = ShortConvolution(s.value_dim, s.conv_size, rngs=rngs)
        if s.gate in ("gla", "scalar"):
            self.gk_proj = nnx.List([Linear(s.d, s.r, bias=False, rngs=rngs),
                                     Linear(s.r, s.key_dim if s.gate == "gla" else s.H, bias=True, rngs=rngs)])
        if s.gate == "const":
            self.g_gamma = Buffer(jnp.asarray(retnet_log_gammas(s.H), jnp.float32))
        self.g_norm = NormSwishGate(s.V, s.norm, s.eps)
        self.o_proj = Linear(s.value_dim, s.d, bias=False, rngs=rngs)

    def log_gate(self, x):
        """log α for x ``[B, T, d]``: ``[B, T, H, K]``, ``[B, T, H]``, ``[H]`` or None, by ``gate``."""
        s = self.sizes
        if s.gate in ("const", "none"):
            return self.g_gamma[...] if s.gate == "const" else None
        z = self.gk_proj[1](self.gk_proj[0](x))
        g = jax.nn.log_sigmoid(z.astype(jnp.float32)) / s.tau
        return g.reshape(*g.shape[:-1], s.H, s.K) if s.gate == "gla" else g

    def _heads(self, x):
        s = self.sizes
        q = self.q_proj(x).reshape(*x.shape[:-1], s.H, s.K)
        k = self.k_proj(x).reshape(*x.shape[:-1], s.H, s.K)
        v = self.v_proj(x).reshape(*x.shape[:-1], s.H, s.V)
        return q, k, v, self.log_gate(x)

    def _short_conv(self, q, k, v, conv, cu_seqlens):
        if not self.sizes.use_short_conv:
            return q, k, v, None
        conv = (None, None, None) if conv is None else conv
        out = [layer(x.reshape(*x.shape[:-2], -1), cache, cu_seqlens)
               for layer, x, cache in zip((self.q_conv1d, self.k_conv1d, self.v_conv1d), (q, k, v), conv)]
        (q2, cq), (k2, ck), (v2, cv) = out
        return q2.reshape(q.shape), k2.reshape(k.shape), v2.reshape(v.shape), (cq, ck, cv)

    def _kernel_name(self, x=None):
        """The name of the :mod:`gla_ref.pallas` function a call on x runs, or None for the reference."""
        backend = resolve_backend(self.sizes.backend, x)
        return None if backend == "reference" else KERNELS[backend]

    def _mix(self, q, k, v, g, **kw):
        kernel = self._kernel_name(q)
        if kernel is None:
            return jax_ref.chunk_gla(q, k, v, g, **kw)
        if g is None or g.ndim != 4:
            g = jax_ref.expand_gate(g, *q.shape)
        return _pallas(kernel)(q, k, v, g, **kw)

    def _out(self, x, o):
        s = self.sizes
        o = self.g_norm(o, self.g_proj(x).reshape(*x.shape[:-1], s.H, s.V))
        return self.o_proj(o.reshape(*x.shape[:-1], s.value_dim))


class SimpleGatedLinearAttention(_TokenMixer):
    """The Pallas RFC's simple GLA layer; see :class:`gla_ref.layers.torch.SimpleGatedLinearAttention`
    (same equations, names, shapes and decay). ``rngs`` initialises the weights."""

    def __init__(self, hidden_size, num_heads=4, head_dim=None, group_norm_size=1, use_qk_norm=False,
                 layer_idx=0, num_layers=1, backend="auto", norm_eps=1e-5, *, rngs):
        s = self.sizes = config.simple_sizes(hidden_size, num_heads, head_dim, group_norm_size, use_qk_norm,
                                             layer_idx, num_layers, norm_eps, backend)
        self.dims = (s.d, s.H, s.D, s.D)
        self.query_key_value = Linear(s.d, 3 * s.inner, bias=False, rngs=rngs)
        if s.use_qk_norm:
            self.query_layernorm = RMSNorm(s.D, s.eps)
            self.key_layernorm = RMSNorm(s.D, s.eps)
        self.g_proj = Linear(s.d, s.inner, bias=False, rngs=rngs)
        self.g_norm = GroupRMSNorm(s.inner, s.groups, s.eps)
        self.dense = Linear(s.inner, s.d, bias=False, rngs=rngs)
        g_gamma = slopes_to_g_gamma(build_slope_tensor(s.H), scale=s.decay_scale)
        self.g_gamma = Buffer(jnp.asarray(g_gamma, jnp.float32))

    def _heads(self, x):
        s = self.sizes
        qkv = self.query_key_value(x).reshape(*x.shape[:-1], 3, s.H, s.D)
        q, k, v = qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]
        if s.use_qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        return q, k, v, self.g_gamma[...]

    def _kernel_name(self, x=None):
        """The name of the :mod:`gla_ref.pallas` function a call on x runs, or None for the reference."""
        return None if resolve_backend(self.sizes.backend, x) == "reference" else "chunk_simple_gla"

    def _mix(self, q, k, v, g, **kw):
        kernel = self._kernel_name(q)
        if kernel is None:
            return jax_ref.chunk_gla(q, k, v, g, **kw)
        return _pallas(kernel)(q, k, v, g_gamma=g, **kw)

    def _out(self, x, o):
        o = self.g_norm(o.reshape(*o.shape[:-2], -1))
        return self.dense(o * jax.nn.sigmoid(self.g_proj(x)))
