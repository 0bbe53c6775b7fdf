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

from gla_ref import bench
from gla_ref.bench.profiling import host_times, kernel_times, make_step  # noqa: F401  (the study's tools)
from gla_ref.triton import chunk_gla, fused_chunk_gla

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
        inputs = bench.torch_inputs(B, T, H, K, V, "gla", "bfloat16", "cuda")
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
