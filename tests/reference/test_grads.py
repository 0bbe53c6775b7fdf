"""The hand-written backward passes of gla_ref.reference.grads against autograd of gla_ref.torch_ref (float64)."""

import pytest

torch = pytest.importorskip("torch")

from gla_ref import torch_ref  # noqa: E402
from gla_ref.reference import grads  # noqa: E402
from gla_ref.testing import as_torch, assert_close, random_inputs  # noqa: E402

SHAPES = [{"B": 1, "T": 1, "H": 1, "K": 4, "V": 4}, {"B": 2, "T": 37, "H": 2, "K": 6, "V": 10}, {"B": 1, "T": 16, "H": 1, "K": 8, "V": 3}]
TOL = 1e-10


def _autograd(gate, shape, h0, with_dht, seed=0):
    """Inputs, cotangents, and autograd's gradients of <o, do> + <S_T, dht> through the recurrence."""
    x = as_torch(random_inputs(**shape, gate=gate, seed=seed, initial_state=h0), dtype=torch.float64,
                 requires_grad=True)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(shape["B"], shape["T"], shape["H"], shape["V"], generator=gen, dtype=torch.float64)
    dht = torch.randn(shape["B"], shape["H"], shape["K"], shape["V"], generator=gen, dtype=torch.float64) if with_dht else None
    o, S = torch_ref.recurrent_gla(**x, output_final_state=True)
    loss = (o * do).sum() + (0 if dht is None else (S * dht).sum())
    names = [n for n in ("q", "k", "v", "g", "initial_state") if x[n] is not None]
    ref = dict(zip(names, torch.autograd.grad(loss, [x[n] for n in names])))
    plain = {n: None if t is None else t.detach() for n, t in x.items()}
    return plain, do, dht, ref, S.detach()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("materialize", [True, False])
@pytest.mark.parametrize("h0,with_dht", [(False, False), (True, True)])
def test_linear_attention_bwd(shape, materialize, h0, with_dht):
    x, do, dht, ref, _ = _autograd("none", shape, h0, with_dht)
    dq, dk, dv, dh0 = grads.linear_attention_bwd(x["q"], x["k"], x["v"], do, initial_state=x["initial_state"],
                                                 dht=dht, chunk_size=8, materialize=materialize)
    for name, got in (("q", dq), ("k", dk), ("v", dv)):
        assert_close(f"d{name}", ref[name], got, TOL)
    if h0:
        assert_close("dh0", ref["initial_state"], dh0, TOL)
    else:
        assert dh0 is None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("h0,with_dht", [(False, False), (True, True)])
def test_gla_bwd_recurrent(shape, h0, with_dht):
    x, do, dht, ref, _ = _autograd("gla", shape, h0, with_dht)
    got = grads.gla_bwd_recurrent(**x, do=do, dht=dht)
    for name in ("q", "k", "v", "g") + (("initial_state",) if h0 else ()):
        key = "dh0" if name == "initial_state" else f"d{name}"
        assert_close(key, ref[name], got[key], TOL)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk_size", [4, 16])
@pytest.mark.parametrize("h0,with_dht", [(False, False), (True, True), (False, True)])
def test_gla_bwd_chunk(shape, chunk_size, h0, with_dht):
    x, do, dht, ref, _ = _autograd("gla", shape, h0, with_dht)
    got = grads.gla_bwd_chunk(**x, do=do, dht=dht, chunk_size=chunk_size)
    for name in ("q", "k", "v", "g") + (("initial_state",) if h0 else ()):
        key = "dh0" if name == "initial_state" else f"d{name}"
        assert_close(key, ref[name], got[key], TOL)


def test_gla_bwd_chunk_intra_and_state_grads():
    """The intra-chunk parts are the gradients of one chunk alone; dS_[n] is d(loss)/d(state leaving n)."""
    shape, C = {"B": 1, "T": 20, "H": 2, "K": 5, "V": 7}, 8
    x, do, dht, _, _ = _autograd("gla", shape, True, True)
    got = grads.gla_bwd_chunk(**x, do=do, dht=dht, chunk_size=C)
    for n, start in enumerate(range(0, shape["T"], C)):
        r = slice(start, start + C)
        xs = {a: x[a][:, r].clone().requires_grad_() for a in "qk"}
        o, _ = torch_ref.parallel_gla(xs["q"], xs["k"], x["v"][:, r], x["g"][:, r])
        dq, dk = torch.autograd.grad((o * do[:, r]).sum(), [xs["q"], xs["k"]])
        assert_close("dq_intra", dq, got["dq_intra"][:, r], TOL)
        assert_close("dk_intra", dk, got["dk_intra"][:, r], TOL)
        cut = min(start + C, shape["T"])
        S_cut = torch_ref.recurrent_gla(*(x[a][:, :cut] for a in "qkvg"), initial_state=x["initial_state"],
                                        output_final_state=True)[1].requires_grad_()
        if cut == shape["T"]:
            assert_close("dS_T", dht, got["dS"][:, :, n], TOL)
            continue
        o_s, S_s = torch_ref.recurrent_gla(*(x[a][:, cut:] for a in "qkvg"), initial_state=S_cut,
                                           output_final_state=True)
        dS, = torch.autograd.grad((o_s * do[:, cut:]).sum() + (S_s * dht).sum(), S_cut)
        assert_close(f"dS_[{n}]", dS, got["dS"][:, :, n], TOL)


