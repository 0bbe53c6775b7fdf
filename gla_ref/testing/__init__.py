"""Inputs, error measures and the float64 ground truth shared by the tests and the notebooks.

Inputs are made in NumPy (float64) from a seed, then handed to a framework with
:func:`as_torch` or :func:`as_jax`, so PyTorch and JAX see the very same numbers. The ground truth,
:func:`recurrence64` and :func:`recurrence64_grads`, is the token-by-token recurrence in NumPy float64
(:mod:`gla_ref.testing.ground_truth`, which imports nothing else of gla_ref).

Importing this package loads no framework. Submodules imported by name:

* :mod:`gla_ref.testing.cases`: the case tables the tests of torch_ref and jax_ref share (NumPy);
* :mod:`gla_ref.testing.triton_cases`: what the Triton tests share (imports torch);
* :mod:`gla_ref.testing.pallas_cases`: what the Pallas tests share (imports jax);
* :mod:`gla_ref.testing.scripts`: the scripts of ``benchmarks/`` loaded as modules (in a checkout).
"""

from __future__ import annotations

import numpy as np

from gla_ref.testing.ground_truth import gate_bthk, recurrence64, recurrence64_grads  # noqa: F401  (NumPy only)

GATES = ("none", "const", "scalar", "gla")
"""Gate kinds, by the rank of ``g``: None, [H], [B,T,H], [B,T,H,K]."""


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def random_inputs(B=2, T=37, H=2, K=20, V=24, gate="gla", *, seed=0, tau=4.0,
                  initial_state=False):
    """Seeded float64 inputs ``{"q","k","v","g","initial_state"}`` as NumPy arrays.

    ``gate`` picks the family (see :data:`GATES`). Log-gates are ``logsigmoid(x) / tau``
    with ``x ~ N(0, 1)``, the paper's parameterisation: larger ``tau`` means slower decay.
    ``g`` is None for ``gate="none"``; ``initial_state`` is None unless asked for.
    """
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K))
    v = rng.standard_normal((B, T, H, V))
    g_shape = {"none": None, "const": (H,), "scalar": (B, T, H), "gla": (B, T, H, K)}[gate]
    g = None if g_shape is None else _log_sigmoid(rng.standard_normal(g_shape)) / tau
    h0 = rng.standard_normal((B, H, K, V)) if initial_state else None
    return {"q": q, "k": k, "v": v, "g": g, "initial_state": h0}


def _convert(inputs, dtype, state_dtype, convert):
    """``convert(x, dtype)`` for every array of ``inputs`` (None stays None)."""
    out = {}
    for name, x in inputs.items():
        # gates and states keep full precision; q, k, v take the requested dtype
        dt = state_dtype if name in ("g", "initial_state") else dtype
        out[name] = None if x is None else convert(x, dt)
    return out


def as_torch(inputs, dtype=None, device=None, requires_grad=False):
    """The same dict as PyTorch tensors (``dtype`` default float32; states stay float32 or float64)."""
    import torch

    dtype = dtype or torch.float32
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return _convert(inputs, dtype, state_dtype, lambda x, dt: torch.tensor(
        x, dtype=dt, device=device).requires_grad_(requires_grad))


def as_jax(inputs, dtype=None):
    """The same dict as JAX arrays (``dtype`` default float32; states stay float32 or float64)."""
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype or jnp.float32)
    state_dtype = jnp.float64 if dtype == jnp.float64 else jnp.float32
    return _convert(inputs, dtype, state_dtype, lambda x, dt: jnp.asarray(x, dtype=dt))


def rounded_inputs(inputs, dtype):
    """The inputs as a kernel of ``dtype`` receives them, back in float64 NumPy: q, k, v rounded to
    ``dtype``, gates and states to float32 (what :func:`as_jax` hands a kernel).

    The inputs of a float64 reference that measures a kernel's own error. Against unrounded inputs
    the error also holds the rounding of the inputs, which no kernel can undo, and which some
    gradients amplify (chapter 5: the gradient of a constant decay ``g_gamma``)."""
    return {name: None if x is None else np.asarray(x, np.float64) for name, x in as_jax(inputs, dtype).items()}


def rounded_cotangents(cotangents, dtype):
    """Cotangents ``{"o", "final_state"}`` as a kernel of ``dtype`` receives them, in float64 NumPy:
    the one of o rounded to ``dtype`` (o has q's dtype), the final state's to float32."""
    import jax.numpy as jnp

    dtypes = {"o": dtype, "final_state": jnp.float32}
    return {name: np.asarray(jnp.asarray(x, dtypes[name]), np.float64) for name, x in cotangents.items()}


def to_numpy(x) -> np.ndarray:
    """Any tensor (PyTorch, JAX, NumPy) as a float64 NumPy array."""
    if hasattr(x, "detach"):
        return x.detach().cpu().double().numpy()  # a PyTorch tensor
    return np.asarray(x, dtype=np.float64)


def rel_rmse(ref, out) -> float:
    """Relative RMSE ``‖ref − out‖ / ‖ref‖`` in float64 (0 when both are zero)."""
    ref, out = to_numpy(ref), to_numpy(out)
    if ref.shape != out.shape:
        raise ValueError(f"shapes differ: ref {ref.shape} vs out {out.shape}")
    if not np.all(np.isfinite(out)):
        return float("inf")
    denom = np.linalg.norm(ref)
    err = np.linalg.norm(ref - out)
    return float(err / denom) if denom > 0 else float(err)


def assert_close(name: str, ref, out, tol: float) -> float:
    """Assert ``rel_rmse(ref, out) <= tol``; the message names the tensor and the error found.

    Returns the error, so a notebook can print or plot it.
    """
    err = rel_rmse(ref, out)
    if not err <= tol:
        raise AssertionError(f"{name}: relative RMSE {err:.3e} exceeds tolerance {tol:.1e}")
    return err
