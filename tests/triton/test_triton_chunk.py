"""Triton chunk_gla (materialised states, secondary chunking) against the float64 reference.

Each case checks o, the final state and every gradient (dq, dk, dv, dg, dh0) under random
cotangents on o and on the final state. On CPU the kernels run in Triton's interpreter (fp32 and
fp16, tiny shapes, chunk sizes 16/32/64); with CUDA the same cases also run bf16 and the realistic
shape B=4, T=4096, H=8, K=V=128.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gla_ref import device  # noqa: E402
from gla_ref.reference.gates import SAFE_DECAY  # noqa: E402
from gla_ref.testing import as_torch, assert_close, random_inputs  # noqa: E402
from gla_ref.testing.triton_cases import (bad_inputs, check_outputs, compare_with_reference,  # noqa: E402
                                          float64_copies, forbid_launch, poisoned)
from gla_ref.torch_ref import chunk_gla as chunk_ref  # noqa: E402
from gla_ref.torch_ref import recurrent_gla  # noqa: E402
from gla_ref.triton import chunk as chunk_module  # noqa: E402
from gla_ref.triton import chunk_gla  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = device.torch_device()
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# Relative RMSE bounds per input dtype, for every tensor (o, final state, dq, dk, dv, dg, dh0).
# fp32 runs IEEE dots (worst seen ~1e-6, 2e-5 for dg under very fast decay: the closed form
# subtracts large q·dq and k·dk terms); fp16 rounds inputs, outputs and the operands of the
# half-precision matmuls (worst seen ~5e-4); bf16 has 8 mantissa bits (worst seen 3e-3 on an H200).
TOL = {F32: 1e-4, F16: 5e-3, BF16: 3e-2}
TOL_LONG = {F32: 1e-4, BF16: 3e-2}  # T = 4096: longer sums, states rounded to the operand dtype


MIXED_TAU = 0.25
"""A gate temperature whose 16-token sub-chunks of the T=70 case decay by 60-72 nats: two take the diagonal
tiles' exact form, two the fast form with key factors up to e^62 (test_mixed_case_takes_both_forms)."""

CHUNK_TAU = 0.9
"""A gate temperature whose two full 64-token chunks of the T=140 case decay by 67 and 61 nats: the first builds A
by sub-chunks, the second as one whole-chunk matmul with key factors up to e^61 (test_chunk_case_takes_both_forms)."""


class Case(NamedTuple):
    dtype: torch.dtype
    B: int
    T: int
    H: int
    K: int
    V: int
    C: int = 64
    h0: bool = True
    final: bool = True
    tau: float = 4.0  # gate temperature: small tau = fast decay
    gate_dtype: torch.dtype | None = None  # None: float32 gates
    tol: dict = TOL


def _cases():
    half = [F16, BF16] if CUDA else [F16]
    cases = [Case(dtype, 2, 37, 2, 20, 24, C=C) for dtype in (F32, *half) for C in (16, 32, 64)]
    cases += [
        Case(F32, 1, 1, 1, 20, 24, h0=False, final=False),  # T = 1
        Case(F32, 1, 70, 1, 24, 20, C=32, h0=True, final=False),  # T spans 3 chunks, the last partial
        Case(F32, 1, 70, 1, 24, 20, h0=False, final=True),
        Case(F16, 1, 40, 1, 40, 48, C=32),  # two key and two value blocks of 32
        Case(F32, 1, 19, 1, 100, 72, C=16),  # K = 100: a partial second key block of 64
        Case(F16, 1, 19, 1, 20, 24, gate_dtype=F16),  # 16-bit gates: dg comes back in fp16
        Case(F32, 1, 70, 1, 20, 24, tau=0.05),  # gates near -14 per token: Γ reaches ~-900 in a chunk
        *(Case(dtype, 1, 70, 1, 20, 24, tau=MIXED_TAU) for dtype in (F32, *half)),  # both diagonal forms
        *(Case(dtype, 1, 140, 1, 20, 24, tau=CHUNK_TAU) for dtype in (F32, *half)),  # whole chunk and sub-chunks
        Case(F32, 1, 70, 1, 64, 256, C=32),  # V = 256, the largest value dimension
    ]
    if CUDA:
        cases += [Case(F32, 4, 4096, 8, 128, 128, tol=TOL_LONG), Case(BF16, 4, 4096, 8, 128, 128, tol=TOL_LONG)]
        cases += [Case(dtype, 2, 1000, 2, 64, 256) for dtype in (F16, BF16)]  # V = 256, partial last chunk
        cases += [Case(BF16, 1, 200, 2, 256, 64)]  # K = 256
    return cases


