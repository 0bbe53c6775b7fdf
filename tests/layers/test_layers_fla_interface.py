"""FLA's interface of the PyTorch GLA layer (CPU, the reference backend): FLA's constructor arguments
(each implemented, against FLA's layer written out in float64 NumPy from FLA 0.6.0's fla/layers/gla.py, or
refused by name), FLA's forward with ``attention_mask`` and ``past_key_values``/``use_cache`` (FLA's cache
layouts), checked loading of FLA's weights, tied embeddings of the small LM, ``backend="auto"`` and the
import order of Triton. The same against FLA's own objects: test_fla_parity.py (where FLA imports).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gla_ref.layers import config, fla_torch  # noqa: E402
from gla_ref.layers.cache import Cache  # noqa: E402
from gla_ref.layers.torch import GLALM, GatedLinearAttention  # noqa: E402
from gla_ref.testing import assert_close, recurrence64  # noqa: E402

D, B, T = 32, 3, 21
TOL = 1e-5

# FLA 0.6.0's GatedLinearAttention constructor, written from fla/layers/gla.py (the argument list and defaults)
FLA_LAYER_DEFAULTS = dict(mode="chunk", hidden_size=1024, expand_k=0.5, expand_v=1.0, num_heads=4, num_kv_heads=None,
                          feature_map=None, use_short_conv=False, conv_size=4, conv_bias=False, use_output_gate=True,
                          gate_fn="swish", elementwise_affine=True, norm_eps=1e-5, gate_logit_normalizer=16,
                          gate_low_rank_dim=16, clamp_min=None, fuse_norm=True, layer_idx=None)


def _x(batch=B, T=T, seed=0):
    return torch.randn(batch, T, D, generator=torch.Generator().manual_seed(seed))


def _layer(seed=0, **kw):
    torch.manual_seed(seed)
    layer = GatedLinearAttention(**{"hidden_size": D, "num_heads": 2, "backend": "reference", **kw})
    with torch.no_grad():  # weights away from their initial values (biases, norm weights): every role shows
        for p in layer.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + p.numel())))
    return layer


# ----------------------------------------------------------------------------- FLA's layer in float64

_ACT = {"relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "logsigmoid": lambda x: -np.logaddexp(0, -x), "swish": lambda x: x / (1 + np.exp(-x)),
        "silu": lambda x: x / (1 + np.exp(-x)), "sqrelu": lambda x: np.maximum(x, 0) ** 2,
        "gelu": lambda x: 0.5 * x * (1 + np.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))}


def _conv64(x, w, b):
    """FLA's ShortConvolution (causal depthwise, activation silu): x [T, D], w [D, 1, W], b [D] or None."""
    W = w.shape[-1]
    src = np.concatenate([np.zeros((W - 1, x.shape[1])), x])
    y = sum(src[j:j + len(x)] * w[:, 0, j] for j in range(W)) + (0 if b is None else b)
    return _ACT["swish"](y)


