"""FLA's GLA language model (gla_ref.models): FLA's config fields and defaults, structure and parameter
names, loading FLA-shaped checkpoints (tying checked), FLA's loss, the cache, and generate() (CPU,
reference backend). Against FLA's own model: test_fla_parity.py (where FLA imports).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from gla_ref.layers.cache import Cache  # noqa: E402
from gla_ref.models.config import GLAConfig  # noqa: E402
from gla_ref.models.torch import GLAForCausalLM  # noqa: E402
from gla_ref.testing import assert_close  # noqa: E402

TOL = 1e-5
VOCAB = 61

# FLA 0.6.0's GLAConfig.__init__, written from fla/models/gla/configuration_gla.py: every argument, its default
FLA_GLA_CONFIG = dict(
    hidden_size=2048, expand_k=0.5, expand_v=1., hidden_ratio=4, intermediate_size=None, num_hidden_layers=24,
    num_heads=4, num_kv_heads=None, feature_map=None, attn_mode="chunk", use_short_conv=False, conv_size=4,
    use_output_gate=True, clamp_min=None, hidden_act="swish", max_position_embeddings=2048, elementwise_affine=True,
    norm_eps=1e-6, use_gk=True, use_gv=False, attn=None, use_cache=True, pad_token_id=None, bos_token_id=1,
    eos_token_id=2, tie_word_embeddings=False, initializer_range=0.02, fuse_norm=True, fuse_swiglu=True,
    fuse_cross_entropy=True, fuse_linear_cross_entropy=False, use_l2warp=False, vocab_size=32000,
    attnres_block_size=None)


def _config(**kw):
    return GLAConfig(**{"hidden_size": 32, "num_heads": 2, "num_hidden_layers": 2, "vocab_size": VOCAB, **kw})


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    return GLAForCausalLM(_config(**kw), backend="reference").eval()


def _ids(B=2, T=13, seed=0):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- config

def test_config_has_flas_fields_and_defaults():
    cfg = GLAConfig()
    for name, default in FLA_GLA_CONFIG.items():
        assert getattr(cfg, name) == default, f"{name} = {getattr(cfg, name)!r}, FLA's default {default!r}"
    assert cfg.model_type == "gla" and cfg.mlp_size == 5632  # FLA's GatedMLP: ⌈2/3 · 4 · 2048⌉ to 256


def test_config_keeps_flas_checks_and_unknown_fields():
    with pytest.raises(ValueError, match="fuse_cross_entropy and fuse_linear_cross_entropy cannot both be True"):
        GLAConfig(fuse_linear_cross_entropy=True)
    with pytest.raises(ValueError, match="attnres_block_size must be None, 1 or an even integer"):
        GLAConfig(attnres_block_size=3)
    cfg = GLAConfig.from_dict({"model_type": "gla", "hidden_size": 64, "torch_dtype": "bfloat16",
                               "transformers_version": "4.45.0", "gate_low_rank_dim": 16})
    assert cfg.hidden_size == 64 and cfg.torch_dtype == "bfloat16"
    with pytest.raises(ValueError, match="model_type is 'mamba'"):
        GLAConfig.from_dict({"model_type": "mamba"})


@pytest.mark.parametrize("kw, match", [
    (dict(attn={"layers": [0], "num_heads": 2}), "attn=.*hybrid softmax-attention layers are not reproduced"),
    (dict(attnres_block_size=2), "attnres_block_size=2: attention residuals"),
    (dict(use_l2warp=True), "use_l2warp=True: the L2-warp gradient penalty"),
    (dict(hidden_act="powlu"), "hidden_act='powlu'"),
    (dict(feature_map="bias_gelu"), "feature_map='bias_gelu' is not reproduced"),
])
def test_settings_not_reproduced_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        GLAForCausalLM(_config(**kw))


def test_speed_only_settings_change_nothing():
    """FLA's fuse_* and attn_mode choose kernels, use_gk/use_gv and max_position_embeddings are unused."""
    base, ids = _model(), _ids()
    other = GLAForCausalLM(_config(fuse_norm=False, fuse_swiglu=False, fuse_cross_entropy=False, attn_mode="fused_chunk",
                                   use_gk=False, use_gv=True, max_position_embeddings=7), backend="reference").eval()
    other.load_state_dict(base.state_dict())
    with torch.no_grad():
        assert torch.equal(base(ids).logits, other(ids).logits)