def _case_id(c):
    return (f"{str(c.dtype)[6:]}-B{c.B}T{c.T}H{c.H}K{c.K}V{c.V}-C{c.C}{'-h0' if c.h0 else ''}"
            f"{'-final' if c.final else ''}{f'-tau{c.tau}' if c.tau != 4.0 else ''}{'-g16' if c.gate_dtype else ''}")


@pytest.mark.parametrize("c", _cases(), ids=_case_id)
def test_against_float64_reference(c):
    x = random_inputs(c.B, c.T, c.H, c.K, c.V, "gla", seed=c.T + c.K + c.C, tau=c.tau, initial_state=c.h0)
    t = as_torch(x, dtype=c.dtype, device=DEV)
    if c.gate_dtype is not None:
        t["g"] = t["g"].to(c.gate_dtype)
    names = [n for n in ("q", "k", "v", "g", "initial_state") if t[n] is not None]
    for n in names:
        t[n].requires_grad_()
    o, ht = chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                      output_final_state=c.final, chunk_size=c.C)
    check_outputs(c, o, ht)

    # the reference runs in float64 on the kernel's own (rounded) inputs
    r = float64_copies(t)
    form, extra = (chunk_ref, {"chunk_size": 16}) if c.T > 1024 else (recurrent_gla, {})
    ro, rht = form(r["q"], r["k"], r["v"], r["g"], initial_state=r["initial_state"], output_final_state=c.final,
                   **extra)
    compare_with_reference(c, t, r, names, (o, ht), (ro, rht), _case_id(c), DEV)


def test_mixed_case_takes_both_forms():
    """The MIXED_TAU case's sub-chunks straddle SAFE_DECAY, so its kernels run both forms of the diagonal tiles
    (the fast one where every decay from the sub-chunk's first token is within it) in one call."""
    g = random_inputs(1, 70, 1, 20, 24, "gla", seed=70 + 20 + 64, tau=MIXED_TAU)["g"][0, :, 0]
    decays = [(-g[p + 1:p + 16].sum(0)).max() for p in range(0, 64, 16)]  # b_p − b_{p+15}, the steepest key
    assert min(decays) <= SAFE_DECAY < max(decays), decays


def test_chunk_case_takes_both_forms():
    """The CHUNK_TAU case's two full chunks straddle SAFE_DECAY, so the forward builds A as one whole-chunk matmul
    in one of them and by sub-chunks in the other, in one call."""
    g = random_inputs(1, 140, 1, 20, 24, "gla", seed=140 + 20 + 64, tau=CHUNK_TAU)["g"][0, :, 0]
    decays = [(-g[s + 1:s + 64].sum(0)).max() for s in (0, 64)]  # b_s − b_{s+63}, the steepest key
    assert min(decays) <= SAFE_DECAY < max(decays), decays


def test_only_final_state_cotangent():
    """A loss on the final state alone still reaches q (no), k, v, g and h0 through dS_N."""
    t = as_torch(random_inputs(1, 21, 1, 16, 16, seed=3, initial_state=True), device=DEV, requires_grad=True)
    _, ht = chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                      output_final_state=True, chunk_size=16)
    r = {n: a.detach().double().requires_grad_() for n, a in t.items()}
    _, rht = recurrent_gla(r["q"], r["k"], r["v"], r["g"], initial_state=r["initial_state"], output_final_state=True)
    ht.sum().backward()
    rht.sum().backward()
    assert torch.count_nonzero(t["q"].grad) == 0  # the final state does not depend on q
    for n in ("k", "v", "g", "initial_state"):
        assert_close("d" + n, r[n].grad, t[n].grad, TOL[F32])


