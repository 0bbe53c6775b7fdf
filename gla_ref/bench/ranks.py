"""The step each rank of a sequence-parallel candidate runs (started by :func:`gla_ref.bench.measures.measure_ranks`
through :func:`gla_ref.sequence_parallel.local.launch`).

Importing this module loads no framework; the ranks import torch.
"""

from __future__ import annotations

import time


def time_step(rank, world_size, *, B, T, H, K, V, dtype, gate, chunk_size, warmup, rep, peak_repeats, seed=0):
    """One training step of :func:`gla_ref.sequence_parallel.torch.chunk_gla` on this rank's slice of T tokens
    (tokens ``[rank·T/P, (rank+1)·T/P)``; inputs drawn on this rank's device by
    :func:`gla_ref.bench.inputs.torch_inputs`, seed + rank), ``warmup`` untimed then ``rep`` timed: every rank
    starts each step after a barrier, gradients None before it, and its time ends after a synchronise.
    Returns ``{"step_ms": [...], "sent", "received", "peak"}`` (``peak``: :func:`gla_ref.bench.measures.peak_memory`
    of the step, ``peak_repeats`` times, on a GPU; None otherwise)."""
    import torch
    import torch.distributed as dist

    from gla_ref.bench.inputs import torch_inputs
    from gla_ref.bench.measures import peak_memory
    from gla_ref.sequence_parallel import torch as sp

    cuda = torch.cuda.is_available()
    dev = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    lo, hi = rank * T // world_size, (rank + 1) * T // world_size
    (q, k, v, g), do = torch_inputs(B, hi - lo, H, K, V, gate, dtype, dev, seed=seed + rank, cotangent=True)
    leaves = [x for x in (q, k, v, g) if x is not None]
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step():
        o, _ = sp.chunk_gla(q, k, v, g, chunk_size=chunk_size)
        o.backward(do)

    times = []
    for i in range(warmup + rep):
        for x in leaves:
            x.grad = None
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        if i == 0:
            with sp.count_traffic() as moved:
                step()
        else:
            step()
        sync()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    peak = None
    if cuda and peak_repeats:
        dist.barrier()
        peak = peak_memory(step, leaves, peak_repeats)
    return {"step_ms": times, "sent": moved.sent, "received": moved.received, "peak": peak}
