"""FLA's interface in PyTorch, for :mod:`gla_ref.layers.torch`: activations, padding masks, the layouts
of FLA's cached states, and which backend a call runs.

* :data:`ACTIVATIONS` — FLA's ``ACT2FN`` functions (by the names of :data:`config.ACTIVATIONS`),
  written here in PyTorch: the layers' ``feature_map`` and ``gate_fn``.
* :func:`unpad` / :func:`repad` — FLA's treatment of an ``attention_mask`` ``[B, T]`` (1 = token,
  0 = padding): the tokens are packed into one row with ``cu_seqlens`` (each sequence then runs from
  its own state, as if its padding were not there), the output is put back, zeros at the padding.
* :func:`state_from_fla` / :func:`state_to_fla`, :func:`conv_from_fla` / :func:`conv_to_fla` — FLA's
  cache keeps the recurrent state as ``[N, H, V, K]`` (its kernels' ``state_v_first``) and each short
  convolution's cache as ``[N, D, W]`` (the last W inputs, newest last); ours are ``[N, H, K, V]``
  and ``[N, W − 1, D]`` (or ``[N, W, D]`` on the FLA path, which keeps FLA's oldest column too).
* :func:`resolve_backend` / :func:`kernel` — ``"auto"`` per call, and the
  Triton kernels imported on first use only (the reference path never imports Triton).
* :class:`FLALayerInterface` — FLA's ``forward(hidden_states, attention_mask, past_key_values,
  use_cache)`` and FLA's weights (``from_fla``, ``load_fla_state_dict``, ``fla_state_dict``) of
  :class:`gla_ref.layers.torch.GatedLinearAttention`; :func:`check_tied_weights` for the LMs.

The cache contract: an FLA-format cache object in (``past_key_values``: ours,
:class:`gla_ref.layers.cache.Cache`, or FLA's), FLA's layouts out (written into it); our own path
(``initial_state``/``output_final_state``, ``step``) keeps ``[N, H, K, V]`` states.
"""

from __future__ import annotations

import importlib
import sys

import torch
import torch.nn.functional as F
from torch import nn

from gla_ref._validate import MAX_K, MAX_V
from gla_ref.layers import config
from gla_ref.layers.cache import is_cache

__all__ = ["ACTIVATIONS", "unpad", "repad", "padding_mask", "state_from_fla", "state_to_fla", "conv_from_fla",
           "conv_to_fla", "resolve_backend", "import_kernels", "kernel", "check_tied_weights", "check_tensor",
           "FLALayerInterface"]


def _sqrelu(x):
    return F.relu(x.float()).square().to(x.dtype)


def _gelu_tanh(x):
    """FLA's ``gelu``: the tanh approximation, with FLA's constants 0.79788456 and 0.044715."""
    y = x.float()
    return (0.5 * y * (1.0 + torch.tanh(0.79788456 * y * (1.0 + 0.044715 * y * y)))).to(x.dtype)


ACTIVATIONS = {"relu": F.relu, "sigmoid": torch.sigmoid, "logsigmoid": F.logsigmoid, "silu": F.silu,
               "swish": F.silu, "sqrelu": _sqrelu, "gelu": _gelu_tanh}
"""Name → function, the entries of FLA's ``ACT2FN`` that :data:`gla_ref.layers.config.ACTIVATIONS` names."""


# ----------------------------------------------------------------------------- padding masks

