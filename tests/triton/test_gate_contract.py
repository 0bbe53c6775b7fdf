"""The log-gate contract of every form (gla_ref._validate): a valid log-gate is finite and ≤ 0.

NaN, a positive value (a gate given as a probability) and -inf (a gate of exactly 0, a hard reset:
not supported, packed batches are the exact reset) are invalid, and

* the references (torch_ref, jax_ref: every form, every gate rank) raise a ValueError naming g and
  its first bad position; under jax.jit, where nothing can be read, they give NaN;
* the kernels (Triton, Pallas) without debug never return a finite answer: o of the bad token's
  sequence and head from that token on, the final state's rows of its key channel and the
  gradients are NaN (checked through every later chunk, forward and backward);
* the kernels under ``gla_ref.device.debug(True)`` raise the references' error;
* valid edge gates, exactly 0 and -30, give the float64 recurrence's answer, debug on and off.

Also here: an explicit ``scale`` in the fused Triton kernels (o, final state and every gradient
against float64), and packed batches with initial states, where an invalid gate stays in its own
sequence. Shapes are tiny (the Triton interpreter and Pallas' interpret mode on a CPU); on a GPU
the same tests run the compiled kernels.
"""

from __future__ import annotations

import ast
import math
import pathlib
from typing import NamedTuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from gla_ref import device, jax_ref, pallas, torch_ref  # noqa: E402
from gla_ref import triton as gtriton  # noqa: E402
from gla_ref.teaching import historical  # noqa: E402
from gla_ref._validate import check_gate_values  # noqa: E402
from gla_ref.testing import (as_jax, as_torch, random_inputs, recurrence64, recurrence64_grads, rel_rmse,  # noqa: E402
                             to_numpy)

DEV = device.torch_device()
BAD = {"positive": 0.5, "hard-reset": -math.inf, "nan": math.nan}
MESSAGE = {  # what the error says after the position, per bad value
    "positive": r" > 0 at {where}: {name} looks like gate probabilities, not their logs: pass the natural log",
    "hard-reset": r"-inf at {where}: a hard reset \(gate exactly 0\) is not supported: split the sequences "
                  r"with cu_seqlens",
    "nan": r"NaN at {where}$",
}


def error_pattern(bad: str, name: str, where: str) -> str:
    """The regex of the contract's error for ``name`` with its first bad entry at ``where`` ("b=1, t=3")."""
    where = rf"{name}\[{where}\]"
    return rf"^{name} must hold log forget gates <= 0 \(finite.*\), got .*" + MESSAGE[bad].format(
        where=where, name=name)


# ----------------------------------------------------------------------------- the one check

@pytest.mark.parametrize("bad", BAD)
def test_check_names_the_first_bad_position_in_c_order(bad):
    g = -np.random.default_rng(0).random((2, 5, 3, 4))
    g[1, 3, 2, 1] = BAD[bad]
    g[1, 4, 0, 0] = 0.7   # later in C order: not the first
    g[0, 0, 0, 0] = -0.0  # valid (0 is)
    with pytest.raises(ValueError, match=error_pattern(bad, "g", "b=1, t=3, h=2, k=1")):
        check_gate_values("g", torch.from_numpy(g))


@pytest.mark.parametrize("g", [np.zeros((1, 3, 2)), np.full((2,), -30.0), np.array([-1e-30, -3e38])])
def test_check_accepts_zero_and_very_negative_gates(g):
    for x in (g, torch.from_numpy(g), jnp.asarray(g)):
        check_gate_values("g", x)


# ----------------------------------------------------------------------------- references

RB, RT, RH, RK, RV = 2, 5, 3, 4, 3
REF_FORMS = {
    "torch.recurrent_gla": torch_ref.recurrent_gla, "torch.parallel_gla": torch_ref.parallel_gla,
    "torch.chunk_gla": torch_ref.chunk_gla, "torch.chunk_gla_two_level": torch_ref.chunk_gla_two_level,
    "torch.chunk_gla_direct": torch_ref.chunk_gla_direct, "torch.parallel_gla_naive": torch_ref.parallel_gla_naive,
    "jax.recurrent_gla": jax_ref.recurrent_gla, "jax.parallel_gla": jax_ref.parallel_gla,
    "jax.chunk_gla": jax_ref.chunk_gla, "jax.chunk_gla_two_level": jax_ref.chunk_gla_two_level,
}
BAD_AT = {"const": ((2,), "h=2"), "scalar": ((1, 3, 2), "b=1, t=3, h=2"), "gla": ((1, 3, 2, 1), "b=1, t=3, h=2, k=1")}


