"""fused_chunk_gla's state tiles: the wide tile its launcher picks (``value_block``) against the narrow one.

    python benchmarks/fused_tiles.py [--shapes 128x128 128x256 256x512] [--T 4096 16384] [--fla] [--out PATH]

Programs that hold every key (the forward and the dv kernel) take ``WIDE_STATE_ELEMENTS`` float32 state
elements instead of ``STATE_ELEMENTS`` when the grid then still has a program per streaming multiprocessor
(:func:`gla_ref.triton.fused_chunk.forward.value_block`). For each (K, V) shape, in one process and on the same
inputs (B=8, H=16, bf16, float32 gates of the paper's strength), both tilings are timed at every T: the
forward and the forward+backward (``bench.time_cuda`` medians), each kernel's share of a forward+backward
step (torch.profiler), the value columns a program holds and how many programs that makes, and the largest
relative difference between the two tilings' o and gradients. ``narrow`` forces ``STATE_ELEMENTS``
everywhere (the launcher told it knows no SM count); ``picked`` is the library as it launches. With
``--fla``, FLA's ``chunk_gla`` is timed too, in the same process, for the ratio the speed target names
(fused_chunk_gla forward+backward within 1.5x of FLA's chunk_gla). Writes
``benchmarks/results/fused_tiles_<device>.json``, stamped by ``bench.environment()``.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from speed_vs_fla import candidates, measure, parse_shape, ratios  # noqa: E402

from gla_ref import bench  # noqa: E402
from gla_ref.bench.profiling import kernel_times  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
B, H = 8, 16
TILINGS = ("narrow", "picked")
PAIRS = (("fused_chunk_gla picked", "fused_chunk_gla narrow"), ("fused_chunk_gla picked", "fla.chunk_gla"),
         ("fused_chunk_gla narrow", "fla.chunk_gla"))


@contextlib.contextmanager
def tiling(name: str):
    """``narrow``: the launcher sees no SM count, so every program holds ``STATE_ELEMENTS``; ``picked``: as is."""
    from gla_ref.triton.fused_chunk import forward as fused_chunk_fwd

    real = fused_chunk_fwd.sm_count
    if name == "narrow":
        fused_chunk_fwd.sm_count = lambda x: None
    try:
        yield
    finally:
        fused_chunk_fwd.sm_count = real


def tiles(q, v) -> dict:
    """Value columns of a whole-K program and the forward's program count, as the launcher would pick them."""
    from gla_ref.triton.fused_chunk.forward import launch_meta

    grid, meta = launch_meta(q, v, 16, "K")
    return {"BK": meta["BK"], "BV": meta["BV"], "programs": grid[0] * grid[1]}


def outputs(inputs, do):
    """o and every gradient of fused_chunk_gla, float32 copies."""
    from gla_ref.triton import fused_chunk_gla

    o = fused_chunk_gla(*inputs)[0]
    o.backward(do)
    out = [o.detach().float()] + [x.grad.float() for x in inputs]
    for x in inputs:
        x.grad = None
    return out


def run_shape(K, V, Ts, with_fla: bool, done_T=lambda rows: None) -> list[dict]:
    """Both tilings (and FLA's chunk_gla with ``with_fla``) at every T; ``done_T(rows)`` after each T."""
    import torch

    from gla_ref.triton import fused_chunk_gla

    fla = candidates(only_ours=not with_fla, only=["fla.chunk_gla"]).get("fla.chunk_gla")
    rows = []
    for i, T in enumerate(Ts):
        inputs = bench.torch_inputs(B, T, H, K, V, "gla", torch.bfloat16, "cuda")
        do = torch.randn_like(inputs[2])
        ref = None
        for name in TILINGS:
            with tiling(name):
                row = {"K": K, "V": V, "T": T, "name": f"fused_chunk_gla {name}", **tiles(inputs[0], inputs[2])}
                row.update(measure(lambda q, k, v, g: fused_chunk_gla(q, k, v, g)[0], inputs, True, first=i == 0))

                def step():
                    fused_chunk_gla(*inputs)[0].backward(do)
                    for x in inputs:
                        x.grad = None
                row["kernels_ms"] = kernel_times(step, 3)[0]
                got = outputs(inputs, do)
            ref = ref or got
            row["max_rel_diff_vs_narrow"] = max(((a - b).norm() / b.norm()).item() for a, b in zip(got, ref))
            rows.append(row)
            print({k: v for k, v in row.items() if k != "kernels_ms"}, flush=True)
        if fla is not None:
            rows.append({"K": K, "V": V, "T": T, "name": "fla.chunk_gla", **measure(fla[1], inputs, True, first=i == 0)})
            print(rows[-1], flush=True)
        torch.cuda.empty_cache()
        done_T(rows)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=parse_shape, nargs="+", default=[(128, 128), (128, 256), (256, 512)])
    parser.add_argument("--T", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--fla", action="store_true", help="time FLA's chunk_gla in the same process")
    parser.add_argument("--keep", type=pathlib.Path, help="start from the rows of this earlier result")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    bench.start_gpu_run(parser, smoke=False)
    import torch

    env = bench.environment()
    rows = list(bench.load_results(args.keep)["rows"]) if args.keep else []
    t0 = time.perf_counter()

    def write(all_rows):  # after every T: a run cut short keeps the lengths it finished
        result = {"env": env, "setting": {"B": B, "H": H, "dtype": "bfloat16", "T": args.T},
                  "sms": torch.cuda.get_device_properties(0).multi_processor_count,
                  "rows": all_rows, "ratios": ratios(all_rows, PAIRS), "wall_s": time.perf_counter() - t0}
        return result, bench.write_result(result, "fused_tiles", RESULTS, args.out)

    for K, V in args.shapes:
        rows += run_shape(K, V, args.T, args.fla, done_T=lambda part: write(rows + part))
        result, path = write(rows)
    for row in result["ratios"]:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()})
    print("wrote", path)
    return path


if __name__ == "__main__":
    main()
