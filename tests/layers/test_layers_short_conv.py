"""Short convolutions (FLA's ``use_short_conv``) in the GLA layers, PyTorch and Flax.

The convolution alone against a direct float64 sum; the layer with it: shapes and names, every Triton
backend against the reference (interpreter, fp32, small shapes), prefill + decode = one pass, packed
sequences = each alone (no leak across a boundary), gradients into the conv weights, FLA's weights,
and the Flax layer against the PyTorch one from the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gla_ref.layers import config  # noqa: E402
from gla_ref.layers.config import ShortConvState  # noqa: E402
from gla_ref.layers.short_conv import ShortConvolution, causal_conv1d  # noqa: E402
from gla_ref.layers.torch import GLALM, GatedLinearAttention  # noqa: E402
from gla_ref.testing import assert_close  # noqa: E402

D, H, T = 32, 2, 13
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where the kernel backends run
TOL = 1e-5


def _x(batch=2, T=T, seed=0, d=D):
    return torch.randn(batch, T, d, generator=torch.Generator().manual_seed(seed))


def _layer(seed=0, **kw):
    torch.manual_seed(seed)
    return GatedLinearAttention(D, H, use_short_conv=True, **{"backend": "reference", **kw})


def _conv64(x, w, cache=None):
    """The causal depthwise filter + SiLU in float64, one token and tap at a time."""
    x, w = x.double().numpy(), w.double().numpy()[:, 0]
    W = w.shape[-1]
    pad = np.zeros((x.shape[0], W - 1, x.shape[2])) if cache is None else cache.double().numpy()
    src = np.concatenate([pad, x], 1)
    y = np.zeros_like(x)
    for t in range(x.shape[1]):
        for j in range(W):
            y[:, t] += w[:, j] * src[:, t + j]
    return y / (1 + np.exp(-y))


# ----------------------------------------------------------------------------- the convolution alone

@pytest.mark.parametrize("W", [1, 2, 4])
def test_causal_conv_is_the_windowed_sum_and_keeps_the_last_inputs(W):
    torch.manual_seed(0)
    conv, x = ShortConvolution(6, W), _x(T=5, d=6)
    cache = torch.randn(2, W - 1, 6)
    y, new = conv(x, cache)
    assert_close("y", _conv64(x, conv.weight.detach(), cache), y.detach(), 1e-6)
    assert torch.equal(new, torch.cat([cache, x], 1)[:, 5:])  # the W − 1 latest inputs, oldest first
    y0, _ = conv(x)  # no cache: zeros before the first token
    assert_close("y0", _conv64(x, conv.weight.detach()), y0.detach(), 1e-6)
    assert conv.weight.shape == (6, 1, W)


def test_causal_conv_sees_no_future_token():
    torch.manual_seed(0)
    conv, x = ShortConvolution(4), _x(batch=1, d=4)
    x2 = x.clone()
    x2[:, 7:] += 1.0
    y, y2 = conv(x)[0], conv(x2)[0]
    assert torch.equal(y[:, :7], y2[:, :7]) and not torch.equal(y[:, 7:], y2[:, 7:])


def test_causal_conv_cache_shape_is_checked():
    conv = ShortConvolution(4)
    with pytest.raises(ValueError, match=r"cache must have shape \[N, W - 1, D\] = \(2, 3, 4\)"):
        conv(_x(d=4), torch.zeros(2, 4, 4))


# ----------------------------------------------------------------------------- the layer

def test_conv_layer_shapes_names_and_parameter_count():
    plain, conv = GatedLinearAttention(D, H, backend="reference"), _layer(conv_size=3)
    extra = {n: tuple(p.shape) for n, p in conv.state_dict().items()}.items() - \
        {n: tuple(p.shape) for n, p in plain.state_dict().items()}.items()
    assert dict(extra) == {"q_conv1d.weight": (16, 1, 3), "k_conv1d.weight": (16, 1, 3), "v_conv1d.weight": (32, 1, 3)}
    assert sum(p.numel() for p in conv.parameters()) == config.gla_num_params(D, H, use_short_conv=True, conv_size=3)
    x = _x()
    y, state = conv(x, output_final_state=True)
    assert y.shape == plain(x)[0].shape == x.shape
    assert isinstance(state, ShortConvState) and state.recurrent.shape == (2, H, 8, 16)
    assert (state.q.shape, state.k.shape, state.v.shape) == ((2, 2, 16), (2, 2, 16), (2, 2, 32))
    assert conv(x)[1] is None and isinstance(plain(x, output_final_state=True)[1], torch.Tensor)


@pytest.mark.parametrize("gate, backend", [("gla", "chunk"), ("gla", "fused_chunk"), ("gla", "fused_recurrent"),
                                           ("scalar", "fused_recurrent"), ("const", "chunk"),
                                           ("none", "fused_recurrent")])
def test_kernel_backend_with_conv_matches_reference(gate, backend):
    ref, ker = _layer(gate=gate).to(DEVICE), _layer(gate=gate, backend=backend).to(DEVICE)
    ker.load_state_dict(ref.state_dict())
    x = _x(batch=1).to(DEVICE)
    outs = []
    for layer in (ref, ker):
        layer.zero_grad()
        y, S = layer(x, output_final_state=True)
        (y.square().mean() + S.recurrent.square().mean()).backward()
        outs.append((y.detach(), S, {n: p.grad for n, p in layer.named_parameters()}))
    (y_r, S_r, g_r), (y_k, S_k, g_k) = outs
    assert_close("y", y_r, y_k, TOL)
    for name in ShortConvState._fields:
        assert_close(name, getattr(S_r, name).detach(), getattr(S_k, name).detach(), TOL)
    for name in ("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight", "q_proj.weight"):
        assert_close(f"d {name}", g_r[name], g_k[name], TOL)


@pytest.mark.parametrize("gate", config.GATES)
def test_prefill_then_decode_equals_one_pass(gate):
    """Chunkwise over 5 tokens (fewer conv inputs than a full window at first), again from that state,
    then ``step`` token by token: the outputs and every part of the state equal one pass."""
    layer, x = _layer(gate=gate), _x()
    with torch.no_grad():
        y_full, S_full = layer(x, output_final_state=True)
        y_a, S = layer(x[:, :2], output_final_state=True)
        y_b, S = layer(x[:, 2:5], initial_state=S, output_final_state=True)
        ys = [y_a, y_b]
        for t in range(5, T):
            y_t, S = layer.step(x[:, t], S)
            ys.append(y_t[:, None])
    assert_close("y", y_full, torch.cat(ys, 1), TOL)
    for name in ShortConvState._fields:
        assert_close(name, getattr(S_full, name), getattr(S, name), TOL)


def test_step_needs_the_conv_state():
    layer = _layer()
    _, S = layer(_x(), output_final_state=True)
    with pytest.raises(TypeError, match="state of a layer built with use_short_conv=True must be a ShortConvState"):
        layer.step(_x()[:, 0], S.recurrent)


@pytest.mark.parametrize("backend", ["reference", "fused_recurrent"])
def test_packed_sequences_equal_each_sequence_alone(backend):
    """Lengths 6, 1, 2, 4: a conv window must not reach into the previous sequence, each sequence starts
    from its own state row, and the final conv caches are each sequence's own last inputs."""
    layer, lengths = _layer(backend=backend).to(DEVICE), [6, 1, 2, 4]
    xs = [_x(batch=1, T=n, seed=i).to(DEVICE) for i, n in enumerate(lengths)]
    gen = torch.Generator().manual_seed(5)
    N = len(lengths)
    h0 = ShortConvState(*(x.to(DEVICE) for x in (
        torch.randn(N, H, 8, 16, generator=gen), torch.randn(N, 3, 16, generator=gen),
        torch.randn(N, 3, 16, generator=gen), torch.randn(N, 3, 32, generator=gen))))
    cu = torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int64, device=DEVICE)
    with torch.no_grad():
        y, S = layer(torch.cat(xs, 1), initial_state=h0, output_final_state=True, cu_seqlens=cu)
        alone = [layer(x, initial_state=ShortConvState(*(s[i:i + 1] for s in h0)), output_final_state=True)
                 for i, x in enumerate(xs)]
    assert_close("y", torch.cat([a[0] for a in alone], 1), y, TOL)
    for f, name in enumerate(ShortConvState._fields):
        assert_close(name, torch.cat([a[1][f] for a in alone], 0), S[f], TOL)
    # no leak: changing the first sequence changes nothing in the others
    xs2 = [xs[0] + 1.0, *xs[1:]]
    with torch.no_grad():
        y2, _ = layer(torch.cat(xs2, 1), initial_state=h0, cu_seqlens=cu)
    assert_close("y after the first sequence", y[:, 6:], y2[:, 6:], 1e-6)
    assert not torch.allclose(y[:, :6], y2[:, :6])


