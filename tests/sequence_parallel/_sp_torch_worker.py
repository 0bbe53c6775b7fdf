"""Worker for tests/test_sequence_parallel_torch.py: one rank of a gloo group on 127.0.0.1.

Usage: ``python _sp_torch_worker.py RANK WORLD PORT CASES_JSON``. Runs every case in order (bad
calls first, so the later cases also show that the group still works after every rank raised)
and prints one JSON line mapping each case id to what this rank measured.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recurrence64 import recurrence64, recurrence64_grads  # noqa: E402

from gla_ref import torch_ref  # noqa: E402
from gla_ref.sequence_parallel import torch as sp  # noqa: E402
from gla_ref.testing import as_torch, random_inputs, rel_rmse  # noqa: E402


def whole_sequence(case):
    """The inputs of the whole sequence (every rank makes the same), and cotangents do, dS."""
    x = random_inputs(**case["shape"], T=sum(case["lengths"]), gate=case["gate"],
                      initial_state=case["h0"])
    rng = np.random.default_rng(1)
    B, T, H, K = x["q"].shape
    V = x["v"].shape[-1]
    return x, rng.standard_normal((B, T, H, V)), rng.standard_normal((B, H, K, V))


def my_slice(x, rank, lengths):
    """This rank's part: tokens [lo, hi) of q, k, v and of a per-token gate; a [H] gate whole;
    the initial state on rank 0 only."""
    lo, hi = sum(lengths[:rank]), sum(lengths[:rank + 1])
    part = {n: x[n][:, lo:hi] for n in ("q", "k", "v")}
    part["g"] = None if x["g"] is None else (x["g"] if x["g"].ndim == 1 else x["g"][:, lo:hi])
    part["initial_state"] = x["initial_state"] if rank == 0 else None
    return part, slice(lo, hi)


def backward(o, S, do, dS):
    """Backpropagate the loss Σ o·do + Σ S·dS (S None: its term is absent)."""
    loss = (o * torch.tensor(do, dtype=o.dtype)).sum()
    if S is not None:
        loss = loss + (S * torch.tensor(dS, dtype=S.dtype)).sum()
    loss.backward()


def accuracy(case, rank, world):
    """Relative RMSEs ``[vs torch_ref.chunk_gla on the whole sequence, vs recurrence64]`` of this
    rank's o and gradients, of the final state (last rank) and of dh0 (rank 0). With
    ``case["group"]`` (global ranks) the chain runs on that subgroup; other ranks return None."""
    group = None
    if "group" in case:
        group = dist.new_group(case["group"])  # every rank of the world must create it
        if rank not in case["group"]:
            return None
        rank = dist.get_rank(group)
    dtype = torch.float64 if case.get("float64") else torch.float32
    C = case["chunk_size"]
    x, do, dS = whole_sequence(case)
    part, mine = my_slice(x, rank, case["lengths"])
    t = as_torch(part, dtype, requires_grad=True)
    o, S = sp.chunk_gla(**t, group=group, output_final_state=True, chunk_size=C)
    backward(o, S, do[:, mine], dS)
    full = as_torch(x, dtype, requires_grad=True)
    o_ref, S_ref = torch_ref.chunk_gla(**full, output_final_state=True, chunk_size=C)
    backward(o_ref, S_ref, do, dS)
    o64, S64 = recurrence64(**x)
    grads64 = recurrence64_grads(**x, do=do, dS=dS)

    def errors_of(out, ref, ref64, tokens=None):  # tokens: this rank's part of the reference
        if tokens is not None:
            ref, ref64 = ref[:, tokens], ref64[:, tokens]
        return [rel_rmse(ref, out), rel_rmse(ref64, out)]

    errors = {"o": errors_of(o, o_ref, o64, mine)}
    for name in ("q", "k", "v"):
        errors["d" + name] = errors_of(t[name].grad, full[name].grad, grads64[name], mine)
    if x["g"] is not None:
        dg = t["g"].grad
        if dg.ndim == 1:  # a replicated [H] parameter: its gradient is the sum of the ranks' parts
            dist.all_reduce(dg, group=group)
        errors["dg"] = errors_of(dg, full["g"].grad, grads64["g"], None if dg.ndim == 1 else mine)
    if S is not None:
        errors["final_state"] = errors_of(S, S_ref, S64)
    if t["initial_state"] is not None:
        errors["dinitial_state"] = errors_of(t["initial_state"].grad, full["initial_state"].grad,
                                             grads64["initial_state"])
    return {"errors": errors, "dtype": str(o.dtype), "final_state_is_none": S is None}


def traffic(case, rank, world):
    """Bytes this rank sent and received in one forward + backward, for each slice length in
    ``case["lengths"]``, and what bytes_per_call predicts."""
    measured = {}
    for T in case["lengths"]:
        x = random_inputs(**case["shape"], T=T, gate="gla", initial_state=rank == 0, seed=rank)
        t = as_torch(x, requires_grad=True)
        with sp.count_traffic() as moved:
            o, S = sp.chunk_gla(**t, output_final_state=True)
            (o.sum() + (S.sum() if S is not None else 0)).backward()
        measured[T] = [moved.sent, moved.received]
    predicted = sp.bytes_per_call(**case["shape"], rank=rank, world_size=world)
    return {"measured": measured, "predicted": [predicted.sent, predicted.received]}


def bad_call(case, rank, world):
    """The (exception type, message) this rank's call raised, or None if it returned."""
    h0_here = case["bad"] == "initial_state_on_rank_1" and rank == 1
    x = random_inputs(**case["shape"], T=4, gate="gla", initial_state=h0_here)
    if case["bad"] == "positive_gate_on_rank_0" and rank == 0:
        x["g"] = np.abs(x["g"]) + 0.1
    if case["bad"] == "K_differs_on_last_rank" and rank == world - 1:
        x = random_inputs(**{**case["shape"], "K": 6}, T=4, gate="gla")
    try:
        sp.chunk_gla(**as_torch(x, requires_grad=True))
    except (TypeError, ValueError) as err:
        return [type(err).__name__, str(err)]
    return None


def main():
    rank, world, port = (int(a) for a in sys.argv[1:4])
    cases = json.loads(sys.argv[4])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    kinds = {"accuracy": accuracy, "traffic": traffic, "bad_call": bad_call}
    results = {cid: kinds[case["kind"]](case, rank, world) for cid, case in cases.items()}
    dist.destroy_process_group()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