def test_non_contiguous_inputs():
    """Views with other strides (a [B, H, T, D] tensor transposed) give the same result."""
    x = as_torch(random_inputs(1, 5, 2, 16, 16, initial_state=True), device=DEV)
    heads_first = {n: x[n].transpose(1, 2).contiguous().transpose(1, 2) for n in ("q", "k", "v", "g")}
    assert not heads_first["q"].is_contiguous()
    args = {"initial_state": x["initial_state"], "output_final_state": True, "chunk_size": 16}
    o1, s1 = chunk_gla(x["q"], x["k"], x["v"], x["g"], **args)
    o2, s2 = chunk_gla(heads_first["q"], heads_first["k"], heads_first["v"], heads_first["g"], **args)
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    torch.testing.assert_close(s1, s2, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [F32, F16, *([BF16] if CUDA else [])], ids=lambda d: str(d)[6:])
def test_states_in_fp32_option(dtype):
    """Both state dtypes of the forward against the float64 reference, o, the final state and every
    gradient. The output kernel rounds each state to q's dtype for its matmul, so storing it rounded
    gives the same o bit for bit; the backward recomputes float32 states either way."""
    c = Case(dtype, 2, 70, 2, 24, 20, C=32)
    runs = {}
    for flag in (False, True):
        t = as_torch(random_inputs(c.B, c.T, c.H, c.K, c.V, "gla", seed=11, initial_state=True), dtype=dtype,
                     device=DEV, requires_grad=True)
        names = ["q", "k", "v", "g", "initial_state"]
        o, ht = chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"], output_final_state=True,
                          chunk_size=c.C, states_in_fp32=flag)
        r = float64_copies(t)
        ro, rht = recurrent_gla(r["q"], r["k"], r["v"], r["g"], initial_state=r["initial_state"],
                                output_final_state=True)
        compare_with_reference(c, t, r, names, (o, ht), (ro, rht), f"states_in_fp32={flag}", DEV)
        assert ht.dtype == F32
        runs[flag] = (o.detach(), ht.detach(), *(t[n].grad for n in names))
    for got16, got32 in zip(runs[False], runs[True]):
        torch.testing.assert_close(got16, got32, rtol=0, atol=0)


def test_scale_is_used():
    x = as_torch(random_inputs(1, 9, 1, 16, 16), device=DEV)
    o, _ = chunk_gla(x["q"], x["k"], x["v"], x["g"], scale=0.3, chunk_size=16)
    ro, _ = recurrent_gla(*(x[n].double() for n in ("q", "k", "v", "g")), scale=0.3)
    assert_close("o", ro, o, TOL[F32])


# ----------------------------------------------------------------------------- bad input

def _good(B=1, T=3, H=1, K=8, V=8):
    return as_torch(random_inputs(B, T, H, K, V, initial_state=True), device=DEV)


def _bad_inputs():
    x = _good()
    q, k, v, g = x["q"], x["k"], x["v"], x["g"]
    return {  # the shared cases, then chunk_gla's own
        **bad_inputs(_good),
        "g-none": ((q, k, v, None), {}, ValueError, "g is required"),
        "final-not-bool": ((q, k, v, g), {"output_final_state": "yes"}, TypeError, "output_final_state"),
        "chunk_size-20": ((q, k, v, g), {"chunk_size": 20}, ValueError, "chunk_size"),
        "chunk_size-128": ((q, k, v, g), {"chunk_size": 128}, ValueError, "chunk_size"),
        "chunk_size-True": ((q, k, v, g), {"chunk_size": True}, ValueError, "chunk_size"),
        "states_in_fp32-int": ((q, k, v, g), {"states_in_fp32": 1}, TypeError, "states_in_fp32"),
        "states_in_fp32-None": ((q, k, v, g), {"states_in_fp32": None}, TypeError, "states_in_fp32"),
        "states_in_fp32-dtype": ((q, k, v, g), {"states_in_fp32": torch.float32}, TypeError, "states_in_fp32"),
    }


BAD = _bad_inputs()


@pytest.fixture
def no_launch(monkeypatch):
    """Any launch fails the test: errors must come from the checks made before it."""
    forbid_launch(monkeypatch, chunk_module.ChunkGLAFunction, ["apply"])


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_raises_before_launch(case, no_launch):
    args, kwargs, error, text = BAD[case]
    with pytest.raises(error, match=text):
        chunk_gla(*args, **kwargs)


CLEAN = _good()
POISONED = poisoned(CLEAN)


