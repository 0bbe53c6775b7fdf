"""Triton fused kernels (fused_recurrent_gla, fused_chunk_gla) against the float64 reference.

Every case checks o, the final state and every gradient (q, k, v, g, initial_state) under
cotangents on o and on the final state. On CPU the kernels run in Triton's interpreter (fp32,
fp16, tiny shapes); with CUDA the same cases also run bf16 and the realistic shape.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from gla_ref import device  # noqa: E402
from gla_ref.reference.gates import SAFE_DECAY  # noqa: E402
from gla_ref.testing import as_torch, random_inputs, rel_rmse  # noqa: E402
from gla_ref.testing.triton_cases import (Allocations, bad_inputs, check_outputs, compare_with_reference,  # noqa: E402
                                          float64_copies, forbid_launch, grads, poisoned)
from gla_ref.torch_ref import chunk_gla, recurrent_gla  # noqa: E402
from gla_ref.triton import fused_chunk as fused_chunk_module  # noqa: E402
from gla_ref.triton import fused_chunk_gla, fused_recurrent_gla  # noqa: E402
from gla_ref.triton.fused_chunk import backward as fused_chunk_bwd, forward as fused_chunk_fwd  # noqa: E402
from gla_ref.triton import fused_recurrent as fused_recurrent_module  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = device.torch_device()
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# Relative RMSE bounds, one per input dtype, for every tensor (o, final state, dq, dk, dv, dg, dh0).
# Worst seen (CPU interpreter and an H200): fp32 3e-6 (IEEE matmuls); fp16 1e-3 and bf16 2.3e-3,
# which round o and the gradients to 16 bits (the chunk kernel also its P·V operands). TOL_LONG is
# the realistic T = 4096 shape (GPU only), where dg sums 4096 rounded terms: fp32 4.5e-6, bf16 5.8e-3.
# fp32 has room up to 2e-5 for the one-token case (T = 1, K = 20, seed 21): o is then one dot product of 20 terms
# that cancel 110-fold (Σ|q k| = 13.2, Σ q k = −0.12), so float32's rounding of each term, made once more by the
# fast form's split exponents, comes out 110 times larger: 1.09e-5 under the interpreter on an AMD EPYC (whose
# float32 matmul is OpenBLAS's, its summation order chosen by the CPU it runs on), 6e-7 where the terms do not cancel.
TOL = {F32: 2e-5, F16: 5e-3, BF16: 1e-2}
TOL_LONG = {F32: 2e-5, BF16: 2e-2}

KERNELS = {"recurrent": fused_recurrent_gla, "chunk": fused_chunk_gla}


class Case(NamedTuple):
    kernel: str
    dtype: torch.dtype
    B: int
    T: int
    H: int
    K: int
    V: int
    gate: str = "gla"
    h0: bool = True
    final: bool = True
    opts: dict = {}
    gate_dtype: torch.dtype | None = None  # None: float32 gates
    tol: dict = TOL
    tau: float = 4.0  # log-gates logsigmoid(x) / tau (random_inputs' default)


# Gates steep enough that one call of fused_chunk_gla takes both forms of the intra-chunk sums: some chunks
# decay by at most SAFE_DECAY from their start (max over keys of −Σ g over the chunk's tokens: the fast form),
# others by more (the exact form; past 88.7 nats the fast form's exp(−b) would overflow float32). The decays
# noted are the seeded gates'; test_straddle_cases_take_both_forms checks that each case straddles SAFE_DECAY.
STEEP_F16 = {**TOL, F16: 1e-2}
STRADDLE = [
    Case("chunk", F32, 2, 37, 2, 20, 24, tau=0.2),  # C = 16: full chunks 80 to 91 nats, the last (5 tokens) 32 to 39
    # fp16 at ~5 nats a token: dg 6.5e-3 and 7.4e-3 on the H200 in either form (the exact form alone, forced, gives
    # the same: the TF32 state matmuls, with dg a difference of far larger q ⊙ dq and k ⊙ dk), hence 1e-2
    Case("chunk", F16, 2, 37, 2, 20, 24, tau=0.2, tol=STEEP_F16),
    Case("chunk", F32, 2, 48, 2, 20, 24, tau=0.25),  # full chunks only, 59 to 77 nats
    Case("chunk", F32, 1, 100, 1, 16, 16, opts=dict(chunk_size=32), tau=0.3),  # 96, 102, 118 and 18 nats
    Case("chunk", F32, 1, 160, 1, 16, 16, h0=False, opts=dict(chunk_size=64), tau=0.6),  # 92, 104 and 49 nats
    # the first chunk decays by 74 nats over keys 0–63 but by 60 over keys 64–71, the second key block of
    # the dq and dk kernels: one chunk, both forms (the last chunk, 28 nats, is fast everywhere)
    Case("chunk", F16, 1, 20, 1, 72, 80, tau=0.25, tol=STEEP_F16),
]


def _cases():
    half = [F16, BF16] if CUDA else [F16]
    cases = []
    for kernel in KERNELS:
        for dtype in [F32, *half]:  # the main shape: T = 37 (not a multiple of 16), K ≠ V, neither a power of 2
            cases.append(Case(kernel, dtype, 2, 37, 2, 20, 24))
        cases += [
            Case(kernel, F32, 1, 1, 1, 20, 24, h0=False, final=False),  # T = 1
            Case(kernel, F32, 1, 37, 2, 20, 24, gate="none"),  # plain linear attention
            Case(kernel, F32, 1, 23, 1, 24, 20, h0=True, final=False),
            Case(kernel, F32, 1, 23, 1, 24, 20, h0=False, final=True),
            Case(kernel, F16, 1, 19, 1, 20, 24, gate_dtype=F16),  # 16-bit gates
        ]
    cases += [
        Case("recurrent", F32, 2, 19, 1, 20, 24, opts=dict(reverse=True)),
        Case("recurrent", F16, 1, 19, 1, 100, 72),  # K = 100 → BK = 128, BV = 32: three value blocks
        Case("chunk", F16, 1, 20, 1, 72, 80),  # 128 × 64 state tiles: 2 value blocks (o, dv), 2 key blocks (dq, dk)
        Case("chunk", F16, 1, 9, 1, 256, 200),  # the largest K: 256 × 32 tiles (o, dv), 32 × 256 (dq, dk)
        Case("chunk", F32, 1, 70, 1, 16, 16, opts=dict(chunk_size=32)),
        Case("chunk", F32, 1, 70, 1, 16, 16, h0=False, opts=dict(chunk_size=64)),
        *STRADDLE,
    ]
    if CUDA:  # the realistic shape
        cases += [Case(kernel, dtype, 4, 4096, 8, 128, 128, tol=TOL_LONG)
                  for kernel in KERNELS for dtype in (F32, BF16)]
    return cases


def _case_id(c):
    opts = "-".join(f"{k}{v}" for k, v in c.opts.items())
    return (f"{c.kernel}-{str(c.dtype)[6:]}-B{c.B}T{c.T}H{c.H}K{c.K}V{c.V}-{c.gate}"
            f"{'-h0' if c.h0 else ''}{'-final' if c.final else ''}{'-' + opts if opts else ''}"
            f"{'-g16' if c.gate_dtype else ''}{f'-tau{c.tau}' if c.tau != Case._field_defaults['tau'] else ''}")


def _inputs(c):
    """The case's seeded float64 inputs as NumPy arrays."""
    return random_inputs(c.B, c.T, c.H, c.K, c.V, c.gate, seed=c.T + c.K, tau=c.tau, initial_state=c.h0)


