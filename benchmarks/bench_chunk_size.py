"""Inter-chunk against intra-chunk time as the chunk size grows: the sweep of the GLA paper's first
version (its Fig. 2, right), forward only, bf16 inputs with GLA gates, on a CUDA GPU.

``python benchmarks/bench_chunk_size.py [--T 4096] [--B 8] [--H 16] [--K 128] [--V 128] [--C 16 32 ...] [--out PATH] [--smoke]``

For C = 16, 32, 64, 128, 256 it times, each part on its own (``gla_ref.bench``):

* ``torch``: the pure-PyTorch chunk form cut at its two terms (:func:`bench.torch_chunk_parts`):
  ``inter`` = the state recurrence and Q S, ``intra`` = the within-chunk (P ⊙ M) V, sub-chunks of 16.
  Every C.
* ``triton``: the four forward kernels of ``gla_ref.triton.chunk_gla`` (:func:`bench.triton_chunk_stages`:
  cumsum, state, intra, output) and the whole forward (``total``), at the chunk sizes chunk_gla
  accepts; the others are recorded under ``unsupported`` with the library's own error message.
* ``fused``: ``gla_ref.triton.fused_chunk_gla``'s whole forward, at the chunk sizes it accepts.

Before timing, every output is checked against ``gla_ref.triton.chunk_gla``. The device's peaks are
measured once (bf16 and fp32 matmul TFLOP/s, copy bandwidth). Writes
``benchmarks/results/chunk_size_sweep_<device>.json`` stamped by ``bench.environment()``. Medians and
20/80 % quantiles by ``bench.time_cuda`` (CUDA events, L2 flushed); the first call of each part
(compilation, autotuning) is timed apart as ``first_call_ms``. About two minutes on an H200, most
of it Triton compiling and autotuning.

``--smoke`` runs tiny float32 shapes on any device (on a CPU: Triton's interpreter and the host clock)
and writes to the temporary directory unless ``--out`` is given: it exercises the logic, not speed.
"""

from __future__ import annotations

import argparse
import pathlib
import time

from gla_ref import bench, device

RESULTS = pathlib.Path(__file__).parent / "results"
CHUNK_SIZES = (16, 32, 64, 128, 256)
SUB_CHUNK = 16
SMOKE_SHAPE = dict(B=1, T=64, H=2, K=32, V=32)

IMPLEMENTATIONS = {
    "torch": "gla_ref.torch_ref.chunk_gla_two_level cut at its two terms (gla_ref.bench.torch_chunk_parts), "
             "float32 math in PyTorch",
    "triton": "gla_ref.triton.chunk_gla's forward kernels apart (gla_ref.bench.triton_chunk_stages) and whole",
    "fused": "gla_ref.triton.fused_chunk_gla's forward, whole (states kept on chip)",
}
PARTS = {
    "torch": {"inter": "state recurrence over the chunks and Q S (torch_ref.scan_chunks)",
              "intra": "within-chunk (P ⊙ M) V by sub-chunks of 16 (torch_ref.two_level_scores, then @ V)"},
    "triton": {"cumsum": "chunk_local_cumsum: g -> b = log Λ",
               "state": "chunk_state_fwd: the inter-chunk recurrence, one float32 state per chunk",
               "intra": "chunk_intra_attention: the C x C blocks A (sub-chunk pairs by tl.dot, diagonal in float32)",
               "output": "chunk_output: (Q ⊙ Λ) S (inter) + A V (intra) in one kernel",
               "total": "chunk_gla forward"},
    "fused": {"total": "fused_chunk_gla forward"},
}


def make_inputs(B, T, H, K, V, dtype, dev, seed=0):
    """q, k, v in ``dtype`` and GLA log-gates of the paper's strength (logsigmoid / 16) in float32
    (:func:`gla_ref.bench.torch_inputs`, no gradients)."""
    return tuple(bench.torch_inputs(B, T, H, K, V, "gla", dtype, dev, seed=seed, requires_grad=False))


def measure(fn, on_gpu):
    """Median and quantiles (ms) of ``fn()``, and its first call timed on its own."""
    import torch

    if on_gpu:
        first = bench.time_wall(fn, warmup=0, rep=1, sync=lambda _: torch.cuda.synchronize())["first_ms"]
        return {**bench.time_cuda(fn, warmup=10, rep=50), "first_call_ms": first}
    t = bench.time_wall(fn, warmup=1, rep=2)
    return {"median_ms": t["median_ms"], "p20_ms": t["p20_ms"], "p80_ms": t["p80_ms"], "first_call_ms": t["first_ms"]}


def supported(check, C):
    """None if the library accepts chunk size C, else its error message."""
    try:
        check(C)
    except ValueError as err:
        return str(err)
    return None