@pytest.mark.parametrize("case", POISONED, ids=list(POISONED))
def test_debug_mode_checks_values(case, no_launch):
    q, g, h0, name = POISONED[case]
    with device.debug(True), pytest.raises(ValueError, match=f"^{name} "):
        chunk_gla(q, CLEAN["k"], CLEAN["v"], g, initial_state=h0)


def test_values_unchecked_without_debug():
    """No device sync by default: a positive gate is not looked for on the host, but the cumsum
    kernel turns it into NaN (tests/triton/test_gate_contract.py has every kernel and invalid value)."""
    q, g, h0, _ = POISONED["positive-g"]  # g[0, 2, 0, 3] = 0.5
    assert not device.is_debug()
    o, ht = chunk_gla(q, CLEAN["k"], CLEAN["v"], g, initial_state=h0, chunk_size=16, output_final_state=True)
    assert o.shape == CLEAN["v"].shape
    assert torch.isnan(o[0, 2:, 0]).all() and torch.isnan(ht[0, 0, 3]).all()


# ----------------------------------------------------------------------------- backward steps: dA, intra-chunk dq/dk

from gla_ref.triton.chunk.backward import chunk_bwd_dA  # noqa: E402
from gla_ref.triton.chunk.backward_intra import chunk_bwd_dqk_intra  # noqa: E402
from gla_ref.triton.chunk.cumsum import chunk_local_cumsum  # noqa: E402


class StepCase(NamedTuple):
    dtype: torch.dtype
    B: int
    T: int
    H: int
    K: int  # K for the intra-chunk step, V for dA
    C: int
    tau: float = 4.0


STEP_CASES = [
    StepCase(F32, 1, 1, 1, 20, 64),  # T = 1
    StepCase(F32, 2, 37, 2, 20, 16),  # T not a multiple of C, partial last chunk and sub-chunk
    StepCase(F32, 1, 37, 2, 24, 32),
    StepCase(F32, 1, 70, 1, 100, 64),  # two key blocks of 64 (the second partial); V = 100: four blocks of 32 on CPU
    StepCase(F16, 1, 70, 2, 40, 32),
    StepCase(F32, 1, 70, 1, 20, 64, tau=0.05),  # gates near -14 per token
    *([StepCase(BF16, 2, 300, 4, 128, 64)] if CUDA else []),
]


def _step_id(c):
    return f"{str(c.dtype)[6:]}-B{c.B}T{c.T}H{c.H}D{c.K}-C{c.C}{f'-tau{c.tau}' if c.tau != 4.0 else ''}"


def _chunk_rows(T, C):
    """Row ranges of the chunks of a length-T sequence."""
    return [slice(s, min(s + C, T)) for s in range(0, T, C)]


@pytest.mark.parametrize("c", STEP_CASES, ids=_step_id)
def test_bwd_dA_step(c):
    """dA[t, s] = scale · ⟨dO_t, v_s⟩ for s ≤ t in t's chunk (column s − chunk start), 0 elsewhere."""
    gen = torch.Generator().manual_seed(c.T + c.K)
    v, do = (torch.randn(c.B, c.T, c.H, c.K, generator=gen).to(c.dtype).to(DEV) for _ in range(2))
    dA = chunk_bwd_dA(v, do, 0.7, c.C)
    assert dA.dtype == F32 and dA.shape == (c.B, c.T, c.H, c.C)
    ref = torch.zeros(dA.shape, dtype=torch.float64)
    for rows in _chunk_rows(c.T, c.C):
        L = rows.stop - rows.start
        block = 0.7 * torch.einsum("bthv,bshv->bths", do[:, rows].double().cpu(), v[:, rows].double().cpu())
        ref[:, rows, :, :L] = block.where(torch.ones(L, L, dtype=torch.bool).tril()[:, None, :], 0.0)
    assert_close("dA", ref, dA, TOL[c.dtype])


