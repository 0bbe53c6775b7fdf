"""Targets for test_sequence_parallel_local.py (beside it), run by gla_ref.sequence_parallel.local.launch
in fresh processes (named by file path, so this file is not imported by pytest itself)."""

from __future__ import annotations

import time


def fail_while_neighbour_waits(rank, world_size):
    """Rank 1 raises; rank 0 waits for a message from rank 1 that never comes."""
    import torch
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.recv(torch.empty(1), 1)


def sleep(rank, world_size, *, seconds):
    time.sleep(seconds)


def subgroup_chain(rank, world_size, *, inputs, members, lengths):
    """sequence_parallel.torch.chunk_gla (float64, chunk size 4) on the subgroup ``members`` (global ranks,
    ascending: a group orders its ranks so), forward and backward with all-ones cotangents; ranks outside the
    group return None."""
    import torch
    import torch.distributed as dist

    from gla_ref.sequence_parallel import torch as sp
    from gla_ref.testing import as_torch

    group = dist.new_group(members)  # every rank of the world creates it
    if rank not in members:
        dist.barrier()  # rank 0 holds the group's store: it stays until the others are done
        return None
    me = dist.get_rank(group)
    assert me == members.index(rank)
    lo, hi = sum(lengths[:me]), sum(lengths[:me + 1])
    part = {n: inputs[n][:, lo:hi] for n in ("q", "k", "v", "g")}
    part["initial_state"] = inputs["initial_state"] if me == 0 else None
    t = as_torch(part, torch.float64, requires_grad=True)
    o, S = sp.chunk_gla(**t, group=group, output_final_state=True, chunk_size=4)
    (o.sum() + (S.sum() if S is not None else 0)).backward()
    out = {"o": o, "final_state": S, "dg": t["g"].grad, "dinitial_state": t["initial_state"].grad if me == 0 else None}
    dist.barrier()
    return {n: None if x is None else x.detach().numpy() for n, x in out.items()}
