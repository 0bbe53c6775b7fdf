"""Triton chunk_simple_gla (scalar gates [B,T,H], constant decay g_gamma [H]) against float64.

Each case checks o, the final state and every gradient (dq, dk, dv, dg for data-dependent gates,
dh0) under random cotangents on o and on the final state. CPU: Triton's interpreter, fp32 and
fp16, tiny shapes; with CUDA the same cases also run bf16 and the realistic shape.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gla_ref import device  # noqa: E402
from gla_ref.testing import as_torch, assert_close, random_inputs  # noqa: E402
from gla_ref.testing.triton_cases import (check_outputs, compare_with_reference, float64_copies,  # noqa: E402
                                          forbid_launch)
from gla_ref.torch_ref import chunk_gla as chunk_ref  # noqa: E402
from gla_ref.torch_ref import recurrent_gla  # noqa: E402
from gla_ref.triton import chunk_simple as simple_module  # noqa: E402
from gla_ref.triton import chunk_simple_gla  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = device.torch_device()
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# Relative RMSE bounds per input dtype, for every tensor (o, final state, dq, dk, dv, dg, dh0):
# fp32 runs IEEE dots (worst seen ~1e-6), fp16 rounds inputs and matmul operands (~1e-3).
TOL = {F32: 1e-4, F16: 5e-3, BF16: 3e-2}
TOL_LONG = {F32: 1e-4, BF16: 3e-2}

GATES = {  # name → (data-dependent g [B,T,H]?, constant g_gamma [H]?)
    "scalar": (True, False),
    "gamma": (False, True),
    "scalar+gamma": (True, True),
    "none": (False, False),
}


class Case(NamedTuple):
    dtype: torch.dtype
    B: int
    T: int
    H: int
    K: int
    V: int
    gates: str = "scalar"
    C: int = 64
    h0: bool = True
    final: bool = True
    tol: dict = TOL


def _cases():
    half = [F16, BF16] if CUDA else [F16]
    cases = [Case(dtype, 2, 37, 2, 20, 24, C=C) for dtype in (F32, *half) for C in (16, 64)]
    cases += [Case(F32, 2, 37, 2, 20, 24, gates=gates, C=32) for gates in ("gamma", "scalar+gamma", "none")]
    cases += [
        Case(F32, 1, 1, 1, 20, 24, h0=False, final=False),  # T = 1
        Case(F32, 1, 70, 1, 24, 20, C=32, final=False),  # three chunks, the last partial
        Case(F16, 1, 70, 1, 24, 20, gates="gamma", h0=False),
        Case(F16, 1, 40, 1, 72, 40, C=32),  # K = 72: key blocks of 64 and a partial one
        Case(F32, 1, 70, 1, 64, 256, C=32, gates="gamma"),  # V = 256, the largest value dimension
    ]
    if CUDA:
        cases += [Case(dtype, 4, 4096, 8, 128, 128, tol=TOL_LONG) for dtype in (F32, BF16)]
        # V = 256, a partial last chunk: Triton 3.6's own ptxas 12.8 made code that faulted here (see _ptxas)
        cases += [Case(dtype, 2, 1000, 2, 64, 256, gates=gates) for dtype in (F16, BF16) for gates in ("scalar", "gamma")]
        cases += [Case(BF16, 1, 200, 2, 256, 64)]  # K = 256
    return cases


def _case_id(c):
    return (f"{str(c.dtype)[6:]}-B{c.B}T{c.T}H{c.H}K{c.K}V{c.V}-{c.gates}-C{c.C}"
            f"{'-h0' if c.h0 else ''}{'-final' if c.final else ''}")


def _inputs(c, seed):
    """Kernel inputs (q's dtype, float32 gates) and the log-gate the reference sees."""
    use_g, use_gamma = GATES[c.gates]
    x = random_inputs(c.B, c.T, c.H, c.K, c.V, "scalar", seed=seed, initial_state=c.h0)
    x["g_gamma"] = random_inputs(1, 1, c.H, 1, 1, "const", seed=seed + 1)["g"] if use_gamma else None
    if not use_g:
        x["g"] = None
    return as_torch(x, dtype=c.dtype, device=DEV)


@pytest.mark.parametrize("c", _cases(), ids=_case_id)
def test_against_float64_reference(c):
    t = _inputs(c, seed=c.T + c.K + c.C)
    t["g_gamma"] = None if t["g_gamma"] is None else t["g_gamma"].float()
    names = [n for n in ("q", "k", "v", "g", "initial_state") if t[n] is not None]
    for n in names:
        t[n].requires_grad_()
    o, ht = chunk_simple_gla(t["q"], t["k"], t["v"], t["g"], t["g_gamma"], initial_state=t["initial_state"],
                             output_final_state=c.final, chunk_size=c.C)
    check_outputs(c, o, ht)

    r = float64_copies(t)
    g_ref = r["g"]  # the reference takes one log-gate: g (+ g_gamma broadcast over B, T)
    if r["g_gamma"] is not None:
        g_ref = r["g_gamma"] if g_ref is None else g_ref + r["g_gamma"]
    form, extra = (chunk_ref, {"chunk_size": 16}) if c.T > 1024 else (recurrent_gla, {})
    ro, rht = form(r["q"], r["k"], r["v"], g_ref, initial_state=r["initial_state"], output_final_state=c.final,
                   **extra)
    compare_with_reference(c, t, r, names, (o, ht), (ro, rht), _case_id(c), DEV)


@pytest.mark.parametrize("with_g", [False, True], ids=["gamma", "g+gamma"])
def test_g_gamma_gradient(with_g):
    """g_gamma gets its true gradient (as in the Pallas kernel): the gate gradient summed over batch and
    tokens, against float64 autograd through g_gamma broadcast to every token."""
    x = as_torch(random_inputs(2, 21, 2, 16, 16, "scalar", initial_state=True), device=DEV)
    gamma = as_torch(random_inputs(1, 1, 2, 1, 1, "const", seed=5), device=DEV)["g"].requires_grad_()
    g = x["g"].clone().requires_grad_() if with_g else None
    o, ht = chunk_simple_gla(x["q"], x["k"], x["v"], g, gamma, initial_state=x["initial_state"],
                             output_final_state=True, chunk_size=16)
    gen = torch.Generator().manual_seed(2)
    do, dht = torch.randn(o.shape, generator=gen).to(DEV), torch.randn(ht.shape, generator=gen).to(DEV)
    got = torch.autograd.grad((o, ht), [gamma] + ([g] if with_g else []), (do, dht))
    r = {n: x[n].double() for n in ("q", "k", "v", "initial_state")}
    gamma64 = gamma.detach().double().requires_grad_()
    g64 = x["g"].double().requires_grad_() if with_g else None
    g_ref = gamma64 if g64 is None else g64 + gamma64
    ro, rht = recurrent_gla(r["q"], r["k"], r["v"], g_ref, initial_state=r["initial_state"], output_final_state=True)
    ref = torch.autograd.grad((ro, rht), [gamma64] + ([g64] if with_g else []), (do.double(), dht.double()))
    assert got[0].dtype == gamma.dtype and got[0].shape == gamma.shape
    for name, a, b in zip(("dg_gamma", "dg"), ref, got):
        assert_close(name, a, b, TOL[F32])


def test_simple_matches_chunk_gla_with_broadcast_gate():
    """A scalar gate is the GLA gate with equal columns: both kernels agree on o and the gate gradient."""
    from gla_ref.triton import chunk_gla

    x = as_torch(random_inputs(1, 40, 2, 16, 24, "scalar", initial_state=True), device=DEV)
    g = x["g"].clone().requires_grad_()
    g_full = x["g"][..., None].expand(-1, -1, -1, 16).clone().requires_grad_()
    o1, _ = chunk_simple_gla(x["q"], x["k"], x["v"], g, initial_state=x["initial_state"], chunk_size=16)
    o2, _ = chunk_gla(x["q"], x["k"], x["v"], g_full, initial_state=x["initial_state"], chunk_size=16)
    assert_close("o", o2, o1, TOL[F32])
    do = torch.randn_like(o1)
    o1.backward(do)
    o2.backward(do)
    assert_close("dg", g_full.grad.sum(-1), g.grad, TOL[F32])


def test_states_in_fp32_option():
    """fp16 inputs: both state dtypes of the forward within tolerance of float64, the same o bit for bit
    (the output kernel rounds each state to q's dtype for its matmul), the same gradients."""
    x = as_torch(random_inputs(1, 40, 2, 16, 24, "scalar", initial_state=True), dtype=F16, device=DEV)
    gamma = as_torch(random_inputs(1, 1, 2, 1, 1, "const"), device=DEV)["g"]
    r = float64_copies(x)
    ro, _ = recurrent_gla(r["q"], r["k"], r["v"], r["g"] + gamma.double(), initial_state=r["initial_state"])
    runs = []
    for flag in (False, True):
        q = x["q"].clone().requires_grad_()
        o, _ = chunk_simple_gla(q, x["k"], x["v"], x["g"], g_gamma=gamma, initial_state=x["initial_state"],
                                chunk_size=16, states_in_fp32=flag)
        assert_close("o", ro, o, TOL[F16])
        o.backward(torch.ones_like(o))
        runs.append((o.detach(), q.grad))
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dg_sums_only_the_partials_the_chosen_config_wrote(monkeypatch):
    """While autotuning, every BK config writes its key-block partials of dg into one buffer; rows that
    the chosen config does not write hold stale values (NaN here) and must not enter the sum."""
    K = 100  # room for four key blocks (BK = 32); BK = 64 writes two rows, BK = 128 one

    def stale(B, T, H, K_, dev):
        return torch.full(((K_ + 31) // 32, B, T, H), float("nan"), device=dev)

    monkeypatch.setattr(simple_module, "dg_partials", stale)
    x = as_torch(random_inputs(1, 40, 2, K, 24, "scalar"), device=DEV)
    g = x["g"].clone().requires_grad_()
    o, _ = chunk_simple_gla(x["q"], x["k"], x["v"], g, chunk_size=16)
    do = torch.randn_like(o)
    o.backward(do)
    g64 = x["g"].double().requires_grad_()
    o_ref, _ = recurrent_gla(x["q"].double(), x["k"].double(), x["v"].double(), g64)
    o_ref.backward(do.double())
    assert_close("dg", g64.grad, g.grad, TOL[F32])


# ----------------------------------------------------------------------------- bad input

def _good(B=1, T=3, H=2, K=8, V=8):
    x = as_torch(random_inputs(B, T, H, K, V, "scalar", initial_state=True), device=DEV)
    x["g_gamma"] = as_torch(random_inputs(1, 1, H, 1, 1, "const"), device=DEV)["g"]
    return x


def _bad_inputs():
    x = _good()
    q, k, v, g, h0, gamma = x["q"], x["k"], x["v"], x["g"], x["initial_state"], x["g_gamma"]
    big = _good(K=300)
    return {  # name → (arguments, keyword arguments, error type, text the message must contain)
        "q-rank": ((q[0], k, v, g), {}, ValueError, "q must have shape"),
        "v-shape": ((q, k, v[:, :2], g), {}, ValueError, "v must have shape"),
        "g-gla": ((q, k, v, g[..., None].expand(-1, -1, -1, 8)), {}, ValueError, "g must have shape"),
        "g-const": ((q, k, v, gamma), {}, ValueError, "g must have shape"),
        "g_gamma-shape": ((q, k, v), {"g_gamma": gamma[:1]}, ValueError, "g_gamma must have shape"),
        "g_gamma-dtype": ((q, k, v), {"g_gamma": gamma.int()}, TypeError, "g_gamma"),
        "g_gamma-type": ((q, k, v), {"g_gamma": [0.1, 0.2]}, TypeError, "g_gamma"),
        "g_gamma-device": ((q, k, v), {"g_gamma": gamma.to("meta")}, ValueError, "g_gamma is on"),
        "h0-shape": ((q, k, v, g), {"initial_state": h0[..., :4]}, ValueError, "initial_state must have shape"),
        "float64": ((q.double(), k.double(), v.double(), g), {}, TypeError, "float64"),
        "mixed-dtype": ((q, k.half(), v, g), {}, TypeError, "share one dtype"),
        "K>256": ((big["q"], big["k"], big["v"], big["g"]), {}, ValueError, "at most 256"),
        "scale-str": ((q, k, v, g), {"scale": "0.5"}, TypeError, "scale"),
        "chunk_size-8": ((q, k, v, g), {"chunk_size": 8}, ValueError, "chunk_size"),
        "states_in_fp32-str": ((q, k, v, g), {"states_in_fp32": "no"}, TypeError, "states_in_fp32"),
    }


BAD = _bad_inputs()


@pytest.fixture
def no_launch(monkeypatch):
    forbid_launch(monkeypatch, simple_module.ChunkSimpleGLAFunction, ["apply"])


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_raises_before_launch(case, no_launch):
    args, kwargs, error, text = BAD[case]
    with pytest.raises(error, match=text):
        chunk_simple_gla(*args, **kwargs)


def _poisoned():
    x = _good()
    nan_v = x["v"].clone()
    nan_v[0, 1, 0, 2] = float("nan")
    positive_g = x["g"].clone()
    positive_g[0, 2, 1] = 0.5
    positive_gamma = x["g_gamma"].clone()
    positive_gamma[1] = 0.1
    return {  # name → (v, g, g_gamma, argument named in the message)
        "nan-v": (nan_v, x["g"], None, "v"),
        "positive-g": (x["v"], positive_g, None, "g"),
        "positive-g_gamma": (x["v"], None, positive_gamma, "g_gamma"),
    }, x


POISONED, CLEAN = _poisoned()


@pytest.mark.parametrize("case", POISONED, ids=list(POISONED))
def test_debug_mode_checks_values(case, no_launch):
    v, g, gamma, name = POISONED[case]
    with device.debug(True), pytest.raises(ValueError, match=f"^{name} "):
        chunk_simple_gla(CLEAN["q"], CLEAN["k"], v, g, gamma)
