"""What the launch shortcut (``gla_ref.triton.common.launch_cache``) saves: chunk GLA with it and without it, same process.

Run on a CUDA GPU: ``python benchmarks/launch_overhead.py [--shape 128x128] [--T 1024 2048 4096] [--rounds 2]
[--out PATH]``. For each T, rounds alternate the shortcut on and off (``GLA_REF_LAUNCH_CACHE``); each round
records, for a forward step and a forward+backward step, the host's time to issue 200 steps back to back and
the time until the GPU has finished them (as ``profile_chunk.py`` does), and the median of
``triton.testing.do_bench`` (the speed benchmark's timing, L2 flushed between runs). A last row times one
kernel's launch (``chunk_output``, through its Python wrapper and through the autotuned kernel alone) both
ways. Writes ``benchmarks/results/launch_cache_<device>.json`` (stamped with device, versions, date).
B=8, H=16, bf16 inputs, as in the speed benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import torch

from gla_ref import bench
from gla_ref.bench.profiling import host_times, make_step
from gla_ref.triton import chunk_gla
from gla_ref.triton.common import launch_cache as _launch

RESULTS = pathlib.Path(__file__).parent / "results"
MODES = {"shortcut": "1", "triton": "0"}


def run(q, k, v, g):
    return chunk_gla(q, k, v, g)[0]


def round_row(inputs, steps):
    """Host issue and wall time (ms per step) and do_bench's median for a forward and a forward+backward step."""
    row = {}
    for part, forward in (("fwd", True), ("fwd_bwd", False)):
        step = make_step(run, inputs, forward)
        row[f"{part}_host"] = host_times(step, steps)
        row[part] = bench.time_cuda(step, **({} if forward else {"grad_to_none": inputs}))
    return row


def launch_row(inputs, n=2000):
    """Microseconds of host time per launch of ``chunk_output``: its wrapper, and the autotuned kernel alone."""
    from gla_ref.triton.common.host import cdiv
    from gla_ref.triton.chunk.cumsum import chunk_gates_and_operands
    from gla_ref.triton.chunk.intra import chunk_intra_attention
    from gla_ref.triton.chunk.output import chunk_output, chunk_output_kernel
    from gla_ref.triton.chunk.state import chunk_state_fwd

    q, k, v, g = (x.detach() for x in inputs)
    B, T, H, K = q.shape
    scale = K ** -0.5
    b, qt, kt = chunk_gates_and_operands(q, k, g, scale, 64)
    h, _ = chunk_state_fwd(kt, v, b, None, False, 64, decayed=True)
    A = chunk_intra_attention(q, k, b, scale, 64)
    o = chunk_output(qt, v, h, A, 64)
    direct = dict(T=T, H=H, K=K, V=v.shape[-1], C=64, PREC="tf32", cu_seqlens=None, chunk_indices=None,
                  IS_VARLEN=False)
    grid = lambda meta: (cdiv(v.shape[-1], meta["BV"]), cdiv(T, 64), B * H)
    calls = {"wrapper": lambda: chunk_output(qt, v, h, A, 64),
             "kernel": lambda: chunk_output_kernel[grid](qt, v, h, A, o, **direct)}
    row = {}
    for mode, switch in MODES.items():
        os.environ[_launch.SWITCH] = switch
        for name, call in calls.items():
            call()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            row[f"{name}_{mode}_us"] = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="128x128", help="KxV of the heads")
    parser.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    bench.show_tuning()
    B, H = 8, 16
    K, V = (int(n) for n in args.shape.split("x"))
    env = bench.environment()
    path = args.out or RESULTS / f"launch_cache_{bench.slug(env['device'])}.json"
    rows = []
    for T in args.T:
        inputs = bench.torch_inputs(B, T, H, K, V, "gla", "bfloat16", "cuda")
        for step in (make_step(run, inputs), make_step(run, inputs, True)):  # tuning and compiling happen here
            step()
        for r in range(args.rounds):
            for mode, switch in MODES.items():
                os.environ[_launch.SWITCH] = switch
                rows.append({"K": K, "V": V, "T": T, "mode": mode, "round": r, **round_row(inputs, args.steps)})
                last = rows[-1]
                print(f"T={T} {mode:8s} round {r}: fwd issue {last['fwd_host']['issue_ms']:.3f} wall "
                      f"{last['fwd_host']['wall_ms']:.3f} bench {last['fwd']['median_ms']:.3f} | fwd+bwd issue "
                      f"{last['fwd_bwd_host']['issue_ms']:.3f} wall {last['fwd_bwd_host']['wall_ms']:.3f} bench "
                      f"{last['fwd_bwd']['median_ms']:.3f} ms", flush=True)
    launches = {"K": K, "V": V, "T": args.T[0], **launch_row(bench.torch_inputs(B, args.T[0], H, K, V, "gla", "bfloat16", "cuda"))}
    print("one launch:", {key: round(val, 1) for key, val in launches.items()})
    os.environ.pop(_launch.SWITCH)
    result = {"env": env, "shape": {"B": B, "H": H, "K": K, "V": V, "dtype": "bfloat16"}, "rows": rows,
              "launch_us": launches}
    path.write_text(json.dumps(result, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
