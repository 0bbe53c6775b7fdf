"""gla_ref.torch_ref and gla_ref.jax_ref agree on the very same inputs: outputs, final states
and the gradients of every input. Shapes match test_jax_ref.py so JAX reuses its compilations."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from gla_ref import jax_ref, torch_ref  # noqa: E402
from gla_ref.testing import GATES, as_jax, as_torch, random_inputs, rel_rmse  # noqa: E402
from gla_ref.testing.cases import cotangents, forms  # noqa: E402

TORCH_FORMS, JAX_FORMS = forms(torch_ref), forms(jax_ref)
TOL = 1e-5


def torch_run(form, x, do, dS, dtype=torch.float32):
    """(o, S, grads) from torch_ref with the loss Σ o·do + Σ S·dS."""
    f, kw = TORCH_FORMS[form]
    xt = as_torch(x, dtype=dtype, requires_grad=True)
    o, S = f(**xt, output_final_state=True, **kw)
    ((o * torch.tensor(do, dtype=o.dtype)).sum() + (S * torch.tensor(dS, dtype=S.dtype)).sum()).backward()
    return o, S, {n: t.grad for n, t in xt.items() if t is not None}


def jax_run(form, x, do, dS, dtype=jnp.float32):
    """(o, S, grads) from jax_ref with the same loss, through jax.vjp."""
    f, kw = JAX_FORMS[form]
    xj = as_jax(x, dtype=dtype)
    names = [n for n in xj if xj[n] is not None]

    def outputs(*args):
        return f(**{**xj, **dict(zip(names, args))}, output_final_state=True, **kw)

    (o, S), vjp = jax.vjp(outputs, *(xj[n] for n in names))
    grads = vjp((jnp.asarray(do, o.dtype), jnp.asarray(dS, S.dtype)))
    return o, S, dict(zip(names, grads))


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("form", TORCH_FORMS)
def test_torch_and_jax_agree(form, gate):
    x = random_inputs(B=2, T=37, H=1, K=20, V=24, gate=gate, initial_state=True)
    do, dS = cotangents(x)
    o_t, S_t, d_t = torch_run(form, x, do, dS)
    o_j, S_j, d_j = jax_run(form, x, do, dS)
    assert rel_rmse(o_t, o_j) < TOL and rel_rmse(S_t, S_j) < TOL
    assert d_t.keys() == d_j.keys()
    for n in d_t:
        assert rel_rmse(d_t[n], d_j[n]) < TOL, n


@pytest.mark.parametrize("form", TORCH_FORMS)
def test_torch_and_jax_agree_in_float64(form, x64):
    x = random_inputs(B=1, T=37, H=2, K=6, V=5, gate="gla", initial_state=True)
    do, dS = cotangents(x)
    o_t, S_t, d_t = torch_run(form, x, do, dS, dtype=torch.float64)
    o_j, S_j, d_j = jax_run(form, x, do, dS, dtype=jnp.float64)
    assert o_j.dtype == jnp.float64 and d_j["g"].dtype == jnp.float64
    assert rel_rmse(o_t, o_j) < 1e-13 and rel_rmse(S_t, S_j) < 1e-13
    for n in d_t:
        assert rel_rmse(d_t[n], d_j[n]) < 1e-12, n


def test_half_precision_matmuls_agree():
    """The fp16 operand rounding of the two-level form is the same in both frameworks."""
    x = random_inputs(B=1, T=128, H=2, K=16, V=16, gate="gla", tau=2.0, initial_state=True)
    o_t, _ = torch_ref.chunk_gla_two_level(**as_torch(x), sub_chunk_size=8, matmul_dtype=torch.float16)
    o_j, _ = jax_ref.chunk_gla_two_level(**as_jax(x), sub_chunk_size=8, matmul_dtype=jnp.float16)
    assert rel_rmse(o_t, o_j) < TOL
