"""Where the time of chunk GLA goes: CUDA time per kernel of our ``chunk_gla``, our ``fused_chunk_gla`` and FLA's
``chunk_gla``, forward+backward.

Run on a CUDA GPU: ``python benchmarks/profile_chunk.py [--T 4096] [--shape 128x128] [--forward]
[--only chunk_gla fused_chunk_gla fla.chunk_gla] [--out PATH]``. Each implementation runs a few warm-up steps
(autotuning happens there), then ``torch.profiler`` records ``--steps`` forward+backward steps (forward steps alone
with ``--forward``); the CUDA time of every kernel is summed over them and divided by the step count, and the CUDA
operations a step launches are counted. Then, outside the profiler, the same steps run back to back on the host's
clock: the time to issue them and the time until the GPU has finished them (at a short T the two are equal and the
host's launch path, not the kernels, sets the pace). Writes ``benchmarks/results/chunk_profile_<device>.json``
(stamped with device, versions, date) and prints a table. B=8, H=16, bf16 inputs, as in the speed benchmark;
K×V from ``--shape`` (default 128x128).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from bench_triton import make_inputs  # noqa: E402

from gla_ref import bench  # noqa: E402
from gla_ref.triton import chunk_gla, fused_chunk_gla  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"


def implementations(only=None):
    """name -> function(q, k, v, g) -> o; ``only``: the names to keep (default all; FLA is not imported
    when it is left out, which saves its first call's minutes of autotuning)."""
    runs = {"chunk_gla": lambda q, k, v, g: chunk_gla(q, k, v, g)[0],
            "fused_chunk_gla": lambda q, k, v, g: fused_chunk_gla(q, k, v, g)[0]}
    if only and "fla.chunk_gla" not in only:
        return {name: run for name, run in runs.items() if name in only}
    try:
        from fla.ops.gla import chunk_gla as fla_chunk_gla

        runs["fla.chunk_gla"] = lambda q, k, v, g: fla_chunk_gla(q, k, v, g)[0]
    except ImportError as err:
        print(f"FLA not available ({err}); profiling ours only")
    return {name: run for name, run in runs.items() if not only or name in only}


def make_step(fn, inputs, forward=False):
    """One forward+backward step of ``fn`` (a forward under ``torch.no_grad`` when ``forward``), returning what
    it computed: o, or the inputs' gradients (reset to None first, so none is added into an old one, and a
    step recorded in a CUDA graph allocates them in the graph's pool)."""
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


def host_times(step, steps, sync=torch.cuda.synchronize, clock=time.perf_counter):
    """Milliseconds per step on the host's clock, outside the profiler: ``issue_ms``, the time to
    launch ``steps`` steps back to back (read before the synchronisation), and ``wall_ms``, the time
    until the GPU has finished them. With that queue the wall time is the slower of the two sides:
    when it equals ``issue_ms`` the GPU waits for Python and Triton's launch path, not the reverse."""
    step()
    sync()
    t0 = clock()
    for _ in range(steps):
        step()
    t1 = clock()
    sync()
    t2 = clock()
    return {"issue_ms": (t1 - t0) / steps * 1e3, "wall_ms": (t2 - t0) / steps * 1e3}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--T", type=int, nargs="+", default=[4096])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--shape", default="128x128", help="KxV of the heads")
    parser.add_argument("--forward", action="store_true", help="profile forward steps only")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--only", nargs="+", choices=("chunk_gla", "fused_chunk_gla", "fla.chunk_gla"),
                        help="implementations to profile (default all three)")
    args = parser.parse_args()
    bench.show_tuning()  # a line per kernel autotuned: the first call at a shape takes minutes
    B, H = 8, 16
    K, V = (int(n) for n in args.shape.split("x"))
    step_kind = "fwd" if args.forward else "fwd+bwd"
    env = bench.environment()
    slug = bench.slug(env["device"])
    path = args.out or RESULTS / f"chunk_profile_{slug}.json"
    rows = []
    for T in args.T:
        inputs = make_inputs(B, T, H, K, V, "gla")
        for name, fn in implementations(args.only).items():
            step = make_step(fn, inputs, args.forward)
            kernels, launches = kernel_times(step, args.steps)
            host = host_times(step, args.steps)
            rows.append({"T": T, "name": name, "step": step_kind, "total_ms": sum(kernels.values()),
                         "kernels_ms": kernels, "launches": launches, "host": host})
            print(f"\nT={T} {name}: {sum(kernels.values()):.3f} ms of kernels per {step_kind} step, {launches:g} "
                  f"launches; host: issued in {host['issue_ms']:.3f} ms, done in {host['wall_ms']:.3f} ms", flush=True)
            for kname, ms in kernels.items():
                print(f"  {ms:8.3f} ms  {kname[:100]}")
            result = {"env": env, "shape": {"B": B, "H": H, "K": K, "V": V, "dtype": "bfloat16"}, "rows": rows}
            path.write_text(json.dumps(result, indent=1))  # after every row: a run cut short keeps what it has
    print("wrote", path)


if __name__ == "__main__":
    main()
