"""FLA's GLA language model in PyTorch: :class:`GLAForCausalLM` (and :class:`GLAModel`, :class:`GLABlock`),
a drop-in for FLA 0.6.0's ``fla.models.GLAForCausalLM`` without FLA or transformers.

Same structure and parameter names — ``model.embeddings``, ``model.layers.N.{attn_norm, attn, mlp_norm,
mlp}``, ``model.norm``, ``lm_head`` — so FLA's ``state_dict()`` and FLA's published checkpoints load as
they are (:meth:`GLAForCausalLM.from_pretrained`, :meth:`~GLAForCausalLM.from_fla`, plain
``load_state_dict``; FLA's ``g_norm_swish_gate`` is taken as our ``g_norm``, and tying follows
``config.tie_word_embeddings``: a checkpoint that disagrees raises, naming ``lm_head.weight``).
The config is :class:`gla_ref.models.config.GLAConfig` (FLA's fields and defaults). Each block::

    h = x + attn(RMSNorm(x)),   out = h + MLP(RMSNorm(h)),   MLP(z) = W_down (Swish(z W_gate) ⊙ z W_up)

with :class:`gla_ref.layers.torch.GatedLinearAttention` as ``attn``. ``forward`` takes FLA's arguments
(``input_ids`` or ``inputs_embeds``, ``attention_mask`` for padding, ``past_key_values`` a
:class:`gla_ref.layers.cache.Cache` or FLA's, ``use_cache``, ``labels``, ``logits_to_keep``,
``num_items_in_batch``, ``output_hidden_states``, ``return_dict``) and returns FLA's outputs (objects with
``.loss``, ``.logits``, ``.past_key_values``, ``.hidden_states``, indexable like transformers' outputs).
The loss is FLA's: labels shifted left by one inside (the last position gets -100), cross-entropy
over the positions whose label is not -100, their mean (their sum / ``num_items_in_batch`` if given).
:meth:`GLAForCausalLM.generate` decodes greedily or by sampling with the recurrent state cache
(:mod:`gla_ref.models.generation`).

``backend`` (every layer's; default ``"auto"``): the reference on a CPU, the Triton kernels on a GPU,
decided at each call (see :mod:`gla_ref.layers.torch`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gla_ref.layers import config as layer_config
from gla_ref.layers import fla_torch
from gla_ref.layers.cache import Cache, is_cache
from gla_ref.layers.short_conv import ShortConvolution
from gla_ref.layers.torch import GatedLinearAttention
from gla_ref.models import checkpoint, generation
from gla_ref.models.config import GLAConfig

__all__ = ["GLAForCausalLM", "GLAModel", "GLABlock", "GatedMLP", "RMSNorm", "ModelOutput",
           "BaseModelOutputWithPast", "CausalLMOutputWithPast", "Cache", "GLAConfig"]


# ----------------------------------------------------------------------------- outputs

class ModelOutput(dict):
    """transformers' output object, reduced: fields as attributes (None when absent), and a dict of the
    fields that are set, which ``out[0]``, ``out[1]``, … index in field order, as transformers does."""

    fields: tuple = ()

    def __init__(self, **values):
        unknown = set(values) - set(self.fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(unknown)}")
        super().__init__((k, values[k]) for k in self.fields if values.get(k) is not None)

    def __getattr__(self, name):
        if name in self.fields:
            return self.get(name)
        raise AttributeError(name)

    def __getitem__(self, key):
        return self.to_tuple()[key] if isinstance(key, (int, slice)) else super().__getitem__(key)

    def to_tuple(self) -> tuple:
        return tuple(self.values())


class BaseModelOutputWithPast(ModelOutput):
    fields = ("last_hidden_state", "past_key_values", "hidden_states", "attentions")


class CausalLMOutputWithPast(ModelOutput):
    fields = ("loss", "logits", "past_key_values", "hidden_states", "attentions")


# ----------------------------------------------------------------------------- modules

class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a ``weight``, in float32, rounded to x's dtype (as FLA's fused
    RMSNorm computes it)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.eps = layer_config.positive_number("eps", eps)
        self.weight = nn.Parameter(torch.ones(layer_config.positive_int("hidden_size", hidden_size)))

    def forward(self, x):
        y = x.float()
        return (y * torch.rsqrt(y.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


class GatedMLP(nn.Module):
    """FLA's ``GatedMLP`` with Swish: ``down_proj(Swish(gate_proj(z)) ⊙ up_proj(z))``, the product in float32."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, z, **kwargs):
        gate, up = self.gate_proj(z), self.up_proj(z)
        return self.down_proj((F.silu(gate.float()) * up.float()).to(z.dtype))


def _check_config(config):
    if not isinstance(config, GLAConfig):
        if hasattr(config, "to_dict"):  # FLA's GLAConfig, say
            config = GLAConfig.from_fla(config)
        else:
            raise TypeError(f"config must be a GLAConfig (ours or FLA's), got {type(config).__name__}")
    refused = config.refused()
    if refused:
        raise ValueError("GLAConfig settings that gla_ref does not reproduce: " + "; ".join(refused))
    return config


