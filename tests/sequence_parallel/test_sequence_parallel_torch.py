"""gla_ref.sequence_parallel.torch with 2 and 4 gloo processes on 127.0.0.1, against
torch_ref.chunk_gla in one process and the float64 recurrence: every rank's outputs and gradients,
the final state (last rank), dh0 (rank 0), a subgroup; the bytes moved per call, for two T; and
bad input on one rank raising on every rank (so none waits forever).

Each group is a set of subprocesses running tests/_sp_torch_worker.py (both groups at once, with
a timeout); each test reads its part of the results.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from ref_cases import GRAD_TOL, TOL

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = dict(B=1, H=2, K=4, V=3)


def _accuracy(lengths, gate, h0, **extra):
    """lengths: tokens per rank (chunk size 4, so most slices end in a partial chunk)."""
    return dict(kind="accuracy", shape=SHAPE, lengths=lengths, gate=gate, h0=h0, chunk_size=4, **extra)


BAD = {  # the rank with the bad input (None: the ranks disagree), and what its message names;
    # every other rank's message names that rank
    "bad_initial_state_on_rank_1": (1, "initial_state is given on rank 0 only"),
    "bad_positive_gate_on_rank_0": (0, "g must hold log forget gates"),
    "bad_K_differs_on_last_rank": (None, "same B, H, K, V"),
}
CASES = {  # world size -> cases, run in this order (bad calls first: the group must survive them)
    2: {
        "bad_initial_state_on_rank_1": dict(kind="bad_call", shape=SHAPE, bad="initial_state_on_rank_1"),
        "gla_h0": _accuracy([6, 5], "gla", True),
        "scalar": _accuracy([4, 4], "scalar", False),
        "gla_h0_float64": _accuracy([3, 6], "gla", True, float64=True),
        "traffic": dict(kind="traffic", shape=SHAPE, lengths=[4, 16]),
    },
    4: {
        "bad_positive_gate_on_rank_0": dict(kind="bad_call", shape=SHAPE, bad="positive_gate_on_rank_0"),
        "bad_K_differs_on_last_rank": dict(kind="bad_call", shape=SHAPE, bad="K_differs_on_last_rank"),
        "gla": _accuracy([5, 3, 4, 6], "gla", False),
        "const_h0": _accuracy([3, 3, 3, 3], "const", True),
        "none_h0": _accuracy([2, 4, 1, 5], "none", True),
        "subgroup_1_2_3_scalar_h0": _accuracy([4, 2, 5], "scalar", True, group=[1, 2, 3]),
        "traffic": dict(kind="traffic", shape=SHAPE, lengths=[4, 16]),
    },
}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks():
    """{world: {case id: [rank 0's result, rank 1's, ...]}} from both groups, run side by side."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    worker = os.path.join(HERE, "_sp_torch_worker.py")
    procs = {}
    for world, cases in CASES.items():
        argv = [str(world), str(_free_port()), json.dumps(cases)]
        procs[world] = [subprocess.Popen([sys.executable, worker, str(rank), *argv], text=True, env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                        for rank in range(world)]
    results = {}
    try:
        for world, group in procs.items():
            outs = [p.communicate(timeout=120) for p in group]
            for p, (_, err) in zip(group, outs):
                assert p.returncode == 0, err[-4000:]
            per_rank = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
            results[world] = {cid: [r[cid] for r in per_rank] for cid in CASES[world]}
    finally:
        for p in (p for group in procs.values() for p in group):
            if p.poll() is None:
                p.kill()
    return results


def _ids(kind):
    return [(w, cid) for w, cases in CASES.items() for cid, c in cases.items() if c["kind"] == kind]


def _expected_tensors(case, rank, size):
    """What rank ``rank`` of a chain of ``size`` checks: its o and gradients, the final state on
    the last rank, dh0 on rank 0."""
    names = {"o", "dq", "dk", "dv"} | ({"dg"} if case["gate"] != "none" else set())
    names |= {"final_state"} if rank == size - 1 else set()
    return names | ({"dinitial_state"} if rank == 0 and case["h0"] else set())


@pytest.mark.parametrize("world,cid", _ids("accuracy"), ids=str)
def test_matches_one_process_and_recurrence64(ranks, world, cid):
    case = CASES[world][cid]
    members = case.get("group", list(range(world)))
    assert all(r is None for i, r in enumerate(ranks[world][cid]) if i not in members)
    f64 = case.get("float64", False)
    tol_ref = 1e-12 if f64 else 1e-5
    for rank, result in enumerate(ranks[world][cid][i] for i in members):
        assert set(result["errors"]) == _expected_tensors(case, rank, len(members)), rank
        assert result["final_state_is_none"] == (rank != len(members) - 1)
        assert result["dtype"] == ("torch.float64" if f64 else "torch.float32")
        for name, (vs_ref, vs_64) in result["errors"].items():
            tol_64 = 1e-12 if f64 else (TOL if name in ("o", "final_state") else GRAD_TOL)
            assert vs_ref < tol_ref, f"rank {rank}: {name} vs torch_ref.chunk_gla: {vs_ref:.2e}"
            assert vs_64 < tol_64, f"rank {rank}: {name} vs recurrence64: {vs_64:.2e}"


@pytest.mark.parametrize("world", CASES)
def test_bytes_per_call_do_not_grow_with_T(ranks, world):
    """Measured bytes (forward + backward) are the same for 4 and 16 tokens per rank, and equal
    bytes_per_call: the header plus one [B, H, K, V] float32 state per hop."""
    state = 4 * SHAPE["B"] * SHAPE["H"] * SHAPE["K"] * SHAPE["V"]
    for rank, result in enumerate(ranks[world]["traffic"]):
        measured = list(result["measured"].values())
        assert measured[0] == measured[1] == result["predicted"], rank
        hops = 1 if rank in (0, world - 1) else 2  # each way: the end ranks talk to one neighbour
        header = (world - 1) * 7 * 8
        assert result["predicted"] == [header + hops * state] * 2, rank


@pytest.mark.parametrize("world,cid", _ids("bad_call"), ids=str)
def test_bad_input_on_one_rank_raises_on_every_rank(ranks, world, cid):
    culprit, words = BAD[cid]
    for rank, raised in enumerate(ranks[world][cid]):
        assert raised is not None, f"rank {rank} returned"
        kind, message = raised
        assert kind in ("ValueError", "TypeError")
        expected = words if culprit in (None, rank) else f"rank(s) [{culprit}]"
        assert expected in message, (rank, message)
