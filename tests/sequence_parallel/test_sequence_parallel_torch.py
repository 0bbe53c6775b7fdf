"""gla_ref.sequence_parallel.torch on 2 and 3 gloo ranks on 127.0.0.1 (gla_ref.sequence_parallel.local), the
Triton kernels in their CPU interpreter (float32, float16) and the float64 reference path: every rank's o and
gradients, the final state (last rank) and dh0 (rank 0), stitched into whole-sequence arrays, against the
one-device chunk_gla and the float64 recurrence; uneven slices that are not multiples of the chunk size, with
and without an initial state, every gate rank; the bytes per call; and ranks that disagree (scale, chunk size,
output_final_state, gate rank) or hold a bad input raising on every rank.

Both groups run at once in subprocesses (local.launch stops them after a timeout); the one-device references run
here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gla_ref import torch_ref  # noqa: E402
from gla_ref.sequence_parallel import local  # noqa: E402
from gla_ref.testing import random_inputs, recurrence64, recurrence64_grads, rel_rmse  # noqa: E402
from gla_ref.testing.cases import GRAD_TOL, TOL  # noqa: E402

# every test reads the groups' results, run once by the module fixture `ranks`: 42 s of CPU in all
pytestmark = pytest.mark.slow

SHAPE = dict(B=1, H=2, K=4, V=3)
C = 16
STATE = 4 * SHAPE["B"] * SHAPE["H"] * SHAPE["K"] * SHAPE["V"]
HEADER = 11 * 8


def _run(lengths, gate, h0, dtype="float32", seed=0, chunk_size=C, **extra):
    x = random_inputs(**SHAPE, T=sum(lengths), gate=gate, initial_state=h0, seed=seed)
    rng = np.random.default_rng(seed + 100)
    do = rng.standard_normal(x["v"].shape)
    dS = rng.standard_normal((SHAPE["B"], SHAPE["H"], SHAPE["K"], SHAPE["V"]))
    return dict(inputs=x, lengths=lengths, do=do, dS=dS, dtype=dtype, chunk_size=chunk_size, **extra)


def _positive_gate_on_rank_0():
    """float64 (the reference path checks values always; the kernels only under gla_ref.device.debug)."""
    run = _run([8, 8], "gla", False, "float64")
    run["inputs"]["g"][:, 2] = 0.5
    return run


RUNS = {  # world size -> runs, in this order (bad calls first: the group must go on after every rank raised)
    2: {
        "bad_scale_on_rank_1": _run([8, 8], "gla", False, ranks={1: {"scale": 0.3}}),
        "bad_chunk_size_on_rank_0": _run([8, 8], "gla", False, ranks={0: {"chunk_size": 32}}),
        "bad_output_final_state_on_rank_1": _run([8, 8], "gla", False, ranks={1: {"output_final_state": False}}),
        "bad_initial_state_on_rank_1": _run([8, 8], "gla", False, ranks={1: {"initial_state": np.zeros((1, 2, 4, 3))}}),
        "bad_positive_gate_on_rank_0": _positive_gate_on_rank_0(),
        "gla_h0_float32": _run([20, 13], "gla", True, seed=1),
        "gla_float16": _run([11, 21], "gla", False, "float16", seed=2),
    },
    3: {
        "bad_gate_rank_on_rank_2": _run([4, 4, 4], "gla", False, ranks={2: {"g": None}}),
        "scalar_float32": _run([10, 17, 6], "scalar", False, seed=3),
        "const_h0_float16": _run([16, 5, 12], "const", True, "float16", seed=4),
        "gla_h0_float64": _run([5, 3, 6], "gla", True, "float64", seed=5, chunk_size=4),
    },
}
BAD = {  # the run's culprit rank (None: the ranks disagree) and what its message names; the others name it
    "bad_scale_on_rank_1": (None, "same scale; by rank: scale {0: 0.5, 1: 0.3}"),
    "bad_chunk_size_on_rank_0": (None, "same chunk_size; by rank: chunk_size {0: 32, 1: 16}"),
    "bad_output_final_state_on_rank_1": (None, "output_final_state {0: True, 1: False}"),
    "bad_initial_state_on_rank_1": (1, "initial_state is given on rank 0 only"),
    "bad_positive_gate_on_rank_0": (0, "g must hold log forget gates"),
    "bad_gate_rank_on_rank_2": (None, "gate rank {0: 4, 1: 4, 2: 0}"),
}
TOLERANCE = {  # (vs the one-device chunk_gla, vs the float64 recurrence on the rounded inputs: o and S, gradients)
    "float32": (1e-5, TOL, GRAD_TOL),
    "float16": (5e-3, 5e-3, 5e-3),
    "float64": (1e-12, 1e-12, 1e-12),
}


@pytest.fixture(scope="module")
def ranks():
    """{world: {run id: result}} from both groups, run side by side."""
    with ThreadPoolExecutor(2) as pool:
        futures = {world: pool.submit(local.chunk_gla_on_ranks, runs.values(), timeout=280)
                   for world, runs in RUNS.items()}
        return {world: dict(zip(RUNS[world], f.result())) for world, f in futures.items()}


def _rounded(run):
    """The inputs and cotangents as the ranks' kernels see them (q, k, v, dO in the run's dtype; g and states
    float32), in float64."""
    dt = {"float16": np.float16, "float32": np.float32, "float64": np.float64}[run["dtype"]]
    state = np.float64 if dt is np.float64 else np.float32
    x = {n: None if a is None else np.asarray(a, dt if n in "qkv" else state).astype(np.float64)
         for n, a in run["inputs"].items()}
    return x, run["do"].astype(dt).astype(np.float64), run["dS"].astype(state).astype(np.float64)


def _one_device(run):
    """o, the final state and the gradients of the whole sequence on one device: the Triton chunk_gla (float32,
    float16; the gate broadcast to [B, T, H, K]) or the PyTorch reference (float64)."""
    x, do, dS = _rounded(run)
    dtype = getattr(torch, run["dtype"])
    state = torch.float64 if dtype == torch.float64 else torch.float32
    t = {n: None if a is None else torch.tensor(a, dtype=dtype if n in "qkv" else state).requires_grad_()
         for n, a in x.items()}
    B, T, H, K = t["q"].shape
    g = torch_ref.expand_gate(t["g"], B, T, H, K, dtype=state)
    if dtype == torch.float64:
        o, S = torch_ref.chunk_gla(t["q"], t["k"], t["v"], g, initial_state=t["initial_state"],
                                   output_final_state=True, chunk_size=run["chunk_size"])
    else:
        from gla_ref import triton as gla_triton

        o, S = gla_triton.chunk_gla(t["q"], t["k"], t["v"], g.contiguous(), initial_state=t["initial_state"],
                                    output_final_state=True, chunk_size=run["chunk_size"])
    torch.autograd.backward([o, S], [torch.tensor(do, dtype=o.dtype), torch.tensor(dS, dtype=S.dtype)])
    out = {"o": o, "final_state": S}
    out.update({"d" + n: t[n].grad for n in t if t[n] is not None})
    return out


def _ids(bad):
    return [(w, rid) for w, runs in RUNS.items() for rid in runs if rid.startswith("bad_") == bad]


@pytest.mark.parametrize("world,rid", _ids(bad=False), ids=str)
def test_matches_one_device_and_recurrence64(ranks, world, rid):
    run, got = RUNS[world][rid], ranks[world][rid]
    assert "raised" not in got, got.get("raised")
    x, do, dS = _rounded(run)
    o64, S64 = recurrence64(**x)
    grads64 = recurrence64_grads(**x, do=do, dS=dS)
    truth = {"o": o64, "final_state": S64, **{"d" + n: grads64[n] for n in grads64 if grads64[n] is not None}}
    one = _one_device(run)
    assert got["dg"] is None if x["g"] is None else got["dg"].shape == x["g"].shape
    assert (got["dinitial_state"] is None) == (x["initial_state"] is None)
    vs_one, tol_out, tol_grad = TOLERANCE[run["dtype"]]
    for name, want in truth.items():
        tol = tol_out if name in ("o", "final_state") else tol_grad
        assert rel_rmse(one[name], got[name]) < vs_one, f"{name} vs one device: {rel_rmse(one[name], got[name]):.2e}"
        assert rel_rmse(want, got[name]) < tol, f"{name} vs recurrence64: {rel_rmse(want, got[name]):.2e}"


@pytest.mark.parametrize("world", RUNS)
def test_bytes_per_call_match_the_count_and_do_not_grow_with_T(ranks, world):
    """Measured bytes (forward + backward) equal bytes_per_call: the 11-integer header plus one [B, H, K, V]
    state per hop (float32 for float32 and float16 input, float64 for float64), whatever the slice lengths."""
    for rid, got in ranks[world].items():
        if rid.startswith("bad_"):
            continue
        state = STATE * (2 if RUNS[world][rid]["dtype"] == "float64" else 1)
        hops = [1 if r in (0, world - 1) else 2 for r in range(world)]  # the end ranks talk to one neighbour
        expected = [(world - 1) * HEADER + h * state for h in hops]
        assert got["sent"] == got["received"] == expected, rid
        assert got["predicted"] == [(e, e) for e in expected], rid


@pytest.mark.parametrize("world,rid", _ids(bad=True), ids=str)
def test_mismatch_or_bad_input_on_one_rank_raises_on_every_rank(ranks, world, rid):
    culprit, words = BAD[rid]
    raised = ranks[world][rid]["raised"]
    assert len(raised) == world
    for rank, error in enumerate(raised):
        assert error is not None, f"rank {rank} returned"
        kind, message = error
        assert kind in ("ValueError", "TypeError")
        expected = words if culprit in (None, rank) else f"rank(s) [{culprit}]"
        assert expected in message, (rank, message)