def ref_call(form, x):
    """A reference form on NumPy inputs in its framework (float32), no initial state for the naive form."""
    t = as_torch(x) if form.startswith("torch") else as_jax(x)
    h0 = {} if form.endswith("naive") else {"initial_state": t["initial_state"]}
    return REF_FORMS[form](t["q"], t["k"], t["v"], t["g"], **h0)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("gate", BAD_AT)
@pytest.mark.parametrize("form", REF_FORMS)
def test_references_reject_invalid_gates(form, gate, bad):
    x = random_inputs(RB, RT, RH, RK, RV, gate, initial_state=True)
    index, where = BAD_AT[gate]
    x["g"][index] = BAD[bad]
    with pytest.raises(ValueError, match=error_pattern(bad, "g", where)):
        ref_call(form, x)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("form", [f for f in REF_FORMS if f.startswith("jax")])
def test_jax_references_under_jit_give_nan(form, bad):
    """Under jit the gate has no value to check: an invalid one makes o (from its token on) and the
    final state (its channel's rows) NaN, never a finite answer."""
    x = as_jax(random_inputs(1, RT, 1, RK, RV, "gla", initial_state=True))
    g = x["g"].at[0, 2, 0, 1].set(BAD[bad])
    f = jax.jit(lambda q, k, v, g, h0: REF_FORMS[form](q, k, v, g, initial_state=h0, output_final_state=True))
    o, S = f(x["q"], x["k"], x["v"], g, x["initial_state"])
    assert np.isnan(np.asarray(o)[0, 2:, 0]).all() and np.isnan(np.asarray(S)[0, 0, 1]).all()


# ----------------------------------------------------------------------------- kernels

B, T, H, K, V = 1, 20, 1, 8, 8  # two chunks of 16 (the second partial): NaN must cross a chunk boundary
T0, K0 = 9, 3                   # the bad gate: g[0, T0, 0, K0] (g[0, T0, 0] scalar, g_gamma[0])


class Kernel(NamedTuple):
    f: object
    fw: str            # "torch" or "jax"
    gate: str          # "gla" [B,T,H,K], "scalar" [B,T,H], "gamma" ([H], passed as g_gamma)
    options: dict
    reverse: bool = False
    grads: bool = True


KERNELS = {
    "triton.chunk_gla": Kernel(gtriton.chunk_gla, "torch", "gla", {"chunk_size": 16}),
    "triton.chunk_simple_gla": Kernel(gtriton.chunk_simple_gla, "torch", "scalar", {"chunk_size": 16}),
    "triton.chunk_simple_gla-g_gamma": Kernel(gtriton.chunk_simple_gla, "torch", "gamma", {"chunk_size": 16}),
    "triton.fused_chunk_gla": Kernel(gtriton.fused_chunk_gla, "torch", "gla", {"chunk_size": 16}),
    "triton.fused_recurrent_gla": Kernel(gtriton.fused_recurrent_gla, "torch", "gla", {}),
    "triton.fused_recurrent_gla-reverse": Kernel(gtriton.fused_recurrent_gla, "torch", "gla", {"reverse": True},
                                                 reverse=True),
    "triton.fused_chunk_gla_historical": Kernel(historical.fused_chunk_gla_historical, "torch", "gla", {},
                                                grads=False),
    "pallas.chunk_gla": Kernel(pallas.chunk_gla, "jax", "gla", {"chunk_size": 16}),
    "pallas.fused_chunk_gla": Kernel(pallas.fused_chunk_gla, "jax", "gla", {"chunk_size": 16}),
    "pallas.chunk_simple_gla": Kernel(pallas.chunk_simple_gla, "jax", "scalar", {"chunk_size": 16}),
    "pallas.chunk_simple_gla-g_gamma": Kernel(pallas.chunk_simple_gla, "jax", "gamma", {"chunk_size": 16}),
}
NAMES = ("q", "k", "v", "g", "initial_state")