def padding_mask(attention_mask, B, T):
    """The mask's columns for the T tokens of this call, as FLA takes them: all of it when it has T
    columns, else its last T (its last one for a single token: decoding after a prompt)."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2 or attention_mask.shape[0] != B \
            or attention_mask.shape[1] < T:
        raise ValueError(f"attention_mask must be a 0/1 padding mask [batch_size, seq_len] = [{B}, >= {T}] "
                         f"(1 = token, 0 = padding; FLA takes no [B, T, T] masks), got "
                         f"{tuple(getattr(attention_mask, 'shape', ())) or type(attention_mask).__name__}")
    return attention_mask[:, -T:].bool()


def unpad(x, mask):
    """Pack the tokens of x ``[B, T, ...]`` where mask ``[B, T]`` (bool) is set into one row:
    ``(x [1, n, ...], indices [n], lengths [B])``, in batch then time order."""
    indices = mask.flatten().nonzero().flatten()
    return x.flatten(0, 1).index_select(0, indices)[None], indices, mask.sum(-1)


def repad(y, indices, B, T):
    """The inverse of :func:`unpad`: y ``[1, n, ...]`` back to ``[B, T, ...]``, zeros at the padding."""
    out = y.new_zeros(B * T, *y.shape[2:]).index_copy(0, indices, y[0])
    return out.unflatten(0, (B, T))


# ----------------------------------------------------------------------------- FLA's cached states

def state_from_fla(S):
    """FLA's recurrent state ``[N, H, V, K]`` → ours ``[N, H, K, V]`` float32 (None stays None)."""
    return None if S is None else S.transpose(-1, -2).float()


def state_to_fla(S):
    """Ours ``[N, H, K, V]`` → FLA's ``[N, H, V, K]`` (contiguous, as its kernels read it)."""
    return None if S is None else S.transpose(-1, -2).contiguous()


def conv_from_fla(cache):
    """FLA's short-convolution cache ``[N, D, W]`` → ``[N, W, D]`` (oldest input first), which
    :func:`gla_ref.layers.short_conv.causal_conv1d` takes and returns at the same width."""
    return None if cache is None else cache.transpose(1, 2)


def conv_to_fla(cache):
    return None if cache is None else cache.transpose(1, 2).contiguous()


# ----------------------------------------------------------------------------- backends

def resolve_backend(backend, mode, x, T, K, V):
    """The backend one call runs. An explicit backend is kept. ``"auto"``: the reference unless x is a
    CUDA tensor; on CUDA, FLA's choice — ``fused_recurrent`` for T ≤ 64, else ``mode`` — unless a head is
    wider than the kernels take (K > 256 or V > 4096: the reference)."""
    if backend != "auto":
        return backend
    if not x.is_cuda or K > MAX_K or V > MAX_V:
        return "reference"
    return "fused_recurrent" if T <= 64 else mode


def import_kernels(backend: str) -> None:
    """Import :mod:`gla_ref.triton` when a layer is built whose ``backend`` will use it: an explicit kernel
    backend, or ``"auto"`` on a machine with CUDA. A model compiled before its first call then finds the
    kernels loaded (``torch.compile`` traces :func:`kernel`'s lookup, and would stop at an import)."""
    if backend not in ("auto", "reference") or (backend == "auto" and torch.cuda.is_available()):
        importlib.import_module("gla_ref.triton")


def kernel(name):
    """A :mod:`gla_ref.triton` function, imported on first use (whatever imported Triton before it:
    :func:`gla_ref.device.use_triton_interpreter`)."""
    triton_kernels = sys.modules.get("gla_ref.triton")  # torch.compile traces this lookup, not an import
    if triton_kernels is None:
        triton_kernels = importlib.import_module("gla_ref.triton")
    return getattr(triton_kernels, name)


# ----------------------------------------------------------------------------- tied embeddings

