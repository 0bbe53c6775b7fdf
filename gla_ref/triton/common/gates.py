"""How every Triton kernel reads a log-gate: invalid values become NaN, and no clamp hides a NaN.

The contract (:mod:`gla_ref._validate`): a valid log-gate is finite and ≤ 0. Checking that on the
host costs a device sync, so kernels only do it under ``gla_ref.device.debug(True)``. Without
debug, a kernel turns an invalid gate (NaN, > 0, -inf) into NaN right where it loads the gate
(:func:`valid_gate`: one compare-and-select on a value already in registers, no extra HBM
traffic). The NaN then reaches every output row of that sequence and head from the bad token on
(the chunked kernels: from the start of its chunk or sub-chunk) and the final state, and the
gradients: the result is never a finite wrong answer. Every step after the load must let a NaN
through, so exponents that must stay ≤ 0 are capped by :func:`at_most_zero`, never by
``tl.minimum(x, 0.0)``, which returns 0 for a NaN x on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gla_ref._validate import invalid_gates_to_nan
from gla_ref.reference.gates import SAFE_DECAY

_SAFE_DECAY = tl.constexpr(SAFE_DECAY)


@triton.jit
def valid_gate(g):
    """``g`` where it is a valid log-gate (finite and ≤ 0), NaN elsewhere (NaN, > 0 and -inf)."""
    return tl.where((g <= 0.0) & (g > float("-inf")), g, float("nan"))


@triton.jit
def at_most_zero(x):
    """``min(x, 0)`` that keeps a NaN x NaN (``tl.minimum`` does not, on a GPU)."""
    return tl.where(x > 0.0, 0.0, x)


@triton.jit
def gentle(b_g, g_p):
    """Whether a sub-chunk's log-gate rows ``b_g [c, BK]`` decay by at most :data:`~gla_ref.reference.gates.SAFE_DECAY`
    from its first row ``g_p [BK]``: its diagonal tile may then be one matmul (the fast form). A program-wide
    scalar, so the choice is one branch, with no sync; a NaN row may be skipped by the max, and then reaches
    the outputs through the fast form's exponentials instead."""
    return tl.max(tl.max(g_p[None, :] - b_g, axis=1), axis=0) <= _SAFE_DECAY


def invalid_to_nan(g: torch.Tensor) -> torch.Tensor:
    """:func:`valid_gate` for a gate that is combined on the host side before any kernel reads it
    (chunk_simple_gla adds ``g`` and ``g_gamma``: a positive g could hide in a negative sum)."""
    return invalid_gates_to_nan(g, torch.where)
