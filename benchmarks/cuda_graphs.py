"""Eager calls against the same kernels replayed from a CUDA graph, at the short lengths where the host sets the pace.

Run on a CUDA GPU: ``python benchmarks/cuda_graphs.py [--shapes 64x64] [--T 1024 2048 4096]
[--only chunk_gla fused_chunk_gla fla.chunk_gla] [--out PATH]``.

Every candidate (``speed_vs_fla.py``'s names: ours, and FLA's when it is installed, in the same process and on
the same inputs) is timed four ways at each (K, V) and T, as ``speed_vs_fla.py`` times it (``bench.time_cuda``:
the L2 cache flushed, CUDA events): its forward under ``torch.no_grad`` and its forward+backward, each called
eagerly and replayed from a CUDA graph (``bench.cuda_graph``: one launch on the host for all the kernels). The
replayed output (and gradients) must equal the eager ones bit for bit; a candidate that cannot be captured has
its error recorded in place of the graph's times. Where the eager time is the host's and not the GPU's, the
two differ; where the kernels take longer than their launches, they agree. ``first_fwd_bwd_s``: the wall
time of the first forward+backward at the shape's first T (compiling and autotuning).

Writes ``benchmarks/results/cuda_graphs_<device>.json`` stamped by ``bench.environment()``, with
``ratios``: ours over FLA's per (K, V, T), forward and forward+backward, eager and replayed apart.
B=8, H=16, bf16 q, k, v and float32 log-gates of the paper's strength, as in the speed benchmark.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from speed_vs_fla import candidates, parse_shape  # noqa: E402
from speed_vs_fla import ratios as speed_ratios  # noqa: E402

from gla_ref import bench  # noqa: E402
from gla_ref.bench.profiling import make_step  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SETTING = {"B": 8, "H": 16, "dtype": "bfloat16"}
DEFAULT_ONLY = ("chunk_gla", "fused_chunk_gla", "fla.chunk_gla")
PASSES = ("fwd", "fwd_bwd")
MODES = ("eager", "graph")


def same_bits(a, b) -> bool:
    """Whether two results (a tensor, or a list of tensors) are equal bit for bit."""
    import torch

    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def measure(step, grad_to_none) -> dict:
    """Eager and replayed times of one step, and whether the replay gave the eager result bit for bit."""
    eager_out = [x.clone() for x in step()] if grad_to_none else step().clone()
    row = {"eager": bench.time_cuda(step, grad_to_none=grad_to_none)}
    try:
        graph, out = bench.cuda_graph(step)
    except RuntimeError as err:  # a launch path that syncs or reads the device on the host cannot be captured
        return {**row, "graph": None, "graph_error": str(err).splitlines()[0]}
    graph.replay()
    row["graph"] = bench.time_cuda(graph.replay)
    row["graph_equals_eager"] = same_bits(out, eager_out)
    del graph
    return row


def run_point(K, V, T, runs, first: bool) -> list[dict]:
    """Rows of every candidate at one (K, V, T): each pass eager and replayed."""
    import torch

    rows = []
    for name, (gate, run) in runs.items():
        inputs = bench.torch_inputs(SETTING["B"], T, SETTING["H"], K, V, gate, torch.bfloat16, "cuda")
        step = {part: make_step(run, inputs, forward=part == "fwd") for part in PASSES}
        row = {"K": K, "V": V, "T": T, "name": name}
        if first:
            start = time.perf_counter()
            step["fwd_bwd"]()
            torch.cuda.synchronize()
            row["first_fwd_bwd_s"] = time.perf_counter() - start
        for part in PASSES:
            row[part] = measure(step[part], inputs if part == "fwd_bwd" else None)
        rows.append(row)
        print(row, flush=True)
        torch.cuda.empty_cache()
    return rows


def ratios(rows) -> dict:
    """``{mode: speed_vs_fla.ratios(...)}`` for ``eager`` and ``graph``: ours over FLA's per (K, V, T), forward
    and forward+backward, from the rows' times in that mode (a pass that could not be captured is left out)."""
    return {mode: speed_ratios([{**{k: r[k] for k in ("K", "V", "T", "name")},
                                 **{part: r[part][mode] for part in PASSES if r[part].get(mode)}} for r in rows])
            for mode in MODES}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shape, nargs="+", default=[(64, 64)])
    parser.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--only", nargs="+", default=list(DEFAULT_ONLY))
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    bench.start_gpu_run(parser, smoke=False)
    runs = candidates(only_ours=not any(n.startswith("fla.") for n in args.only), only=args.only)
    env = bench.environment()
    start = time.perf_counter()
    rows = [row for K, V in args.shapes for i, T in enumerate(args.T) for row in run_point(K, V, T, runs, i == 0)]
    result = {"env": env, "setting": {**SETTING, "T": args.T, "shapes": [f"{K}x{V}" for K, V in args.shapes]},
              "rows": rows, "ratios": ratios(rows), "wall_s": time.perf_counter() - start}
    print(f"wrote {bench.write_result(result, 'cuda_graphs', RESULTS, out=args.out)}")


if __name__ == "__main__":
    main()
