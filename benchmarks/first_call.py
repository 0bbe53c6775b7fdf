"""The first call of each Triton kernel at a new shape (compile + autotune), whether a new length re-tunes, and
the timing of every autotune config (issue 15).

``python benchmarks/first_call.py [--shapes 64x64,128x128,128x256,256x512] [--kernels chunk_gla,...]
[--B 8] [--H 16] [--T 4096] [--then 2048,8192] [--out PATH] [--smoke]``

For each kernel (``chunk_gla``, ``fused_chunk_gla``, ``chunk_simple_gla``) and each head shape ``KxV``, a fresh
Python process (nothing compiled or tuned in memory) with ``TRITON_CACHE_DIR`` pointing to a new empty folder
(nothing compiled reused from disk) runs, in bf16 on a CUDA GPU:

1. the first forward+backward at ``T`` (default 4096): the wall time of compile + autotune + run, and the
   autotuner keys it tuned;
2. one forward+backward at each length of ``--then`` (default 2048 and 8192) in the same process: no kernel key
   holds T, so none may tune again (``retuned`` lists any that did);
3. a last forward+backward at ``T`` again: the time of a warm call, for scale.

Whether a kernel tuned is read from its autotuner's cache (one entry per key it has tuned); after each tuning the
autotuner's ``configs_timings`` (Triton 3.x: config → do_bench's [median, p20, p80] ms) and ``bench_time`` are
recorded, so the config lists can be pruned from measured data. ``GLA_REF_COMPILE_WORKERS`` (see
``gla_ref.triton.common.host.precompile``) is passed on to the fresh processes and recorded. Writes
``benchmarks/results/first_call_<device>.json`` stamped by ``bench.environment()``. ``--smoke`` runs tiny float32
shapes on any device (Triton's interpreter on a CPU keeps one config, so nothing tunes there) into a temp file.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

RESULTS = pathlib.Path(__file__).parent / "results"
KERNELS = ("chunk_gla", "fused_chunk_gla", "chunk_simple_gla")
SHAPES = ((64, 64), (128, 128), (128, 256), (256, 512))
SMOKE = {"shapes": ((16, 16),), "B": 1, "H": 1, "T": 20, "then": (9, 33)}


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"64x64,128x256"`` → ``[(64, 64), (128, 256)]`` (K x V); a clear error otherwise."""
    shapes = []
    for part in text.split(","):
        try:
            K, V = (int(n) for n in part.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--shapes: expected KxV pairs such as 128x256, got {part!r}") from None
        if K < 1 or V < 1:
            raise argparse.ArgumentTypeError(f"--shapes: sizes must be positive, got {part!r}")
        shapes.append((K, V))
    return shapes


def parse_ints(text: str) -> list[int]:
    try:
        values = [int(n) for n in text.split(",") if n]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated lengths, got {text!r}") from None
    if any(n < 1 for n in values):
        raise argparse.ArgumentTypeError(f"lengths must be positive, got {text!r}")
    return values


# ----------------------------------------------------------------------------- inside the fresh process

def _config(config) -> dict:
    """A triton.Config as plain JSON: its block sizes and launch options."""
    out = {"kwargs": dict(config.kwargs)}
    for name in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        value = getattr(config, name, None)
        if value is not None:
            out[name] = value
    return out


def tunings(tuners: dict, before: dict) -> list[dict]:
    """Keys tuned since ``before`` (label → set of cache keys), with each autotuner's last config timings."""
    out = []
    for label, tuner in tuners.items():
        new = [key for key in tuner.cache if key not in before[label]]
        if not new:
            continue
        timings = getattr(tuner, "configs_timings", None) or {}
        out.append({"kernel": label, "keys": [[str(x) for x in key] for key in new],
                    "best": _config(tuner.cache[new[-1]]), "bench_s": getattr(tuner, "bench_time", None),
                    "configs_timings": [{"config": _config(c), "ms": list(t) if isinstance(t, (list, tuple)) else [t]}
                                        for c, t in timings.items()]})
    return out


def child(args) -> dict:
    t_start = time.perf_counter()
    from gla_ref import bench, device

    bench.start_gpu_run(argparse.ArgumentParser(), smoke=True)
    import torch

    from gla_ref import triton as kernels

    on_gpu = torch.cuda.is_available()
    dev = device.torch_device()
    dtype = torch.bfloat16 if on_gpu and not args.smoke else torch.float32
    B, H, K, V = args.B, args.H, args.K, args.V
    fn = getattr(kernels, args.kernel)
    scalar_gate = args.kernel == "chunk_simple_gla"
    from gla_ref.triton.autotuners import autotuners

    tuners = autotuners()
    import_s = time.perf_counter() - t_start  # torch, triton and every gla_ref.triton module

    def inputs(T, seed):  # q, k, v, g, then do, from one generator
        return bench.torch_inputs(B, T, H, K, V, "scalar" if scalar_gate else "gla", dtype, dev, seed=seed,
                                  cotangent=True)

    def call(T, seed):
        xs, do = inputs(T, seed)
        before = {label: set(tuner.cache) for label, tuner in tuners.items()}
        if on_gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        o, _ = fn(*xs)
        o.backward(do)
        if on_gpu:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        return {"T": T, "fwd_bwd_ms": ms, "tuned": tunings(tuners, before)}

    first = call(args.T, 0)
    then = [call(T, i + 1) for i, T in enumerate(args.then)]
    warm = call(args.T, 0)
    return {"kernel": args.kernel, "B": B, "H": H, "K": K, "V": V, "dtype": str(dtype).removeprefix("torch."),
            "autotuned_kernels": sorted(tuners), "import_s": import_s,
            "first": first, "then": then, "warm": warm,
            "retuned": sorted({t["kernel"] for run in then + [warm] for t in run["tuned"]})}


# ----------------------------------------------------------------------------- the driver

def run_fresh(kernel, K, V, args) -> dict:
    """One shape of one kernel in a new process with an empty Triton cache folder."""
    with tempfile.TemporaryDirectory(prefix="gla_first_call_") as tmp:
        out = pathlib.Path(tmp) / "row.json"
        env = {**os.environ, "TRITON_CACHE_DIR": str(pathlib.Path(tmp) / "triton_cache")}
        cmd = [sys.executable, __file__, "--child", str(out), "--kernel", kernel, "--K", str(K), "--V", str(V),
               "--B", str(args.B), "--H", str(args.H), "--T", str(args.T),
               "--then", ",".join(map(str, args.then)), *(["--smoke"] if args.smoke else [])]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout + proc.stderr)[-2000:]
            return {"kernel": kernel, "K": K, "V": V, "error": f"exit {proc.returncode}: {tail}", "process_s": wall}
        row = json.loads(out.read_text())
        row["process_s"] = wall  # interpreter start, imports and all three calls
        return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=parse_shapes, default=list(SHAPES), help="KxV pairs, e.g. 128x128,256x512")
    parser.add_argument("--kernels", type=lambda s: s.split(","), default=list(KERNELS))
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--then", type=parse_ints, default=[2048, 8192], help="lengths run after the first call")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--smoke", action="store_true", help="tiny float32 shapes on any device, to a temp path")
    parser.add_argument("--child", type=pathlib.Path, help=argparse.SUPPRESS)  # internal: one fresh-process run
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    parser.add_argument("--K", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--V", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.kernels) - set(KERNELS))
    if unknown:
        parser.error(f"--kernels: unknown {unknown}; choose from {list(KERNELS)}")
    if args.child is not None:
        args.child.write_text(json.dumps(child(args)))
        return args.child

    from gla_ref import bench
    from gla_ref.triton.common.host import COMPILE_WORKERS

    on_gpu = bench.start_gpu_run(parser, args.smoke)
    if args.smoke:
        args.shapes, args.B, args.H, args.T, args.then = (list(SMOKE["shapes"]), SMOKE["B"], SMOKE["H"], SMOKE["T"],
                                                          list(SMOKE["then"]))
    t0 = time.perf_counter()
    result = {"env": bench.environment(),
              "shape": {"B": args.B, "H": args.H, "T": args.T, "then": args.then,
                        "dtype": "bfloat16" if on_gpu and not args.smoke else "float32"},
              "note": "each row: a fresh process and an empty TRITON_CACHE_DIR; first = compile + autotune + "
                      "fwd+bwd at T; then = other lengths, which must not re-tune; warm = T again. The autotuned "
                      "kernels compile their configs on threads before timing them (GLA_REF_COMPILE_WORKERS, "
                      "recorded here; 1 = one at a time), so bench_s is the timing alone unless it is 1",
              "compile_workers": os.environ.get(COMPILE_WORKERS, "default"),
              "rows": []}
    for kernel in args.kernels:
        for K, V in args.shapes:
            row = run_fresh(kernel, K, V, args)
            row["T"] = args.T
            row["name"] = kernel
            result["rows"].append(row)
            if "error" in row:
                print(f"{kernel} K={K} V={V}: {row['error']}", flush=True)
                continue
            tuned = len(row["first"]["tuned"])
            print(f"{kernel:<17} K={K:>3} V={V:>3}: first fwd+bwd {row['first']['fwd_bwd_ms'] / 1e3:6.1f} s "
                  f"({tuned} kernels tuned), then " + ", ".join(f"T={r['T']} {r['fwd_bwd_ms']:.1f} ms"
                                                               for r in row["then"])
                  + f", warm {row['warm']['fwd_bwd_ms']:.1f} ms; re-tuned: {row['retuned'] or 'none'}", flush=True)
    result["wall_s"] = time.perf_counter() - t0
    path = bench.write_result(result, "first_call", RESULTS, args.out, args.smoke)
    print(f"wrote {path} in {result['wall_s']:.0f} s")
    return path


if __name__ == "__main__":
    main()