def _dqk_intra_reference(q, k, b, dA, C):
    """float64 dq_r = Σ_{s ≤ r} dA[r, s] k_s ⊙ exp(b_r − b_s), dk_s = Σ_{r ≥ s} dA[r, s] q_r ⊙ exp(b_r − b_s),
    r and s in one chunk (entries of dA above the diagonal ignored)."""
    q, k, b, dA = (x.double().cpu() for x in (q, k, b, dA))
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    for rows in _chunk_rows(q.shape[1], C):
        L = rows.stop - rows.start
        causal = torch.ones(L, L, dtype=torch.bool).tril()[None, :, :, None, None]
        diff = b[:, rows, None] - b[:, None, rows]  # [B, r, s, H, K]
        decay = torch.where(causal, torch.exp(torch.where(causal, diff, 0.0)), 0.0)
        D = dA[:, rows, :, :L].permute(0, 1, 3, 2)  # [B, r, s, H]
        dq[:, rows] = torch.einsum("brsh,brshk,bshk->brhk", D, decay, k[:, rows])
        dk[:, rows] = torch.einsum("brsh,brshk,brhk->bshk", D, decay, q[:, rows])
    return dq, dk


@pytest.mark.parametrize("c", STEP_CASES, ids=_step_id)
def test_bwd_dqk_intra_step(c):
    """The intra-chunk dq, dk from a random dA (entries above the diagonal too: the kernel must mask them)."""
    x = random_inputs(c.B, c.T, c.H, c.K, 16, "gla", seed=c.T + c.C, tau=c.tau)
    t = as_torch(x, dtype=c.dtype, device=DEV)
    b = chunk_local_cumsum(t["g"], c.C)
    dA = torch.randn(c.B, c.T, c.H, c.C, generator=torch.Generator().manual_seed(c.K)).to(DEV)
    dq, dk = chunk_bwd_dqk_intra(t["q"], t["k"], b, dA, c.C)
    assert dq.dtype == dk.dtype == F32 and dq.shape == dk.shape == t["q"].shape
    ref_dq, ref_dk = _dqk_intra_reference(t["q"], t["k"], b, dA, c.C)
    assert_close("dq_intra", ref_dq, dq, TOL[c.dtype])
    assert_close("dk_intra", ref_dk, dk, TOL[c.dtype])


# ----------------------------------------------------------------------------- forward steps: A, states, output

from gla_ref.triton.chunk.cumsum import chunk_gates_and_operands  # noqa: E402
from gla_ref.triton.chunk.intra import chunk_intra_attention  # noqa: E402
from gla_ref.triton.chunk.output import chunk_output  # noqa: E402
from gla_ref.triton.chunk.state import chunk_state_fwd  # noqa: E402


def _step_inputs(c):
    """Kernel inputs of a step case (V = K + 7: never a power of two here), gates accumulated per chunk."""
    t = as_torch(random_inputs(c.B, c.T, c.H, c.K, c.K + 7, "gla", seed=c.T + c.K, tau=c.tau, initial_state=True),
                 dtype=c.dtype, device=DEV)
    return t, chunk_local_cumsum(t["g"], c.C)


@pytest.mark.parametrize("c", STEP_CASES, ids=_step_id)
def test_fwd_intra_A_step(c):
    """A[r, s] = scale · Σ_d q_rd k_sd exp(b_rd − b_sd) for s ≤ r in one chunk, exactly 0 above."""
    t, b = _step_inputs(c)
    A = chunk_intra_attention(t["q"], t["k"], b, 0.7, c.C)
    assert A.dtype == t["q"].dtype and A.shape == (c.B, c.T, c.H, c.C)  # stored in the input dtype
    q, k, g = (x.double().cpu() for x in (t["q"], t["k"], b))
    ref = torch.zeros(A.shape, dtype=torch.float64)
    for rows in _chunk_rows(c.T, c.C):
        L = rows.stop - rows.start
        causal = torch.ones(L, L, dtype=torch.bool).tril()[None, :, :, None, None]
        decay = torch.exp(torch.where(causal, g[:, rows, None] - g[:, None, rows], -torch.inf))  # [B, r, s, H, K]
        ref[:, rows, :, :L] = 0.7 * torch.einsum("brhk,bshk,brshk->brhs", q[:, rows], k[:, rows], decay)
    assert_close("A", ref, A, TOL[c.dtype])
    r = torch.arange(c.T) % c.C
    above = (torch.arange(c.C)[None, :] > r[:, None])[None, :, None, :].expand(A.shape)
    assert torch.count_nonzero(A.cpu()[above]) == 0