def kernel_inputs(kernel: Kernel, *, B=B, T=T, H=H, seed=0) -> dict:
    """Seeded NumPy inputs with an initial state; g shaped for the kernel's gate family."""
    gate = {"gla": "gla", "scalar": "scalar", "gamma": "const"}[kernel.gate]
    return random_inputs(B, T, H, K, V, gate, seed=seed, initial_state=True)


def run(kernel: Kernel, x: dict, grads: bool = False):
    """``(o, final_state, gradients or None)`` as NumPy arrays; gradients of Σ o + Σ final_state with
    respect to q, k, v, g (or g_gamma) and the initial state."""
    gate_arg = "g_gamma" if kernel.gate == "gamma" else "g"

    def call(q, k, v, g, h0):
        return kernel.f(q, k, v, **{gate_arg: g}, initial_state=h0, output_final_state=True, **kernel.options)

    if kernel.fw == "jax":
        args = [as_jax(x)[n] for n in NAMES]
        if not grads:
            o, S = call(*args)
            return to_numpy(o), to_numpy(S), None
        (o, S), vjp = jax.vjp(call, *args)
        return to_numpy(o), to_numpy(S), [to_numpy(d) for d in vjp((jnp.ones_like(o), jnp.ones_like(S)))]
    args = [as_torch(x, device=DEV, requires_grad=grads)[n] for n in NAMES]
    with torch.set_grad_enabled(grads):
        o, S = call(*args)
    if not grads:
        return to_numpy(o), to_numpy(S), None
    return to_numpy(o), to_numpy(S), [to_numpy(d) for d in torch.autograd.grad((o.sum() + S.sum()), args)]


def poison(kernel: Kernel, x: dict, value: float) -> dict:
    g = x["g"].copy()
    if kernel.gate == "gla":
        g[0, T0, 0, K0] = value
    elif kernel.gate == "scalar":
        g[0, T0, 0] = value
    else:
        g[0] = value
    return {**x, "g": g}


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("name", KERNELS)
def test_kernels_give_nan_for_an_invalid_gate(name, bad):
    """Without debug nothing is checked on the host, yet nothing finite comes back. Pallas' gradients
    are taken for one bad value only (interpret mode is slow; its NaN comes from one shared line)."""
    kernel = KERNELS[name]
    assert not device.is_debug()
    grads = kernel.grads and (kernel.fw == "torch" or bad == "positive")
    o, S, dx = run(kernel, poison(kernel, kernel_inputs(kernel), BAD[bad]), grads)
    if kernel.gate == "gamma":  # every token decays by g_gamma
        rows, state = o[0, :, 0], S[0, 0]
    else:
        rows = o[0, : T0 + 1, 0] if kernel.reverse else o[0, T0:, 0]
        state = S[0, 0, K0] if kernel.gate == "gla" else S[0, 0]
    assert np.isnan(rows).all(), f"finite o rows: {np.argwhere(~np.isnan(rows))[:5].tolist()}"
    assert np.isnan(state).all(), "a finite final state"
    for n, d in zip(NAMES, dx or []):
        assert np.isnan(d).any(), f"d{n} is finite"


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("name", KERNELS)
def test_debug_mode_raises_the_references_error(name, bad):
    kernel = KERNELS[name]
    x = kernel_inputs(kernel, B=2, H=3)
    index, where = {"gla": ((1, 4, 2, 1), "b=1, t=4, h=2, k=1"), "scalar": ((1, 4, 2), "b=1, t=4, h=2"),
                    "gamma": ((2,), "h=2")}[kernel.gate]
    x["g"][index] = BAD[bad]
    name = "g_gamma" if kernel.gate == "gamma" else "g"
    with device.debug(True), pytest.raises(ValueError, match=error_pattern(bad, name, where)):
        run(kernel, x)


EDGE_H = 2