def _reference(t, c):
    """float64 reference on the kernel's own (rounded) inputs; ``reverse`` by flipping time."""
    flip = (lambda x: None if x is None else x.flip(1)) if c.opts.get("reverse") else (lambda x: x)
    form = chunk_gla if c.T > 1024 else recurrent_gla
    extra = dict(chunk_size=16) if form is chunk_gla else {}
    o, ht = form(flip(t["q"]), flip(t["k"]), flip(t["v"]), flip(t["g"]), initial_state=t["initial_state"],
                 output_final_state=c.final, **extra)
    return flip(o), ht


@pytest.mark.parametrize("c", _cases(), ids=_case_id)
def test_against_float64_reference(c):
    t = as_torch(_inputs(c), dtype=c.dtype, device=DEV)
    if c.gate_dtype is not None:
        t["g"] = t["g"].to(c.gate_dtype)
    names = [n for n in ("q", "k", "v", "g", "initial_state") if t[n] is not None]
    for n in names:
        t[n].requires_grad_()
    o, ht = KERNELS[c.kernel](t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                              output_final_state=c.final, **c.opts)
    check_outputs(c, o, ht)

    r = float64_copies(t)
    ro, rht = _reference(r, c)
    compare_with_reference(c, t, r, names, (o, ht), (ro, rht), _case_id(c), DEV)