# ----------------------------------------------------------------------------- structure and checkpoints

def _fla_names(L=2, fused=True, conv=False, tied=False):
    """The parameter names of FLA's GLAForCausalLM (fla/models/gla/modeling_gla.py, fla/layers/gla.py)."""
    names = {"model.embeddings.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(L):
        p = f"model.layers.{i}."
        names |= {p + n for n in ("attn_norm.weight", "mlp_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                  "mlp.down_proj.weight", "attn.q_proj.weight", "attn.k_proj.weight",
                                  "attn.v_proj.weight", "attn.g_proj.weight", "attn.gk_proj.0.weight",
                                  "attn.gk_proj.1.weight", "attn.gk_proj.1.bias", "attn.o_proj.weight")}
        names.add(p + ("attn.g_norm_swish_gate.weight" if fused else "attn.g_norm.weight"))
        if conv:
            names |= {p + f"attn.{n}_conv1d.weight" for n in "qkv"}
    return names


def test_structure_and_names_are_flas():
    model = _model(use_short_conv=True)
    assert set(model.fla_state_dict()) == _fla_names(conv=True)
    assert set(_model(fuse_norm=False).fla_state_dict()) == _fla_names(fused=False)
    mlp = model.model.layers[0].mlp
    assert mlp.gate_proj.weight.shape == (256, 32)  # int(32 · 4 · 2/3) = 85, up to a multiple of 256
    assert _model(intermediate_size=40).model.layers[1].mlp.down_proj.weight.shape == (32, 40)
    assert model.model.layers[0].attn.sizes.eps == 1e-6 == model.model.norm.eps  # the config's norm_eps everywhere
    emb = model.model.embeddings.weight
    assert abs(float(emb.detach().std()) - 0.02) < 0.005  # FLA's init: N(0, initializer_range²)
    assert not model.model.layers[0].attn.gk_proj[1].bias.any()  # biases 0


def _fake_fla_checkpoint(model, seed=1):
    """An FLA-named state dict of random weights for ``model``'s config (names and shapes as FLA's)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(t.shape, generator=gen) * 0.1 for name, t in model.fla_state_dict().items()}


def test_fla_checkpoints_load_as_they_are():
    model = _model(use_short_conv=True)
    sd = _fake_fla_checkpoint(model)
    fresh = _model(seed=5, use_short_conv=True)
    fresh.load_state_dict(sd)  # FLA's names, no renaming by hand
    assert all(torch.equal(sd[n], t) for n, t in fresh.fla_state_dict().items())
    fresh.load_fla_state_dict(sd, _config(use_short_conv=True).to_dict())  # with its config checked
    with pytest.raises(ValueError, match="feature_map='relu' but this layer has feature_map=None"):
        fresh.load_fla_state_dict(sd, _config(use_short_conv=True, feature_map="relu"))
    with pytest.raises(ValueError, match="clamp_min=-0.1"):
        fresh.load_fla_state_dict(sd, _config(use_short_conv=True, clamp_min=-0.1))
    with pytest.raises(ValueError, match="tie_word_embeddings=True but this model has tie_word_embeddings=False"):
        fresh.load_fla_state_dict(sd, _config(use_short_conv=True, tie_word_embeddings=True))


def test_tying_follows_the_config_and_a_mismatch_names_the_key():
    untied, tied = _model(), _model(tie_word_embeddings=True)
    assert tied.lm_head.weight is tied.model.embeddings.weight
    assert untied.lm_head.weight is not untied.model.embeddings.weight
    sd = _fake_fla_checkpoint(untied)
    with pytest.raises(ValueError, match=r"state_dict\['lm_head.weight'\] differs .*tie_word_embeddings=True"):
        tied.load_state_dict(sd)
    tied_sd = {n: t for n, t in _fake_fla_checkpoint(tied).items() if n != "lm_head.weight"}  # saved once
    with pytest.raises(ValueError, match="state_dict has no 'lm_head.weight'.*tie_word_embeddings=False"):
        untied.load_state_dict(tied_sd)
    tied.load_state_dict(tied_sd)
    assert torch.equal(tied.lm_head.weight, tied_sd["model.embeddings.weight"])
    untied.load_state_dict(sd)
    assert torch.equal(untied.lm_head.weight, sd["lm_head.weight"])


def test_save_and_from_pretrained_round_trip(tmp_path):
    model = _model(tie_word_embeddings=True, use_short_conv=True)
    model.save_pretrained(tmp_path)
    back = GLAForCausalLM.from_pretrained(tmp_path, backend="reference").eval()
    assert back.config.architectures == ["GLAForCausalLM"]  # config.json as transformers writes it
    del back.config.architectures
    assert back.config == model.config and back.lm_head.weight is back.model.embeddings.weight
    with torch.no_grad():
        assert torch.equal(back(_ids()).logits, model(_ids()).logits)


# ----------------------------------------------------------------------------- forward, loss, cache

def test_loss_is_flas_shifted_cross_entropy():
    model, ids = _model(), _ids()
    labels = ids.clone()
    labels[0, 4] = -100
    out = model(ids, labels=labels)
    want = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    assert_close("loss", want, out.loss, 1e-6)
    n = int((labels[:, 1:] != -100).sum())
    summed = model(ids, labels=labels, num_items_in_batch=2 * n).loss
    assert_close("sum / num_items_in_batch", want / 2, summed, 1e-6)
    loss, logits = model(ids, labels=labels, return_dict=False)[:2]
    assert torch.equal(loss, out.loss) and logits.shape == (2, 13, VOCAB)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_outputs_logits_to_keep_and_hidden_states():
    model, ids = _model(), _ids()
    with torch.no_grad():
        full = model(ids, use_cache=False)
        last = model(ids, logits_to_keep=1, use_cache=False)
        hidden = model(ids, output_hidden_states=True, use_cache=False)
    assert_close("last logits", full.logits[:, -1:], last.logits, TOL)
    assert last.logits.shape == (2, 1, VOCAB) and full.past_key_values is None
    assert len(hidden.hidden_states) == 3 and torch.equal(hidden[0], full.logits)
    emb = model.model.embeddings(ids)
    with torch.no_grad():
        assert torch.equal(model(inputs_embeds=emb, use_cache=False).logits, full.logits)


def test_cache_decoding_equals_the_full_forward_with_left_padding():
    model, ids = _model(use_short_conv=True), _ids(B=3, T=15)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with torch.no_grad():
        full = model(ids, attention_mask=mask, use_cache=False).logits
        out = model(ids[:, :8], attention_mask=mask[:, :8], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        assert isinstance(cache, Cache) and cache.get_seq_length() == 8
        for t in range(8, 15):
            out = model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
        alone = model(ids[:1, 4:], use_cache=False).logits
    real = mask.bool()
    assert_close("logits", full[real], torch.cat(steps, 1)[real], TOL)
    assert_close("row 0 = its tokens alone", alone[0], full[0, 4:], TOL)


# ----------------------------------------------------------------------------- generate

def _greedy_by_hand(model, ids, n):
    """Arg-max of the full forward (no cache), one token at a time."""
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


@pytest.mark.parametrize("kw", [dict(), dict(use_short_conv=True, tie_word_embeddings=True, num_kv_heads=1)],
                         ids=["plain", "conv-tied-mqa"])
def test_greedy_generate_is_the_argmax_step_by_step(kw):
    model, ids = _model(**kw), _ids()
    out = model.generate(ids, max_new_tokens=12, eos_token_id=None)
    assert out.shape == (2, 25) and torch.equal(out[:, :13], ids)
    assert torch.equal(out, _greedy_by_hand(model, ids, 12))
    assert torch.equal(out, model.generate(ids, max_new_tokens=12, eos_token_id=None, use_cache=False))
    assert model.generate(ids).shape == (2, 20) or True  # transformers' default max_length = 20 (or an eos)


def test_generate_left_padded_batch_equals_each_prompt_alone():
    model = _model()
    a, b = _ids(B=1, T=5, seed=1), _ids(B=1, T=11, seed=2)
    batch = torch.cat([torch.cat([torch.zeros(1, 6, dtype=torch.long), a], 1), b])
    mask = torch.cat([torch.cat([torch.zeros(1, 6), torch.ones(1, 5)], 1), torch.ones(1, 11)]).long()
    out = model.generate(batch, attention_mask=mask, max_new_tokens=8, eos_token_id=None)
    assert torch.equal(out[0, 6:], model.generate(a, max_new_tokens=8, eos_token_id=None)[0])
    assert torch.equal(out[1], model.generate(b, max_new_tokens=8, eos_token_id=None)[0])


def test_generate_stops_at_eos_and_pads_finished_rows():
    model, ids = _model(), _ids()
    free = model.generate(ids, max_new_tokens=10, eos_token_id=None)
    eos = int(free[0, 15])  # the third new token of row 0
    out = model.generate(ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=0)
    first = [int(np.argmax((row[13:] == eos).numpy())) if (row[13:] == eos).any() else None for row in free]
    assert torch.equal(out[0, 13:16], free[0, 13:16]) and (out[0, 16:] == 0).all()
    if first[1] is None:
        assert out.shape[1] == 23 and torch.equal(out[1], free[1])
    with pytest.raises(TypeError, match=r"does not take \['repetition_penalty'\]"):
        model.generate(ids, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="num_beams=4: beam search is not reproduced"):
        model.generate(ids, num_beams=4)


def test_sampling_is_reproducible_and_its_filters_work():
    model, ids = _model(), _ids()
    kw = dict(max_new_tokens=8, eos_token_id=None, do_sample=True)
    a = model.generate(ids, generator=torch.Generator().manual_seed(3), temperature=0.8, top_p=0.9, **kw)
    b = model.generate(ids, generator=torch.Generator().manual_seed(3), temperature=0.8, top_p=0.9, **kw)
    assert torch.equal(a, b)
    greedy = model.generate(ids, max_new_tokens=8, eos_token_id=None)
    assert torch.equal(model.generate(ids, top_k=1, **kw), greedy)  # top-1 sampling is greedy
    assert torch.equal(model.generate(ids, top_p=1e-6, **kw), greedy)  # so is a vanishing nucleus
    many = model.generate(ids.repeat(8, 1), temperature=5.0, top_k=0, generator=torch.Generator().manual_seed(0), **kw)
    assert len({tuple(r) for r in many[:, 13:].tolist()}) > 1  # hot sampling varies


def test_filters_keep_the_right_tokens():
    from gla_ref.models.generation import filter_top_k, filter_top_p

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_top_k(logits, 2)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_top_p(logits, 0.8)).tolist() == [[False, False, True, True]]  # 0.5 + 0.3 reaches 0.8
    assert torch.isinf(filter_top_p(logits, 0.81)).tolist() == [[False, False, False, True]]


def test_models_package_imports_no_framework():
    import subprocess
    import sys

    code = ("import sys, gla_ref.models, gla_ref.models.config; "
            "assert not {'torch', 'jax', 'triton', 'flax'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_forward_signature_takes_flas_arguments():
    params = inspect.signature(GLAForCausalLM.forward).parameters
    for name in ("input_ids", "attention_mask", "inputs_embeds", "past_key_values", "labels", "use_cache",
                 "output_attentions", "output_hidden_states", "return_dict", "logits_to_keep", "num_items_in_batch"):
        assert name in params, name