def edge_gates(kernel: Kernel, x: dict) -> dict:
    """Valid gates at the edges: exactly 0 (no decay) and -30 (all but a reset), among ordinary ones."""
    g = x["g"].copy()
    if kernel.gate == "gamma":
        g[:] = [0.0, -30.0]
    else:
        g[:, 3:7] = 0.0    # no decay over several tokens
        g[:, 11] = -30.0   # the state all but forgotten
        if g.ndim == 4:
            g[:, 17, :, ::2] = -30.0  # half of its channels forgotten
        g[:, 18, 0] = 0.0
    return {**x, "g": g}


def reference64(x, reverse=False, scale=None):
    """The float64 recurrence (run from the last token to the first when reverse)."""
    if not reverse:
        return recurrence64(**x, scale=scale)
    flipped = {n: (a[:, ::-1] if n in ("q", "k", "v", "g") else a) for n, a in x.items()}
    o, S = recurrence64(**flipped, scale=scale)
    return o[:, ::-1], S


@pytest.mark.parametrize("debug", [False, True], ids=["debug-off", "debug-on"])
@pytest.mark.parametrize("name", KERNELS)
def test_edge_gates_are_exact(name, debug):
    kernel = KERNELS[name]
    x = edge_gates(kernel, kernel_inputs(kernel, H=EDGE_H, seed=1))
    with device.debug(debug):
        o, S, _ = run(kernel, x)
    o64, S64 = reference64(x, kernel.reverse)
    assert rel_rmse(o64, o) < 1e-5 and rel_rmse(S64, S) < 1e-5


# ----------------------------------------------------------------------------- no clamp hides a NaN

