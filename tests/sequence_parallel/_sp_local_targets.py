"""Targets for tests/test_sequence_parallel_local.py, run by gla_ref.sequence_parallel.local.launch
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
