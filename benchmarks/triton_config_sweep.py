"""Every autotune config of the Triton kernels behind one call, one at a time: which ones fault.

Autotuning launches every config of a kernel, so a single config that faults (an illegal memory
access) or computes wrong numbers brings the whole call down, whichever config would have won.
This script isolates them. For each autotuned kernel that the call launches and each of its
configs, a fresh process pins that kernel to that config and every other kernel to its first
config, runs ``--steps`` forward+backward calls, and compares the last one with the float64
reference (a fault kills only that process). ``--only`` sweeps just the launched kernels whose
``module.kernel`` name contains one of its words.

    python benchmarks/triton_config_sweep.py "chunk_simple_gla[g_gamma]" --dtype bfloat16 \\
        --shape 2 1000 2 64 256 [--steps 400] [--jobs 4] [--only chunk_state] [--out PATH]

KERNEL is a name of ``triton_accuracy.KERNELS``. Writes
``benchmarks/results/triton_config_sweep_<device>.json`` (or PATH): one row per (kernel, config)
with its status, the seconds taken and the relative errors. A config is ``ok`` only when its process
finished *and* every error is within :data:`TOLERANCE` of the dtype; ``wrong`` when it finished with
larger (or NaN) errors — silent corruption, which an exit code cannot show; ``fault`` when the process
died; ``timeout``. ``--rejudge PATH`` applies that verdict again to a stored file's rows. Without a GPU
the kernels run in the interpreter, where every kernel has one config.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

RESULTS = pathlib.Path(__file__).parent / "results"
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}
"""Largest relative error (o, final state, every gradient, against float64) of an ``ok`` config: about five
times the worst of any kernel in benchmarks/results/triton_accuracy_*.json (fp32 ≤ 4e-6, fp16 ≤ 4.6e-3,
bf16 ≤ 5.7e-3). The configs corrupted by ptxas 12.8.93 showed 0.6–1.3."""


def judge(row: dict, dtype: str) -> dict:
    """``row`` with its verdict: a finished run (``ok``) whose largest error exceeds the dtype's tolerance,
    or is NaN, becomes ``wrong``; ``max_error`` is recorded for every finished run."""
    if row["status"] not in ("ok", "wrong"):
        return row
    errors = [v for v in row["errors"].values() if v is not None]
    worst = float("nan") if any(v != v for v in errors) else max(errors, default=float("nan"))
    return {**row, "status": "ok" if worst <= TOLERANCE[dtype] else "wrong", "max_error": worst}


def describe(config) -> dict:
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def worker(kernel_name, dtype, shape, steps, pinned, index):
    """Pin, run ``steps`` calls, print one JSON line: the kernels launched, then the errors."""
    import time

    import torch

    import triton_accuracy as acc
    from gla_ref import device, torch_ref

    from gla_ref.triton.autotuners import autotuners

    tuned = autotuners()
    launched = []
    for name, kernel in tuned.items():
        kernel.configs = [kernel.configs[index if name == pinned else 0]]
        kernel.run = (lambda run, name: lambda *a, **kw: (launched.append(name), run(*a, **kw))[1])(kernel.run, name)
    gate, fn = acc.KERNELS[kernel_name]
    dev = "cuda" if device.has_cuda() else "cpu"
    x, x64, do, dht = acc.inputs(gate, tuple(shape), getattr(torch, dtype), dev)
    start = time.perf_counter()
    for _ in range(steps - 1):
        acc.run(fn, x, do, dht.float())
    out = acc.run(fn, x, do, dht.float())
    if dev == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    errs = acc.errors(acc.run(torch_ref.chunk_gla, x64, do, dht), out)
    print(json.dumps({"launched": sorted(set(launched)), "seconds": round(seconds, 2), "errors": errs}))


def worker_command(args, pinned="", index=0) -> list:
    """The command line of one worker (``pinned`` empty: every kernel at its first config)."""
    return [sys.executable, __file__, "--worker", pinned, str(index), args.kernel, "--dtype", args.dtype,
            "--shape", *map(str, args.shape), "--steps", str(args.steps)]


def run_worker(args, pinned="", index=0, timeout=120) -> dict:
    """One worker process; its JSON line, or how it ended."""
    cmd = worker_command(args, pinned, index)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return {"status": "ok", **json.loads(lines[-1])}
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    raised = [line for line in lines if not line.startswith(" ") and ("Error" in line or "Exception" in line)]
    return {"status": "fault", "error": (raised or lines or [f"exit code {proc.returncode}"])[-1][:300]}


def sweep(args) -> list:
    """A probe with every kernel at its first config finds the kernels launched; then one worker per config.
    If the probe faults, ``--only`` names the kernels to sweep (all of them may be launched)."""
    probe = run_worker(args)
    from gla_ref.triton.autotuners import autotuners

    tuned = autotuners()
    counts = {name: len(kernel.configs) for name, kernel in tuned.items()}
    configs = {name: [describe(c) for c in kernel.configs] for name, kernel in tuned.items()}
    if probe["status"] == "ok":
        candidates = probe["launched"]
    elif args.only:
        print(f"the probe (every kernel at its first config) failed: {probe}", flush=True)
        candidates = sorted(tuned)
    else:
        raise SystemExit(f"the call fails with every kernel at its first config: {probe}; name kernels with --only")
    swept = [name for name in candidates if not args.only or any(w in name for w in args.only)]
    if not swept:
        raise SystemExit(f"--only {args.only} matches none of the kernels {candidates}")
    jobs = [(name, i) for name in swept for i in range(counts[name])]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = pool.map(lambda job: run_worker(args, *job), jobs)
        rows = [{"kernel": name, "config": configs[name][i], **res} for (name, i), res in zip(jobs, results)]
    rows = [judge({k: v for k, v in row.items() if k != "launched"}, args.dtype) for row in rows]
    for row in rows:
        print(row["status"], row["kernel"], row["config"], row.get("seconds", ""), row.get("max_error", ""),
              row.get("error", ""), flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernel", nargs="?", help="a name of triton_accuracy.KERNELS, e.g. chunk_gla")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--shape", type=int, nargs=5, default=[2, 1000, 2, 64, 256], metavar=("B", "T", "H", "K", "V"))
    p.add_argument("--steps", type=int, default=400, help="forward+backward calls per config")
    p.add_argument("--jobs", type=int, default=4, help="worker processes at a time")
    p.add_argument("--only", nargs="+", metavar="WORD", help="sweep only kernels whose name contains a WORD")
    p.add_argument("--out", type=pathlib.Path)
    p.add_argument("--worker", nargs=2, metavar=("KERNEL", "INDEX"), help=argparse.SUPPRESS)
    p.add_argument("--rejudge", type=pathlib.Path, metavar="PATH", help="judge a stored file's rows again")
    args = p.parse_args()
    if args.rejudge:
        return rejudge(args.rejudge)
    if not args.kernel:
        p.error("KERNEL is required")
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    if args.worker:
        return worker(args.kernel, args.dtype, args.shape, args.steps, args.worker[0], int(args.worker[1]))
    rows = sweep(args)
    from gla_ref import bench  # after gla_ref.triton (sweep), which must be imported before triton

    env = bench.environment()
    slug = bench.slug(env["device"])
    out = args.out or RESULTS / f"triton_config_sweep_{slug}.json"
    case = {"kernel": args.kernel, "dtype": args.dtype, "shape": args.shape, "steps": args.steps}
    rows = [{"ptxas": env.get("ptxas"), **row} for row in rows]  # runs under several assemblers can share a file
    out.write_text(json.dumps({"env": env, "case": case, "rows": rows}, indent=1))
    print(f"{sum(r['status'] == 'ok' for r in rows)} of {len(rows)} configs ok; wrote {out}")


def rejudge(path: pathlib.Path) -> None:
    """Apply :func:`judge` to the rows of a stored sweep (its ``case`` names the dtype) and rewrite it."""
    data = json.loads(path.read_text())
    data["rows"] = [judge(row, data["case"]["dtype"]) for row in data["rows"]]
    path.write_text(json.dumps(data, indent=1))
    print(f"{sum(r['status'] == 'ok' for r in data['rows'])} of {len(data['rows'])} configs ok; rewrote {path}")


if __name__ == "__main__":
    main()
