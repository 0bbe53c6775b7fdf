"""gla_ref.jax_ref against the float64 NumPy recurrence: outputs, final states, gradients,
dtypes, jit, x64 and the exponent-sign rule (mirrors test_torch_ref.py).

Shapes are shared between cases on purpose: eager JAX compiles each operation once per shape.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from gla_ref import jax_ref as R  # noqa: E402
from gla_ref.testing import (GATES, as_jax, gate_bthk, random_inputs, recurrence64, recurrence64_grads,  # noqa: E402
                             rel_rmse, to_numpy)
from gla_ref.testing.cases import GRAD_TOL, SHAPES, STATES, TOL, close_to_recurrence, cotangents, forms  # noqa: E402

FORMS = forms(R)


@pytest.mark.parametrize("h0,final", STATES, ids=["S0-final", "h0-nofinal"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("form", FORMS)
def test_forward_matches_recurrence64(form, gate, shape, h0, final):
    f, kw = FORMS[form]
    x = random_inputs(**SHAPES[shape], gate=gate, initial_state=h0)
    o64, S64 = recurrence64(**x)
    o, S = f(**as_jax(x), output_final_state=final, **kw)
    assert o.dtype == jnp.float32 and o.shape == o64.shape
    assert rel_rmse(o64, o) < TOL
    if final:
        assert S.dtype == jnp.float32 and S.shape == S64.shape
        assert rel_rmse(S64, S) < TOL
    else:
        assert S is None


@pytest.mark.parametrize("shape", ["T37_K20_V24"])  # one shape: each costs a compilation per form
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("form", FORMS)
def test_gradients_match_recurrence64(form, gate, shape):
    f, kw = FORMS[form]
    x = random_inputs(**SHAPES[shape], gate=gate, initial_state=True)
    do, dS = cotangents(x)
    ref = recurrence64_grads(**x, do=do, dS=dS)
    names = [n for n in ref if ref[n] is not None]
    xj = as_jax(x)

    def outputs(*args):
        return f(**{**xj, **dict(zip(names, args))}, output_final_state=True, **kw)

    (o, S), vjp = jax.vjp(outputs, *(xj[n] for n in names))
    assert close_to_recurrence(x, o, S)
    grads = vjp((jnp.asarray(do, jnp.float32), jnp.asarray(dS, jnp.float32)))
    for name, d in zip(names, grads):
        assert rel_rmse(ref[name], d) < GRAD_TOL, name


@pytest.mark.parametrize("form", FORMS)
def test_float64_in_float64_out(form, x64):
    f, kw = FORMS[form]
    x = random_inputs(B=1, T=37, H=2, K=6, V=5, gate="gla", initial_state=True)
    o64, S64 = recurrence64(**x)
    o, S = f(**as_jax(x, jnp.float64), output_final_state=True, **kw)
    assert o.dtype == jnp.float64 and S.dtype == jnp.float64
    assert rel_rmse(o64, o) < 1e-13 and rel_rmse(S64, S) < 1e-13


def test_x64_stays_off_outside_the_fixture():
    """The library never enables float64 globally (other tests rely on float32 defaults)."""
    assert not jax.config.jax_enable_x64
    assert jnp.asarray(1.0).dtype == jnp.float32


@pytest.mark.parametrize("dtype,tol", [(jnp.float16, 2e-3), (jnp.bfloat16, 1e-2)])
@pytest.mark.parametrize("form", ["parallel", "chunk16", "two_level16/4"])
def test_half_inputs_keep_q_dtype(form, dtype, tol):
    """Half inputs: math in float32, o rounded once to q's dtype, state stays float32."""
    f, kw = FORMS[form]
    xj = as_jax(random_inputs(B=1, T=37, H=2, K=8, V=8, gate="gla", initial_state=True), dtype=dtype)
    o64, S64 = recurrence64(**{n: to_numpy(a) for n, a in xj.items()})
    o, S = f(**xj, output_final_state=True, **kw)
    assert o.dtype == dtype and S.dtype == jnp.float32
    assert rel_rmse(o64, o) < tol and rel_rmse(S64, S) < TOL


@pytest.mark.parametrize("form", FORMS)
def test_explicit_scale(form):
    f, kw = FORMS[form]
    x = random_inputs(B=1, T=37, H=2, K=8, V=8, gate="scalar")
    o64, _ = recurrence64(**x, scale=0.7)
    o, _ = f(**as_jax(x), scale=0.7, **kw)
    assert rel_rmse(o64, o) < TOL


@pytest.mark.parametrize("gate", GATES)
def test_expand_gate(gate):
    x = random_inputs(B=2, T=5, H=3, K=4, V=2, gate=gate)
    g = None if x["g"] is None else jnp.asarray(x["g"], jnp.float32)
    out = R.expand_gate(g, 2, 5, 3, 4)
    assert out.shape == (2, 5, 3, 4)
    np.testing.assert_allclose(to_numpy(out), gate_bthk(x["g"], 2, 5, 3, 4), rtol=1e-7)


@pytest.mark.parametrize("form", FORMS)
def test_jit_matches_eager(form):
    """The forms trace under a caller's jit (value checks skipped) and give the same numbers."""
    f, kw = FORMS[form]
    xj = as_jax(random_inputs(B=1, T=20, H=1, K=4, V=4, gate="gla", initial_state=True))
    o, S = f(**xj, output_final_state=True, **kw)
    oj, Sj = jax.jit(functools.partial(f, output_final_state=True, **kw))(**xj)
    assert rel_rmse(o, oj) < 1e-6 and rel_rmse(S, Sj) < 1e-6


def test_value_checks_skip_under_jit_but_run_under_grad():
    """Under jit the values are abstract, so a NaN passes through; jax.grad still sees values."""
    xj = as_jax(random_inputs(B=1, T=37, H=2, K=8, V=8, gate="gla"))
    xj["v"] = xj["v"].at[0, 3, 0, 0].set(jnp.nan)
    o, _ = jax.jit(R.chunk_gla)(**xj)
    assert np.isnan(to_numpy(o)).any()
    with pytest.raises(ValueError, match="^v contains NaN"):
        jax.grad(lambda q: R.chunk_gla(q, xj["k"], xj["v"], xj["g"])[0].sum())(xj["q"])


@pytest.mark.parametrize("form", FORMS)
def test_no_positive_exponent_is_evaluated(form, monkeypatch):
    """Every jnp.exp the forms call sees arguments ≤ 0 (masked entries are −inf)."""
    f, kw = FORMS[form]
    seen = []
    exp = jnp.exp

    def checked_exp(x):
        seen.append(float(jnp.max(x)))
        return exp(x)

    monkeypatch.setattr(jnp, "exp", checked_exp)
    x = random_inputs(B=1, T=20, H=1, K=4, V=4, gate="gla", tau=0.5, initial_state=True)
    # the token/chunk scans trace their bodies (abstract values), so unroll them for this check
    with jax.disable_jit():
        f(**as_jax(x), output_final_state=True, **kw)
    assert seen and max(seen) <= 0.0
