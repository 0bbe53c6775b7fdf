"""Our Triton kernels against FLA's at the speed targets' setting: B=8, H=16, bf16, T 1K–16K, four (K, V).

    python benchmarks/speed_vs_fla.py [--shapes 64x64 128x128 128x256 256x512] [--T 1024 ... 16384]
                                      [--keep EARLIER.json] [--out PATH] [--smoke]

Each (K, V) shape runs in this one process, FLA in the same process and on the same inputs. For every
candidate the first forward+backward at the shape's first T is timed alone on the wall clock (compile and
autotune land there), then, for every T, the forward and the forward+backward (medians of CUDA events,
``bench.time_cuda``) and their peak memory above the inputs. Candidates:

* ``chunk_gla`` and ``fla.chunk_gla`` (per-key gates ``[B, T, H, K]``);
* ``fused_chunk_gla``, our kernel that keeps the state on chip (FLA's raises);
* ``chunk_simple_gla`` and ``fla.chunk_simple_gla`` (a scalar gate per token and head). FLA 0.6.0's
  backward of this one refuses Triton 3.4–3.7.0 on Hopper: its error is recorded in place of the time.

After the first T of a shape, every later T must reuse the tuned configs of our kernels: the number of
autotune entries added (``retunes_after_first_T``) is recorded per shape and must be 0. The forward's
roofline fraction is the time the compulsory traffic (q, k, v, g read, o written: ``bench.gla_io_bytes``)
takes at the measured copy bandwidth, over the measured time. Ratios against FLA per (shape, T) land in
``ratios``. Writes ``benchmarks/results/speed_vs_fla_<device>.json`` stamped by ``bench.environment()``;
``--keep`` starts from an earlier file's rows (a long sweep split across several calls; the file is rewritten
after every candidate, so a run cut short keeps every row it finished: on 2026-11-27 FLA's chunk_simple_gla
compile ran past the device's limit at the first T and took the rows of the other candidates with it); ``--smoke`` runs tiny float32 shapes on a
CPU under Triton's interpreter into a temporary file.

Several shapes at once on one GPU: start one process per shape, each with ``--gpu-turns PATH`` (the same PATH)
and its own ``--out``, then ``--merge`` their files into one. Compilation, most of a first call, runs side by
side on the CPU cores; every timing (``triton.testing.do_bench``: ours, the autotuners', the copy bandwidth)
and every peak is taken in an exclusive turn (:class:`GpuTurns`). Outside a turn a process only compiles and
makes first runs: a first forward+backward at the shape's first T, and an autotuned config's first launch.
Such a launch may overlap another process's timing; the median of its many runs absorbs one. The first-call
wall times of such a run include waiting for turns and sharing the CPU: ``benchmarks/first_call.py`` measures
first calls alone.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import pathlib
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

from gla_ref import bench  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SHAPES = ("64x64", "128x128", "128x256", "256x512")
FULL = {"B": 8, "H": 16, "T": [1024, 2048, 4096, 8192, 16384], "dtype": "bfloat16"}
SMOKE = {"B": 1, "H": 1, "T": [20, 36], "dtype": "float32"}
OURS = ("chunk_gla", "fused_chunk_gla", "chunk_simple_gla")


def parse_shape(text: str) -> tuple[int, int]:
    """``"128x256"`` → ``(128, 256)`` (:func:`gla_ref.bench.parse_shape`, as argparse reads it)."""
    try:
        return bench.parse_shape(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def candidates(only_ours: bool, only=None):
    """name -> (gate kind, run(q, k, v, g) -> o); ``only``: the names to keep (default all)."""
    runs = _all_candidates(only_ours)
    return {name: run for name, run in runs.items() if not only or name in only}


def _all_candidates(only_ours: bool):
    from gla_ref.triton import chunk_gla, chunk_simple_gla, fused_chunk_gla

    runs = {
        "chunk_gla": ("gla", lambda q, k, v, g: chunk_gla(q, k, v, g)[0]),
        "fused_chunk_gla": ("gla", lambda q, k, v, g: fused_chunk_gla(q, k, v, g)[0]),
        "chunk_simple_gla": ("scalar", lambda q, k, v, g: chunk_simple_gla(q, k, v, g)[0]),
    }
    if only_ours:
        return runs
    try:
        from fla.ops.gla import chunk_gla as fla_chunk_gla
        from fla.ops.simple_gla import chunk_simple_gla as fla_chunk_simple_gla
    except ImportError as err:
        print(f"FLA not available ({err}); timing ours only", flush=True)
        return runs
    runs["fla.chunk_gla"] = ("gla", lambda q, k, v, g: fla_chunk_gla(q, k, v, g)[0])
    runs["fla.chunk_simple_gla"] = ("scalar", lambda q, k, v, g: fla_chunk_simple_gla(q, k, v, g)[0])
    return runs


def make_inputs(B, T, H, K, V, gate, dtype, dev, seed=0):
    """q, k, v in ``dtype`` and float32 log-gates of the paper's strength (logsigmoid / 16), all leaves
    (:func:`gla_ref.bench.torch_inputs`)."""
    return bench.torch_inputs(B, T, H, K, V, gate, dtype, dev, seed=seed)


def autotune_entries() -> int:
    """How many (kernel, key) pairs our Triton kernels have tuned so far in this process (each
    autotuner of :func:`gla_ref.triton.autotuners.autotuners` once)."""
    from gla_ref.triton.autotuners import autotuners

    return sum(len(tuner.cache) for tuner in autotuners().values())


class GpuTurns:
    """Exclusive turns on a GPU that several processes share: an ``fcntl`` lock on the file ``path``, held
    from the outermost ``with`` to its end (nested ``with`` blocks in one process hold it once). Without a
    path it only counts the nesting."""

    def __init__(self, path=None):
        self.path, self.depth, self.file = path, 0, None

    def __enter__(self):
        if self.path is not None and self.depth == 0:
            self.file = open(self.path, "a")
            fcntl.flock(self.file, fcntl.LOCK_EX)
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.file is not None and self.depth == 0:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


TURNS = GpuTurns()
"""This process's turns: :func:`measure` times inside one; :func:`take_turns` gives it a lock file."""


