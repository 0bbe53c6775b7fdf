"""Pallas kernels against jax_ref under jax.jit and the Triton kernels, each case in its own process.

    python benchmarks/bench_pallas.py [T ...] [--only NAME ...] [--limit 120] [--budget 320]
                                      [--out PATH] [--merge] [--xla-dump DIR] [--xla-flags FLAGS]
    python benchmarks/bench_pallas.py --smoke          # tiny shapes on any machine (CPU: interpreters)

Every (candidate, T) runs in a worker process (this script with ``--worker``) that compiles and
times the forward pass, then forward+backward, printing each row the moment it is measured. A
worker still running after ``--limit`` seconds is killed, and the parent records which phase it
was in, e.g. "compile did not finish in 120 s". A mode whose compile ran out of time is not tried
again at a larger T, and no worker starts once ``--budget`` seconds are spent, so the whole run ends
within the budget plus a few seconds whatever XLA does. Rows carry ``compile_ms`` (XLA's
ahead-of-time compile; for Triton the first call) apart from the run times (``median_ms``,
``p20_ms``, ``p80_ms``), or an ``error``.

Writes ``benchmarks/results/pallas_bench_<device>.json`` (``--smoke``: a temporary file), stamped
with device, versions and date: ``{"env": {...}, "rows": [{"T", "name", ...}]}``, the file
chapters 5 and 7 read. ``--merge`` keeps the rows of an existing file that this run did not measure.
``--xla-dump DIR`` makes every JAX worker dump its HLO there (one folder per case), to find what
XLA compiles slowly; ``--xla-flags=...`` passes extra XLA flags to the workers.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gla_ref import bench  # noqa: E402

import pallas_harness as harness  # noqa: E402  (beside this script)

RESULTS = ROOT / "benchmarks" / "results"
MIN_CASE_S = 10.0
"""A case gets at least this many seconds, or is not started."""
FULL = {"T": [1024, 2048, 4096], "B": 2, "H": 16, "K": 128, "V": 128, "chunk": 64, "dtype": "bfloat16",
        "warmup": 5, "rep": 50}
SMOKE = {"T": [32], "B": 1, "H": 2, "K": 32, "V": 32, "chunk": 16, "dtype": "float32", "warmup": 1, "rep": 2}


# ---------------------------------------------------------------- the worker: one (candidate, T)

def describe_error(err: BaseException) -> str:
    """A one-line error entry; running out of GPU memory (JAX or PyTorch) reads "OOM: ..."."""
    text = f"{type(err).__name__}: {err}"
    first = next((line for line in text.splitlines() if line.strip()), text)[:300]
    oom = "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or "OutOfMemory" in type(err).__name__
    return f"OOM: {first}" if oom else first


def worker(args) -> None:
    """Time ``args.worker`` at ``args.T[0]`` in each of ``args.modes``: ``STAGE`` lines as phases start,
    one ``ROW`` line (JSON) per mode, an error row when a mode raises."""
    name, T, start = args.worker, args.T[0], time.perf_counter()
    shape = {"B": args.B, "H": args.H, "K": args.K, "V": args.V, "chunk_size": args.chunk, "dtype": args.dtype}
    for mode in args.modes:
        def stage(phase, mode=mode):
            print(f"STAGE {time.perf_counter() - start:.1f} {mode} {phase}", flush=True)

        try:
            row = harness.time_pallas_gla(name, mode, T, **shape, warmup=args.warmup, rep=args.rep, stage=stage)
        except Exception as err:  # recorded, and the next mode still runs
            row = {"T": T, "name": f"{name} {mode}", "error": describe_error(err)}
        print("ROW " + json.dumps(row), flush=True)


# ---------------------------------------------------------------- the parent: run workers within limits

def run_limited(cmd, env, limit):
    """Run ``cmd`` for at most ``limit`` seconds: ``(stdout, stderr, returncode)``, returncode None if
    it was killed (its whole process group, compiler subprocesses included)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
        return out, err, proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return out, err, None


def parse_worker(out, err, returncode, name, T, modes, limit):
    """Rows of one worker's output, one per mode. Modes without a ``ROW`` line get an error saying
    what happened: which phase the time limit cut (and after how long), or how the worker died.
    Returns ``(rows, compile_timeouts)``, the latter the modes whose compile ran out of time."""
    rows, stages = {}, {}
    for line in out.splitlines():
        if line.startswith("ROW "):
            row = json.loads(line[4:])
            rows[row["name"][len(name) + 1:]] = row
        elif line.startswith("STAGE "):
            _, t, mode, phase = line.split(" ", 3)
            stages[mode] = (float(t), phase)
    last_err = next((line for line in reversed(err.splitlines()) if line.strip()), "")[:300]
    result, compile_timeouts = [], set()
    for mode in modes:
        if mode in rows:
            result.append(rows[mode])
            continue
        if returncode is None and mode in stages:
            t, phase = stages[mode]
            error = f"{phase} did not finish in {limit - t:.0f} s (case limit {limit:.0f} s)"
            if "compile" in phase:  # for Triton, "compile and run": the first call compiles
                compile_timeouts.add(mode)
        elif returncode is None:
            error = f"not run: the case's {limit:.0f} s were spent by an earlier mode"
        else:
            error = f"worker exited with code {returncode}: {last_err}"
        result.append({"T": T, "name": f"{name} {mode}", "error": error})
    return result, compile_timeouts


