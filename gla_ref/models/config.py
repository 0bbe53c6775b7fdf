"""FLA's ``GLAConfig`` without FLA or transformers: the same fields, the same defaults, the same JSON.

:class:`GLAConfig` has every argument of FLA 0.6.0's ``fla.models.GLAConfig`` with FLA's default, and
keeps unknown keyword arguments as attributes (as transformers' ``PretrainedConfig`` does), so a
published FLA ``config.json`` loads as it is (:meth:`GLAConfig.from_pretrained`) and
:meth:`GLAConfig.save_pretrained` writes one FLA reads. No framework is imported here.

Which fields change the model, and what :class:`gla_ref.models.torch.GLAForCausalLM` does with them:

* reproduced — ``hidden_size``, ``expand_k``, ``expand_v``, ``hidden_ratio``, ``intermediate_size``,
  ``num_hidden_layers``, ``num_heads``, ``num_kv_heads``, ``feature_map``, ``use_short_conv``,
  ``conv_size``, ``use_output_gate``, ``clamp_min``, ``hidden_act`` (``"swish"``: the MLP's and the output
  gate's activation), ``elementwise_affine``, ``norm_eps``, ``tie_word_embeddings``, ``vocab_size``,
  ``pad_token_id`` (the embedding's ``padding_idx``), ``initializer_range``; ``bos_token_id``,
  ``eos_token_id`` (``generate()`` stops at eos), ``use_cache`` (the default of ``forward``);
* speed only in FLA, accepted and without effect here — ``attn_mode`` (which kernel ``backend="auto"``
  runs on a GPU), ``fuse_norm``, ``fuse_swiglu``, ``fuse_cross_entropy``, ``fuse_linear_cross_entropy``
  (FLA then returns no logits with a loss; neither do we); ``max_position_embeddings`` (only FLA's
  softmax-attention layers read it); ``use_gk``, ``use_gv`` (FLA 0.6.0 stores them and never reads them);
* refused by name when the model is built — ``attn`` (hybrid softmax-attention layers),
  ``attnres_block_size`` (attention residuals), ``use_l2warp`` (a gradient penalty), ``hidden_act``
  other than ``"swish"`` (FLA's GLA layer cannot build one either).
"""

from __future__ import annotations

import json
import os
import warnings

__all__ = ["GLAConfig", "FLA_GLA_CONFIG_DEFAULTS", "REFUSED"]

FLA_GLA_CONFIG_DEFAULTS = dict(
    hidden_size=2048, expand_k=0.5, expand_v=1.0, hidden_ratio=4, intermediate_size=None, num_hidden_layers=24,
    num_heads=4, num_kv_heads=None, feature_map=None, attn_mode="chunk", use_short_conv=False, conv_size=4,
    use_output_gate=True, clamp_min=None, hidden_act="swish", max_position_embeddings=2048,
    elementwise_affine=True, norm_eps=1e-6, use_gk=True, use_gv=False, attn=None, use_cache=True,
    pad_token_id=None, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.02,
    fuse_norm=True, fuse_swiglu=True, fuse_cross_entropy=True, fuse_linear_cross_entropy=False, use_l2warp=False,
    vocab_size=32000, attnres_block_size=None)
"""Every argument of FLA 0.6.0's ``GLAConfig`` (fla/models/gla/configuration_gla.py) and its default."""

REFUSED = {
    "attn": (None, "hybrid softmax-attention layers are not reproduced"),
    "attnres_block_size": (None, "attention residuals (AttnRes) are not reproduced"),
    "use_l2warp": (False, "the L2-warp gradient penalty is not reproduced"),
    "hidden_act": ("swish", "only the Swish (SiLU) MLP and output gate are reproduced, as FLA's GLA layer builds "
                            "no other"),
}
"""Field → (the one value the model takes, why): a config with another value is refused by name."""

_TRANSFORMERS_DEFAULTS = dict(return_dict=True, output_hidden_states=False, output_attentions=False)


