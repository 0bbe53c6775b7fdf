"""Reading and writing FLA's GLA checkpoints: a directory with ``config.json`` and the weights
(``model.safetensors``, ``model-0000N-of-0000M.safetensors`` with its ``.index.json``, or
``pytorch_model.bin``, sharded or not), as FLA's models publish them on the Hugging Face Hub.
``safetensors`` and ``huggingface_hub`` are optional (``pip install gla_ref[hub]``).
"""

from __future__ import annotations

import json
import os

import torch

from gla_ref.layers import config as layer_config
from gla_ref.models.config import GLAConfig

__all__ = ["check_same_function", "load_weights", "from_pretrained", "save_pretrained"]

MODEL_FUNCTION_FIELDS = ("num_hidden_layers", "vocab_size", "tie_word_embeddings", "mlp_size", "pad_token_id")
"""The model-level fields (besides every layer's, :data:`gla_ref.layers.config.FLA_FUNCTION_SETTINGS`,
and the block norms' ``norm_eps``) that change what a checkpoint computes."""


def check_same_function(ours: GLAConfig, theirs: GLAConfig) -> None:
    """Raise ValueError naming the first field in which ``theirs`` builds another function than ``ours``
    (the layers' settings, then the model's), or a field of theirs that we do not reproduce."""
    refused = theirs.refused()
    if refused:
        raise ValueError("the checkpoint's config has settings gla_ref does not reproduce: " + "; ".join(refused))
    layer_config.check_fla_settings(layer_config.fla_config_layer_settings(ours),
                                    layer_config.fla_config_layer_settings(theirs), what="the checkpoint's config")
    for name in MODEL_FUNCTION_FIELDS:
        a, b = getattr(ours, name), getattr(theirs, name)
        if a != b:
            raise ValueError(f"the checkpoint's config has {name}={b!r} but this model has {name}={a!r}")


def _read(path):
    if path.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file
        except ImportError as err:
            raise ImportError(f"{os.path.basename(path)} needs safetensors: pip install gla_ref[hub] "
                              f"(or pip install safetensors)") from err
        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def load_weights(directory) -> dict:
    """The state dict stored in a checkpoint directory (safetensors first, sharded or not, then .bin)."""
    for index, single in (("model.safetensors.index.json", "model.safetensors"),
                          ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        if os.path.exists(os.path.join(directory, index)):
            with open(os.path.join(directory, index)) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            state = {}
            for shard in shards:
                state.update(_read(os.path.join(directory, shard)))
            return state
        if os.path.exists(os.path.join(directory, single)):
            return _read(os.path.join(directory, single))
    raise FileNotFoundError(f"{directory} holds no model.safetensors, pytorch_model.bin or their sharded index")


def _resolve(path):
    if os.path.isdir(path):
        return path
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:
        raise FileNotFoundError(f"{path!r} is not a directory; to download it from the Hugging Face Hub install "
                                f"huggingface_hub (pip install gla_ref[hub])") from err
    return snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.bin"])


def from_pretrained(cls, path, backend="auto", dtype=None, device=None):
    directory = _resolve(os.fspath(path))
    cfg = GLAConfig.from_pretrained(directory)
    if dtype == "auto":
        name = getattr(cfg, "torch_dtype", None) or getattr(cfg, "dtype", None) or "float32"
        dtype = getattr(torch, str(name).replace("torch.", ""))
    model = cls(cfg, backend)
    state = load_weights(directory)
    model.load_state_dict(state)  # FLA's names load as they are; tying is checked against the config
    return model.to(device=device, dtype=dtype)


def save_pretrained(model, directory) -> None:
    os.makedirs(directory, exist_ok=True)
    model.config.save_pretrained(directory)
    state = {k: v.detach().cpu().contiguous() for k, v in model.fla_state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    try:
        from safetensors.torch import save_file
    except ImportError:
        torch.save(state, os.path.join(directory, "pytorch_model.bin"))
    else:
        save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