def test_gradients_reach_the_conv_weights():
    layer = _layer()
    y, S = layer(_x(), output_final_state=True)
    (y.square().mean() + S.recurrent.square().mean()).backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} gets no gradient"


def test_lm_with_conv_decodes_as_one_pass():
    torch.manual_seed(0)
    lm = GLALM(40, D, num_layers=2, num_heads=H, mixer="scalar", use_short_conv=True)
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _ = lm(ids)
        _, states = lm(ids[:, :4], output_final_state=True)
        for t in range(4, 9):
            step_logits, states = lm.step(ids[:, t], states)
    assert all(isinstance(s, ShortConvState) for s in states)
    assert_close("logits", logits[:, -1], step_logits, TOL)


# ----------------------------------------------------------------------------- FLA's weights

def test_fla_state_dict_with_short_conv_loads():
    torch.manual_seed(1)
    fla = {n: torch.randn(p.shape) for n, p in _layer().state_dict().items()}
    fla["g_norm_swish_gate.weight"] = fla.pop("g_norm.weight")
    layer, settings = _layer(seed=2), dict(hidden_size=D, num_heads=H, use_short_conv=True)
    layer.load_fla_state_dict(fla, settings=settings)
    assert torch.equal(layer.v_conv1d.weight, fla["v_conv1d.weight"])
    plain = GatedLinearAttention(D, H, backend="reference")
    with pytest.raises(ValueError, match="use_short_conv=True but this layer has use_short_conv=False"):
        plain.load_fla_state_dict(fla, settings=settings)
    with pytest.raises(ValueError, match=r"unexpected \['k_conv1d.weight', 'q_conv1d.weight', 'v_conv1d.weight'\]"):
        plain.load_fla_state_dict(fla, settings=dict(hidden_size=D, num_heads=H))  # settings that lie
    with pytest.raises(ValueError, match="conv_size=3 but this layer has conv_size=4"):
        layer.load_fla_state_dict(fla, settings={**settings, "conv_size": 3})
    fla["q_conv1d.weight"] = torch.zeros(16, 1, 3)  # FLA's conv_size = 3 into a layer of width 4
    with pytest.raises(ValueError, match=r"state_dict\['q_conv1d.weight'\] must have shape \(16, 1, 4\)"):
        layer.load_fla_state_dict(fla, settings=settings)