def take_turns(path, sync=None) -> None:
    """Share the GPU with the other processes given the same ``path``: ``triton.testing.do_bench`` (which
    ``bench.time_cuda`` and Triton's autotuners call) then times inside a turn. Called outside one, by an
    autotuner during a first call, it first runs the config once (the launch that compiles it) before
    waiting for the turn, so compiling stays parallel. ``sync`` waits for the GPU (default
    ``torch.cuda.synchronize``)."""
    import torch
    import triton.testing

    TURNS.path = path
    plain, sync = triton.testing.do_bench, sync or torch.cuda.synchronize

    def do_bench(fn, *args, **kwargs):
        if TURNS.depth == 0:
            fn()
            sync()
        with TURNS:
            return plain(fn, *args, **kwargs)

    triton.testing.do_bench = do_bench


def measure(run, inputs, on_gpu, first: bool) -> dict:
    """Times and peaks of one candidate at one T. Each part is tried on its own, so a backward that
    refuses (FLA's ``chunk_simple_gla`` on Hopper) still leaves the forward's numbers; its error lands
    in ``first_error``, ``fwd_error`` or ``fwd_bwd_error``."""
    import torch

    do = torch.randn_like(inputs[2])
    sync = (lambda _: torch.cuda.synchronize()) if on_gpu else None

    def fwd():
        with torch.no_grad():
            run(*inputs)

    def fwd_bwd():
        run(*inputs).backward(do)

    def timed(f, **kw):
        if on_gpu:
            return bench.time_cuda(f, **kw)
        return {"median_ms": bench.time_wall(f, warmup=0, rep=1)["median_ms"]}

    parts = {"fwd": lambda: {"fwd": timed(fwd), **({"fwd_peak_bytes": bench.peak_memory_cuda(fwd)} if on_gpu else {})},
             "fwd_bwd": lambda: {"fwd_bwd": timed(fwd_bwd, **({"grad_to_none": inputs} if on_gpu else {})),
                                 **({"fwd_bwd_peak_bytes": bench.peak_memory_cuda(fwd_bwd)} if on_gpu else {})}}
    if first:
        parts = {"first": lambda: {"first_fwd_bwd_s": bench.time_wall(fwd_bwd, warmup=0, rep=1, sync=sync)["first_ms"] / 1e3},
                 **parts}
    out = {}
    for key, part in parts.items():
        try:
            with TURNS if key != "first" else contextlib.nullcontext():
                out.update(part())
        except torch.OutOfMemoryError:
            out[f"{key}_error"] = "out of memory"
        except (RuntimeError, AssertionError, NotImplementedError) as err:
            out[f"{key}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:240]}"
        finally:
            for x in inputs:
                x.grad = None
    return out


PAIRS = (("chunk_gla", "fla.chunk_gla"), ("fused_chunk_gla", "fla.chunk_gla"), ("chunk_simple_gla", "fla.chunk_simple_gla"))


def ratios(rows, pairs=PAIRS) -> list[dict]:
    """Per (K, V, T): for each (ours, ref) of ``pairs`` (default ours over FLA's), ``"ours/ref fwd"``,
    ``"ours/ref fwd_bwd"`` and ``"ours/ref fwd_bwd peak"`` where both rows have them (time and peak;
    < 1 means faster or smaller)."""
    by = {(r["K"], r["V"], r["T"], r["name"]): r for r in rows}
    out = []
    for K, V, T in sorted({(r["K"], r["V"], r["T"]) for r in rows}):
        row = {"K": K, "V": V, "T": T}
        for ours, ref in pairs:
            a, b = by.get((K, V, T, ours), {}), by.get((K, V, T, ref), {})
            for key in ("fwd", "fwd_bwd"):
                if key in a and key in b:
                    row[f"{ours}/{ref} {key}"] = a[key]["median_ms"] / b[key]["median_ms"]
            if "fwd_bwd_peak_bytes" in a and "fwd_bwd_peak_bytes" in b:
                row[f"{ours}/{ref} fwd_bwd peak"] = a["fwd_bwd_peak_bytes"] / b["fwd_bwd_peak_bytes"]
        out.append(row)
    return out


def run_shape(K, V, setting, runs, on_gpu, copy_gbs, dev, dtype, done=lambda rows: None) -> tuple[list, dict]:
    """All candidates at every T of one (K, V): rows, and the shape's retune count. ``done(rows)`` is
    called with the shape's rows so far after every candidate at every T."""
    import torch

    B, H, rows = setting["B"], setting["H"], []
    tuned_after_first = None
    for i, T in enumerate(setting["T"]):
        if i == 1:
            tuned_after_first = autotune_entries()
        for name, (gate, run) in runs.items():
            res = measure(run, make_inputs(B, T, H, K, V, gate, dtype, dev), on_gpu, first=i == 0)
            if "fwd" in res and on_gpu:
                floor_ms = bench.gla_io_bytes(B, T, H, K, V, 2, gate) / (copy_gbs * 1e9) * 1e3
                res["fwd_roofline_fraction"] = floor_ms / res["fwd"]["median_ms"]
            rows.append({"K": K, "V": V, "T": T, "name": name, **res})
            print(f"K={K} V={V} T={T:>6} {name:<22}",
                  {k: round(v["median_ms"], 3) if isinstance(v, dict) else v for k, v in res.items()
                   if k in ("fwd", "fwd_bwd", "first_fwd_bwd_s") or k.endswith("error")}, flush=True)
            if on_gpu:
                torch.cuda.empty_cache()
            done(rows)
    retunes = None if tuned_after_first is None else autotune_entries() - tuned_after_first
    return rows, {"K": K, "V": V, "retunes_after_first_T": retunes}


def merge(results: list[dict]) -> dict:
    """One result from several processes' (``--gpu-turns``): their rows and retunes, ratios recomputed, each
    process's copy bandwidth and wall time by the shapes it ran (and its candidates, where two ran a shape).
    They must share device, versions and setting but their lengths (the date may differ: a run may pass
    midnight)."""
    first = results[0]
    same = lambda r: ({k: v for k, v in r["env"].items() if k != "date"}, {k: v for k, v in r["setting"].items() if k != "T"})  # noqa: E731
    if any(same(r) != same(first) for r in results):
        raise ValueError("--merge: the results differ in device, versions or setting")
    shapes = lambda r: " ".join(sorted({f"{row['K']}x{row['V']}" for row in r["rows"]}))  # noqa: E731
    runs = collections.Counter(map(shapes, results))  # processes per set of shapes
    names = lambda r: " ".join(dict.fromkeys(row["name"] for row in r["rows"]))  # noqa: E731
    key = lambda r: f"{shapes(r)} [{names(r)}]" if runs[shapes(r)] > 1 else shapes(r)  # noqa: E731
    rows = [row for r in results for row in r["rows"]]
    return {"env": first["env"], "setting": dict(first["setting"], T=sorted({t for r in results for t in r["setting"]["T"]})),
            "copy_bandwidth_GBps": first["copy_bandwidth_GBps"],
            "copy_bandwidth_GBps_per_shape": {key(r): r["copy_bandwidth_GBps"] for r in results},
            "rows": rows, "retunes": [x for r in results for x in r["retunes"]], "ratios": ratios(rows),
            "wall_s": {key(r): r["wall_s"] for r in results}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=parse_shape, nargs="+", help=f"KxV shapes (default {' '.join(SHAPES)})")
    parser.add_argument("--T", type=int, nargs="+", help=f"lengths (default {FULL['T']})")
    parser.add_argument("--only", nargs="+", help="candidate names to run (default all)")
    parser.add_argument("--keep", type=pathlib.Path, help="start from the rows of this earlier result")
    parser.add_argument("--out", type=pathlib.Path, help="JSON path (default results/speed_vs_fla_<device>.json)")
    parser.add_argument("--smoke", action="store_true", help="tiny float32 shapes on a CPU, a temporary file")
    parser.add_argument("--gpu-turns", type=pathlib.Path, help="lock file shared with processes timing on this GPU")
    parser.add_argument("--merge", type=pathlib.Path, nargs="+", help="combine these results (one per process) into --out")
    args = parser.parse_args(argv)
    if args.merge:
        return bench.write_result(merge([bench.load_results(p) for p in args.merge]), "speed_vs_fla", RESULTS, args.out)
    on_gpu = bench.start_gpu_run(parser, args.smoke)
    import torch

    if args.gpu_turns:
        take_turns(args.gpu_turns)

    from gla_ref import device

    from gla_ref.triton.common import launch_cache as _launch

    setting = dict(SMOKE if args.smoke else FULL, launch_shortcut=_launch.enabled())
    if args.T:
        setting["T"] = args.T
    shapes = args.shapes or ([(16, 24)] if args.smoke else [parse_shape(s) for s in SHAPES])
    earlier = bench.load_results(args.keep) if args.keep else {"rows": [], "retunes": []}
    env = bench.environment()
    copy_gbs = bench.copy_bandwidth_cuda() if on_gpu else None
    runs = candidates(only_ours=args.smoke, only=args.only)
    rows, retunes, t0 = list(earlier["rows"]), list(earlier["retunes"]), time.perf_counter()
    dtype = getattr(torch, setting["dtype"])
    def write(all_rows, all_retunes):
        result = {"env": env, "setting": setting, "copy_bandwidth_GBps": copy_gbs, "rows": all_rows,
                  "retunes": all_retunes, "ratios": ratios(all_rows), "wall_s": time.perf_counter() - t0}
        return result, bench.write_result(result, "speed_vs_fla", RESULTS, args.out, args.smoke)

    for K, V in shapes:
        # after every candidate: a run cut short (the device's time limit) keeps what it finished
        shape_rows, retune = run_shape(K, V, setting, runs, on_gpu, copy_gbs, device.torch_device(), dtype,
                                       done=lambda part: write(rows + part, retunes))
        rows += shape_rows
        retunes.append(retune)
        result, path = write(rows, retunes)
    for row in result["ratios"]:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
    print(f"retunes after the first T: {retunes}; wrote {path} in {result['wall_s']:.0f} s")
    return path


if __name__ == "__main__":
    main()
