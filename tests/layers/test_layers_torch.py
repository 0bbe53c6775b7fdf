"""PyTorch layers (gla_ref.layers.torch): Triton backends against the reference, prefill + decode against
one pass, gradients to every parameter, the parameter count, FLA's state dict, and argument errors.

CPU: the Triton kernels run in the interpreter, in float32, at tiny sizes (d = 32, H = 2, so K = 8 and
V = 16 per head at the paper's expand_k = 1/2, expand_v = 1; T = 19 is no multiple of a chunk size;
a batch of one where a kernel runs, since the interpreter's time grows with the grid).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from gla_ref.layers import config  # noqa: E402
from gla_ref.layers.torch import (MIXERS, GatedLinearAttention, GLABlock, GLALM, GroupRMSNorm,  # noqa: E402
                                  SimpleGatedLinearAttention)
from gla_ref.testing import assert_close, recurrence64  # noqa: E402

D, H, B, T = 32, 2, 2, 19
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where the kernel backends run
TOL = 1e-5  # relative RMSE, float32 against float32 (seen: ~3e-7 for outputs, ~1e-6 for gradients)
SIMPLE = dict(group_norm_size=2, use_qk_norm=True, layer_idx=1, num_layers=3)


def _x(T=T, seed=0, batch=B):
    return torch.randn(batch, T, D, generator=torch.Generator().manual_seed(seed))


def _gla(seed=0, **kw):
    torch.manual_seed(seed)
    return GatedLinearAttention(D, H, **kw)


def _simple(seed=0, **kw):
    torch.manual_seed(seed)
    return SimpleGatedLinearAttention(D, H, **SIMPLE, **kw)


def _same_weights(layer, make, backend):
    twin = make(backend=backend)
    twin.load_state_dict(layer.state_dict())
    return twin


def _run_with_grads(layer, x, h0, cotangents):
    """y and final state from h0, and the gradients of ⟨y, c_y⟩ + ⟨S, c_S⟩ for every parameter, x and h0
    (the layer on DEVICE, the tensors made on the CPU and moved there)."""
    x, h0 = x.clone().requires_grad_(), h0.clone().requires_grad_()
    layer.to(DEVICE).zero_grad()
    y, S = layer(x.to(DEVICE), initial_state=h0.to(DEVICE), output_final_state=True)
    ((y * cotangents[0].to(DEVICE)).sum() + (S * cotangents[1].to(DEVICE)).sum()).backward()
    grads = {name: p.grad for name, p in layer.named_parameters()}
    return y.detach(), S.detach(), {**grads, "x": x.grad, "initial_state": h0.grad}


# ----------------------------------------------------------------------------- backends

KERNEL_CASES = [("gla", "chunk"), ("gla", "fused_chunk"), ("gla", "fused_recurrent"),
                ("scalar", "fused_recurrent"), ("const", "fused_recurrent"), ("none", "fused_recurrent")]


@pytest.mark.parametrize("make, backend", [
    *[pytest.param(lambda gate=gate, **kw: _gla(gate=gate, **kw), b, id=f"{gate}-{b}") for gate, b in KERNEL_CASES],
    pytest.param(_simple, "chunk", id="simple-chunk")])
def test_kernel_backend_matches_reference(make, backend):
    ref = make(backend="reference")
    kernel = _same_weights(ref, make, backend)
    _, H_, K, V = ref.dims
    gen = torch.Generator().manual_seed(1)
    h0 = torch.randn(1, H_, K, V, generator=gen)
    cot = (torch.randn(1, T, D, generator=gen), torch.randn(1, H_, K, V, generator=gen))
    y_ref, S_ref, g_ref = _run_with_grads(ref, _x(batch=1), h0, cot)
    y, S, grads = _run_with_grads(kernel, _x(batch=1), h0, cot)
    assert_close("y", y_ref, y, TOL)
    assert_close("final state", S_ref, S, TOL)
    assert grads.keys() == g_ref.keys()
    for name, g in g_ref.items():
        assert_close(f"d{name}", g, grads[name], TOL)


@pytest.mark.parametrize("make", [
    pytest.param(lambda: _gla(backend="reference"), id="gla-reference"),
    pytest.param(lambda: _gla(backend="chunk"), id="gla-chunk"),
    pytest.param(lambda: _gla(gate="const", backend="fused_recurrent"), id="const-fused_recurrent"),
    pytest.param(lambda: _simple(backend="chunk"), id="simple-chunk")])
def test_packed_sequences_equal_each_sequence_alone(make):
    """cu_seqlens: one packed row of three sequences (lengths 7, 1, 11) = each run alone, states included."""
    layer, lengths = make().to(DEVICE), [7, 1, 11]
    _, H_, K, V = layer.dims
    xs = [_x(T=n, seed=i, batch=1).to(DEVICE) for i, n in enumerate(lengths)]
    h0 = torch.randn(len(lengths), H_, K, V, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    cu = torch.tensor([0, 7, 8, 19], dtype=torch.int64, device=DEVICE)
    with torch.no_grad():
        y, S = layer(torch.cat(xs, 1), initial_state=h0, output_final_state=True, cu_seqlens=cu)
        alone = [layer(x, initial_state=h0[i:i + 1], output_final_state=True) for i, x in enumerate(xs)]
    assert_close("y", torch.cat([a[0] for a in alone], 1), y, TOL)
    assert_close("states", torch.cat([a[1] for a in alone], 0), S, TOL)
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer(torch.cat(xs, 1), cu_seqlens=torch.tensor([0, 7, 8, 18], device=DEVICE))


@pytest.mark.parametrize("backend", ["reference", "fused_recurrent"])
def test_packed_offsets_follow_fla_conventions(backend):
    """int32, strided and NumPy offsets pass through a layer (its short convolutions included) as int64
    ones do, bit for bit; an empty sequence returns its initial state, recurrent state and convolution
    caches alike, exactly."""
    layer = _gla(backend=backend, use_short_conv=True)
    lengths = [0, 7, 0, 1, 11, 0]
    with torch.no_grad():
        _, h0 = layer(_x(T=3, seed=1, batch=len(lengths)), output_final_state=True)  # N rows of states
        cu = torch.tensor(np.cumsum([0, *lengths]))
        y, S = layer(_x(T=19, batch=1), initial_state=h0, output_final_state=True, cu_seqlens=cu)
        for other in (cu.int(), torch.stack([cu, cu], 1)[:, 1], cu.numpy().astype(np.int32)):
            y2, S2 = layer(_x(T=19, batch=1), initial_state=h0, output_final_state=True, cu_seqlens=other)
            assert torch.equal(y, y2) and all(torch.equal(a, b) for a, b in zip(S, S2))
    empty = [n for n, length in enumerate(lengths) if length == 0]
    for name, a, b in zip(("recurrent", "q", "k", "v"), S, h0):
        assert torch.equal(a[empty], b[empty]), name


# ----------------------------------------------------------------------------- prefill and decode

@pytest.mark.parametrize("make, batch", [
    pytest.param(lambda: _gla(backend="chunk"), 1, id="gla-chunk"),
    *[pytest.param(lambda gate=gate: _gla(gate=gate, norm="layer", backend="reference"), B, id=f"{gate}-reference")
      for gate in config.GATES],
    pytest.param(lambda: _simple(backend="chunk"), 1, id="simple-chunk")])
def test_prefill_then_decode_equals_one_pass(make, batch):
    """Two chunkwise calls (the second from the first's state), then one token at a time with ``step``."""
    layer, x = make().to(DEVICE), _x(batch=batch).to(DEVICE)
    with torch.no_grad():
        y_full, S_full = layer(x, output_final_state=True)
        y_a, S = layer(x[:, :8], output_final_state=True)
        y_b, S = layer(x[:, 8:14], initial_state=S, output_final_state=True)
        ys = [y_a, y_b]
        for t in range(14, T):
            y_t, S = layer.step(x[:, t], S)
            ys.append(y_t[:, None])
    assert_close("y", y_full, torch.cat(ys, 1), TOL)
    assert_close("state", S_full, S, TOL)
    assert layer(x)[1] is None  # no state unless asked for


def test_step_from_no_state_is_the_first_token():
    layer, x = _gla(backend="reference"), _x(T=1)
    with torch.no_grad():
        y, S = layer(x, output_final_state=True)
        y_t, S_t = layer.step(x[:, 0])
    assert_close("y", y[:, 0], y_t, TOL)
    assert_close("state", S, S_t, TOL)


# ----------------------------------------------------------------------------- gradients and sizes

@pytest.mark.parametrize("make", [
    *[pytest.param(lambda gate=gate, norm=norm: _gla(gate=gate, norm=norm, backend="reference"), id=f"{gate}-{norm}")
      for gate in config.GATES for norm in config.NORMS],
    pytest.param(lambda: _simple(backend="reference"), id="simple")])
def test_gradients_reach_every_parameter(make):
    layer = make()
    y, S = layer(_x(), output_final_state=True)
    (y.square().mean() + S.square().mean()).backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} gets no gradient"