# Cases whose programs holding every key (forward, dv) take the wide tile when the grid fills the GPU
# (fused_chunk_fwd.value_block): 128 × 128 instead of 128 × 64 at K = 72, 256 × 64 instead of 256 × 32 at K = 256.
WIDE = [Case("chunk", F16, 1, 20, 1, 72, 80), Case("chunk", F32, 2, 37, 1, 72, 80, h0=False),
        Case("chunk", F16, 1, 9, 1, 256, 200), STRADDLE[-1]] + (
    [Case("chunk", BF16, 2, 100, 2, 256, 200), Case("chunk", F32, 2, 100, 2, 256, 200)] if CUDA else [])


@pytest.mark.parametrize("c", WIDE, ids=_case_id)
def test_wide_state_tiles_against_float64_reference(c, monkeypatch):
    monkeypatch.setattr(fused_chunk_fwd, "sm_count", lambda x: 1)  # one SM: any grid fills it, so the tile widens
    q, v = torch.empty(c.B, c.T, c.H, c.K, device=DEV), torch.empty(c.B, c.T, c.H, c.V, device=DEV)
    narrow = fused_chunk_fwd.value_block(fused_chunk_fwd.block(c.K), c.V, c.B * c.H, None)
    assert fused_chunk_fwd.launch_meta(q, v, 16, "K")[1]["BV"] == 2 * narrow
    test_against_float64_reference(c)


# dg's running sum over the later tokens restarts from the state parked by the dq kernel every
# fused_chunk_bwd.RESTART tokens (1024: the realistic T = 4096 cases above, on a GPU). A RESTART of 64 takes it to
# the interpreter: fp32, and fp16 (a 16-bit dv holds the state as two halves of its bits), with h0 and a
# final-state cotangent or neither, T not a multiple of it, chunks of 16 and 32.
RESTARTS = [Case("chunk", F32, 2, 150, 2, 20, 24), Case("chunk", F16, 1, 150, 2, 20, 24),
            Case("chunk", F32, 1, 100, 1, 16, 16, h0=False, final=False, opts=dict(chunk_size=32))]


@pytest.mark.parametrize("c", RESTARTS, ids=_case_id)
def test_gate_gradient_restarts_against_float64(c, monkeypatch):
    monkeypatch.setattr(fused_chunk_bwd, "RESTART", 64)
    test_against_float64_reference(c)


def test_gate_gradient_restarts_with_values_sliced(monkeypatch):
    """V > 256: each value slice's programs park and read their own columns of the state, and their partial
    sums of Σ_v S ⊙ dS add up in the launcher."""
    monkeypatch.setattr(fused_chunk_bwd, "RESTART", 64)
    test_against_float64_reference(Case("chunk", F32, 1, 80, 1, 16, 264))


@triton.jit
def _no_state(dv, row0, o_k, o_v, K: tl.constexpr, V: tl.constexpr, HV: tl.constexpr, HALVES: tl.constexpr):
    return o_k[:, None] * 0.0 + o_v[None, :] * 0.0


@pytest.mark.skipif(CUDA, reason="replaces a device function, which only the interpreter looks up at run time")
def test_gate_gradient_restarts_read_the_parked_state(monkeypatch):
    """With the parked states read as zeros, dg changes before each restart and not after the last: the
    dk kernel takes the sum over the later tokens from them (so the float64 comparison checks them)."""
    monkeypatch.setattr(fused_chunk_bwd, "RESTART", 64)
    t = as_torch(_inputs(RESTARTS[0]), dtype=F32, device=DEV)
    t["g"].requires_grad_()

    def dg():
        o, _ = fused_chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"])
        return torch.autograd.grad(o.sum(), t["g"])[0]

    right = dg()
    monkeypatch.setattr(fused_chunk_bwd, "parked_state", _no_state)
    wrong = dg()
    assert torch.equal(wrong[:, 128:], right[:, 128:])  # after the last restart (T = 150): the running sum
    assert (wrong[:, :128] - right[:, :128]).abs().amax(dim=(0, 2, 3)).min() > 1e-3  # every earlier token


@pytest.mark.parametrize("restart", [40, 32])  # not a multiple of the chunk; fewer rows than a 16-bit state needs
def test_gate_gradient_restart_must_fit(restart, monkeypatch):
    monkeypatch.setattr(fused_chunk_bwd, "RESTART", restart)
    t = as_torch(_inputs(Case("chunk", F16, 1, 20, 1, 20, 24)), dtype=F16, device=DEV, requires_grad=True)
    o, _ = fused_chunk_gla(t["q"], t["k"], t["v"], t["g"])
    with pytest.raises(RuntimeError, match=f"RESTART is {restart}"):
        o.sum().backward()


