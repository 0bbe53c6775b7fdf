"""Case tables and helpers shared by the tests of torch_ref and jax_ref (tests/reference: the two mirror each
other). NumPy only: the reference module is passed in."""

from __future__ import annotations

import numpy as np

from gla_ref.testing import rel_rmse
from gla_ref.testing.ground_truth import recurrence64


def forms(R):
    """The forms both reference modules ``R`` share: name → (function, extra keyword arguments)."""
    return {
        "recurrent": (R.recurrent_gla, {}),
        "parallel": (R.parallel_gla, {}),
        "chunk16": (R.chunk_gla, dict(chunk_size=16)),
        "chunk64": (R.chunk_gla, {}),
        "two_level64/16": (R.chunk_gla_two_level, {}),
        "two_level16/4": (R.chunk_gla_two_level, dict(chunk_size=16, sub_chunk_size=4)),
    }


SHAPES = {  # T=1; T=63 (one short chunk of 64, four of 16); T not a multiple; K≠V, not powers of two
    "T1": dict(B=1, T=1, H=2, K=8, V=8),
    "T63": dict(B=1, T=63, H=2, K=8, V=8),
    "T37_K20_V24": dict(B=2, T=37, H=1, K=20, V=24),
    "T130": dict(B=1, T=130, H=1, K=8, V=8),
}
STATES = [(False, True), (True, False)]  # (initial_state, output_final_state); both on: gradient tests
TOL, GRAD_TOL = 2e-5, 1e-4


def close_to_recurrence(x, o, S):
    o64, S64 = recurrence64(**x)
    return rel_rmse(o64, o) < TOL and rel_rmse(S64, S) < TOL


def cotangents(x, seed=1):
    """Random do, dS so a loss Σ o·do + Σ S·dS touches both outputs."""
    rng = np.random.default_rng(seed)
    B, T, H, K = x["q"].shape
    return rng.standard_normal((B, T, H, x["v"].shape[-1])), rng.standard_normal((B, H, K, x["v"].shape[-1]))