@pytest.mark.parametrize("kw", [dict(), dict(norm="layer"), dict(gate="scalar"), dict(gate="const"),
                                dict(gate="none", expand_k=1.0, expand_v=2.0, num_heads=4),
                                dict(gate_low_rank_dim=5, expand_k=0.75)])
def test_parameter_count(kw):
    args = {"hidden_size": 48, "num_heads": 2, **kw}
    layer = GatedLinearAttention(**args, backend="reference")
    assert sum(p.numel() for p in layer.parameters()) == config.gla_num_params(**args)


def test_parameter_count_of_the_papers_layer_is_about_4d2():
    """d_k = d/2, d_v = d, r = 16: exactly 4d² + 3rd/2 + d/2 + d/H, within 3 % of 4d² at d = 512."""
    for d, heads in ((64, 4), (512, 4)):
        n = sum(p.numel() for p in GatedLinearAttention(d, heads, backend="reference").parameters())
        assert n == 4 * d * d + 3 * 16 * d // 2 + d // 2 + d // heads
    assert abs(n / (4 * 512 ** 2) - 1) < 0.03


@pytest.mark.parametrize("use_qk_norm", [False, True])
def test_simple_parameter_count(use_qk_norm):
    layer = SimpleGatedLinearAttention(D, 4, use_qk_norm=use_qk_norm, backend="reference")
    n = sum(p.numel() for p in layer.parameters())
    assert n == config.simple_num_params(D, 4, use_qk_norm=use_qk_norm) == 5 * D * D + D + (2 * D // 4) * use_qk_norm


def test_simple_decay_is_alibi_slopes_scaled_by_layer():
    """g_gamma = −(1 − l/(L−1) + 1e−5) · m_h, m_h = 2^(−8h/H): strongest in the first layer."""
    slopes = 2.0 ** (-8.0 * np.arange(1, 5) / 4)
    for l, scale in ((0, 1 + 1e-5), (1, 0.5 + 1e-5), (2, 1e-5)):
        layer = SimpleGatedLinearAttention(D, 4, layer_idx=l, num_layers=3, backend="reference")
        np.testing.assert_allclose(layer.g_gamma.numpy(), -scale * slopes, rtol=1e-6)
        assert "g_gamma" not in layer.state_dict()


def test_group_rms_norm_normalises_each_group():
    norm = GroupRMSNorm(8, num_groups=2)
    x = torch.randn(3, 8) * torch.tensor([1.0] * 4 + [100.0] * 4)
    y = norm(x).unflatten(-1, (2, 4))
    assert_close("rms of each group", torch.ones(3, 2), y.square().mean(-1).sqrt(), 1e-4)


# ----------------------------------------------------------------------------- FLA's state dict

def _fla_state_dict(seed=0):
    """FLA's GatedLinearAttention(hidden_size=32, num_heads=2) state dict, names and shapes written from
    its constructor: q/k_proj [d_k, d], v/g_proj [d_v, d], gk_proj = Linear(d, 16, no bias) then
    Linear(16, d_k), o_proj [d, d_v], g_norm_swish_gate (FusedRMSNormGated over V) [V]."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"q_proj.weight": (16, 32), "k_proj.weight": (16, 32), "v_proj.weight": (32, 32),
              "g_proj.weight": (32, 32), "gk_proj.0.weight": (16, 32), "gk_proj.1.weight": (16, 16),
              "gk_proj.1.bias": (16,), "o_proj.weight": (32, 32), "g_norm_swish_gate.weight": (16,)}
    return {name: torch.randn(shape, generator=gen) * 0.3 for name, shape in shapes.items()}


def _fla_forward64(sd, x):
    """FLA's layer in NumPy float64 from its own weights: the roles of the names, independently of gla_ref."""
    w = {name: t.double().numpy() for name, t in sd.items()}
    x = x.double().numpy()
    heads = lambda a: a.reshape(*a.shape[:-1], 2, -1)  # noqa: E731
    q, k, v = (heads(x @ w[f"{n}_proj.weight"].T) for n in "qkv")
    z = x @ w["gk_proj.0.weight"].T @ w["gk_proj.1.weight"].T + w["gk_proj.1.bias"]
    o, _ = recurrence64(q, k, v, heads(-np.logaddexp(0.0, -z) / 16))
    o = o / np.sqrt((o ** 2).mean(-1, keepdims=True) + 1e-5) * w["g_norm_swish_gate.weight"]
    r = heads(x @ w["g_proj.weight"].T)
    return (o * r / (1 + np.exp(-r))).reshape(B, -1, 32) @ w["o_proj.weight"].T


FLA_ARGS = dict(hidden_size=32, num_heads=2)  # the FLA layer _fla_state_dict stands for


def test_fla_state_dict_loads_and_computes_flas_layer():
    sd, layer, x = _fla_state_dict(), GatedLinearAttention(32, 2, backend="reference"), _x()
    layer.load_fla_state_dict(sd, settings=FLA_ARGS)
    fla_name = {ours: theirs for theirs, ours in config.FLA_RENAMES.items()}
    for name, p in layer.state_dict().items():
        assert torch.equal(p, sd[fla_name.get(name, name)]), name
    with torch.no_grad():
        assert_close("y", _fla_forward64(sd, x), layer(x)[0], TOL)


def test_fla_state_dict_unfused_norm_name_loads():
    """FLA with fuse_norm=False names the norm g_norm, as we do."""
    sd = _fla_state_dict()
    sd["g_norm.weight"] = sd.pop("g_norm_swish_gate.weight")
    layer = GatedLinearAttention(32, 2, backend="reference")
    layer.load_fla_state_dict(sd, settings={**FLA_ARGS, "fuse_norm": False})
    assert torch.equal(layer.g_norm.weight, sd["g_norm.weight"])


@pytest.mark.parametrize("edit, match", [
    (lambda sd: sd.update({"q_conv1d.weight": torch.zeros(16, 1, 4)}), r"unexpected \['q_conv1d.weight'\]"),
    (lambda sd: sd.pop("g_proj.weight"), r"missing \['g_proj.weight'\]"),
    (lambda sd: sd.update({"k_proj.weight": torch.zeros(8, 32)}),  # FLA's num_kv_heads = 1
     r"state_dict\['k_proj.weight'\] must have shape \(16, 32\)"),
])
def test_fla_state_dict_mismatch_is_refused_before_loading(edit, match):
    sd, layer = _fla_state_dict(), GatedLinearAttention(32, 2, backend="reference")
    before = {name: p.clone() for name, p in layer.state_dict().items()}
    edit(sd)
    with pytest.raises(ValueError, match=match):
        layer.load_fla_state_dict(sd, settings=FLA_ARGS)
    assert all(torch.equal(before[name], p) for name, p in layer.state_dict().items())


# ----------------------------------------------------------------------------- the language model

@pytest.mark.parametrize("mixer", [m for m in MIXERS if m != "const"])  # "const" is "retnet"
def test_lm_decode_equals_one_pass_and_every_parameter_learns(mixer):
    torch.manual_seed(0)
    lm = GLALM(50, D, num_layers=2, num_heads=H, mixer=mixer)
    ids = torch.randint(0, 50, (B, 12), generator=torch.Generator().manual_seed(0))
    logits, states = lm(ids, output_final_state=True)
    assert logits.shape == (B, 12, 50) and len(states) == 2
    F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    for name, p in lm.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} gets no gradient"
    with torch.no_grad():
        prefix, s = lm(ids[:, :5], output_final_state=True)
        steps = [prefix]
        for t in range(5, 12):
            out, s = lm.step(ids[:, t], s)
            steps.append(out[:, None])
    assert_close("logits", logits.detach(), torch.cat(steps, 1), TOL)
    for i in range(2):
        assert_close(f"state {i}", states[i].detach(), s[i], TOL)


