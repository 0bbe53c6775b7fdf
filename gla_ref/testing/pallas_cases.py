"""What the Pallas tests share (tests/pallas): the kernel variants, their inputs, and the comparison of every
output and gradient with the float64 recurrence (jax_ref.recurrent_gla under x64) and jax_ref.chunk_gla.

Imports jax: import it by name (``gla_ref.testing`` itself loads no framework).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gla_ref import device, jax_ref
from gla_ref.pallas import chunk_gla, chunk_simple_gla, fused_chunk_gla
from gla_ref.testing import as_jax, random_inputs, rel_rmse, rounded_cotangents, rounded_inputs

PLATFORM = device.jax_platform()
# the CPU interpreter's programs are large and run once: skip XLA's slow optimisations
CPU_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
TOL = {"float32": 2e-5, "bfloat16": 3e-2}
NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dh0")

# variant -> gate kind of random_inputs, and how to call the kernel with a gate array g
VARIANTS = {
    "chunk": ("gla", lambda q, k, v, g, **kw: chunk_gla(q, k, v, g, **kw)),
    "fused": ("gla", lambda q, k, v, g, **kw: fused_chunk_gla(q, k, v, g, **kw)),
    "simple_chunk": ("scalar", lambda q, k, v, g, **kw: chunk_simple_gla(q, k, v, g, mode="chunk", **kw)),
    "simple_fused": ("scalar", lambda q, k, v, g, **kw: chunk_simple_gla(q, k, v, g, mode="fused", **kw)),
    "gamma_chunk": ("const", lambda q, k, v, g, **kw: chunk_simple_gla(q, k, v, g_gamma=g, mode="chunk", **kw)),
    "gamma_fused": ("const", lambda q, k, v, g, **kw: chunk_simple_gla(q, k, v, g_gamma=g, mode="fused", **kw)),
    "gamma_auto": ("const", lambda q, k, v, g, **kw: chunk_simple_gla(q, k, v, g_gamma=g, **kw)),
}


def slopes_g_gamma(H):
    """ALiBi-style constant decays from gla_ref.reference.gates (the RFC's g_gamma), made a bit stronger."""
    from gla_ref.reference.gates import build_slope_tensor

    return -4.0 * build_slope_tensor(H)


def make_inputs(variant, *, B=1, T=40, H=2, K=20, V=24, h0=True, seed=0, tau=4.0):
    """Inputs of ``variant``'s gate kind (float64 NumPy, g_gamma as ALiBi-style slopes) and random cotangents
    on o and the final state."""
    gate = VARIANTS[variant][0]
    x = random_inputs(B=B, T=T, H=H, K=K, V=V, gate=gate, seed=seed, tau=tau, initial_state=h0)
    if gate == "const":
        x["g"] = slopes_g_gamma(H)
    rng = np.random.default_rng(seed + 100)
    cot = {"o": rng.standard_normal((B, T, H, V)), "final_state": rng.standard_normal((B, H, K, V))}
    return x, cot


def compiled(fn, *args):
    """``fn`` jitted and compiled for ``args`` (on a CPU without XLA's slow optimisations)."""
    lowered = jax.jit(fn).lower(*args)
    return lowered.compile(CPU_COMPILE) if PLATFORM == "cpu" else lowered.compile()


def vjp_all(fn, x, cot, final, dtype=None):
    """Outputs and gradients (w.r.t. q, k, v, g, h0) of ``fn`` for the cotangents ``cot``."""
    j = as_jax(x, dtype)
    args = (j["q"], j["k"], j["v"], j["g"], j["initial_state"])

    def outputs_and_grads(q, k, v, g, h0):
        (o, S), pullback = jax.vjp(lambda *a: fn(*a[:4], initial_state=a[4], output_final_state=final),
                                   q, k, v, g, h0)
        dS = None if S is None else jnp.asarray(cot["final_state"], S.dtype)
        return (o, S), pullback((jnp.asarray(cot["o"], o.dtype), dS))

    (o, S), grads = compiled(outputs_and_grads, *args)(*args)
    return dict(zip(NAMES, (o, S) + tuple(grads)))


def reference(x, cot, final, scale=None):
    """float64 recurrence (jax_ref.recurrent_gla under x64) and float32 jax_ref.chunk_gla."""
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        r64 = vjp_all(lambda *a, **kw: jax_ref.recurrent_gla(*a, scale=scale, **kw), x, cot, final,
                       jnp.float64)
        r64 = {n: (None if a is None else np.asarray(a)) for n, a in r64.items()}
    r32 = vjp_all(lambda *a, **kw: jax_ref.chunk_gla(*a, scale=scale, chunk_size=16, **kw), x, cot, final)
    return r64, r32


def err_vs(ref, out, truth):
    """``‖ref − out‖ / ‖truth‖``: measured against the true size, so that a gradient that is zero
    in exact arithmetic (e.g. dg for T = 1) is not judged by the rounding noise of ``ref``."""
    ref, out, truth = (np.asarray(a, dtype=np.float64) for a in (ref, out, truth))
    if not np.isfinite(out).all():
        return float("inf")
    norm = np.linalg.norm(truth)
    return float(np.linalg.norm(ref - out) / (norm if norm > 0 else 1.0))


def check_variant(variant, *, chunk_size=16, final=True, dtype=jnp.float32, scale=None,
                  launcher=None, interpret=None, tol=None, **shape):
    """Run one kernel variant, compare every output and gradient; returns the worst errors.
    ``tol`` replaces the dtype's tolerance of :data:`TOL`. The references take the kernel's own
    inputs and cotangents, rounded to ``dtype`` (as the Triton tests and FLA's do), so the errors
    are the kernel's, not those of rounding its inputs (:func:`gla_ref.testing.rounded_inputs`)."""
    x, cot = make_inputs(variant, **shape)
    x = rounded_inputs(x, dtype)
    cot = rounded_cotangents(cot, dtype)
    r64, r32 = reference(x, cot, final, scale)
    call = VARIANTS[variant][1]
    out = vjp_all(lambda *a, **kw: call(*a, chunk_size=chunk_size, scale=scale, launcher=launcher,
                                         interpret=interpret, **kw), x, cot, final, dtype)
    errors, tol_all = {}, tol
    for name in NAMES:
        tol = TOL[jnp.dtype(dtype).name] if tol_all is None else tol_all
        if name == "dg" and VARIANTS[variant][0] == "const" and tol_all is None and dtype == jnp.float32:
            tol *= 10  # one number per head, a sum over B·T positions of cancelling terms: 2.7e-5 in float32
        if r64[name] is None:
            assert out[name] is None, f"{name} should be None"
            continue
        assert out[name].shape == r64[name].shape, f"{name}: shape {out[name].shape} != {r64[name].shape}"
        err64, err32 = rel_rmse(r64[name], out[name]), err_vs(r32[name], out[name], r64[name])
        errors[name] = max(err64, err32)
        assert err64 <= tol, f"{variant} {name}: rel. RMSE {err64:.2e} vs float64 recurrence > {tol:.0e}"
        assert err32 <= tol, f"{variant} {name}: rel. RMSE {err32:.2e} vs jax_ref.chunk_gla > {tol:.0e}"
    print(variant, {n: f"{e:.1e}" for n, e in errors.items()})
    return errors