@pytest.mark.parametrize("c", STEP_CASES, ids=_step_id)
def test_fwd_decayed_operands_step(c):
    """Step 1's extra outputs: qt = scale · Q ⊙ exp(b) and kt = K ⊙ exp(b_last − b) per chunk (b_last the
    chunk's last real row), in q's dtype, and b as chunk_local_cumsum gives it (to float32 rounding: on a GPU
    the two compiled kernels may sum a chunk in different orders)."""
    t, b = _step_inputs(c)
    b2, qt, kt = chunk_gates_and_operands(t["q"], t["k"], t["g"], 0.7, c.C)
    assert_close("b", b.double(), b2, 1e-6)
    assert qt.dtype == kt.dtype == c.dtype and qt.shape == kt.shape == t["q"].shape
    q, k, g = (x.double().cpu() for x in (t["q"], t["k"], b))
    last = torch.cat([g[:, rows.stop - 1:rows.stop].expand(-1, rows.stop - rows.start, -1, -1)
                      for rows in _chunk_rows(c.T, c.C)], dim=1)
    assert_close("qt", 0.7 * q * g.exp(), qt, TOL[c.dtype])
    assert_close("kt", k * (last - g).exp(), kt, TOL[c.dtype])


@pytest.mark.parametrize("decayed", [False, True], ids=["k-and-b", "decayed-k"])
@pytest.mark.parametrize("states_in_fp32", [False, True], ids=["states-input-dtype", "states-fp32"])
@pytest.mark.parametrize("c", STEP_CASES, ids=_step_id)
def test_fwd_state_step(c, states_in_fp32, decayed):
    """h[:, :, n] is the state entering chunk n and ht the final state, from the float64 token recurrence;
    h in k's dtype unless ``states_in_fp32``, the final state always float32. The kernel reads k and b
    (the backward's recomputation) or K ⊙ Γ from step 1 and only each chunk's last b row (the forward)."""
    t, b = _step_inputs(c)
    k_in = chunk_gates_and_operands(t["q"], t["k"], t["g"], 0.7, c.C)[2] if decayed else t["k"]
    h, ht = chunk_state_fwd(k_in, t["v"], b, t["initial_state"], True, c.C, states_in_fp32=states_in_fp32,
                            decayed=decayed)
    N = -(-c.T // c.C)
    assert h.dtype == (F32 if states_in_fp32 else c.dtype) and ht.dtype == F32
    assert ht.shape == t["initial_state"].shape
    assert h.shape == (c.B, c.H, N, c.K, c.K + 7)
    k, v, g, S = (x.double().cpu() for x in (t["k"], t["v"], t["g"], t["initial_state"]))
    ref = []
    for i in range(c.T):
        if i % c.C == 0:
            ref.append(S)
        S = S * g[:, i].exp()[..., None] + k[:, i, :, :, None] * v[:, i, :, None, :]
    assert_close("h", torch.stack(ref, dim=2), h, TOL[c.dtype])
    assert_close("ht", S, ht, TOL[c.dtype])


@pytest.mark.parametrize("c", STEP_CASES, ids=_step_id)
def test_fwd_output_step(c):
    """O_n = scale · (Q_n ⊙ exp b_n) S_n + (A_n ⊙ M) V_n from random states and a random A whose entries above
    the diagonal must be ignored."""
    t, b = _step_inputs(c)
    gen = torch.Generator().manual_seed(c.T + c.C)
    N, V = -(-c.T // c.C), c.K + 7
    h = torch.randn(c.B, c.H, N, c.K, V, generator=gen).to(DEV)
    A = torch.randn(c.B, c.T, c.H, c.C, generator=gen).to(DEV)
    o = chunk_output(chunk_gates_and_operands(t["q"], t["k"], t["g"], 0.7, c.C)[1], t["v"], h, A, c.C)
    assert o.dtype == c.dtype and o.shape == t["v"].shape
    q, v, g, h, A = (x.double().cpu() for x in (t["q"], t["v"], b, h, A))
    ref = torch.zeros(o.shape, dtype=torch.float64)
    for n, rows in enumerate(_chunk_rows(c.T, c.C)):
        L = rows.stop - rows.start
        A_n = A[:, rows, :, :L] * torch.ones(L, L, dtype=torch.float64).tril()[None, :, None, :]
        ref[:, rows] = (0.7 * torch.einsum("bthk,bhkv->bthv", q[:, rows] * g[:, rows].exp(), h[:, :, n])
                        + torch.einsum("bths,bshv->bthv", A_n, v[:, rows]))
    assert_close("o", ref, o, TOL[c.dtype])