def test_mixer_names_pick_the_gate_family():
    for mixer, gate in MIXERS.items():
        attn = GLABlock(D, mixer, H).attn
        if gate is None:
            assert isinstance(attn, SimpleGatedLinearAttention)
        else:
            assert isinstance(attn, GatedLinearAttention) and attn.sizes.gate == gate


def test_lm_tied_head_is_the_embedding():
    tied, untied = GLALM(50, D, num_layers=1), GLALM(50, D, num_layers=1, tie_embeddings=False)
    assert tied.lm_head.weight is tied.embeddings.weight
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(untied) - count(tied) == 50 * D


def test_block_is_pre_norm_with_residuals():
    """With the mixer's and the MLP's output projections zeroed, a block is the identity."""
    block = GLABlock(D, "gla", H)
    with torch.no_grad():
        block.attn.o_proj.weight.zero_()
        block.mlp.down_proj.weight.zero_()
        x = _x()
        assert torch.equal(block(x)[0], x)
        assert torch.equal(block.step(x[:, 0])[0], x[:, 0])


# ----------------------------------------------------------------------------- packed sequences through the model

PACKED = [23, 1, 30, 10]  # 64 tokens: no length a multiple of a chunk (16, 64), one a single token
VOCAB = 50


def _packed_ids(lengths=PACKED, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (1, n), generator=gen) for n in lengths]


