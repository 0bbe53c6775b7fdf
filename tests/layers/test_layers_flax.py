"""Flax NNX layers (gla_ref.layers.flax): PyTorch's names and shapes, the same function from the same
weights, Pallas backends against the reference, prefill + decode against one pass, gradients to every
parameter, the parameter count, loading state dicts, and argument errors.

CPU: Pallas runs in its interpreter, float32, tiny sizes (d = 32, H = 2; T = 19), batch of one there.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("flax")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from gla_ref import pallas  # noqa: E402
from gla_ref.layers import config  # noqa: E402
from gla_ref.layers import flax as lf  # noqa: E402
from gla_ref.layers import torch as lt  # noqa: E402
from gla_ref.testing import assert_close  # noqa: E402

D, H, B, T = 32, 2, 2, 19
TOL = 1e-5  # relative RMSE, float32 in both frameworks (seen: ~4e-7)
SIMPLE = dict(group_norm_size=2, use_qk_norm=True, layer_idx=1, num_layers=3)

VARIANTS = {  # name → (PyTorch class, Flax class, constructor arguments)
    **{f"{gate}-{norm}": ("GatedLinearAttention", dict(gate=gate, norm=norm))
       for gate, norm in (("gla", "layer"), ("scalar", "rms"), ("const", "layer"), ("none", "rms"))},
    "simple": ("SimpleGatedLinearAttention", SIMPLE),
}


def _x(T=T, batch=B, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, T, D)).astype(np.float32)


def _torch_layer(variant, seed=0):
    cls, kw = VARIANTS[variant]
    torch.manual_seed(seed)
    return getattr(lt, cls)(D, H, backend="reference", **kw)


def _flax_from_torch(variant, backend="reference", seed=0):
    """(PyTorch layer, Flax layer built from its state dict)."""
    cls, kw = VARIANTS[variant]
    layer = _torch_layer(variant, seed)
    weights = {name: t.numpy() for name, t in layer.state_dict().items()}
    return layer, getattr(lf, cls).from_state_dict(weights, hidden_size=D, num_heads=H, backend=backend, **kw)


def _abstract(cls, *args, **kw):
    """The layer's parameters as ``name → shape``, built without computing anything (nnx.eval_shape)."""
    layer = nnx.eval_shape(lambda: getattr(lf, cls)(*args, **kw, rngs=nnx.Rngs(0)))
    return {".".join(map(str, path)): v.shape for path, v in nnx.to_flat_state(nnx.state(layer, nnx.Param))}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_names_and_shapes_are_pytorchs(variant):
    cls, kw = VARIANTS[variant]
    ours = _abstract(cls, D, H, backend="reference", **kw)
    assert ours == {name: tuple(t.shape) for name, t in _torch_layer(variant).state_dict().items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_same_weights_same_function_as_pytorch(variant):
    """y and final state from an initial state, then one decoded token, in both frameworks."""
    tl, fl = _flax_from_torch(variant)
    _, H_, K, V = tl.dims
    x, h0 = _x(), np.random.default_rng(1).standard_normal((B, H_, K, V)).astype(np.float32)
    with torch.no_grad():
        y_t, S_t = tl(torch.from_numpy(x), initial_state=torch.from_numpy(h0), output_final_state=True)
        step_t = tl.step(torch.from_numpy(x[:, 0]), S_t)
    y_f, S_f = fl(jnp.asarray(x), initial_state=jnp.asarray(h0), output_final_state=True)
    step_f = fl.step(jnp.asarray(x[:, 0]), S_f)
    assert_close("y", y_t, y_f, TOL)
    assert_close("final state", S_t, S_f, TOL)
    assert_close("step y", step_t[0], step_f[0], TOL)
    assert_close("step state", step_t[1], step_f[1], TOL)


@pytest.mark.parametrize("variant, backend", [("gla-layer", "chunk"), ("gla-layer", "fused_chunk"),
                                              ("simple", "chunk")])
def test_pallas_backend_matches_reference(variant, backend):
    """Forward only: the kernels' gradients are tested in test_pallas.py; here the layer's use of them."""
    _, ref = _flax_from_torch(variant)
    _, kernel = _flax_from_torch(variant, backend)
    _, H_, K, V = ref.dims
    x, h0 = jnp.asarray(_x(batch=1)), jnp.asarray(np.random.default_rng(1).standard_normal((1, H_, K, V)), jnp.float32)
    y_ref, S_ref = ref(x, initial_state=h0, output_final_state=True)
    y, S = kernel(x, initial_state=h0, output_final_state=True)
    assert_close("y", y_ref, y, TOL)
    assert_close("final state", S_ref, S, TOL)


@pytest.mark.parametrize("variant", ["gla-layer", "simple"])
def test_prefill_then_decode_equals_one_pass(variant):
    _, layer = _flax_from_torch(variant)
    x = jnp.asarray(_x())
    y_full, S_full = layer(x, output_final_state=True)
    y, S = layer(x[:, :11], output_final_state=True)
    ys = [y]
    for t in range(11, T):
        y_t, S = layer.step(x[:, t], S)
        ys.append(y_t[:, None])
    assert_close("y", y_full, jnp.concatenate(ys, 1), TOL)
    assert_close("state", S_full, S, TOL)
    assert layer(x)[1] is None


@pytest.mark.parametrize("variant", ["gla-layer", "simple"])
def test_gradients_reach_every_parameter_under_jit(variant):
    _, layer = _flax_from_torch(variant)
    x = jnp.asarray(_x())

    def loss(model):
        y, S = model(x, output_final_state=True)
        return jnp.mean(y ** 2) + jnp.mean(S ** 2)

    grads = nnx.to_flat_state(nnx.jit(nnx.grad(loss))(layer))
    assert {".".join(map(str, path)) for path, _ in grads} == set(lf.state_dict(layer))
    for path, g in grads:
        assert float(jnp.abs(g[...]).sum()) > 0, f"{path} gets no gradient"


def test_parameter_count():
    size = lambda shapes: sum(int(np.prod(s)) for s in shapes.values())  # noqa: E731
    for gate in config.GATES:
        shapes = _abstract("GatedLinearAttention", 48, 2, backend="reference", gate=gate, norm="layer")
        assert size(shapes) == config.gla_num_params(48, 2, gate=gate, norm="layer")
    shapes = _abstract("SimpleGatedLinearAttention", D, 4, use_qk_norm=True, backend="reference")
    assert size(shapes) == 5 * D * D + D + 2 * D // 4


def test_constant_decays_are_buffers_not_parameters():
    layer = lf.SimpleGatedLinearAttention(D, H, backend="reference", rngs=nnx.Rngs(0))
    assert "g_gamma" not in lf.state_dict(layer)
    assert isinstance(layer.g_gamma, lf.Buffer)


def test_from_state_dict_takes_flas_names():
    _, ref = _flax_from_torch("scalar-rms")
    weights = lf.state_dict(ref)
    weights["g_norm_swish_gate.weight"] = weights.pop("g_norm.weight") * 2
    layer = lf.GatedLinearAttention.from_state_dict(weights, hidden_size=D, num_heads=H, backend="reference",
                                                    gate="scalar")
    np.testing.assert_array_equal(np.asarray(layer.g_norm.weight[...]), weights["g_norm_swish_gate.weight"])


@pytest.mark.parametrize("edit, error, match", [
    (lambda w: w.pop("o_proj.weight"), ValueError, r"missing \['o_proj.weight'\]"),
    (lambda w: w.update({"q_conv1d.weight": np.zeros((16, 1, 4))}), ValueError, r"unexpected \['q_conv1d.weight'\]"),
    (lambda w: w.update({"q_proj.weight": np.zeros((32, 16))}), ValueError,
     r"state_dict\['q_proj.weight'\] must have shape \(16, 32\)"),
    (lambda w: w.update({"g_proj.weight": [[0.0] * 32] * 32}), TypeError,
     r"state_dict\['g_proj.weight'\] must be an array"),
])
def test_from_state_dict_refuses_other_layers(edit, error, match):
    weights = {name: t.numpy() for name, t in _torch_layer("scalar-rms").state_dict().items()}
    edit(weights)
    with pytest.raises(error, match=match):
        lf.GatedLinearAttention.from_state_dict(weights, hidden_size=D, num_heads=H, backend="reference",
                                                gate="scalar")


_LAYER = lf.GatedLinearAttention(D, H, backend="reference", rngs=nnx.Rngs(0))


@pytest.mark.parametrize("call, error, match", [
    (lambda: lf.GatedLinearAttention(D, H, backend="fused_recurrent", rngs=nnx.Rngs(0)), ValueError,
     "backend must be one of"),
    (lambda: lf.GatedLinearAttention(D, 3, rngs=nnx.Rngs(0)), ValueError, "key_dim = 16"),
    (lambda: lf.SimpleGatedLinearAttention(D, 4, group_norm_size=3, rngs=nnx.Rngs(0)), ValueError,
     "group_norm_size"),
    (lambda: lf.GroupRMSNorm(10, 3), ValueError, "num_groups = 3 must divide"),
    (lambda: _LAYER(jnp.zeros((B, T, D + 1))), ValueError, r"x must have shape \[B, T, d\] with d = 32"),
    (lambda: _LAYER(jnp.zeros((B, T, D), jnp.bfloat16)), TypeError, "x must have the layer's dtype"),
    (lambda: _LAYER([[0.0] * D]), TypeError, "x must be a JAX or NumPy array"),
    (lambda: _LAYER.step(jnp.zeros((B, D)), jnp.zeros((B, H, 16, 8))), ValueError, "state must have shape"),
    (lambda: _LAYER.step(jnp.zeros((B, D)), jnp.zeros((B, H, 8, 16), jnp.bfloat16)), TypeError,
     "state must be float32"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()



# ----------------------------------------------------------------------------- packed sequences (cu_seqlens)

PACKED = [13, 1, 6]  # no length a multiple of a chunk (16, 64), one a single token; short, as XLA compiles per shape
CU = np.cumsum([0, *PACKED])


def _packed_inputs(layer, lengths=PACKED, seed=2):
    """Per-sequence inputs ``[1, n, d]``, initial states ``[N, H, K, V]`` and cotangents for y and the states."""
    _, H_, K, V = layer.dims
    rng, N = np.random.default_rng(seed), len(lengths)
    xs = [_x(T=n, batch=1, seed=seed + i) for i, n in enumerate(lengths)]
    h0 = rng.standard_normal((N, H_, K, V)).astype(np.float32)
    cot_y = rng.standard_normal((1, sum(lengths), D)).astype(np.float32)
    cot_S = rng.standard_normal((N, H_, K, V)).astype(np.float32)
    return xs, h0, cot_y, cot_S


def _flat(grads):
    return {".".join(map(str, path)): g[...] for path, g in nnx.to_flat_state(grads)}


@pytest.mark.parametrize("variant", ["gla-layer", "simple"])  # gates [B, T, H, K] and [H]
def test_packed_sequences_equal_each_sequence_alone(variant):
    """cu_seqlens on the reference backend, under nnx.jit with the offsets closed over: y, the final
    states and the gradients of every parameter and of the initial states equal those of the sequences
    run one by one (B = 1 each). Every variant, forward: packed against PyTorch's packed layer below
    (which tests/layers/test_layers_torch.py checks against each sequence alone)."""
    _, layer = _flax_from_torch(variant)
    xs, h0, cot_y, cot_S = _packed_inputs(layer)

    def packed(model, h0):
        y, S = model(jnp.concatenate(xs, 1), initial_state=h0, output_final_state=True, cu_seqlens=CU)
        return jnp.sum(y * cot_y) + jnp.sum(S * cot_S), (y, S)

    def alone(model, h0):
        runs = [model(x, initial_state=h0[n:n + 1], output_final_state=True) for n, x in enumerate(xs)]
        y, S = jnp.concatenate([r[0] for r in runs], 1), jnp.concatenate([r[1] for r in runs], 0)
        return jnp.sum(y * cot_y) + jnp.sum(S * cot_S), (y, S)

    # jitted whole (the offsets set shapes, so they are a closed-over constant): one compilation per function
    results = [nnx.jit(nnx.grad(f, argnums=(0, 1), has_aux=True))(layer, jnp.asarray(h0)) for f in (packed, alone)]
    ((dw, dh0), (y, S)), ((dw_1, dh0_1), (y_1, S_1)) = results
    assert y.shape == (1, sum(PACKED), D) and S.shape[0] == len(PACKED)
    assert_close("y", y_1, y, TOL)
    assert_close("final states", S_1, S, TOL)
    assert_close("dinitial_state", dh0_1, dh0, TOL)
    dw, dw_1 = _flat(dw), _flat(dw_1)
    assert dw.keys() == dw_1.keys() == set(lf.state_dict(layer))
    for name, g in dw_1.items():
        assert float(jnp.abs(g).sum()) > 0, f"{name} gets no gradient"
        assert_close(f"d{name}", g, dw[name], TOL)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_packed_same_weights_same_function_as_pytorch(variant):
    """One packed row of three sequences (int64 offsets in both frameworks) from the same initial states."""
    tl, fl = _flax_from_torch(variant)
    xs, h0, _, _ = _packed_inputs(fl)
    x = np.concatenate(xs, 1)
    with torch.no_grad():
        y_t, S_t = tl(torch.from_numpy(x), initial_state=torch.from_numpy(h0), output_final_state=True,
                      cu_seqlens=torch.from_numpy(CU))
    y_f, S_f = fl(jnp.asarray(x), initial_state=jnp.asarray(h0), output_final_state=True, cu_seqlens=CU)
    assert_close("y", y_t, y_f, TOL)
    assert_close("final states", S_t, S_f, TOL)


@pytest.mark.parametrize("variant, backend", [("gla-layer", "chunk"), ("gla-layer", "fused_chunk"),
                                              ("simple", "chunk")])
def test_pallas_backend_with_cu_seqlens(variant, backend):
    """A Pallas kernel without cu_seqlens is refused with an error that says so, before any math; one
    that takes it must match the reference."""
    _, ref = _flax_from_torch(variant)
    _, layer = _flax_from_torch(variant, backend)
    x = jnp.asarray(np.concatenate(_packed_inputs(layer)[0], 1))
    if "cu_seqlens" in inspect.signature(getattr(pallas, layer._kernel_name())).parameters:
        assert_close("y", ref(x, cu_seqlens=CU)[0], layer(x, cu_seqlens=CU)[0], TOL)
    else:
        with pytest.raises(ValueError, match=f"cu_seqlens .* not supported by backend='{backend}'.*"
                                             "use backend='reference'"):
            layer(x, cu_seqlens=CU)


@pytest.mark.parametrize("x, cu, error, match", [
    ((1, 20), [0, 13, 14, 19], ValueError, "cu_seqlens must start at 0 and end at T = 20"),
    ((1, 20), [0, 13, 12, 20], ValueError, "cu_seqlens must not decrease"),
    ((2, 10), [0, 4, 10], ValueError, "cu_seqlens needs one packed sequence batch, B = 1"),
    ((1, 20), [0.0, 20.0], TypeError, "cu_seqlens must be"),
])
def test_packed_bad_cu_seqlens(x, cu, error, match):
    with pytest.raises(error, match=match):
        _LAYER(jnp.zeros((*x, D)), cu_seqlens=np.asarray(cu))


def test_packed_initial_state_is_one_per_sequence():
    with pytest.raises(ValueError, match=r"initial_state must have shape \[N, H, K, V\]"):
        _LAYER(jnp.zeros((1, 20, D)), initial_state=jnp.zeros((1, H, 8, 16)), cu_seqlens=CU)