@pytest.mark.parametrize("c", STRADDLE, ids=_case_id)
def test_straddle_cases_take_both_forms(c):
    """Every STRADDLE case has chunks on both sides of SAFE_DECAY (decays of its float32 gates over every key,
    as the forward and dv kernels decide): the fast and the exact form both run in one call."""
    g = as_torch(_inputs(c))["g"]
    C = c.opts.get("chunk_size", 16)
    decays = torch.stack([(-g[:, n:n + C].sum(1)).amax(-1) for n in range(0, c.T, C)])  # [chunk, B, H]
    assert decays.min() <= SAFE_DECAY < decays.max()


def test_states_in_fp32_option():
    """16-bit inputs, gates of the default strength: by default the state enters the forward's output matmul, and
    dS the dv kernel's, rounded to the input dtype (state_dot); with states_in_fp32 in float32. Both within
    tolerance of float64; with the option o and dv are nearer float64; the final state, dq, dk, dg and dh0 are the
    same to the bit (their kernels take no part in it). The dtype is one whose rounding the float32 operand beats:
    fp16 on a CPU, where the interpreter's float32 matmul is exact, bf16 on a GPU, where a float32 operand is TF32,
    whose 10-bit mantissa is fp16's own (there fp16 gives either path the smaller error, by chance)."""
    dt = BF16 if CUDA else F16
    c = Case("chunk", dt, 1, 80, 2, 40, 48, final=True)
    t = as_torch(_inputs(c), dtype=dt, device=DEV)
    r = float64_copies(t)
    names = ["q", "k", "v", "g", "initial_state"]
    for n in names:
        r[n].requires_grad_()
    ro, rht = _reference(r, c)
    gen = torch.Generator(device=DEV).manual_seed(1)
    do = torch.randn(ro.shape, generator=gen, device=DEV)
    dht = torch.randn(rht.shape, generator=gen, device=DEV)
    ref = [ro, rht, *grads((ro, rht), (do.double(), dht.double()), [r[n] for n in names])]
    runs = {}
    for flag in (False, True):
        x = {n: t[n].detach().clone().requires_grad_() for n in names}
        o, ht = fused_chunk_gla(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"],
                                output_final_state=True, states_in_fp32=flag, **c.opts)
        runs[flag] = [o, ht, *grads((o, ht), (do.to(dt), dht), [x[n] for n in names])]
    err = {flag: [rel_rmse(a, b) for a, b in zip(ref, out)] for flag, out in runs.items()}
    assert max(max(e) for e in err.values()) <= c.tol[dt], err
    o_, dv_ = 0, 4  # positions of o and dv in (o, ht, dq, dk, dv, dg, dh0)
    assert err[True][o_] < err[False][o_] and err[True][dv_] < err[False][dv_], err
    assert not torch.equal(runs[True][o_], runs[False][o_]) and not torch.equal(runs[True][dv_], runs[False][dv_])
    for i in (1, 2, 3, 5, 6):
        torch.testing.assert_close(runs[True][i], runs[False][i], rtol=0, atol=0)


def test_states_in_fp32_is_a_strict_bool(monkeypatch):
    x = _good()
    _forbid_launch(monkeypatch)
    with pytest.raises(TypeError, match="states_in_fp32"):
        fused_chunk_gla(x["q"], x["k"], x["v"], x["g"], states_in_fp32="no")


@pytest.mark.parametrize("kernel", KERNELS)
def test_non_contiguous_inputs(kernel):
    """Views with other strides (here a [B, H, T, D] tensor transposed) give the same result."""
    x = as_torch(random_inputs(1, 5, 2, 16, 16, initial_state=True), device=DEV)
    heads_first = {n: x[n].transpose(1, 2).contiguous().transpose(1, 2) for n in ("q", "k", "v", "g")}
    assert not heads_first["q"].is_contiguous()
    args = dict(initial_state=x["initial_state"], output_final_state=True)
    o1, s1 = KERNELS[kernel](x["q"], x["k"], x["v"], x["g"], **args)
    o2, s2 = KERNELS[kernel](heads_first["q"], heads_first["k"], heads_first["v"], heads_first["g"], **args)
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    torch.testing.assert_close(s1, s2, rtol=0, atol=0)


# ----------------------------------------------------------------------------- memory

def _beyond(allocated, outputs):
    """Shape and dtype of each allocated tensor that is not (a view of) one of ``outputs``."""
    kept = {x.untyped_storage().data_ptr() for x in outputs if x is not None}
    return [(tuple(x.shape), x.dtype) for x in allocated if x.untyped_storage().data_ptr() not in kept]