def check_tied_weights(state_dict, prefix, embedding, head, tied, setting):
    """Make ``state_dict`` agree with the model's tying before anything loads (a load-state-dict pre-hook's
    work): ``embedding`` and ``head`` are the two weights' names (after ``prefix``), ``tied`` whether the
    model ties them, ``setting`` the argument that says so.

    Tied: a checkpoint with both weights must have them equal, else it is an untied model's and loading it
    would silently keep only one (ValueError naming the head's key); one with only the embedding gets it
    as the head too (tied checkpoints are saved so). Untied: the checkpoint must have the head (a
    ValueError naming its key otherwise: it is a tied model's)."""
    emb, out = prefix + embedding, prefix + head
    if tied:
        if emb in state_dict and out in state_dict:
            a, b = state_dict[emb], state_dict[out]
            if a.shape != b.shape or not torch.equal(a.to(b.device, b.dtype), b):
                raise ValueError(f"state_dict[{out!r}] differs from state_dict[{emb!r}]: the checkpoint has an untied "
                                 f"output head but this model ties it to the embedding ({setting}=True); build the "
                                 f"model with {setting}=False to load it")
        elif emb in state_dict:
            state_dict[out] = state_dict[emb]
        elif out in state_dict:
            state_dict[emb] = state_dict[out]
    elif emb in state_dict and out not in state_dict:
        raise ValueError(f"state_dict has no {out!r}: the checkpoint is a tied model's (its output head is its "
                         f"embedding) but this model has its own head ({setting}=False); build the model with "
                         f"{setting}=True to load it")


# ----------------------------------------------------------------------------- FLA's layer interface

_UNSET = object()  # "not given": picks our (initial_state, output_final_state) path over FLA's


def check_tensor(name, x, shape_doc, ndim, last, dtype):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim or x.shape[-1] != last:
        raise ValueError(f"{name} must have shape {shape_doc} with d = {last}, got {tuple(x.shape)}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have the layer's dtype {dtype}, got {x.dtype}")