@pytest.mark.parametrize("kw, error, match", [
    (dict(use_short_conv=1), TypeError, "use_short_conv must be a bool"),
    (dict(use_short_conv=True, conv_size=0), ValueError, "conv_size must be a positive int"),
])
def test_bad_conv_arguments(kw, error, match):
    with pytest.raises(error, match=match):
        GatedLinearAttention(D, H, backend="reference", **kw)


# ----------------------------------------------------------------------------- Flax

@pytest.mark.slow  # importing flax and compiling the layer: 26 s of CPU
@pytest.mark.parametrize("gate", ["gla"])
def test_flax_same_weights_same_function_as_pytorch(gate):
    jnp = pytest.importorskip("jax.numpy")
    pytest.importorskip("flax")
    from gla_ref.layers import flax as lf

    tl = _layer(gate=gate)
    sd = {n: p.detach().numpy() for n, p in tl.state_dict().items()}
    fl = lf.GatedLinearAttention.from_state_dict(sd, hidden_size=D, num_heads=H, gate=gate, backend="reference",
                                                 use_short_conv=True)
    assert lf.state_dict(fl).keys() == sd.keys()
    x = _x()
    with torch.no_grad():
        y_t, S_t = tl(x, output_final_state=True)
    y_f, S_f = fl(jnp.asarray(x.numpy()), output_final_state=True)
    assert_close("y", y_t, torch.tensor(np.asarray(y_f)), TOL)
    for name in ShortConvState._fields:
        assert_close(name, getattr(S_t, name), torch.tensor(np.asarray(getattr(S_f, name))), TOL)
    # decode in Flax from a Flax prefill; packed sequences in Flax against PyTorch
    _, S = fl(jnp.asarray(x[:, :T - 2].numpy()), output_final_state=True)
    for t in range(T - 2, T):
        y_step, S = fl.step(jnp.asarray(x[:, t].numpy()), S)
    assert_close("step", y_t[:, -1], torch.tensor(np.asarray(y_step)), TOL)
    cu = np.array([0, 3, 4, T], dtype=np.int32)
    y_fp, S_fp = fl(jnp.asarray(x[:1].numpy()), output_final_state=True, cu_seqlens=cu)
    with torch.no_grad():
        y_tp, S_tp = tl(x[:1], output_final_state=True, cu_seqlens=torch.as_tensor(cu, dtype=torch.int64))
    assert_close("packed y", y_tp, torch.tensor(np.asarray(y_fp)), TOL)
    assert_close("packed v cache", S_tp.v, torch.tensor(np.asarray(S_fp.v)), TOL)


def test_flax_gradients_reach_the_conv_weights():
    jax = pytest.importorskip("jax")
    nnx = pytest.importorskip("flax.nnx")

    from gla_ref.layers import flax as lf

    layer = lf.GatedLinearAttention(D, H, backend="reference", use_short_conv=True, rngs=nnx.Rngs(0))
    x = jax.numpy.asarray(_x().numpy())

    def loss(model):
        y, S = model(x, output_final_state=True)
        return (y ** 2).mean() + (S.recurrent ** 2).mean()

    grads = nnx.grad(loss)(layer)
    for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
        assert float(abs(getattr(grads, name).weight[...]).sum()) > 0, name