def _cu(lengths=PACKED):
    return torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int64)


def _lm_run(lm, ids, states, cot_logits, cot_states, cu_seqlens=None):
    """Logits and final states of ``lm`` from ``states``, and ⟨logits, c⟩ + Σ_l ⟨S_l, c_l⟩ (for backward)."""
    logits, out = lm(ids, states=states, output_final_state=True, cu_seqlens=cu_seqlens)
    loss = (logits * cot_logits).sum() + sum((S * c).sum() for S, c in zip(out, cot_states))
    return logits, out, loss


def _packed_and_alone(lm, lengths=PACKED):
    """The model on one packed row and on each sequence alone (B = 1 each), from the same per-layer
    initial states and cotangents: ``(packed, alone)``, each ``(logits, states, grads)`` with the
    gradients of every parameter and of the initial states (those of the sequences run alone add up)."""
    N, ends = len(lengths), np.cumsum([0, *lengths])
    gen = torch.Generator().manual_seed(1)
    dims = [layer.attn.dims[1:] for layer in lm.layers]
    dev = next(lm.parameters()).device
    h0 = [0.3 * torch.randn(N, *hkv, generator=gen).to(dev) for hkv in dims]
    cot_logits = torch.randn(1, ends[-1], VOCAB, generator=gen).to(dev)
    cot_states = [torch.randn(N, *hkv, generator=gen).to(dev) for hkv in dims]
    ids = [x.to(dev) for x in _packed_ids(lengths)]

    def grads(states):
        return {**{name: p.grad.clone() for name, p in lm.named_parameters()},
                **{f"initial_state {i}": s.grad for i, s in enumerate(states)}}

    lm.zero_grad()
    states = [s.clone().requires_grad_() for s in h0]
    logits, out, loss = _lm_run(lm, torch.cat(ids, 1), states, cot_logits, cot_states, _cu(lengths).to(dev))
    loss.backward()
    packed = (logits.detach(), [S.detach() for S in out], grads(states))

    lm.zero_grad()
    states, runs = [s.clone().requires_grad_() for s in h0], []
    for n, x in enumerate(ids):
        runs.append(_lm_run(lm, x, [s[n:n + 1] for s in states], cot_logits[:, ends[n]:ends[n + 1]],
                            [c[n:n + 1] for c in cot_states]))
    sum(loss for *_, loss in runs).backward()
    alone = (torch.cat([r[0] for r in runs], 1).detach(),
             [torch.cat([r[1][i] for r in runs], 0).detach() for i in range(len(lm.layers))], grads(states))
    return packed, alone