def worker_env(name, T, args):
    """The environment of one worker: JAX allocating GPU memory as it needs it (Triton workers keep
    JAX on the CPU, where it only makes the inputs), optional XLA flags and HLO dumps."""
    env = dict(os.environ)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if name.startswith("triton"):
        env["JAX_PLATFORMS"] = "cpu"
    flags = [env.get("XLA_FLAGS", ""), args.xla_flags or ""]
    if args.xla_dump and not name.startswith("triton"):
        flags.append(f"--xla_dump_to={pathlib.Path(args.xla_dump) / f'{bench.slug(name)}_T{T}'} --xla_dump_hlo_as_text")
    env["XLA_FLAGS"] = " ".join(f for f in flags if f)
    return env


def worker_cmd(name, T, modes, args):
    return [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", name, str(T), "--modes", *modes,
            "--B", str(args.B), "--H", str(args.H), "--K", str(args.K), "--V", str(args.V),
            "--chunk", str(args.chunk), "--dtype", args.dtype, "--warmup", str(args.warmup), "--rep", str(args.rep)]


def run_all(args, names, start=None):
    """Every (T, candidate) case in its own worker, within ``args.limit`` per case and ``args.budget``
    in all; returns the rows, printing each case's as it ends."""
    start = time.perf_counter() if start is None else start
    rows, timed_out = [], {}  # (name, mode) -> T at which its compile ran out of time
    for T in args.T:
        for name in names:
            modes = [m for m in harness.BENCH_MODES if (name, m) not in timed_out]
            case = [{"T": T, "name": f"{name} {m}",
                     "error": f"not run: compile did not finish at T={timed_out[name, m]}"}
                    for m in harness.BENCH_MODES if (name, m) in timed_out]
            left = args.budget - (time.perf_counter() - start)
            if modes and left < MIN_CASE_S:
                spent = f"not run: the {args.budget:.0f} s budget was spent"
                case += [{"T": T, "name": f"{name} {m}", "error": spent} for m in modes]
            elif modes:
                limit = min(args.limit, left)
                out, err, code = run_limited(worker_cmd(name, T, modes, args), worker_env(name, T, args), limit)
                measured, compile_timeouts = parse_worker(out, err, code, name, T, modes, limit)
                case += measured
                timed_out.update({(name, m): T for m in compile_timeouts})
            for row in sorted(case, key=lambda r: r["name"]):
                print(format_row(row), flush=True)
            rows += case
    return rows


def format_row(r) -> str:
    head = f"T={r['T']:>6} {r['name']:<40}"
    if "error" in r:
        return f"{head} {r['error']}"
    return (f"{head} {r['median_ms']:10.3f} ms  (p20 {r['p20_ms']:.3f}, p80 {r['p80_ms']:.3f}; "
            f"compile {r['compile_ms'] / 1e3:.1f} s)")


def merge_rows(old, new):
    """``new`` rows plus the ``old`` ones whose (T, name) this run did not measure."""
    keys = {(r["T"], r["name"]) for r in new}
    return [r for r in old if (r["T"], r["name"]) not in keys] + new


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("T", type=int, nargs="*", help="sequence lengths (default 1024 2048 4096; --smoke: 32)")
    p.add_argument("--only", nargs="+", choices=harness.PALLAS_BENCH, metavar="NAME",
                   help=f"candidates to run (default: all of {', '.join(harness.PALLAS_BENCH)})")
    p.add_argument("--limit", type=float, default=120.0, help="seconds for one (candidate, T): compile and run")
    p.add_argument("--budget", type=float, default=320.0, help="seconds for all cases together")
    p.add_argument("--out", type=pathlib.Path, help="JSON path (default results/pallas_bench_<device>.json)")
    p.add_argument("--merge", action="store_true", help="keep the rows of an existing --out not measured now")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, float32, any device, a temporary output")
    p.add_argument("--xla-dump", help="folder for XLA's HLO dumps of every JAX case")
    p.add_argument("--xla-flags", help="extra XLA_FLAGS for the workers, written with '=', e.g. "
                   "--xla-flags=--xla_gpu_autotune_level=0")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--modes", nargs="+", default=list(harness.BENCH_MODES), help=argparse.SUPPRESS)
    for key in ("B", "H", "K", "V", "chunk", "warmup", "rep"):
        hidden = key in ("warmup", "rep")
        p.add_argument(f"--{key}", type=int, help=argparse.SUPPRESS if hidden else f"default {FULL[key]}")
    p.add_argument("--dtype", choices=("bfloat16", "float32"))
    args = p.parse_args(argv)
    for key, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, key) in (None, []):
            setattr(args, key, value)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    from gla_ref import device

    if not args.smoke and not device.has_cuda():
        sys.exit("bench_pallas.py times GPU kernels and needs CUDA; on a CPU run it with --smoke")
    start = time.perf_counter()
    rows = run_all(args, list(args.only or harness.PALLAS_BENCH), start)
    env = {**bench.environment(),
           "shape": {"B": args.B, "H": args.H, "K": args.K, "V": args.V, "chunk_size": args.chunk,
                     "dtype": args.dtype},
           "limit_s": args.limit, "budget_s": args.budget, "xla_flags": args.xla_flags or "",
           "smoke": args.smoke, "wall_s": round(time.perf_counter() - start, 1)}
    default_dir = pathlib.Path(tempfile.gettempdir()) if args.smoke else RESULTS
    path = args.out or default_dir / f"pallas_bench_{'smoke_' if args.smoke else ''}{bench.slug(env['device'])}.json"
    if args.merge and path.exists():
        rows = merge_rows(json.loads(path.read_text())["rows"], rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(f"{env['device']}, jax {env['jax']}, torch {env['torch']}: {len(rows)} rows in {env['wall_s']} s")
    print("wrote", path)


if __name__ == "__main__":
    main()