class FLALayerInterface:
    """FLA's interface of :class:`gla_ref.layers.torch.GatedLinearAttention`: its call (``forward``, with a
    padding mask and a cache), and its weights (:meth:`fla_settings`, :meth:`fla_state_dict`,
    :meth:`load_fla_state_dict`, :meth:`from_fla`). It runs the layer through the layer's own
    ``_run(x, state, conv caches, cu_seqlens, want_state, conv_keep)``, which our path uses too.
    """

    # ------------------------------------------------------------------ FLA's interface

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, use_cache=False,
                output_attentions=False, *, initial_state=_UNSET, output_final_state=_UNSET, cu_seqlens=None,
                **kwargs):
        """FLA's call: ``(o [B, T, d], None, past_key_values)``; or ours, ``(y, state)``.

        FLA's (the default): ``attention_mask`` ``[B, T']`` (1 = token, 0 = padding; T' ≥ T, its last T
        columns are this call's) packs the tokens into sequences run as if alone, FLA's treatment of
        (left) padding; the output is 0 at padded positions. ``past_key_values``: None or a cache with
        FLA's interface (:class:`gla_ref.layers.cache.Cache`, or FLA's ``Cache``): the layer starts from
        its entry ``layer_idx`` (FLA's layouts: recurrent ``[B, H, V, K]``, each convolution ``[B, D, W]``)
        and, with ``use_cache``, writes its new states there in the same layouts. ``cu_seqlens`` (packed
        sequences, B = 1) takes precedence over the mask, as in FLA. ``output_attentions`` and other
        keyword arguments are accepted and ignored, as FLA does.

        Ours: given ``initial_state=`` or ``output_final_state=`` (by keyword), the call is
        :meth:`TokenMixer.forward`: ``(y, final state [B, H, K, V] float32 or None)``.
        """
        if initial_state is not _UNSET or output_final_state is not _UNSET:
            fla = [name for name, value in (("attention_mask", attention_mask), ("past_key_values", past_key_values),
                                            ("use_cache", use_cache), ("output_attentions", output_attentions))
                   if value is not None and value is not False] + sorted(kwargs)
            if fla:
                raise TypeError(f"{', '.join(fla)} belong to FLA's interface and initial_state/output_final_state "
                                f"to ours: call the layer with one or the other")
            return super().forward(hidden_states, None if initial_state is _UNSET else initial_state,
                                   False if output_final_state is _UNSET else output_final_state, cu_seqlens)
        return self._forward_fla(hidden_states, attention_mask, past_key_values, bool(use_cache), cu_seqlens)

    def _forward_fla(self, x, attention_mask, cache, use_cache, cu_seqlens):
        s = self.sizes
        autocast = isinstance(x, torch.Tensor) and torch.is_autocast_enabled(x.device.type)
        check_tensor("hidden_states", x, "[B, T, d]", 3, s.d, x.dtype if autocast else self._dtype())
        if cache is not None and not is_cache(cache):
            raise TypeError(f"past_key_values must be None or a cache (gla_ref.layers.cache.Cache or FLA's Cache), "
                            f"got {type(cache).__name__}; our own path takes initial_state=/output_final_state= "
                            f"by keyword")
        if cache is not None and s.layer_idx is None:
            raise ValueError("past_key_values needs the layer's layer_idx (its entry in the cache): build the "
                             "layer with layer_idx=i, as FLA requires")
        B, T, _ = x.shape
        last = cache[s.layer_idx] if cache is not None and len(cache) > s.layer_idx else None
        S0 = state_from_fla(last.get("recurrent_state")) if last else None
        conv_fla = (last.get("conv_state") if last else None) if s.use_short_conv else None
        conv_fla = None if conv_fla is None else tuple(None if c is None else conv_from_fla(c) for c in conv_fla)
        conv0 = None if conv_fla is None else tuple(None if c is None else c[:, 1:] for c in conv_fla)
        keep_w = s.conv_size if use_cache and s.use_short_conv else None
        indices = None
        if cu_seqlens is None and attention_mask is not None:
            mask = padding_mask(attention_mask, B, T)
            if not bool(mask.all()):
                x, indices, lengths = unpad(x, mask)
                y, S, conv = self._run_rows(x, lengths, S0, conv_fla, use_cache, keep_w)
        if indices is None:
            y, S, conv = self._run(x, S0, conv0, cu_seqlens, use_cache, keep_w)
        if cache is not None:
            conv_state = None
            if s.use_short_conv:
                conv_state = tuple(conv_to_fla(c) for c in conv) if use_cache else (None, None, None)
            cache.update(recurrent_state=state_to_fla(S) if use_cache else None, conv_state=conv_state,
                         layer_idx=s.layer_idx, offset=T)
        if indices is not None:
            y = repad(y, indices, B, T)
        return y, None, cache

    def _run_rows(self, x, lengths, S0, conv_fla, want_state, keep_w):
        """The packed tokens x ``[1, n, d]`` of B rows of ``lengths`` tokens from per-row states S0 (ours)
        and FLA's convolution caches as ``[B, W, D]``: ``(y, states, conv caches)``. Rows without a token
        keep their states (zeros where there were none)."""
        B, rows = len(lengths), lengths.nonzero().flatten()
        every = len(rows) == B
        pick = (lambda t: t) if every else (lambda t: None if t is None else t.index_select(0, rows))
        conv0 = None if conv_fla is None else tuple(None if c is None else pick(c)[:, 1:] for c in conv_fla)
        if len(rows):
            cu = F.pad(lengths.index_select(0, rows).cumsum(0), (1, 0)).to(torch.int64)
            y, S, conv = self._run(x, pick(S0), conv0, cu, want_state, keep_w)
        else:  # nothing but padding: no token to run
            y, S, conv = x.new_zeros(1, 0, self.dims[0]), None, None
        if every or not want_state:
            return y, S, conv
        _, H, K, V = self.dims
        full = torch.zeros(B, H, K, V, device=x.device) if S0 is None else S0.clone()
        if S is not None:
            full = full.index_copy(0, rows, S)
        if self.sizes.use_short_conv:
            W, old = self.sizes.conv_size, conv_fla or (None, None, None)
            widths = [m.weight.shape[0] for m in (self.q_conv1d, self.k_conv1d, self.v_conv1d)]
            conv = tuple((x.new_zeros(B, W, D) if o is None else o.clone()) if c is None else
                         (x.new_zeros(B, W, D) if o is None else o.clone()).index_copy(0, rows, c)
                         for o, c, D in zip(old, conv or (None, None, None), widths))
        return y, full, conv

    # ------------------------------------------------------------------ FLA's weights

    def fla_settings(self) -> dict:
        """This layer as FLA ``GatedLinearAttention`` constructor arguments (all of them). Raises
        ValueError for our own variants, which FLA has no arguments for (``gate`` other than ``"gla"``,
        ``norm="layer"``)."""
        s = self.sizes
        if s.gate != "gla":
            raise ValueError(f"gate={s.gate!r} has no FLA counterpart: FLA's GatedLinearAttention gates every key "
                             f"channel (gate='gla')")
        if s.norm != "rms":
            raise ValueError(f"norm={s.norm!r} has no FLA counterpart: FLA's GatedLinearAttention uses RMSNorm")
        return dict(mode=s.mode, hidden_size=s.d, expand_k=s.key_dim / s.d, expand_v=s.value_dim / s.d,
                    num_heads=s.H, num_kv_heads=None if s.kv_heads == s.H else s.kv_heads, feature_map=s.feature_map,
                    use_short_conv=s.use_short_conv, conv_size=s.conv_size, conv_bias=s.conv_bias,
                    use_output_gate=s.use_output_gate, gate_fn=s.gate_fn, elementwise_affine=s.affine,
                    norm_eps=s.eps, gate_logit_normalizer=s.tau, gate_low_rank_dim=s.r, clamp_min=s.clamp_min,
                    fuse_norm=s.fuse_norm, layer_idx=s.layer_idx)

    def fla_state_dict(self) -> dict:
        """The ``state_dict()`` under the names FLA's layer built with :meth:`fla_settings` has
        (``g_norm_swish_gate`` for the fused norm), so FLA's ``load_state_dict`` takes it as it is."""
        self.fla_settings()
        head = "g_norm_swish_gate." if self.sizes.fused_gate else "g_norm."
        return {(head + name[7:] if name.startswith("g_norm.") else name): value
                for name, value in self.state_dict().items()}

    def load_fla_state_dict(self, state_dict, settings=None):
        """Load the weights of an FLA ``GatedLinearAttention``, after checking that its settings compute
        the same function as this layer's.

        ``state_dict``: the FLA layer itself (its weights and settings), or its ``state_dict()`` with
        ``settings`` = the FLA layer, its model's ``GLAConfig`` or its constructor arguments (a dict). A
        state dict alone does not say ``feature_map``, ``clamp_min``, ``gate_fn`` or
        ``gate_logit_normalizer``, which change the function without changing a shape, so it is refused.
        Raises ValueError naming the first setting that differs (:func:`config.check_fla_settings`),
        or names/shapes that differ, before loading anything. FLA's ``g_norm_swish_gate`` is our ``g_norm``.
        """
        if isinstance(state_dict, nn.Module):
            settings = state_dict if settings is None else settings
            state_dict = state_dict.state_dict()
        if settings is None:
            raise TypeError("load_fla_state_dict needs the FLA layer's settings, which a state dict does not carry "
                            "(feature_map, clamp_min, gate_fn, gate_logit_normalizer change the function, not the "
                            "shapes): pass the FLA layer, load_fla_state_dict(fla_layer), or "
                            "load_fla_state_dict(state_dict, settings=fla_layer or its GLAConfig or its arguments)")
        config.check_fla_settings(self.fla_settings(), config.fla_layer_settings(settings))
        renamed = config.from_fla_names(state_dict)
        config.check_state_dict(renamed, {name: tuple(p.shape) for name, p in self.state_dict().items()})
        self.load_state_dict(renamed)

    @classmethod
    def from_fla(cls, layer, backend="auto"):
        """Our layer with the settings and weights of the FLA ``GatedLinearAttention`` ``layer`` (on its
        device, in its dtype). Raises ValueError naming a setting we do not reproduce."""
        ours = cls(backend=backend, **config.fla_layer_settings(layer))
        weight = layer.q_proj.weight
        ours.to(device=weight.device, dtype=weight.dtype)
        ours.load_fla_state_dict(layer)
        return ours