@pytest.mark.parametrize("mixer, backend", [
    *[(m, "reference") for m in MIXERS if m != "const"],  # "const" is "retnet"
    ("gla", "fused_recurrent"), ("simple", "chunk")])  # gla-chunk: the layer test above (the LM here takes 15 s)
def test_packed_lm_equals_each_sequence_alone(mixer, backend):
    """cu_seqlens through embedding, blocks and head: the logits, every layer's final state and the
    gradient of every parameter (and initial state) equal those of the sequences run one by one.
    Triton's interpreter is slow, so its cases get one layer and 20 tokens (lengths 13, 1, 6)."""
    reference = backend == "reference"
    lengths = PACKED if reference else [13, 1, 6]
    torch.manual_seed(0)
    lm = GLALM(VOCAB, D, num_layers=2 if reference else 1, num_heads=H, mixer=mixer, backend=backend).to(DEVICE)
    (logits, states, grads), (logits_1, states_1, grads_1) = _packed_and_alone(lm, lengths)
    assert logits.shape == (1, sum(lengths), VOCAB) and states[0].shape[0] == len(lengths)
    assert_close("logits", logits_1, logits, TOL)
    for i, (S_1, S) in enumerate(zip(states_1, states)):
        assert_close(f"final state {i}", S_1, S, TOL)
    assert grads.keys() == grads_1.keys() and len(grads) == len(list(lm.parameters())) + len(lm.layers)
    for name, g in grads_1.items():
        assert g.abs().sum() > 0, f"{name} gets no gradient"
        assert_close(f"d{name}", g, grads[name], TOL)


