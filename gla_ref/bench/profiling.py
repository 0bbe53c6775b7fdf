"""Where the time of a step goes: a step to repeat, the CUDA time of each kernel it launches, and the host's side.

Shared by the special studies of ``benchmarks/`` (``profile_chunk.py``, ``launch_overhead.py``,
``cuda_graphs.py``, ``fused_tiles.py``). Importing this module loads no framework.
"""

from __future__ import annotations

import time


def make_step(fn, inputs, forward=False):
    """One forward+backward step of ``fn`` (a forward under ``torch.no_grad`` when ``forward``), returning what
    it computed: o, or the inputs' gradients (reset to None first, so none is added into an old one, and a
    step recorded in a CUDA graph allocates them in the graph's pool)."""
    import torch

    do = torch.randn_like(inputs[2])

    def step():
        if forward:
            with torch.no_grad():
                return fn(*inputs)
        for x in inputs:
            x.grad = None
        fn(*inputs).backward(do)
        return [x.grad for x in inputs]

    return step


def kernel_times(step, steps):
    """Mean CUDA milliseconds per step of every kernel ``steps`` calls of ``step`` launch, and how many
    CUDA operations (kernels, and any memset or copy) a step launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):  # warm-up: compilation and autotuning stay outside the recording
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals, launches = {}, 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / 1e3 / steps
            launches += 1
    return dict(sorted(totals.items(), key=lambda kv: -kv[1])), launches / steps


def host_times(step, steps, sync=None, clock=time.perf_counter):
    """Milliseconds per step on the host's clock, outside the profiler: ``issue_ms``, the time to
    launch ``steps`` steps back to back (read before the synchronisation), and ``wall_ms``, the time
    until the GPU has finished them. With that queue the wall time is the slower of the two sides:
    when it equals ``issue_ms`` the GPU waits for Python and Triton's launch path, not the reverse.
    ``sync`` waits for the device (default ``torch.cuda.synchronize``)."""
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    step()
    sync()
    t0 = clock()
    for _ in range(steps):
        step()
    t1 = clock()
    sync()
    t2 = clock()
    return {"issue_ms": (t1 - t0) / steps * 1e3, "wall_ms": (t2 - t0) / steps * 1e3}
