"""The historical five-step GLA forward (gla_ref.teaching.historical) against float64 computations.

The whole pipeline is checked against the float64 recurrence; each stage is checked on its own,
against a float64 computation of that stage from the very inputs the kernel was given, so an
error is pinned to the stage that made it. The float64 stage references are themselves checked:
composed, they must give the recurrence. On CPU the kernels run in Triton's interpreter (fp32,
fp16, tiny shapes); with CUDA the same cases also run bf16 and the realistic shape.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from gla_ref import device  # noqa: E402
from gla_ref.testing import as_torch, assert_close, random_inputs, recurrence64, to_numpy  # noqa: E402
from gla_ref.torch_ref import chunk_gla  # noqa: E402
from gla_ref.teaching.historical import fused_chunk_gla_historical  # noqa: E402
from gla_ref.teaching import historical as hist  # noqa: E402
from gla_ref.testing.triton_cases import bad_inputs, forbid_launch, poisoned  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = device.torch_device()
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
C = 16

# Relative RMSE bounds, one per input dtype, for every tensor (o, final state and each stage's
# output). fp32 matmuls are IEEE (worst seen ~9e-7, the GPU's approximate exp2); 16-bit inputs round
# q_g, k_g and o to their dtype (worst seen: fp16 ~4e-4, bf16 ~2e-3); "long" is the realistic
# B=4, T=4096, H=8, K=V=128 shape on a GPU (worst seen: fp32 1.4e-7, bf16 1.8e-3 on an H200).
TOL = {F32: 1e-5, F16: 5e-3, BF16: 3e-2}
TOL_LONG = {F32: 1e-4, BF16: 3e-2}


class Case(NamedTuple):
    dtype: torch.dtype
    B: int
    T: int
    H: int
    K: int
    V: int
    h0: bool = True
    final: bool = True
    scale: float | None = None
    tau: float = 4.0
    gate_dtype: torch.dtype = F32
    tol: dict = TOL


def _cases():
    half = [F16, BF16] if CUDA else [F16]
    cases = [Case(dtype, 2, 37, 2, 20, 24) for dtype in (F32, *half)]  # T not a multiple of 16, K ≠ V
    cases += [
        Case(F32, 1, 1, 1, 20, 24, h0=False, final=False),  # T = 1
        Case(F16, 1, 1, 1, 24, 20),
        Case(F32, 1, 32, 1, 16, 16, h0=False),  # T a multiple of 16, power-of-two dims
        Case(F32, 1, 23, 1, 24, 20, h0=True, final=False),
        Case(F32, 1, 23, 1, 24, 20, h0=False, final=True, scale=0.3),
        Case(F16, 1, 20, 1, 72, 80),  # BK = BV = 64: two key blocks × two value blocks
        Case(F32, 1, 19, 1, 100, 36),  # K = 100: two key blocks, the second one mostly masked
        Case(F32, 1, 50, 1, 20, 24, tau=0.05),  # fast decay: 2^b underflows to 0 inside a chunk, no NaN
        Case(F16, 1, 19, 1, 20, 24, gate_dtype=F16),  # 16-bit gates
    ]
    if CUDA:
        cases += [Case(dtype, 4, 4096, 8, 128, 128, tol=TOL_LONG) for dtype in (F32, BF16)]
    return cases


CASES = _cases()


def _case_id(c):
    return (f"{str(c.dtype)[6:]}-B{c.B}T{c.T}H{c.H}K{c.K}V{c.V}{'-h0' if c.h0 else ''}"
            f"{'-final' if c.final else ''}{f'-scale{c.scale}' if c.scale else ''}"
            f"{f'-tau{c.tau}' if c.tau != 4.0 else ''}{'-g16' if c.gate_dtype != F32 else ''}")


def _inputs(c):
    x = random_inputs(c.B, c.T, c.H, c.K, c.V, "gla", seed=c.T + c.K, tau=c.tau, initial_state=c.h0)
    t = as_torch(x, dtype=c.dtype, device=DEV)
    t["g"] = t["g"].to(c.gate_dtype)
    return t


def _f64(t):
    return {n: None if x is None else x.double() for n, x in t.items()}


# ----------------------------------------------------------------------------- float64 stage references

def _chunked(x, N):
    """``[B, T, H, D]`` → ``[B, N, 16, H, D]``, zero-padded."""
    B, T, H, D = x.shape
    return F.pad(x, (0, 0, 0, 0, 0, N * C - T)).view(B, N, C, H, D)


def _last_rows(T):
    """Index of each chunk's last real token."""
    return [min(n * C + C - 1, T - 1) for n in range(-(-T // C))]


def ref_decay_cumsum(g):
    B, T, H, K = g.shape
    return (_chunked(g, -(-T // C)).cumsum(2) / math.log(2)).reshape(B, -1, H, K)[:, :T]


def ref_prepare_qg_kg(q, k, b, scale):
    b_last = b[:, _last_rows(q.shape[1])].repeat_interleave(C, dim=1)[:, :q.shape[1]]
    return scale * q * 2 ** b, k * 2 ** (b_last - b)


def ref_inter_chunk(q_g, k_g, v, b, h0):
    B, T, H, K = q_g.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=v.dtype, device=v.device) if h0 is None else h0.clone()
    o = torch.zeros_like(v)
    for n, last in enumerate(_last_rows(T)):
        t = slice(n * C, last + 1)
        o[:, t] = torch.einsum("bthk,bhkv->bthv", q_g[:, t], S)
        S = 2 ** b[:, last, :, :, None] * S + torch.einsum("bthk,bthv->bhkv", k_g[:, t], v[:, t])
    return o, S


def ref_intra_chunk(q, k, b, scale):
    N = -(-q.shape[1] // C)
    qc, kc, bc = (_chunked(x, N) for x in (q, k, b))
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()[None, None, :, :, None, None]
    d = torch.where(causal, bc[:, :, :, None] - bc[:, :, None, :], -math.inf)  # b_i − b_j, [B, N, i, j, H, K]
    return scale * torch.einsum("bnihk,bnjhk,bnijhk->bhnij", qc, kc, 2 ** d)


def ref_combine(o_inter, A, v):
    o = o_inter.clone()
    for n, last in enumerate(_last_rows(v.shape[1])):
        L = last + 1 - n * C
        o[:, n * C:last + 1] += torch.einsum("bhij,bjhv->bihv", A[:, :, n, :L, :L], v[:, n * C:last + 1])
    return o


def test_float64_stages_compose_to_the_recurrence():
    """The stage references above, composed in float64, are the GLA recurrence (the stage tests rest on them)."""
    for T, h0 in ((37, True), (1, False), (32, True)):
        r = _f64(as_torch(random_inputs(2, T, 2, 20, 24, initial_state=h0), dtype=torch.float64, device=DEV))
        scale = 20 ** -0.5
        b = ref_decay_cumsum(r["g"])
        q_g, k_g = ref_prepare_qg_kg(r["q"], r["k"], b, scale)
        o_inter, S = ref_inter_chunk(q_g, k_g, r["v"], b, r["initial_state"])
        o = ref_combine(o_inter, ref_intra_chunk(r["q"], r["k"], b, scale), r["v"])
        ro, rS = recurrence64(*(to_numpy(r[n]) for n in ("q", "k", "v", "g")),
                              initial_state=None if r["initial_state"] is None else to_numpy(r["initial_state"]))
        assert_close("o", ro, o, 1e-12)
        assert_close("final_state", rS, S, 1e-12)


# ----------------------------------------------------------------------------- the pipeline and its stages

def _reference(r, c):
    """float64 (o, final state) of the kernel's own (rounded) inputs."""
    if c.T > 1024:  # the realistic shape: the chunked float64 reference on the GPU
        return chunk_gla(r["q"], r["k"], r["v"], r["g"], scale=c.scale, initial_state=r["initial_state"],
                         output_final_state=True, chunk_size=64)
    h0 = None if r["initial_state"] is None else to_numpy(r["initial_state"])
    return recurrence64(*(to_numpy(r[n]) for n in ("q", "k", "v", "g")), scale=c.scale, initial_state=h0)


@pytest.mark.parametrize("c", CASES, ids=_case_id)
def test_pipeline_against_float64_recurrence(c):
    t = _inputs(c)
    with torch.no_grad():
        o, ht = fused_chunk_gla_historical(t["q"], t["k"], t["v"], t["g"], scale=c.scale,
                                           initial_state=t["initial_state"], output_final_state=c.final)
    assert o.dtype == c.dtype and o.shape == (c.B, c.T, c.H, c.V)
    assert (ht is None) != c.final
    ro, rht = _reference(_f64(t), c)
    errors = {"o": assert_close("o", ro, o, c.tol[c.dtype])}
    if c.final:
        assert ht.dtype == F32 and ht.shape == (c.B, c.H, c.K, c.V)
        errors["final_state"] = assert_close("final_state", rht, ht, c.tol[c.dtype])
    print(_case_id(c), {k: f"{e:.1e}" for k, e in errors.items()})


@pytest.mark.parametrize("c", [c for c in CASES if c.T <= 1024], ids=_case_id)
def test_each_stage_against_float64(c):
    """Every intermediate, each against float64 arithmetic on the inputs that stage received."""
    t = _inputs(c)
    scale = c.K ** -0.5 if c.scale is None else c.scale
    NK, N, tol = -(-c.K // 64), -(-c.T // C), c.tol[c.dtype]
    errors = {}

    b = hist.historical_decay_cumsum(t["g"])  # 1
    assert b.dtype == F32 and b.shape == t["g"].shape
    errors["b"] = assert_close("b", ref_decay_cumsum(t["g"].double()), b, 1e-6)

    q_g, k_g = hist.historical_prepare_qg_kg(t["q"], t["k"], b, scale=c.scale)  # 2
    assert q_g.dtype == k_g.dtype == c.dtype
    ref_qg, ref_kg = ref_prepare_qg_kg(t["q"].double(), t["k"].double(), b.double(), scale)
    errors["q_g"] = assert_close("q_g", ref_qg, q_g, tol)
    errors["k_g"] = assert_close("k_g", ref_kg, k_g, tol)
    assert k_g.abs().le(t["k"].abs()).all(), "k_g = k ⊙ 2^(b_last − b) cannot grow"

    o_inter, ht = hist.historical_inter_chunk(q_g, k_g, t["v"], b, initial_state=t["initial_state"],
                                              output_final_state=c.final)  # 3
    assert o_inter.dtype == F32 and o_inter.shape == (NK, c.B, c.T, c.H, c.V)
    h0 = None if t["initial_state"] is None else t["initial_state"].double()
    ref_oi, ref_S = ref_inter_chunk(q_g.double(), k_g.double(), t["v"].double(), b.double(), h0)
    errors["o_inter"] = assert_close("o_inter", ref_oi, o_inter.sum(0), tol)
    if c.final:
        errors["final_state"] = assert_close("final_state", ref_S, ht, tol)
    else:
        assert ht is None

    A = hist.historical_intra_chunk(t["q"], t["k"], b, scale=c.scale)  # 4
    assert A.dtype == F32 and A.shape == (NK, c.B, c.H, N, C, C)
    errors["A"] = assert_close("A", ref_intra_chunk(t["q"].double(), t["k"].double(), b.double(), scale),
                               A.sum(0), tol)
    assert not A.triu(1).any(), "A must be exactly zero above the diagonal"
    past_T = torch.arange(N * C, device=DEV).view(N, C) >= c.T
    assert not A[..., past_T, :].any() and not A.transpose(-1, -2)[..., past_T, :].any()

    o = hist.historical_combine(o_inter, A, t["v"])  # 5
    errors["o"] = assert_close("o", ref_combine(o_inter.sum(0).double(), A.sum(0).double(), t["v"].double()),
                               o, tol)
    with torch.no_grad():
        o_all, _ = fused_chunk_gla_historical(t["q"], t["k"], t["v"], t["g"], scale=c.scale,
                                              initial_state=t["initial_state"])
    assert torch.equal(o, o_all), "the pipeline is the five stages run in order"
    print(_case_id(c), {k: f"{e:.1e}" for k, e in errors.items()})


def test_non_contiguous_inputs():
    """Views with other strides (here a [B, H, T, D] tensor transposed) give the same result."""
    x = as_torch(random_inputs(1, 5, 2, 16, 16, initial_state=True), device=DEV)
    heads_first = {n: x[n].transpose(1, 2).contiguous().transpose(1, 2) for n in ("q", "k", "v", "g")}
    assert not heads_first["q"].is_contiguous()
    args = dict(initial_state=x["initial_state"], output_final_state=True)
    o1, s1 = fused_chunk_gla_historical(x["q"], x["k"], x["v"], x["g"], **args)
    o2, s2 = fused_chunk_gla_historical(heads_first["q"], heads_first["k"], heads_first["v"], heads_first["g"], **args)
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    torch.testing.assert_close(s1, s2, rtol=0, atol=0)


# ----------------------------------------------------------------------------- forward only

def _small():
    return as_torch(random_inputs(1, 5, 1, 16, 16, initial_state=True), device=DEV)


def _stage_calls(x):
    """Each public function with its arguments (stage inputs made under no_grad)."""
    with torch.no_grad():
        b = hist.historical_decay_cumsum(x["g"])
        q_g, k_g = hist.historical_prepare_qg_kg(x["q"], x["k"], b)
        o_inter, _ = hist.historical_inter_chunk(q_g, k_g, x["v"], b)
        A = hist.historical_intra_chunk(x["q"], x["k"], b)
    return {  # name → (function, args, kwargs, the argument to mark as requiring grad)
        "pipeline": (fused_chunk_gla_historical, (x["q"], x["k"], x["v"], x["g"]), {}, "v"),
        "pipeline-h0": (fused_chunk_gla_historical, (x["q"], x["k"], x["v"], x["g"]),
                        dict(initial_state=x["initial_state"]), "initial_state"),
        "decay_cumsum": (hist.historical_decay_cumsum, (x["g"],), {}, "g"),
        "prepare_qg_kg": (hist.historical_prepare_qg_kg, (x["q"], x["k"], b), {}, "q"),
        "inter_chunk": (hist.historical_inter_chunk, (q_g, k_g, x["v"], b), {}, "k_g"),
        "intra_chunk": (hist.historical_intra_chunk, (x["q"], x["k"], b), {}, "b"),
        "combine": (hist.historical_combine, (o_inter, A, x["v"]), {}, "v"),
    }


STAGE_NAMES = ("pipeline", "pipeline-h0", "decay_cumsum", "prepare_qg_kg", "inter_chunk", "intra_chunk", "combine")
ARG_NAMES = {hist.historical_decay_cumsum: ("g",), hist.historical_prepare_qg_kg: ("q", "k", "b"),
             hist.historical_inter_chunk: ("q_g", "k_g", "v", "b"), hist.historical_intra_chunk: ("q", "k", "b"),
             hist.historical_combine: ("o_inter", "A", "v"), fused_chunk_gla_historical: ("q", "k", "v", "g")}


def _with_grad(fn, args, kwargs, name):
    """The call's arguments with ``name`` replaced by a copy that requires grad."""
    args, kwargs = list(args), dict(kwargs)
    if name in kwargs:
        kwargs[name] = kwargs[name].clone().requires_grad_()
    else:
        i = ARG_NAMES[fn].index(name)
        args[i] = args[i].clone().requires_grad_()
    return args, kwargs


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_requires_grad_is_refused_before_launch(stage, monkeypatch):
    """No backward exists, so an input that asks for gradients is an error (not a silent detach)."""
    fn, args, kwargs, name = _stage_calls(_small())[stage]
    args, kwargs = _with_grad(fn, args, kwargs, name)
    _forbid_launch(monkeypatch)
    with pytest.raises(ValueError, match=f"^{name} requires grad.*no backward"):
        fn(*args, **kwargs)


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_runs_under_no_grad_and_returns_no_graph(stage):
    fn, args, kwargs, name = _stage_calls(_small())[stage]
    expected = fn(*args, **kwargs)
    args, kwargs = _with_grad(fn, args, kwargs, name)
    with torch.no_grad():
        out = fn(*args, **kwargs)
    for e, x in zip(*((y if isinstance(y, tuple) else (y,)) for y in (expected, out))):
        if x is not None:
            assert not x.requires_grad
            torch.testing.assert_close(x, e, rtol=0, atol=0)


# ----------------------------------------------------------------------------- bad input

LAUNCHERS = ("launch_decay_cumsum", "launch_prepare_qg_kg", "launch_fused_chunk", "launch_inner_chunk")


def _forbid_launch(monkeypatch):
    """Any launch fails the test: errors must come from the checks made before it."""
    forbid_launch(monkeypatch, hist, LAUNCHERS)


def _good(B=1, T=3, H=1, K=8, V=8):
    return as_torch(random_inputs(B, T, H, K, V, initial_state=True), device=DEV)


def _bad_pipeline():
    x = _good()
    return {**bad_inputs(_good), "g-none": ((x["q"], x["k"], x["v"], None), {}, ValueError, "g is required")}


BAD = _bad_pipeline()


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_raises_before_launch(case, monkeypatch):
    args, kwargs, error, text = BAD[case]
    _forbid_launch(monkeypatch)
    with pytest.raises(error, match=text):
        fused_chunk_gla_historical(*args, **kwargs)


def _bad_stages():
    x = _good(T=20, K=20, V=24)
    q, k, v, g, h0 = x["q"], x["k"], x["v"], x["g"], x["initial_state"]
    b = torch.zeros(g.shape, device=DEV)
    o_inter = torch.zeros(1, *v.shape, device=DEV)
    A = torch.zeros(1, 1, 1, 2, C, C, device=DEV)
    D, P, I, Ch = (hist.historical_decay_cumsum, hist.historical_prepare_qg_kg, hist.historical_inter_chunk,
                   hist.historical_combine)
    return {  # name → (function, arguments, keyword arguments, error type, text the message must contain)
        "cumsum-g-rank": (D, (g[0],), {}, ValueError, "g must have shape"),
        "cumsum-g-list": (D, (g.tolist(),), {}, TypeError, "g must be a torch.Tensor"),
        "cumsum-g-float64": (D, (g.double(),), {}, TypeError, "g must be float16"),
        "cumsum-g-K>256": (D, (torch.zeros(1, 2, 1, 300, device=DEV),), {}, ValueError, "at most 256"),
        "prepare-b-half": (P, (q, k, b.half()), {}, TypeError, "b must have dtype float32"),
        "prepare-b-shape": (P, (q, k, b[:, :4]), {}, ValueError, r"b must have shape \(1, 20, 1, 20\)"),
        "prepare-k-dtype": (P, (q, k.half(), b), {}, TypeError, "k must have dtype float32"),
        "prepare-b-device": (P, (q, k, b.to("meta")), {}, ValueError, "b is on"),
        "prepare-scale": (P, (q, k, b), dict(scale=math.inf), ValueError, "scale"),
        "intra-q-int": (hist.historical_intra_chunk, (q.int(), k, b), {}, TypeError, "q must be float16"),
        "inter-v-dtype": (I, (q, k, v.half(), b), {}, TypeError, "v must have dtype float32"),
        "inter-v-shape": (I, (q, k, v[:, :3], b), {}, ValueError, "v must have shape"),
        "inter-h0-shape": (I, (q, k, v, b), dict(initial_state=h0[..., :4]), ValueError,
                           "initial_state must have shape"),
        "inter-h0-half": (I, (q, k, v, b), dict(initial_state=h0.half()), TypeError, "initial_state must have dtype"),
        "combine-A-chunks": (Ch, (o_inter, A[:, :, :, :1], v), {}, ValueError, "A must have shape"),
        "combine-A-rank": (Ch, (o_inter, A[0], v), {}, ValueError, "A must have shape"),
        "combine-o_inter-half": (Ch, (o_inter.half(), A, v), {}, TypeError, "o_inter must have dtype float32"),
        "combine-o_inter-T": (Ch, (o_inter[:, :, :5], A, v), {}, ValueError, "o_inter must have shape"),
    }


BAD_STAGES = _bad_stages()


@pytest.mark.parametrize("case", BAD_STAGES, ids=list(BAD_STAGES))
def test_bad_stage_input_raises_before_launch(case, monkeypatch):
    fn, args, kwargs, error, text = BAD_STAGES[case]
    _forbid_launch(monkeypatch)
    with pytest.raises(error, match=text):
        fn(*args, **kwargs)


CLEAN = _good()
POISONED = poisoned(CLEAN)


@pytest.mark.parametrize("case", POISONED, ids=list(POISONED))
def test_debug_mode_checks_values(case, monkeypatch):
    q, g, h0, name = POISONED[case]
    _forbid_launch(monkeypatch)
    with device.debug(True), pytest.raises(ValueError, match=f"^{name} "):
        fused_chunk_gla_historical(q, CLEAN["k"], CLEAN["v"], g, initial_state=h0)


def test_debug_mode_checks_stage_values(monkeypatch):
    """A positive cumulative gate b (not step 1's output) is caught before steps 2–4 in debug mode."""
    b = torch.zeros(CLEAN["g"].shape, device=DEV)
    b[0, 1, 0, 0] = 0.25
    _forbid_launch(monkeypatch)
    with device.debug(True):
        with pytest.raises(ValueError, match=r"^b must hold cumulative log2-gates <= 0 \(finite\), got 0.25 "
                                             r"at b\[b=0, t=1, h=0, k=0\]$"):
            hist.historical_intra_chunk(CLEAN["q"], CLEAN["k"], b)
        with pytest.raises(ValueError, match=r"^g must hold log forget gates <= 0 .*got NaN "
                                             r"at g\[b=0, t=0, h=0, k=0\]$"):
            hist.historical_decay_cumsum(torch.full_like(CLEAN["g"], math.nan))


def test_values_unchecked_without_debug():
    """No device sync by default: a positive gate is not looked for on the host, but step 1 turns it
    into NaN (tests/triton/test_gate_contract.py has every kernel and invalid value)."""
    q, g, h0, _ = POISONED["positive-g"]  # g[0, 2, 0, 3] = 0.5
    assert not device.is_debug()
    o, ht = fused_chunk_gla_historical(q, CLEAN["k"], CLEAN["v"], g, initial_state=h0, output_final_state=True)
    assert o.shape == CLEAN["v"].shape
    assert torch.isnan(o[0, 2:, 0]).all() and torch.isnan(ht[0, 0, 3]).all()