@pytest.mark.parametrize("dtype, gate_dtype, h0, final, K, V", [
    (F16, F32, True, True, 72, 80),  # two blocks of V (forward, dv) and of K (dq, dk)
    (F16, F16, False, True, 20, 24),
    (F32, None, True, False, 20, 24),  # no gate
])
def test_allocates_only_its_outputs(dtype, gate_dtype, h0, final, K, V):
    """fused_chunk_gla allocates its outputs and nothing else, forward and backward: every tensor
    created during a call is one it returns, and their bytes are fused_chunk.allocated_bytes."""
    B, T, H = 1, 20, 1
    gate = "none" if gate_dtype is None else "gla"
    t = as_torch(random_inputs(B, T, H, K, V, gate, initial_state=h0), dtype=dtype, device=DEV)
    if gate_dtype is not None:
        t["g"] = t["g"].to(gate_dtype)
    names = [n for n in ("q", "k", "v", "g", "initial_state") if t[n] is not None]
    for n in names:
        t[n].requires_grad_()
    call = functools.partial(fused_chunk_gla, t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                             output_final_state=final)
    if not device.triton_interpret():  # the autotuner allocates while it benchmarks the first calls
        o, ht = call()
        grads((o, ht), (torch.ones_like(o), None if ht is None else torch.ones_like(ht)), [t[n] for n in names])

    with Allocations() as forward:
        o, ht = call()
    do, dht = torch.randn_like(o), torch.randn_like(ht) if final else None
    with Allocations() as backward:
        gradients = grads((o, ht), (do, dht), [t[n] for n in names])

    expected = fused_chunk_module.allocated_bytes(B, T, H, K, V, dtype, gate_dtype, h0, final)
    assert _beyond(forward.tensors, (o, ht)) == []
    assert _beyond(backward.tensors, gradients) == []
    assert (forward.bytes(), backward.bytes()) == expected  # and each output allocated once


# ----------------------------------------------------------------------------- bad input

def _good(B=1, T=3, H=1, K=8, V=8):
    return as_torch(random_inputs(B, T, H, K, V, initial_state=True), device=DEV)


def _bad_inputs():
    return bad_inputs(_good)


BAD = _bad_inputs()
BAD_CHUNK = {"chunk_size-20": 20, "chunk_size-0": 0, "chunk_size-True": True, "chunk_size-128": 128}


def _forbid_launch(monkeypatch):
    """Any launch fails the test: errors must come from the checks made before it."""
    forbid_launch(monkeypatch, fused_recurrent_module.FusedRecurrentGLA, ["apply"])
    forbid_launch(monkeypatch, fused_chunk_module.FusedChunkGLA, ["apply"])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_raises_before_launch(kernel, case, monkeypatch):
    args, kwargs, error, text = BAD[case]
    _forbid_launch(monkeypatch)
    with pytest.raises(error, match=text):
        KERNELS[kernel](*args, **kwargs)


@pytest.mark.parametrize("case", BAD_CHUNK, ids=list(BAD_CHUNK))
def test_bad_chunk_size(case, monkeypatch):
    x = _good()
    _forbid_launch(monkeypatch)
    with pytest.raises(ValueError, match="chunk_size"):
        fused_chunk_gla(x["q"], x["k"], x["v"], x["g"], chunk_size=BAD_CHUNK[case])


CLEAN = _good()
POISONED = poisoned(CLEAN)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", POISONED, ids=list(POISONED))
def test_debug_mode_checks_values(kernel, case, monkeypatch):
    q, g, h0, name = POISONED[case]
    _forbid_launch(monkeypatch)
    with device.debug(True), pytest.raises(ValueError, match=f"^{name} "):
        KERNELS[kernel](q, CLEAN["k"], CLEAN["v"], g, initial_state=h0)


@pytest.mark.parametrize("kernel", KERNELS)
def test_values_unchecked_without_debug(kernel):
    """No device sync by default: a positive gate is not looked for on the host, but the kernel turns
    it into NaN where it reads it (tests/triton/test_gate_contract.py has every kernel and invalid value)."""
    q, g, h0, _ = POISONED["positive-g"]  # g[0, 2, 0, 3] = 0.5
    assert not device.is_debug()
    o, ht = KERNELS[kernel](q, CLEAN["k"], CLEAN["v"], g, initial_state=h0, output_final_state=True)
    assert o.shape == CLEAN["v"].shape
    assert torch.isnan(o[0, 2:, 0]).all() and torch.isnan(ht[0, 0, 3]).all()