class GLABlock(nn.Module):
    """FLA's ``GLABlock``: ``attn_norm``, ``attn`` (:class:`GatedLinearAttention`, built from the config as
    FLA builds it), ``mlp_norm``, ``mlp``. ``forward(hidden_states, attention_mask=None,
    past_key_values=None, use_cache=False, output_attentions=False, **kwargs) -> (hidden_states, None,
    past_key_values)``."""

    def __init__(self, config, layer_idx, backend="auto"):
        super().__init__()
        config = _check_config(config)
        self.layer_idx = layer_idx
        self.attn_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = GatedLinearAttention(backend=backend, **layer_config.fla_config_layer_settings(config, layer_idx))
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.mlp_size)

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, use_cache=False,
                output_attentions=False, **kwargs):
        y, _, past_key_values = self.attn(self.attn_norm(hidden_states), attention_mask=attention_mask,
                                          past_key_values=past_key_values, use_cache=use_cache, **kwargs)
        h = hidden_states + y
        return h + self.mlp(self.mlp_norm(h)), None, past_key_values


class _PreTrained(nn.Module):
    """What the model classes share: the config, FLA's weight initialisation, the device and dtype."""

    def _init_weights(self):
        """FLA's initialisation: every linear and convolution weight ~ N(0, initializer_range²), their
        biases 0, the embedding ~ N(0, initializer_range²), norms 1."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, ShortConvolution, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    @property
    def device(self):
        return next(self.parameters()).device

    @property
    def dtype(self):
        return next(self.parameters()).dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


class GLAModel(_PreTrained):
    """FLA's ``GLAModel``: ``embeddings``, ``layers``, ``norm``; returns :class:`BaseModelOutputWithPast`."""

    def __init__(self, config, backend="auto"):
        super().__init__()
        self.config = config = _check_config(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(GLABlock(config, i, backend) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.norm_eps)
        self._init_weights()

    def get_input_embeddings(self):
        return self.embeddings

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, past_key_values=None, use_cache=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        cfg = self.config
        use_cache = use_cache if use_cache is not None else (cfg.use_cache and not self.training)
        output_hidden_states = cfg.output_hidden_states if output_hidden_states is None else output_hidden_states
        return_dict = cfg.return_dict if return_dict is None else return_dict
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
                raise TypeError(f"input_ids must be an integer torch.Tensor [B, T], got "
                                f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                                f"{tuple(getattr(input_ids, 'shape', ()))}")
            inputs_embeds = self.embeddings(input_ids)
        if past_key_values is None:  # transformers >= 5.2x passes the cache as cache= (FLA 0.6.0 misses it)
            past_key_values = kwargs.pop("cache", None)
        if (use_cache and past_key_values is None) or isinstance(past_key_values, (list, tuple)):
            past_key_values = Cache.from_legacy_cache(past_key_values)
        elif past_key_values is not None and not is_cache(past_key_values):
            raise TypeError(f"past_key_values must be None, a Cache (ours or FLA's) or a tuple of per-layer state "
                            f"dicts, got {type(past_key_values).__name__}")
        h, hidden = inputs_embeds, []
        for layer in self.layers:
            if output_hidden_states:
                hidden.append(h)
            h, _, past_key_values = layer(h, attention_mask=attention_mask, past_key_values=past_key_values,
                                          use_cache=use_cache, **kwargs)
        h = self.norm(h)
        if output_hidden_states:
            hidden.append(h)
        out = BaseModelOutputWithPast(last_hidden_state=h, past_key_values=past_key_values,
                                      hidden_states=tuple(hidden) if output_hidden_states else None)
        return out if return_dict else out.to_tuple()


class GLAForCausalLM(_PreTrained):
    """FLA's ``GLAForCausalLM``: ``model`` (:class:`GLAModel`) and ``lm_head`` (tied to
    ``model.embeddings`` when ``config.tie_word_embeddings``). See the module docstring.

    ``GLAForCausalLM(config, backend="auto")``: ``config`` a :class:`GLAConfig` (FLA's is converted);
    a setting we do not reproduce raises ValueError naming it (:data:`gla_ref.models.config.REFUSED`, and
    the layer's own checks). Weights start as FLA's initialisation (:meth:`_init_weights`).
    """

    def __init__(self, config, backend="auto"):
        super().__init__()
        self.config = config = _check_config(config)
        self.model = GLAModel(config, backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=config.initializer_range)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embeddings.weight
        self.register_load_state_dict_pre_hook(
            lambda module, sd, prefix, *_: fla_torch.check_tied_weights(
                sd, prefix, "model.embeddings.weight", "lm_head.weight", module.config.tie_word_embeddings,
                "tie_word_embeddings"))

    def get_input_embeddings(self):
        return self.model.embeddings

    def get_output_embeddings(self):
        return self.lm_head

    def get_decoder(self):
        return self.model

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, past_key_values=None, labels=None,
                use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                logits_to_keep=0, num_items_in_batch=None, **kwargs):
        """FLA's forward; returns :class:`CausalLMOutputWithPast` (a tuple of its set fields with
        ``return_dict=False``). ``logits_to_keep``: 0 = every position, n = the last n, a tensor = those
        positions (ignored with labels, which need all). ``labels`` ``[B, T]``: FLA's shifted loss."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                         past_key_values=past_key_values, use_cache=use_cache, output_hidden_states=output_hidden_states,
                         return_dict=True, **kwargs)
        loss, logits = self.loss_and_logits(out.last_hidden_state, labels, logits_to_keep, num_items_in_batch)
        result = CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=out.past_key_values,
                                        hidden_states=out.hidden_states)
        return result if return_dict else result.to_tuple()

    def loss_and_logits(self, hidden_states, labels=None, logits_to_keep=0, num_items_in_batch=None):
        """``(loss or None, logits or None)`` from the last hidden states, as FLA computes them."""
        if labels is None:
            h = hidden_states
            if isinstance(logits_to_keep, int):
                h = h if logits_to_keep in (0, None) else h[:, -logits_to_keep:]
            elif logits_to_keep is not None:
                h = h[:, logits_to_keep]
            return None, self.lm_head(h)
        if not isinstance(labels, torch.Tensor) or labels.shape != hidden_states.shape[:2]:
            raise ValueError(f"labels must be a torch.Tensor [B, T] = {tuple(hidden_states.shape[:2])}, got "
                             f"{tuple(getattr(labels, 'shape', ())) or type(labels).__name__}")
        logits = self.lm_head(hidden_states)
        labels = labels.to(hidden_states.device)
        shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], 1)
        loss = F.cross_entropy(logits.float().flatten(0, 1), shifted.flatten(), ignore_index=-100,
                               reduction="mean" if num_items_in_batch is None else "sum")
        if num_items_in_batch is not None:
            loss = loss / num_items_in_batch
        return loss, (None if self.config.fuse_linear_cross_entropy else logits)

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, **kwargs):
        """Greedy or sampled continuation of ``input_ids`` ``[B, T]``: see :func:`gla_ref.models.generation.generate`."""
        return generation.generate(self, input_ids, attention_mask, **kwargs)

    # ------------------------------------------------------------------ FLA's checkpoints

    def fla_state_dict(self) -> dict:
        """``state_dict()`` under FLA's names (each layer's fused norm as ``g_norm_swish_gate``), which FLA's
        ``GLAForCausalLM.load_state_dict`` takes as it is."""
        out = {}
        for name, value in self.state_dict().items():
            head, sep, tail = name.rpartition(".attn.g_norm.")
            if sep and self.model.layers[int(head.split(".")[-1])].attn.sizes.fused_gate:
                name = f"{head}.attn.g_norm_swish_gate.{tail}"
            out[name] = value
        return out

    def load_fla_state_dict(self, state_dict, config):
        """Load an FLA ``GLAForCausalLM``'s ``state_dict`` after checking that its ``config`` (FLA's
        ``GLAConfig``, ours, or its dict) builds the same function as ours: raises ValueError naming the
        first field that differs, before loading anything."""
        theirs = config if isinstance(config, GLAConfig) else GLAConfig.from_fla(config)
        checkpoint.check_same_function(self.config, theirs)
        self.load_state_dict(state_dict)

    @classmethod
    def from_fla(cls, model, backend="auto"):
        """Our model with the config and weights of FLA's ``GLAForCausalLM`` ``model`` (its device and dtype)."""
        ours = cls(GLAConfig.from_fla(model.config), backend)
        weight = next(model.parameters())
        ours.to(device=weight.device, dtype=weight.dtype)
        ours.load_fla_state_dict(model.state_dict(), model.config)
        return ours

    @classmethod
    def from_pretrained(cls, path, backend="auto", dtype=None, device=None):
        """A model from a checkpoint directory as FLA publishes them (``config.json`` and
        ``model.safetensors``, sharded or not, or ``pytorch_model.bin``), or a Hugging Face Hub id
        (needs ``huggingface_hub``: ``pip install gla_ref[hub]``). ``dtype``: None keeps float32 (as
        transformers does), or a torch dtype, or ``"auto"`` for the config's ``torch_dtype``."""
        return checkpoint.from_pretrained(cls, path, backend=backend, dtype=dtype, device=device)

    def save_pretrained(self, directory) -> None:
        """``config.json`` and the weights under FLA's names (``model.safetensors`` where safetensors is
        installed, else ``pytorch_model.bin``; a tied head is not stored twice): FLA's
        ``GLAForCausalLM.from_pretrained`` and ours read it."""
        checkpoint.save_pretrained(self, directory)