def sweep(q, k, v, g, on_gpu, chunk_sizes=CHUNK_SIZES):
    """Rows ``{C, impl, part, median_ms, ...}``, the unsupported (C, impl) pairs and the checks."""
    import torch

    from gla_ref.testing import rel_rmse
    from gla_ref.triton import chunk_gla, fused_chunk_gla
    from gla_ref.triton.common.host import check_chunk_size
    from gla_ref.triton.chunk.state import chunk_state_fwd_kernel
    from gla_ref.triton.fused_chunk.forward import CHUNK_SIZES as FUSED_SIZES

    o_ref = chunk_gla(q, k, v, g)[0]  # the output every part must add up to, C = 64
    rows, unsupported, checks = [], [], {}
    tol = 1e-5 if q.dtype == torch.float32 else 2e-2  # bf16: each output is ~4e-3 from float64

    def record(C, impl, part, fn):
        rows.append({"C": C, "impl": impl, "part": part, **measure(fn, on_gpu)})
        print(f"C={C:>4} {impl:<7} {part:<7} {rows[-1]['median_ms']:9.3f} ms", flush=True)

    def check(name, out):
        checks[name] = err = rel_rmse(o_ref, out)
        if not err < tol:
            raise AssertionError(f"{name}: relative RMSE {err:.2e} against chunk_gla exceeds {tol}")

    for C in chunk_sizes:
        parts, combine = bench.torch_chunk_parts(q, k, v, g, C, SUB_CHUNK)
        check(f"torch C={C}", combine(parts["inter"](), parts["intra"]()))
        for part, fn in parts.items():
            record(C, "torch", part, fn)
        del parts, combine
        for impl, why in (("triton", supported(check_chunk_size, C)),
                          ("fused", supported(lambda c: check_chunk_size(c, FUSED_SIZES), C))):
            if why:
                unsupported.append({"C": C, "impl": impl, "reason": why})
        if not supported(check_chunk_size, C):
            getattr(chunk_state_fwd_kernel, "cache", {}).clear()  # its autotune key lacks C: tune each C anew
            stages = bench.triton_chunk_stages(q, k, v, g, C)
            check(f"triton C={C}", stages["output"]())
            for part, fn in {**stages, "total": lambda: chunk_gla(q, k, v, g, chunk_size=C)}.items():
                record(C, "triton", part, fn)
            del stages
        if not supported(lambda c: check_chunk_size(c, FUSED_SIZES), C):
            check(f"fused C={C}", fused_chunk_gla(q, k, v, g, chunk_size=C)[0])
            record(C, "fused", "total", lambda: fused_chunk_gla(q, k, v, g, chunk_size=C))
        if on_gpu:
            torch.cuda.empty_cache()
    return rows, unsupported, checks


def measure_peaks(smoke):
    """bf16 and fp32 (TF32 off) matmul TFLOP/s and copy GB/s of this GPU (small sizes for --smoke)."""
    n = 1024 if smoke else 8192
    return {"bf16_TFLOPs": bench.matmul_tflops_cuda(n, "bfloat16"),
            "fp32_TFLOPs": bench.matmul_tflops_cuda(n, "float32"),
            "hbm_GBps": bench.copy_bandwidth_cuda(2 ** 24 if smoke else 2 ** 30),
            "matmul_n": n}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--K", type=int, default=128, help="query/key width per head")
    parser.add_argument("--V", type=int, default=128, help="value width per head (the paper's v1 sweep: "
                        "B=32, H=4, K=128, V=256)")
    parser.add_argument("--C", type=int, nargs="+", default=list(CHUNK_SIZES), help="chunk sizes")
    parser.add_argument("--out", type=pathlib.Path, help="JSON path (default: results/chunk_size_sweep_<device>.json)")
    parser.add_argument("--smoke", action="store_true", help="tiny float32 shapes on any device, to a temp path")
    args = parser.parse_args(argv)
    on_gpu = bench.start_gpu_run(parser, args.smoke)  # tuning lines, the interpreter on a CPU
    import torch

    t0 = time.perf_counter()
    shape = SMOKE_SHAPE if args.smoke else dict(B=args.B, T=args.T, H=args.H, K=args.K, V=args.V)
    dtype = torch.float32 if args.smoke else torch.bfloat16  # no bf16 tl.dot in the interpreter
    env = bench.environment()
    peaks = measure_peaks(args.smoke) if on_gpu else None
    with torch.no_grad():
        rows, unsupported, checks = sweep(*make_inputs(**shape, dtype=dtype, dev=device.torch_device()), on_gpu,
                                          args.C)
    result = {"env": env, "shape": {**shape, "dtype": str(dtype).removeprefix("torch."), "gate": "gla",
                                     "sub_chunk": SUB_CHUNK, "smoke": args.smoke},
              "peaks": peaks, "datasheet_peaks": bench.datasheet_peaks(env["device"]),
              "implementations": IMPLEMENTATIONS, "parts": PARTS, "rows": rows, "unsupported": unsupported,
              "checks_rel_rmse_vs_chunk_gla": checks, "timer": "bench.time_cuda" if on_gpu else "bench.time_wall",
              "wall_s": time.perf_counter() - t0}
    path = bench.write_result(result, "chunk_size_sweep", RESULTS, args.out, args.smoke)
    for u in unsupported:
        print(f"C={u['C']:>4} {u['impl']:<7} not run: {u['reason']}")
    if peaks:
        print("peaks:", {key: round(val, 1) for key, val in peaks.items()})
    print(f"wrote {path} in {result['wall_s']:.0f} s")
    return path


if __name__ == "__main__":
    main()
