"""Triton chunk_gla (materialised states, secondary chunking) against the float64 reference.

Each case checks o, the final state and every gradient (dq, dk, dv, dg, dh0) under random
cotangents on o and on the final state. On CPU the kernels run in Triton's interpreter (fp32 and
fp16, tiny shapes, chunk sizes 16/32/64); with CUDA the same cases also run bf16 and the realistic
shape B=4, T=4096, H=8, K=V=128.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from gla_ref import device
from gla_ref.testing import as_torch, assert_close, random_inputs
from gla_ref.torch_ref import chunk_gla as chunk_ref
from gla_ref.torch_ref import recurrent_gla
from gla_ref.triton import chunk as chunk_module
from gla_ref.triton import chunk_gla
from triton_cases import bad_inputs, check_outputs, compare_with_reference, float64_copies, forbid_launch, poisoned

CUDA = torch.cuda.is_available()
DEV = device.torch_device()
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# Relative RMSE bounds per input dtype, for every tensor (o, final state, dq, dk, dv, dg, dh0).
# fp32 runs IEEE dots (worst seen ~1e-6, 2e-5 for dg under very fast decay: the closed form
# subtracts large q·dq and k·dk terms); fp16 rounds inputs, outputs and the operands of the
# half-precision matmuls (worst seen ~5e-4); bf16 has 8 mantissa bits (worst seen 3e-3 on an H200).
TOL = {F32: 1e-4, F16: 5e-3, BF16: 3e-2}
TOL_LONG = {F32: 1e-4, BF16: 3e-2}  # T = 4096: longer sums, states rounded to the operand dtype


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
    ]
    if CUDA:
        cases += [Case(F32, 4, 4096, 8, 128, 128, tol=TOL_LONG), Case(BF16, 4, 4096, 8, 128, 128, tol=TOL_LONG)]
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
    """No device sync by default: a positive gate is not looked for, the kernels just run."""
    q, g, h0, _ = POISONED["positive-g"]
    assert not device.is_debug()
    o, _ = chunk_gla(q, CLEAN["k"], CLEAN["v"], g, initial_state=h0, chunk_size=16)
    assert o.shape == CLEAN["v"].shape