def fla64(sd, s, x):
    """FLA's GatedLinearAttention.forward on one sequence x [T, d], float64, from its state dict ``sd``
    (FLA's names) and its constructor arguments ``s``, following fla/layers/gla.py step by step."""
    w = {n: t.detach().double().numpy() for n, t in sd.items()}
    H = s["num_heads"]
    Hkv = s["num_kv_heads"] or H
    K, V = round(s["hidden_size"] * s["expand_k"]) // H, round(s["hidden_size"] * s["expand_v"]) // H
    q, k, v = (x @ w[f"{n}_proj.weight"].T for n in "qkv")
    if s["use_short_conv"]:
        q, k, v = (_conv64(a, w[f"{n}_conv1d.weight"], w.get(f"{n}_conv1d.bias")) for a, n in zip((q, k, v), "qkv"))
    gk = x @ w["gk_proj.0.weight"].T @ w["gk_proj.1.weight"].T + w["gk_proj.1.bias"]
    rep = lambda a, d: np.repeat(a.reshape(len(x), Hkv, d), H // Hkv, axis=1)  # noqa: E731  kv head h → h·G … h·G+G−1
    q, k, v, gk = q.reshape(len(x), H, K), rep(k, K), rep(v, V), rep(gk, K)
    gk = _ACT["logsigmoid"](gk) / s["gate_logit_normalizer"]
    if s["clamp_min"] is not None:
        gk = np.maximum(gk, s["clamp_min"])
    if s["feature_map"] is not None:
        q, k = _ACT[s["feature_map"]](q), _ACT[s["feature_map"]](k)
    o = recurrence64(q[None], k[None], v[None], gk[None])[0][0]  # [T, H, V]
    o = o / np.sqrt((o ** 2).mean(-1, keepdims=True) + s["norm_eps"])
    fused = s["gate_fn"] == "swish" and s["fuse_norm"] and s["use_output_gate"]
    norm = "g_norm_swish_gate.weight" if fused else "g_norm.weight"
    if s["elementwise_affine"]:
        o = o * w[norm]
    o = o.reshape(len(x), H * V)
    if s["use_output_gate"]:
        o = o * _ACT[s["gate_fn"]](x @ w["g_proj.weight"].T)
    return o @ w["o_proj.weight"].T


def fla64_padded(sd, s, x, mask):
    """FLA on a padded batch: each row's tokens (mask 1) alone; 0 at padding (FLA's unpad and repad)."""
    x, mask = x.double().numpy(), mask.bool().numpy()
    out = np.zeros((*x.shape[:2], s["hidden_size"] and sd["o_proj.weight"].shape[0]))
    for b in range(len(x)):
        if mask[b].any():
            out[b, mask[b]] = fla64(sd, s, x[b, mask[b]])
    return out


# ----------------------------------------------------------------------------- the constructor

def test_constructor_has_flas_arguments_and_defaults():
    params = inspect.signature(GatedLinearAttention).parameters
    for name, default in FLA_LAYER_DEFAULTS.items():
        assert name in params, f"FLA's argument {name} is missing"
        assert params[name].default == default, f"{name} defaults to {params[name].default!r}, FLA's to {default!r}"
    assert config.FLA_LAYER_DEFAULTS == FLA_LAYER_DEFAULTS
    layer = GatedLinearAttention()  # FLA's defaults: hidden_size 1024, 4 heads
    assert layer.dims == (1024, 4, 128, 256) and layer.sizes.backend == "auto"


@pytest.mark.parametrize("kw", [
    dict(), dict(num_heads=4, num_kv_heads=2), dict(num_heads=4, num_kv_heads=1), dict(feature_map="relu"),
    dict(feature_map="gelu"), dict(feature_map="sqrelu"), dict(feature_map="logsigmoid"), dict(feature_map="sigmoid"),
    dict(clamp_min=-0.02), dict(gate_fn="sigmoid"), dict(gate_fn="silu"), dict(gate_fn="gelu", fuse_norm=False),
    dict(fuse_norm=False), dict(use_output_gate=False), dict(elementwise_affine=False), dict(elementwise_affine=None),
    dict(use_short_conv=True), dict(use_short_conv=True, conv_bias=True, conv_size=3),
    dict(gate_logit_normalizer=4, gate_low_rank_dim=8), dict(norm_eps=1e-3), dict(expand_k=1.0, expand_v=2.0),
    dict(mode="fused_chunk", layer_idx=3), dict(mode="fused_recurrent"),
    dict(num_heads=4, num_kv_heads=2, use_short_conv=True, conv_bias=True, feature_map="relu", clamp_min=-0.05,
         use_output_gate=False)], ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "defaults")
def test_each_fla_argument_computes_flas_function(kw):
    """Every FLA argument, implemented: our layer (FLA's names, FLA's interface) = FLA's layer in float64."""
    layer, x = _layer(**kw), _x()
    settings = {**FLA_LAYER_DEFAULTS, "hidden_size": D, "num_heads": 2, **kw}
    sd = layer.fla_state_dict()
    with torch.no_grad():
        y, none, cache = layer(x)
    assert none is None and cache is None
    want = np.stack([fla64(sd, settings, xb) for xb in x.double().numpy()])
    assert_close("y", want, y, TOL)
    assert config.check_fla_settings(layer.fla_settings(), settings) is None


def test_fla_arguments_shape_the_parameters():
    sizes = lambda layer: {n: tuple(p.shape) for n, p in layer.fla_state_dict().items()}  # noqa: E731
    grouped = sizes(_layer(num_heads=4, num_kv_heads=1, use_short_conv=True))
    assert grouped["k_proj.weight"] == (4, D) and grouped["v_proj.weight"] == (8, D)  # one kv head of K = 4, V = 8
    assert grouped["gk_proj.1.weight"] == (4, 16) and grouped["k_conv1d.weight"] == (4, 1, 4)
    assert grouped["q_proj.weight"] == (16, D) and grouped["q_conv1d.weight"] == (16, 1, 4)
    assert "g_proj.weight" not in sizes(_layer(use_output_gate=False))
    assert not any("norm" in n for n in sizes(_layer(elementwise_affine=False)))
    assert sizes(_layer(use_short_conv=True, conv_bias=True))["v_conv1d.bias"] == (32,)
    for kw in (dict(use_short_conv=True, conv_bias=True, num_heads=4, num_kv_heads=2), dict(use_output_gate=False),
               dict(elementwise_affine=False)):
        layer = _layer(**kw)
        args = {k: v for k, v in kw.items() if k in inspect.signature(config.gla_num_params).parameters}
        assert sum(p.numel() for p in layer.parameters()) == config.gla_num_params(D, **{"num_heads": 2, **args})


@pytest.mark.parametrize("kw, error, match", [
    (dict(feature_map="bias_gelu"), ValueError, "feature_map='bias_gelu' is not reproduced"),
    (dict(feature_map="tanh"), ValueError, "feature_map must be one of"),
    (dict(gate_fn="powlu"), ValueError, "gate_fn must be one of"),
    (dict(gate_fn="bias_gelu"), ValueError, "gate_fn='bias_gelu' is not reproduced"),
    (dict(mode="parallel"), ValueError, "mode must be one of"),
    (dict(num_heads=4, num_kv_heads=3), ValueError, "num_kv_heads = 3 must divide num_heads = 4"),
    (dict(num_kv_heads=0), ValueError, "num_kv_heads must be a positive int"),
    (dict(clamp_min=0.5), ValueError, "clamp_min must be None or a finite number <= 0"),
    (dict(clamp_min=float("nan")), ValueError, "clamp_min"),
    (dict(use_output_gate=1), TypeError, "use_output_gate must be a bool"),
    (dict(conv_bias="no"), TypeError, "conv_bias must be a bool"),
    (dict(fuse_norm=None), TypeError, "fuse_norm must be a bool"),
    (dict(elementwise_affine=2), TypeError, "elementwise_affine must be a bool"),
    (dict(layer_idx=-1), ValueError, "layer_idx must be None or an int >= 0"),
    (dict(expand_k=0.3), ValueError, "key_dim = hidden_size × expand_k = 9.6 must be a whole number"),
])
def test_fla_arguments_refused_by_name(kw, error, match):
    with pytest.raises(error, match=match):
        GatedLinearAttention(**{"hidden_size": D, "num_heads": 2, **kw})


def test_flas_positional_order_is_refused_naming_mode():
    with pytest.raises(TypeError, match="first positional argument is hidden_size, FLA's is mode"):
        GatedLinearAttention("chunk", D)


# ----------------------------------------------------------------------------- forward: padding and cache

@pytest.mark.parametrize("kw", [dict(), dict(use_short_conv=True, conv_bias=True),
                                dict(num_heads=4, num_kv_heads=2, feature_map="relu")], ids=["plain", "conv", "grouped"])
def test_attention_mask_left_padding_equals_the_unpadded_sequences(kw):
    """FLA's padding: each row as if alone, zeros at the padding (a fully padded row gives zeros)."""
    layer, x = _layer(**kw), _x(batch=4)
    mask = torch.ones(4, T, dtype=torch.long)
    mask[0, :5] = 0
    mask[2, :T - 1] = 0  # one token
    mask[3] = 0  # nothing
    settings = {**FLA_LAYER_DEFAULTS, "hidden_size": D, "num_heads": 2, **kw}
    with torch.no_grad():
        y, _, _ = layer(x, attention_mask=mask)
        alone = [layer(x[b:b + 1, mask[b].bool()])[0] for b in range(3)]
    assert_close("y", fla64_padded(layer.fla_state_dict(), settings, x, mask), y, TOL)
    for b in range(3):
        assert_close(f"row {b}", alone[b][0], y[b, mask[b].bool()], TOL)
    assert not y[mask == 0].any()
    full, _, _ = layer(x, attention_mask=torch.ones(4, T + 3, dtype=torch.bool))  # longer mask: its last T columns
    assert torch.equal(full, layer(x)[0])


@pytest.mark.parametrize("kw", [dict(), dict(use_short_conv=True, conv_bias=True, conv_size=3),
                                dict(num_heads=4, num_kv_heads=2, use_short_conv=True)], ids=["plain", "conv", "grouped"])
def test_cache_prefill_then_decode_equals_the_full_forward(kw):
    """past_key_values/use_cache: prefill, then one token at a time, = one pass; with left padding too.
    The cache holds FLA's layouts: recurrent [B, H, V, K] (our state transposed), conv [B, D, W]."""
    layer, x = _layer(layer_idx=1, **kw), _x()
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :6] = 0
    with torch.no_grad():
        y_full, _, _ = layer(x, attention_mask=mask)
        cache = Cache.from_legacy_cache([None])  # layer 0 belongs to another layer
        y0, _, cache = layer(x[:, :9], attention_mask=mask[:, :9], past_key_values=cache, use_cache=True)
        ys = [y0]
        for t in range(9, T):
            y_t, _, cache = layer(x[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=cache, use_cache=True)
            ys.append(y_t)
    assert_close("y", y_full, torch.cat(ys, 1), TOL)
    assert cache.get_seq_length(1) == T and len(cache) == 2
    state = cache[1]["recurrent_state"]
    _, H, K, V = layer.dims
    assert state.shape == (B, H, V, K) and state.dtype == torch.float32
    with torch.no_grad():  # the same as our path's [B, H, K, V] state, transposed (row 1 without its padding)
        _, ours = layer(x[:1], output_final_state=True)
        _, ours1 = layer(x[1:2, 6:], output_final_state=True)
    S = ours.recurrent if kw.get("use_short_conv") else ours
    assert_close("state row 0", S[0].transpose(-1, -2), state[0], TOL)
    assert_close("state row 1", (ours1.recurrent if kw.get("use_short_conv") else ours1)[0].transpose(-1, -2),
                 state[1], TOL)
    if kw.get("use_short_conv"):
        W = kw.get("conv_size", 4)
        q_cache = cache[1]["conv_state"][0]
        assert q_cache.shape == (B, layer.sizes.key_dim, W)  # FLA's [N, D, W]: the last W inputs, newest last
        q_in = layer.q_proj(x).detach()[:, -W:]
        assert_close("q conv cache", q_in.transpose(1, 2), q_cache, TOL)
    else:
        assert cache[1]["conv_state"] is None


def test_cache_rows_without_tokens_keep_their_states():
    """A row that is all padding in the prompt starts decoding from zero states (recurrent and conv)."""
    layer, x = _layer(layer_idx=0, use_short_conv=True), _x()
    mask = torch.ones(B, T, dtype=torch.long)
    mask[2, :9] = 0
    with torch.no_grad():
        _, _, cache = layer(x[:, :9], attention_mask=mask[:, :9], past_key_values=Cache(), use_cache=True)
        assert not cache[0]["recurrent_state"][2].any() and not cache[0]["conv_state"][1][2].any()
        ys = []
        for t in range(9, T):
            y_t, _, cache = layer(x[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=cache, use_cache=True)
            ys.append(y_t)
        alone, _, _ = layer(x[2:, 9:])
        full, _, _ = layer(x[:2])
    assert_close("row 2", alone[0], torch.cat(ys, 1)[2], TOL)
    assert_close("rows 0, 1", full[:, 9:], torch.cat(ys, 1)[:2], TOL)


def test_fla_call_returns_flas_triple_and_our_call_ours():
    layer, x = _layer(), _x()
    out = layer(x)
    assert len(out) == 3 and out[1] is None and out[2] is None
    y, S = layer(x, output_final_state=True)
    assert torch.equal(y, out[0]) and S.shape == (B, 2, 8, 16)
    assert layer(x, initial_state=None)[1] is None
    _, _, none = layer(x, use_cache=True)  # FLA computes and drops the state without a cache object
    assert none is None


@pytest.mark.parametrize("call, error, match", [
    (lambda l, x: l(x, past_key_values=Cache()), ValueError, "past_key_values needs the layer's layer_idx"),
    (lambda l, x: l(x, None, True), TypeError, "past_key_values must be None or a cache"),
    (lambda l, x: l(x, attention_mask=torch.ones(B, T), output_final_state=True), TypeError,
     "attention_mask belong to FLA's interface"),
    (lambda l, x: l(x, torch.ones(B, T, T)), ValueError, r"attention_mask must be a 0/1 padding mask \[batch_size"),
    (lambda l, x: l(x, torch.ones(B, T - 1)), ValueError, "attention_mask must be a 0/1 padding mask"),
])
def test_fla_call_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(_layer(), _x())


def test_explicit_cu_seqlens_take_precedence_over_the_mask():
    layer, x = _layer(), _x(batch=1)
    cu = torch.tensor([0, 5, T], dtype=torch.int64)
    with torch.no_grad():
        y, _, _ = layer(x, attention_mask=torch.zeros(1, T), cu_seqlens=cu)
        ours, _ = layer(x, cu_seqlens=cu, output_final_state=False)
    assert torch.equal(y, ours)


# ----------------------------------------------------------------------------- FLA's weights

@pytest.mark.parametrize("setting, value", [
    ("feature_map", "relu"), ("clamp_min", -0.1), ("gate_fn", "sigmoid"), ("gate_logit_normalizer", 8),
    ("norm_eps", 1e-6), ("use_output_gate", False), ("elementwise_affine", False), ("num_kv_heads", 1),
    ("use_short_conv", True), ("gate_low_rank_dim", 8), ("expand_k", 1.0)])
def test_loading_refuses_flas_weights_whose_settings_change_the_function(setting, value):
    """An FLA layer's weights with another function-changing setting are refused, naming it, before
    anything loads — whichever way the settings come (constructor arguments, an FLA GLAConfig's dict)."""
    layer = _layer()
    theirs = {**FLA_LAYER_DEFAULTS, "hidden_size": D, "num_heads": 2, setting: value}
    before = {n: p.clone() for n, p in layer.state_dict().items()}
    with pytest.raises(ValueError, match=f"has {setting if setting != 'expand_k' else 'key_dim'}="):
        layer.load_fla_state_dict(layer.fla_state_dict(), settings=theirs)
    cfg = {"num_hidden_layers": 1, "hidden_size": D, "num_heads": 2,
           ("hidden_act" if setting == "gate_fn" else setting): value}
    if setting not in ("gate_logit_normalizer", "gate_low_rank_dim"):  # not GLAConfig fields: FLA's model fixes them
        with pytest.raises(ValueError, match="would compute another function"):
            layer.load_fla_state_dict(layer.fla_state_dict(), settings=cfg)
    assert all(torch.equal(before[n], p) for n, p in layer.state_dict().items())


def test_loading_a_bare_state_dict_asks_for_the_settings():
    layer = _layer()
    with pytest.raises(TypeError, match="needs the FLA layer's settings"):
        layer.load_fla_state_dict(layer.fla_state_dict())


def test_settings_that_do_not_change_the_function_load():
    layer, other = _layer(seed=1), _layer(seed=2)
    speed_only = {**other.fla_settings(), "mode": "fused_chunk", "fuse_norm": False, "layer_idx": 7,
                  "gate_fn": "silu", "feature_map": None}
    layer.load_fla_state_dict(other.fla_state_dict(), settings=speed_only)
    assert all(torch.equal(a, b) for a, b in zip(layer.state_dict().values(), other.state_dict().values()))


@pytest.mark.parametrize("kw, name", [(dict(), "g_norm_swish_gate.weight"), (dict(fuse_norm=False), "g_norm.weight"),
                                      (dict(gate_fn="sigmoid"), "g_norm.weight"),
                                      (dict(use_output_gate=False), "g_norm.weight")])
def test_fla_names_out_and_in(kw, name):
    """fla_state_dict uses the name FLA gives the norm; load_state_dict takes FLA's names as they are."""
    layer = _layer(**kw)
    sd = layer.fla_state_dict()
    assert name in sd and set(sd) - {name} == set(layer.state_dict()) - {"g_norm.weight"}
    fresh = GatedLinearAttention(D, 2, backend="reference", **kw)
    fresh.load_state_dict(sd)
    assert torch.equal(fresh.g_norm.weight, sd[name])


def test_our_variants_have_no_fla_settings():
    for kw, match in ((dict(gate="scalar"), "gate='scalar' has no FLA counterpart"),
                      (dict(norm="layer"), "norm='layer' has no FLA counterpart")):
        with pytest.raises(ValueError, match=match):
            _layer(**kw).fla_settings()


# ----------------------------------------------------------------------------- the small LM's tied embeddings

def test_glalm_tying_follows_the_model_and_a_mismatch_names_the_key():
    torch.manual_seed(0)
    untied, tied = GLALM(50, D, 1, 2, tie_embeddings=False), GLALM(50, D, 1, 2)
    with pytest.raises(ValueError, match=r"state_dict\['lm_head.weight'\] differs .*\(tie_embeddings=True"):
        tied.load_state_dict(untied.state_dict())
    sd = {n: t for n, t in tied.state_dict().items() if n != "lm_head.weight"}  # a tied checkpoint, saved once
    fresh = GLALM(50, D, 1, 2)
    fresh.load_state_dict(sd)
    assert fresh.lm_head.weight is fresh.embeddings.weight and torch.equal(fresh.lm_head.weight, sd["embeddings.weight"])
    with pytest.raises(ValueError, match="state_dict has no 'lm_head.weight'.*tie_embeddings=False"):
        GLALM(50, D, 1, 2, tie_embeddings=False).load_state_dict(sd)
    GLALM(50, D, 1, 2, tie_embeddings=False).load_state_dict(untied.state_dict())
    tied.load_state_dict(tied.state_dict())


# ----------------------------------------------------------------------------- backends and Triton

class _OnCuda:
    is_cuda = True


def test_auto_picks_the_reference_on_cpu_and_flas_kernel_on_cuda():
    assert fla_torch.resolve_backend("auto", "chunk", torch.zeros(1), 500, 64, 64) == "reference"
    assert fla_torch.resolve_backend("auto", "chunk", _OnCuda(), 500, 64, 64) == "chunk"
    assert fla_torch.resolve_backend("auto", "fused_chunk", _OnCuda(), 64, 64, 64) == "fused_recurrent"
    assert fla_torch.resolve_backend("auto", "chunk", _OnCuda(), 500, 512, 64) == "reference"  # K past the kernels
    assert fla_torch.resolve_backend("fused_chunk", "chunk", torch.zeros(1), 500, 64, 64) == "fused_chunk"


def _run(code):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_auto_on_cpu_never_touches_triton():
    """The default layer and model on a CPU run the reference and import neither gla_ref.triton nor triton."""
    out = _run("""
        import sys, torch
        from gla_ref.layers.torch import GatedLinearAttention, GLALM
        layer = GatedLinearAttention(32, 2)
        assert layer.sizes.backend == "auto"
        y, _, _ = layer(torch.randn(2, 100, 32))
        GLALM(50, 32, 1, 2)(torch.zeros(1, 70, dtype=torch.long))
        print(sorted(m for m in ("triton", "gla_ref.triton") if m in sys.modules))
    """)
    assert out.strip() == "[]"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter question only arises without CUDA")
def test_kernel_backend_works_after_triton_was_imported_first():
    """Triton imported before gla_ref.triton (as AdamW or FLA do) on a CPU: an explicit kernel backend still
    runs, in Triton's interpreter, with the reference's results; "auto" was never affected."""
    pytest.importorskip("triton")
    out = _run("""
        import torch, triton  # triton first, in compiled mode
        assert not triton.knobs.runtime.interpret
        from gla_ref.layers.torch import GatedLinearAttention
        torch.manual_seed(0)
        ref = GatedLinearAttention(32, 2, backend="reference")
        x = torch.randn(1, 19, 32)
        for backend in ("chunk", "fused_chunk", "fused_recurrent"):
            kern = GatedLinearAttention(32, 2, backend=backend)
            kern.load_state_dict(ref.state_dict())
            a, b = ref(x, output_final_state=True), kern(x, output_final_state=True)
            err = max(float((u - v).norm() / u.norm()) for u, v in zip(a, b))
            assert err < 1e-5, (backend, err)
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter question only arises without CUDA")
def test_without_triton_knobs_the_error_says_what_to_do():
    pytest.importorskip("triton")
    out = _run("""
        import torch, triton
        del triton.knobs  # a Triton without knobs (before 3.4) cannot switch its interpreter on afterwards
        from gla_ref.layers.torch import GatedLinearAttention
        try:
            GatedLinearAttention(32, 2, backend="chunk")(torch.randn(1, 19, 32))
        except ImportError as err:
            print(err)
    """)
    assert "import gla_ref.triton" in out and "TRITON_INTERPRET=1" in out and "backend='auto'" in out