def test_packed_lm_does_not_leak_across_sequences():
    """Changing one sequence's tokens changes no logit of the others (a check that does not rely on the
    model computing a sequence alone the same way)."""
    torch.manual_seed(0)
    lm, ids = GLALM(VOCAB, D, num_layers=2, num_heads=H), _packed_ids()
    other = [ids[0], ids[1], (ids[2] + 1) % VOCAB, ids[3]]
    with torch.no_grad():
        a, _ = lm(torch.cat(ids, 1), cu_seqlens=_cu())
        b, _ = lm(torch.cat(other, 1), cu_seqlens=_cu())
    third = slice(PACKED[0] + PACKED[1], PACKED[0] + PACKED[1] + PACKED[2])
    assert torch.equal(torch.cat([a[:, :third.start], a[:, third.stop:]], 1),
                       torch.cat([b[:, :third.start], b[:, third.stop:]], 1))
    assert not torch.allclose(a[:, third], b[:, third])


def test_packed_prefill_then_decode_each_sequence():
    """The states of a packed prefill ([N, H, K, V] per layer) decode the N sequences as a batch of N."""
    torch.manual_seed(0)
    lm, ids = GLALM(VOCAB, D, num_layers=2, num_heads=H, mixer="scalar"), _packed_ids()
    nxt = torch.randint(0, VOCAB, (len(PACKED),), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, states = lm(torch.cat(ids, 1), output_final_state=True, cu_seqlens=_cu())
        step_logits, _ = lm.step(nxt, states)
        alone = [lm(torch.cat([x, nxt[n:n + 1, None]], 1))[0][:, -1] for n, x in enumerate(ids)]
    assert_close("next-token logits", torch.cat(alone, 0), step_logits, TOL)


@pytest.mark.parametrize("shape, cu, match", [
    ((1, 64), [0, 23, 24, 54, 63], "cu_seqlens must start at 0 and end at T = 64"),
    ((1, 64), [0, 23, 20, 54, 64], r"cu_seqlens must not decrease .* cu_seqlens\[1\] = 23 > cu_seqlens\[2\] = 20"),
    ((2, 32), [0, 10, 32], "cu_seqlens needs one packed sequence batch, B = 1"),
    ((1, 64), [[0, 64]], r"cu_seqlens must be a 1-D .* got shape \(1, 2\)"),
])
def test_packed_lm_bad_cu_seqlens(shape, cu, match):
    with pytest.raises(ValueError, match=match):
        _LM(torch.zeros(shape, dtype=torch.long), cu_seqlens=torch.tensor(cu, dtype=torch.int64))


def test_packed_lm_states_are_one_per_sequence():
    with pytest.raises(ValueError, match=r"initial_state must have shape \[N, H, K, V\]"):
        _LM(torch.zeros(1, 64, dtype=torch.long), states=[torch.zeros(1, H, 8, 16)] * 2, cu_seqlens=_cu())


# ----------------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("build, error, match", [
    (lambda: GatedLinearAttention(0), ValueError, "hidden_size must be a positive int"),
    (lambda: GatedLinearAttention(32, 3), ValueError, "key_dim = 16 .* multiple of num_heads = 3"),
    (lambda: GatedLinearAttention(32, 2, expand_k=0), ValueError, "expand_k"),
    (lambda: GatedLinearAttention(32, 2, expand_v=0.01), ValueError, "value_dim = hidden_size × expand_v = 0.32 must "
                                                                     "be a whole number"),
    (lambda: GatedLinearAttention(32, 2, expand_v=1 / 32), ValueError, "value_dim = 1 .* multiple of num_heads = 2"),
    (lambda: GatedLinearAttention(32, 2, gate_low_rank_dim=0), ValueError, "gate_low_rank_dim"),
    (lambda: GatedLinearAttention(32, 2, gate_logit_normalizer=-1), ValueError, "gate_logit_normalizer"),
    (lambda: GatedLinearAttention(32, 2, norm="batch"), ValueError, "norm must be one of"),
    (lambda: GatedLinearAttention(32, 2, backend="flash"), ValueError, "backend must be one of"),
    (lambda: GatedLinearAttention(32, 2, gate="mamba"), ValueError, "gate must be one of"),
    (lambda: GatedLinearAttention(32, 2, norm_eps=0), ValueError, "norm_eps"),
    (lambda: GatedLinearAttention(1024, 1, backend="chunk"), ValueError, "K = 512 per head exceeds 256"),
    (lambda: GatedLinearAttention(16384, 1, expand_k=1 / 128, backend="chunk"), ValueError,
     "V = 16384 per head exceeds 4096"),
    (lambda: SimpleGatedLinearAttention(32, 3), ValueError, "hidden_size = 32 must be a multiple of num_heads"),
    (lambda: SimpleGatedLinearAttention(32, 4, group_norm_size=3), ValueError, "group_norm_size = 3"),
    (lambda: SimpleGatedLinearAttention(32, 2, layer_idx=2, num_layers=2), ValueError, "layer_idx"),
    (lambda: SimpleGatedLinearAttention(32, 2, backend="fused_chunk"), ValueError, "backend"),
    (lambda: SimpleGatedLinearAttention(32, 2, use_qk_norm=1), TypeError, "use_qk_norm"),
    (lambda: GroupRMSNorm(10, 3), ValueError, "num_groups = 3 must divide"),
    (lambda: GLABlock(32, intermediate_size=0), ValueError, "intermediate_size"),
    (lambda: GLALM(0), ValueError, "vocab_size"),
    (lambda: GLALM(50, D, mixer="mamba"), ValueError, "mixer must be one of"),
    (lambda: GLALM(50, D, tie_embeddings="yes"), TypeError, "tie_embeddings"),
])
def test_bad_constructor_arguments(build, error, match):
    with pytest.raises(error, match=match):
        build()


