"""Our GLA layer and model against FLA's own objects (flash-linear-attention 0.6.0), where FLA imports.

Skipped without FLA (``pip install gla_ref[fla]``). On a CPU FLA's kernels run in Triton's interpreter:
this module switches it on before FLA is imported and keeps one autotuning config per kernel (the
interpreter cannot benchmark); FLA's ``chunk`` kernels do not run there, so sequences stay at most 64
tokens long (FLA then takes ``fused_recurrent``). On a GPU everything runs natively.
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

if not torch.cuda.is_available():  # before FLA imports Triton: its kernels must be defined for the interpreter
    if "triton" in sys.modules:
        from gla_ref.device import use_triton_interpreter

        use_triton_interpreter()
    else:
        os.environ["TRITON_INTERPRET"] = "1"
    from triton.runtime import autotuner

    if not getattr(autotuner.Autotuner, "_gla_ref_one_config", False):
        _init = autotuner.Autotuner.__init__

        def _one_config(self, fn, arg_names, configs, *args, **kwargs):
            _init(self, fn, arg_names, configs[:1], *args, **kwargs)

        autotuner.Autotuner.__init__ = _one_config
        autotuner.Autotuner._gla_ref_one_config = True

fla_layers = pytest.importorskip("fla.layers")
fla_models = pytest.importorskip("fla.models")

from gla_ref.layers.cache import Cache  # noqa: E402
from gla_ref.layers.torch import GatedLinearAttention  # noqa: E402
from gla_ref.models.config import GLAConfig  # noqa: E402
from gla_ref.models.torch import GLAForCausalLM  # noqa: E402
from gla_ref.testing import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-5


def _fla_layer(seed=0, **kw):
    torch.manual_seed(seed)
    layer = fla_layers.GatedLinearAttention(**{"hidden_size": 32, "num_heads": 2, "layer_idx": 0, **kw}).to(DEVICE)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.3)
    return layer


@pytest.mark.parametrize("kw", [
    dict(), dict(num_heads=4, num_kv_heads=2), dict(feature_map="relu"), dict(clamp_min=-0.05),
    dict(gate_fn="sigmoid"), dict(fuse_norm=False), dict(use_output_gate=False), dict(elementwise_affine=False),
    dict(use_short_conv=True, conv_bias=True, conv_size=3), dict(gate_logit_normalizer=4, gate_low_rank_dim=8),
    dict(feature_map="logsigmoid", expand_k=1.0, expand_v=2.0)],
    ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "defaults")
def test_from_fla_computes_flas_layer(kw):
    fla = _fla_layer(**kw)
    ours = GatedLinearAttention.from_fla(fla)
    x = torch.randn(2, 40, 32, device=DEVICE)
    with torch.no_grad():
        assert_close("o", fla(x)[0], ours(x)[0], TOL)
    assert set(ours.fla_state_dict()) == set(fla.state_dict())


@pytest.mark.parametrize("kw", [dict(), dict(use_short_conv=True, conv_bias=True),
                                dict(num_heads=4, num_kv_heads=2, use_short_conv=True)], ids=["plain", "conv", "grouped"])
def test_padding_and_cache_match_flas_and_the_caches_interchange(kw):
    fla = _fla_layer(**kw)
    ours = GatedLinearAttention.from_fla(fla)
    x = torch.randn(3, 20, 32, device=DEVICE)
    mask = torch.ones(3, 20, dtype=torch.long, device=DEVICE)
    mask[0, :5] = 0
    mask[2, :19] = 0
    from fla.models.cache_utils import Cache as FLACache

    with torch.no_grad():
        c1, c2 = FLACache(), Cache()
        o1, _, c1 = fla(x, attention_mask=mask, past_key_values=c1, use_cache=True)
        o2, _, c2 = ours(x, attention_mask=mask, past_key_values=c2, use_cache=True)
        assert_close("prefill", o1, o2, TOL)
        for t in range(3):
            xt = torch.randn(3, 1, 32, device=DEVICE)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            o1, _, c1 = fla(xt, attention_mask=mask, past_key_values=c1, use_cache=True)
            o2, _, c2 = ours(xt, attention_mask=mask, past_key_values=c2, use_cache=True)
            assert_close(f"step {t}", o1, o2, TOL)
            assert c1[0]["recurrent_state"].shape == c2[0]["recurrent_state"].shape
            assert_close("recurrent state", c1[0]["recurrent_state"], c2[0]["recurrent_state"], TOL)
            for a, b in zip(c1[0]["conv_state"] or (), c2[0]["conv_state"] or ()):
                assert_close("conv state", a, b, TOL)
        xt = torch.randn(3, 1, 32, device=DEVICE)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        ours_from_fla, _, _ = ours(xt, attention_mask=mask, past_key_values=c1, use_cache=True)
        fla_from_ours, _, _ = fla(xt, attention_mask=mask, past_key_values=c2, use_cache=True)
    assert_close("each continues the other's cache", fla_from_ours, ours_from_fla, TOL)


@pytest.mark.parametrize("kw, setting", [(dict(feature_map="relu"), "feature_map"), (dict(clamp_min=-0.1), "clamp_min"),
                                         (dict(gate_fn="sigmoid"), "gate_fn"),
                                         (dict(gate_logit_normalizer=8), "gate_logit_normalizer")])
def test_loading_an_fla_layer_checks_its_settings(kw, setting):
    ours = GatedLinearAttention(32, 2).to(DEVICE)
    with pytest.raises(ValueError, match=f"has {setting}="):
        ours.load_fla_state_dict(_fla_layer(**kw))
    GatedLinearAttention.from_fla(_fla_layer(**kw))  # built with the same settings, it loads


def _fla_model(**kw):
    torch.manual_seed(0)
    cfg = fla_models.GLAConfig(**{"hidden_size": 32, "num_heads": 2, "num_hidden_layers": 2, "vocab_size": 64,
                                  "fuse_cross_entropy": torch.cuda.is_available(), **kw})
    return fla_models.GLAForCausalLM(cfg).to(DEVICE).eval()


@pytest.mark.parametrize("kw", [dict(), dict(tie_word_embeddings=True, use_short_conv=True, num_kv_heads=1,
                                             feature_map="relu", clamp_min=-0.1)], ids=["default", "variant"])
def test_model_from_fla_logits_loss_and_greedy_decoding(kw):
    fm = _fla_model(**kw)
    ours = GLAForCausalLM.from_fla(fm).eval()
    assert set(ours.fla_state_dict()) == set(fm.state_dict())
    fresh = GLAForCausalLM(GLAConfig.from_fla(fm.config)).to(DEVICE)
    fresh.load_state_dict(fm.state_dict())  # FLA's state dict, as it is
    ids = torch.randint(0, 64, (2, 30), device=DEVICE)
    with torch.no_grad():
        a, b = fm(ids, labels=ids), ours(ids, labels=ids)
        assert_close("logits", a.logits, b.logits, TOL)
        assert_close("loss", a.loss, b.loss, TOL)
        assert_close("fresh", a.logits, fresh.eval()(ids).logits, TOL)
        # FLA's greedy decoding with its own cache (FLA 0.6.0's generate() loses the cache under
        # transformers >= 5.2x, which passes it as cache=; the loop below is what generate() should do)
        x, out = ids, fm(ids, use_cache=True)
        for _ in range(10):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            x = torch.cat([x, token], 1)
            out = fm(token, past_key_values=out.past_key_values, use_cache=True)
    assert torch.equal(ours.generate(ids, max_new_tokens=10, eos_token_id=None), x)


def test_untied_fla_checkpoint_into_a_tied_model_names_the_key():
    fm = _fla_model()
    tied = GLAForCausalLM(GLAConfig.from_fla(fm.config.to_dict() | {"tie_word_embeddings": True})).to(DEVICE)
    with pytest.raises(ValueError, match=r"state_dict\['lm_head.weight'\] differs"):
        tied.load_state_dict(fm.state_dict())