class GLAConfig:
    """FLA's ``GLAConfig`` (see the module docstring): ``GLAConfig(**fields)``, FLA's defaults for the rest.

    FLA's own checks are kept: ``fuse_cross_entropy`` and ``fuse_linear_cross_entropy`` cannot both be
    True, and ``attnres_block_size`` is None, 1 or an even number ≥ 2. ``return_dict``,
    ``output_hidden_states``, ``output_attentions`` default as in transformers. ``model_type`` is ``"gla"``.
    """

    model_type = "gla"

    def __init__(self, **kwargs):
        fields = {**FLA_GLA_CONFIG_DEFAULTS, **_TRANSFORMERS_DEFAULTS, **kwargs}
        fields.pop("model_type", None)
        for name, value in fields.items():
            setattr(self, name, value)
        if self.fuse_cross_entropy and self.fuse_linear_cross_entropy:
            raise ValueError("fuse_cross_entropy and fuse_linear_cross_entropy cannot both be True")
        if self.fuse_linear_cross_entropy:
            warnings.warn("fuse_linear_cross_entropy: FLA computes the same loss in chunks (less memory, a little "
                          "less precision); here it only means that forward returns no logits with a loss",
                          stacklevel=2)
        b = self.attnres_block_size
        if b is not None and b != 1 and (isinstance(b, bool) or not isinstance(b, int) or b < 2 or b % 2):
            raise ValueError(f"attnres_block_size must be None, 1 or an even integer >= 2, got {b!r}")

    # ------------------------------------------------------------------ FLA's checks of what we build

    def refused(self) -> list[str]:
        """The fields whose values the model does not reproduce, each with why (empty: all reproduced)."""
        return [f"{name}={getattr(self, name)!r}: {why}" for name, (ok, why) in REFUSED.items()
                if getattr(self, name) != ok]

    @property
    def mlp_size(self) -> int:
        """The MLP's width as FLA's ``GatedMLP`` computes it: ``intermediate_size``, or 2/3 of
        ``hidden_ratio`` (4 when None) × hidden_size rounded up to a multiple of 256."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        ratio = 4 if self.hidden_ratio is None else self.hidden_ratio
        width = int(self.hidden_size * ratio * 2 / 3)
        return 256 * ((width + 255) // 256)

    # ------------------------------------------------------------------ dicts and files

    def to_dict(self) -> dict:
        return {"model_type": self.model_type, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}

    @classmethod
    def from_dict(cls, d: dict) -> "GLAConfig":
        if d.get("model_type", "gla") != "gla":
            raise ValueError(f"model_type is {d['model_type']!r}, not 'gla': not a GLA config")
        return cls(**{k: v for k, v in d.items() if k not in ("transformers_version",)})

    @classmethod
    def from_fla(cls, config) -> "GLAConfig":
        """Our config from FLA's ``GLAConfig`` object (or any object with ``to_dict()``, or a dict)."""
        return cls.from_dict(config if isinstance(config, dict) else config.to_dict())

    @classmethod
    def from_pretrained(cls, path) -> "GLAConfig":
        """From a directory holding ``config.json`` (or the file itself)."""
        path = os.fspath(path)
        with open(os.path.join(path, "config.json") if os.path.isdir(path) else path) as f:
            return cls.from_dict(json.load(f))

    def save_pretrained(self, directory) -> None:
        os.makedirs(directory, exist_ok=True)
        d = {"architectures": ["GLAForCausalLM"], **self.to_dict()}
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(d, f, indent=2, sort_keys=True, default=str)

    def __eq__(self, other):
        return isinstance(other, GLAConfig) and self.to_dict() == other.to_dict()

    def __repr__(self):
        changed = {k: v for k, v in self.to_dict().items()
                   if k != "model_type" and FLA_GLA_CONFIG_DEFAULTS.get(k, _TRANSFORMERS_DEFAULTS.get(k, object())) != v}
        return f"GLAConfig({', '.join(f'{k}={v!r}' for k, v in changed.items())})"