@pytest.mark.parametrize("with_dht", [False, True])
def test_gate_grad_closed_form_sign(with_dht):
    """Main text §4.3 (q⊙dq − k⊙dk) matches autograd; the flipped sign of Appendix C does not."""
    x, do, dht, ref, S_T = _autograd("gla", SHAPES[1], True, with_dht)
    full = grads.gla_bwd_recurrent(**x, do=do, dht=dht)
    kw = {"final_state": S_T, "dht": dht} if with_dht else {}
    dg = grads.gate_grad_closed_form(x["q"], x["k"], full["dq"], full["dk"], **kw)
    assert_close("dg", ref["g"], dg, TOL)
    flipped = grads.gate_grad_closed_form(x["k"], x["q"], full["dk"], full["dq"], **kw)
    with pytest.raises(AssertionError):
        assert_close("dg (Appendix C sign)", ref["g"], flipped, 1e-2)


def test_states_and_state_grads_shapes():
    x, do, dht, _, S_T = _autograd("gla", SHAPES[1], True, True)
    S = grads.gla_states(x["k"], x["v"], x["g"], x["initial_state"])
    dS = grads.gla_state_grads(x["q"], x["g"], do, dht=dht)
    assert S.shape == (2, 38, 2, 6, 10) and dS.shape == (2, 37, 2, 6, 10)
    assert_close("S_T", S_T, S[:, -1], TOL)
    assert_close("dS_T", dht + SHAPES[1]["K"] ** -0.5 * x["q"][:, -1, :, :, None] * do[:, -1, :, None, :], dS[:, -1], TOL)


@pytest.mark.parametrize("h0,with_dht", [(False, False), (True, True)])
def test_gate_grad_from_states(h0, with_dht):
    x, do, dht, ref, _ = _autograd("gla", SHAPES[1], h0, with_dht)
    S = grads.gla_states(x["k"], x["v"], x["g"], x["initial_state"])
    dS = grads.gla_state_grads(x["q"], x["g"], do, dht=dht)
    assert_close("dg from the states", ref["g"], grads.gate_grad_from_states(x["g"], S, dS), TOL)
    with pytest.raises(ValueError, match="states must have shape"):
        grads.gate_grad_from_states(x["g"], S[:, 1:], dS)
    with pytest.raises(ValueError, match="state_grads must have shape"):
        grads.gate_grad_from_states(x["g"], S, dS[..., :3])


def test_reverse_cumsum():
    x = torch.arange(5.0)[None]
    assert torch.equal(grads.reverse_cumsum(x), torch.tensor([[10.0, 10.0, 9.0, 7.0, 4.0]]))


def test_bad_inputs():
    x = as_torch(random_inputs(B=1, T=5, H=1, K=4, V=3, gate="gla"))
    do = torch.zeros(1, 5, 1, 3)
    with pytest.raises(ValueError, match="do must have shape"):
        grads.gla_bwd_chunk(x["q"], x["k"], x["v"], x["g"], do[:, :4])
    with pytest.raises(ValueError, match="dht must have shape"):
        grads.gla_bwd_recurrent(x["q"], x["k"], x["v"], x["g"], do, dht=torch.zeros(1, 1, 3, 3))
    with pytest.raises(ValueError, match="g must have shape"):
        grads.gla_bwd_chunk(x["q"], x["k"], x["v"], x["g"][..., 0], do)
    with pytest.raises(ValueError, match="chunk_size"):
        grads.linear_attention_bwd(x["q"], x["k"], x["v"], do, chunk_size=0)
    with pytest.raises(TypeError, match="do must have a floating dtype"):
        grads.linear_attention_bwd(x["q"], x["k"], x["v"], do.long())
    with pytest.raises(TypeError, match="materialize"):
        grads.linear_attention_bwd(x["q"], x["k"], x["v"], do, materialize="yes")
    with pytest.raises(ValueError, match="both"):
        grads.gate_grad_closed_form(x["q"], x["k"], x["q"], x["k"], dht=torch.zeros(1, 1, 4, 3))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk_size,sub_chunk_size", [(16, 4), (8, 8), (16, 16), (4, 1)])
def test_intra_chunk_dqk_two_level(shape, chunk_size, sub_chunk_size):
    """Secondary chunking with reference rows gives the log-space intra-chunk gradients."""
    x, do, _, _, _ = _autograd("gla", shape, False, False)
    ref = grads.gla_bwd_chunk(**x, do=do, chunk_size=chunk_size)
    dq, dk = grads.intra_chunk_dqk_two_level(*(x[a] for a in "qkvg"), do, chunk_size=chunk_size,
                                             sub_chunk_size=sub_chunk_size)
    assert_close("dq_intra", ref["dq_intra"], dq, TOL)
    assert_close("dk_intra", ref["dk_intra"], dk, TOL)


def test_gla_state_grads_names_do():
    x = as_torch(random_inputs(B=1, T=5, H=1, K=4, V=3, gate="gla"))
    with pytest.raises(ValueError, match="do must have shape"):
        grads.gla_state_grads(x["q"], x["g"], torch.zeros(1, 4, 1, 3))
    with pytest.raises(ValueError, match="sub_chunk_size"):
        grads.intra_chunk_dqk_two_level(*(x[a] for a in "qkvg"), torch.zeros(1, 5, 1, 3), chunk_size=8,
                                        sub_chunk_size=3)