def _clamps(path):
    """``tl.minimum``/``tl.maximum``/``jnp.minimum``/``jnp.maximum``/``jnp.clip`` calls with a float
    literal argument in a source file: ``(line, source)``."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in ("tl", "jnp")
                and node.func.attr in ("minimum", "maximum", "clip", "clamp")
                and any(isinstance(a, ast.Constant) and isinstance(a.value, float) for a in node.args)):
            found.append((node.lineno, ast.get_source_segment(source, node)))
    return found


@pytest.mark.parametrize("package", ["triton", "pallas"])
def test_no_float_clamp_in_the_kernels(package):
    """A GPU's ``tl.minimum(x, 0.0)`` returns 0 for a NaN x (Triton's CPU interpreter keeps the NaN, so
    the NaN tests above cannot see it there): a clamp on values must be a ``where`` that keeps NaN
    (:func:`gla_ref.triton.common.gates.at_most_zero`). Index clamps (integers) are fine."""
    root = pathlib.Path(pallas.__file__).parent.parent / package
    found = {p.name: c for p in sorted(root.glob("*.py")) if (c := _clamps(p))}
    assert not found, found


# ----------------------------------------------------------------------------- Triton only

@pytest.mark.parametrize("case", ["positive g hidden by g_gamma", "positive g_gamma hidden by g"])
def test_simple_gla_sums_cannot_hide_an_invalid_gate(case):
    """chunk_simple_gla adds g and g_gamma before its cumsum: 0.05 + (-0.1) is a valid sum of an
    invalid gate, and must still give NaN (and raise under debug)."""
    x = as_torch(random_inputs(B, T, 2, K, V, "scalar", initial_state=True), device=DEV)
    g, gamma = -0.1 * torch.ones_like(x["g"]), torch.full((2,), -0.1, device=DEV)
    if case.startswith("positive g hidden"):
        g[0, T0, 1] = 0.05
        rows, name, where = slice(T0, None), "g", "b=0, t=9, h=1"
    else:
        gamma[1] = 0.05
        rows, name, where = slice(None), "g_gamma", "h=1"
    def call():
        return gtriton.chunk_simple_gla(x["q"], x["k"], x["v"], g, gamma, initial_state=x["initial_state"],
                                        output_final_state=True, chunk_size=16)

    o, S = call()
    assert torch.isnan(o[0, rows, 1]).all() and torch.isnan(S[0, 1]).all()
    assert torch.isfinite(o[0, :, 0]).all()  # the other head's gates are valid
    with device.debug(True), pytest.raises(ValueError, match=error_pattern("positive", name, where)):
        call()


SCALED = {"fused_recurrent_gla": gtriton.fused_recurrent_gla, "fused_chunk_gla": gtriton.fused_chunk_gla}


@pytest.mark.parametrize("name", SCALED)
def test_explicit_scale_in_the_fused_kernels(name):
    """A non-default scale reaches o, the final state and every gradient (forward and both backward
    sweeps), against the float64 recurrence and its gradients."""
    scale = 0.37  # not K ** -0.5
    x = random_inputs(1, T, 2, K, V, "gla", seed=2, initial_state=True)
    t = as_torch(x, device=DEV, requires_grad=True)
    o, S = SCALED[name](*(t[n] for n in NAMES[:4]), scale=scale, initial_state=t["initial_state"],
                        output_final_state=True)
    gen = torch.Generator(device=DEV).manual_seed(3)
    do, dS = torch.randn(o.shape, generator=gen, device=DEV), torch.randn(S.shape, generator=gen, device=DEV)
    got = torch.autograd.grad((o, S), [t[n] for n in NAMES], (do, dS))
    o64, S64 = recurrence64(**x, scale=scale)
    ref = recurrence64_grads(**x, scale=scale, do=to_numpy(do), dS=to_numpy(dS))
    assert rel_rmse(o64, o) < 1e-5 and rel_rmse(S64, S) < 1e-5
    for n, d in zip(NAMES, got):
        assert rel_rmse(ref[n], d) < 1e-5, f"d{n}"


PACKED = {  # the Triton kernels that take cu_seqlens
    "chunk_gla": Kernel(gtriton.chunk_gla, "torch", "gla", {"chunk_size": 16}),
    "chunk_simple_gla": Kernel(gtriton.chunk_simple_gla, "torch", "scalar", {"chunk_size": 16}),
    "fused_chunk_gla": Kernel(gtriton.fused_chunk_gla, "torch", "gla", {"chunk_size": 16}),
    "fused_recurrent_gla": Kernel(gtriton.fused_recurrent_gla, "torch", "gla", {}),
}
LENGTHS = (7, 13)  # packed T = 20; the bad gate is token 5 of sequence 1 (packed t = 12)


@pytest.mark.parametrize("mode", ["edge-gates-debug-on", "invalid-gate"])
@pytest.mark.parametrize("name", PACKED)
def test_packed_batches_with_initial_states(name, mode):
    """Each sequence from its own initial state, edge gates included and debug on, matches the float64
    recurrence run on it alone; an invalid gate makes only its own sequence NaN (o from its token on,
    its final state's channel), and debug names its packed position."""
    kernel = PACKED[name]
    x = random_inputs(1, sum(LENGTHS), 2, K, V, "gla" if kernel.gate == "gla" else "scalar", seed=4)
    x["initial_state"] = np.random.default_rng(5).standard_normal((len(LENGTHS), 2, K, V))
    bad = (0, 12, 1, K0)[: x["g"].ndim]
    if mode == "invalid-gate":
        x["g"][bad] = 0.5
    else:
        x = edge_gates(kernel, x)
    t = as_torch(x, device=DEV)
    cu = torch.tensor([0, LENGTHS[0], sum(LENGTHS)], dtype=torch.int64, device=DEV)

    def call():
        return kernel.f(*(t[n] for n in NAMES[:4]), initial_state=t["initial_state"], output_final_state=True,
                        cu_seqlens=cu, **kernel.options)

    if mode == "invalid-gate":
        o, S = (to_numpy(a) for a in call())
        assert np.isnan(o[0, 12:, 1]).all() and np.isnan(S[1, 1][bad[3:]]).all()
        ends = [LENGTHS[0]]  # sequence 0 must be untouched
        with device.debug(True), pytest.raises(ValueError, match=error_pattern(
                "positive", "g", ", ".join(f"{a}={i}" for a, i in zip("bthk", bad)))):
            call()
    else:
        with device.debug(True):
            o, S = (to_numpy(a) for a in call())
        ends = [LENGTHS[0], sum(LENGTHS)]
    for n, (start, end) in enumerate(zip([0, *ends], ends)):
        alone = {m: (a[:, start:end] if m != "initial_state" else a[n:n + 1]) for m, a in x.items()}
        o64, S64 = recurrence64(**alone)
        assert rel_rmse(o64, o[:, start:end]) < 1e-5 and rel_rmse(S64, S[n:n + 1]) < 1e-5, f"sequence {n}"