_LAYER = _gla(backend="reference")
_LM = GLALM(50, D, num_layers=2, num_heads=H)


@pytest.mark.parametrize("call, error, match", [
    (lambda: _LAYER(torch.randn(B, T, D + 1)), ValueError, r"hidden_states must have shape \[B, T, d\] with d = 32"),
    (lambda: _LAYER(torch.randn(B, D)), ValueError, r"hidden_states must have shape \[B, T, d\]"),
    (lambda: _LAYER(torch.randn(B, T, D, dtype=torch.float64)), TypeError, "hidden_states must have the layer's dtype"),
    (lambda: _LAYER(np.zeros((B, T, D), np.float32)), TypeError, "hidden_states must be a torch.Tensor"),
    (lambda: _LAYER(torch.randn(B, T, D + 1), output_final_state=False), ValueError,
     r"^x must have shape \[B, T, d\] with d = 32"),
    (lambda: _LAYER(torch.randn(B, T, D, dtype=torch.float64), initial_state=None), TypeError,
     "^x must have the layer's dtype"),
    (lambda: _LAYER(_x(), initial_state=torch.zeros(B, H, 8, 8)), ValueError, "initial_state must have shape"),
    (lambda: _LAYER.step(_x()), ValueError, r"x_t must have shape \[B, d\]"),
    (lambda: _LAYER.step(_x()[:, 0], torch.zeros(B, H, 16, 8)), ValueError, r"state must have shape \[B, H, K, V\]"),
    (lambda: _LAYER.step(_x()[:, 0], torch.zeros(B, H, 8, 16, dtype=torch.float64)), TypeError,
     "state must be float32"),
    (lambda: _LM(torch.zeros(B, 4)), TypeError, "input_ids must be an int64 or int32"),
    (lambda: _LM.step(torch.zeros(B, 1, dtype=torch.long)), TypeError, r"token must be .* of shape \[B\]"),
    (lambda: _LM.step(torch.zeros(B, dtype=torch.long), [None]), ValueError, "states must be None or a list of 2"),
])
def test_bad_call_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_package_import_loads_no_framework():
    code = ("import sys, gla_ref.layers, gla_ref.layers.config; "
            "assert not {'torch', 'jax', 'triton', 'flax'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
