"""Property tests (hypothesis) of the references over shapes, chunk sizes and gate strengths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from gla_ref import jax_ref, torch_ref  # noqa: E402
from gla_ref.testing import GATES, as_jax, as_torch, random_inputs, recurrence64, to_numpy  # noqa: E402

TOL = 2e-5


@st.composite
def problems(draw, max_T=80, min_tau=0.25):
    """Inputs of random shape, gate family and strength (tau), with a chunk C and sub-chunk c | C."""
    shape = dict(B=draw(st.integers(1, 2)), T=draw(st.integers(1, max_T)), H=draw(st.integers(1, 2)),
                 K=draw(st.integers(1, 24)), V=draw(st.integers(1, 24)))
    c = draw(st.sampled_from([1, 2, 4, 8, 16]))
    C = c * draw(st.sampled_from([1, 2, 3, 4]))
    x = random_inputs(**shape, gate=draw(st.sampled_from(GATES)), seed=draw(st.integers(0, 2**16)),
                      tau=draw(st.floats(min_tau, 32.0)), initial_state=draw(st.booleans()))
    return x, C, c


def close_to_recurrence(x, o, S):
    """o and S within TOL of the float64 recurrence, relative to the size of the terms it sums (the
    recurrence on |q|, |k|, |v|, |S_0|): where o cancels to near 0 (K = V = 1, say), its float32
    error is that of its terms, and a bound relative to o alone fails on correct code."""
    o64, S64 = recurrence64(**x)
    o_size, S_size = recurrence64(**{n: a if n == "g" or a is None else np.abs(a) for n, a in x.items()})
    return all(np.linalg.norm(to_numpy(got) - ref) <= TOL * np.linalg.norm(size)
               for ref, got, size in ((o64, o, o_size), (S64, S, S_size)))


@settings(max_examples=100, deadline=None)
@given(problems())
def test_torch_chunk_forms_match_recurrence(problem):
    x, C, c = problem
    xt = as_torch(x)
    assert close_to_recurrence(x, *torch_ref.chunk_gla(**xt, chunk_size=C, output_final_state=True))
    assert close_to_recurrence(x, *torch_ref.chunk_gla_two_level(
        **xt, chunk_size=C, sub_chunk_size=c, output_final_state=True))


@settings(max_examples=50, deadline=None)
@given(problems(min_tau=1.0))
def test_torch_parallel_matches_recurrence(problem):
    """Eq. 4 over the whole sequence differences global cumulative gates: tau ≥ 1 keeps them moderate."""
    x, _, _ = problem
    assert close_to_recurrence(x, *torch_ref.parallel_gla(**as_torch(x), output_final_state=True))


@settings(max_examples=60, deadline=None)
@given(problems(), st.data())
def test_torch_split_sequence_continues_through_the_state(problem, data):
    """Running [0, t) then [t, T) from the first part's final state equals one run over [0, T)."""
    x, C, c = problem
    T = x["q"].shape[1]
    t = data.draw(st.integers(1, T))
    parts, S = [], x["initial_state"]
    for start, stop in ((0, t), (t, T)):
        if start == stop:
            continue
        part = {n: x[n][:, start:stop] for n in ("q", "k", "v")}
        part = as_torch({**part, "g": _time_slice(x["g"], start, stop)})
        S = None if S is None else torch.as_tensor(S, dtype=torch.float32)
        o, S = torch_ref.chunk_gla_two_level(**part, initial_state=S, chunk_size=C, sub_chunk_size=c,
                                             output_final_state=True)
        parts.append(o)
    assert close_to_recurrence(x, torch.cat(parts, 1), S)


def _time_slice(g, start, stop):
    """Tokens [start, stop) of a log-gate; a per-head [H] gate has no time axis."""
    return g if g is None or g.ndim == 1 else g[:, start:stop]


@settings(max_examples=30, deadline=None)
@given(problems(max_T=40))
def test_torch_gate_ranks_equal_their_expansion(problem):
    """g as [H] or [B,T,H] gives the same result as the same gate expanded to [B,T,H,K]."""
    x, C, c = problem
    xt = as_torch(x)
    B, T, H, K = xt["q"].shape
    g_full = torch_ref.expand_gate(xt["g"], B, T, H, K)
    o, S = torch_ref.chunk_gla_two_level(**xt, chunk_size=C, sub_chunk_size=c, output_final_state=True)
    o_f, S_f = torch_ref.chunk_gla_two_level(**{**xt, "g": g_full}, chunk_size=C, sub_chunk_size=c,
                                             output_final_state=True)
    assert torch.equal(o, o_f) and torch.equal(S, S_f)


@settings(max_examples=8, deadline=None)  # each example compiles new shapes in XLA
@given(problems(max_T=40))
def test_jax_chunk_forms_match_recurrence(problem):
    x, C, c = problem
    xj = as_jax(x)
    assert close_to_recurrence(x, *jax_ref.chunk_gla_two_level(
        **xj, chunk_size=C, sub_chunk_size=c, output_final_state=True))


@pytest.mark.parametrize("tau", [0.1, 0.25])
def test_strong_gates_stay_finite_and_exact(tau):
    """Very strong decay (b down to about −1000 over T) is no problem for the chunked forms."""
    x = random_inputs(B=1, T=200, H=2, K=8, V=8, gate="gla", tau=tau, initial_state=True)
    xt = as_torch(x)
    for o, S in (torch_ref.chunk_gla(**xt, output_final_state=True),
                 torch_ref.chunk_gla_two_level(**xt, output_final_state=True)):
        assert close_to_recurrence(x, o, S)
