"""Speed and memory of the Triton GLA kernels against FLA, SDPA and the pure-PyTorch chunk form.

Run on a CUDA GPU: ``python benchmarks/bench_triton.py [--T 1024 2048 ...] [--only NAME ...] [--out PATH]``.
Writes ``benchmarks/results/triton_bench_<device>.json`` (stamped with device, versions, date; ``--out``
writes elsewhere, e.g. for a partial run) and prints a table. FLA (``fla-core``) and SDPA's flash backend are optional: a missing one is recorded.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
import torch.nn.functional as F

from gla_ref import bench, torch_ref
from gla_ref.triton import chunk_gla, chunk_simple_gla, fused_chunk_gla
from gla_ref.triton.common import launch_cache as _launch

RESULTS = pathlib.Path(__file__).parent / "results"


def make_inputs(B, T, H, K, V, gate, dtype=torch.bfloat16, seed=0):
    """bf16 q, k, v with gates of the paper's strength (logsigmoid / 16), all requiring grad, on the GPU
    (:func:`gla_ref.bench.torch_inputs`)."""
    return tuple(bench.torch_inputs(B, T, H, K, V, gate, dtype, "cuda", seed=seed))


def candidates():
    """name -> (gate kind, function(q, k, v, g) -> o)."""
    runs = {
        "chunk_gla": ("gla", lambda q, k, v, g: chunk_gla(q, k, v, g)[0]),
        "fused_chunk_gla": ("gla", lambda q, k, v, g: fused_chunk_gla(q, k, v, g)[0]),
        "chunk_simple_gla": ("scalar", lambda q, k, v, g: chunk_simple_gla(q, k, v, g)[0]),
        "torch_ref.chunk_gla": ("gla", lambda q, k, v, g: torch_ref.chunk_gla(q, k, v, g)[0]),
        "sdpa_flash": ("gla", sdpa_flash),
    }
    try:
        from fla.ops.gla import chunk_gla as fla_chunk_gla

        runs["fla.chunk_gla"] = ("gla", lambda q, k, v, g: fla_chunk_gla(q, k, v, g)[0])
    except ImportError as err:
        print(f"FLA not available ({err}); skipping it")
    return runs


def sdpa_flash(q, k, v, g):
    """Causal softmax attention by SDPA's flash backend (g unused), in the [B, T, H, D] layout."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return o.transpose(1, 2)


def measure(fn, inputs):
    """Forward and forward+backward time and peak memory of one candidate."""
    do = torch.randn_like(inputs[2])  # o has v's shape [B, T, H, V]

    def fwd():
        with torch.no_grad():
            fn(*inputs)

    def fwd_bwd():
        fn(*inputs).backward(do)

    out = {"fwd": bench.time_cuda(fwd), "fwd_bwd": bench.time_cuda(fwd_bwd, grad_to_none=inputs)}
    for x in inputs:
        x.grad = None
    out["fwd_peak_bytes"] = bench.peak_memory_cuda(fwd)
    out["fwd_bwd_peak_bytes"] = bench.peak_memory_cuda(fwd_bwd)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--D", type=int, default=128)
    parser.add_argument("--only", nargs="+", help="candidate names to run (default: all)")
    parser.add_argument("--out", type=pathlib.Path, help="JSON path (default: results/triton_bench_<device>.json)")
    args = parser.parse_args()
    bench.show_tuning()  # a line per kernel autotuned: the first call at a shape takes minutes
    B, H, K = args.B, args.H, args.D
    V = K
    env = bench.environment()
    copy_gbs = bench.copy_bandwidth_cuda()
    rows = []
    for T in args.T:
        for name, (gate, fn) in candidates().items():
            if args.only and name not in args.only:
                continue
            inputs = make_inputs(B, T, H, K, V, gate)
            try:
                res = measure(fn, inputs)
            except torch.OutOfMemoryError:
                res = {"error": "out of memory"}
            except RuntimeError as err:  # e.g. no flash kernel for this shape
                res = {"error": str(err).splitlines()[0][:200]}
            if "fwd" in res:
                io = bench.gla_io_bytes(B, T, H, K, V, 2, gate)
                res["fwd_GBps"] = io / (res["fwd"]["median_ms"] * 1e-3) / 1e9
            rows.append({"T": T, "name": name, **res})
            torch.cuda.empty_cache()
            print(T, name, {k: v for k, v in res.items() if k in ("fwd", "fwd_bwd", "error")}, flush=True)
    ratios = ratio_table(rows)
    # the kernels' defaults: chunk states and A stored in the input dtype (bf16, 2 bytes an element)
    result = {"env": env, "shape": {"B": B, "H": H, "K": K, "V": V, "dtype": "bfloat16", "state_bytes": 2, "A_bytes": 2,
                                   "decayed_operands": True, "launch_shortcut": _launch.enabled()},
              "copy_bandwidth_GBps": copy_gbs, "rows": rows, "ratios": ratios}
    slug = bench.slug(env["device"])
    RESULTS.mkdir(exist_ok=True)
    path = args.out or RESULTS / f"triton_bench_{slug}.json"
    path.write_text(json.dumps(result, indent=1))
    print_table(result)
    print("wrote", path)


def ratio_table(rows):
    """Per T: our kernels' fwd+bwd time over FLA's and over SDPA's (≤ 1 means as fast or faster)."""
    by = {(r["T"], r["name"]): r for r in rows if "fwd_bwd" in r}
    out = []
    for T in sorted({r["T"] for r in rows}):
        row = {"T": T}
        for ours in ("chunk_gla", "fused_chunk_gla", "chunk_simple_gla"):
            for ref in ("fla.chunk_gla", "sdpa_flash"):
                if (T, ours) in by and (T, ref) in by:
                    row[f"{ours}/{ref}"] = by[T, ours]["fwd_bwd"]["median_ms"] / by[T, ref]["fwd_bwd"]["median_ms"]
        out.append(row)
    return out


def print_table(result):
    print(f"\n{result['env']['device']}  torch {result['env']['torch']}  triton {result['env']['triton']}"
          f"  copy bandwidth {result['copy_bandwidth_GBps']:.0f} GB/s")
    print(f"{'T':>6} {'kernel':<22} {'fwd ms':>8} {'fwd+bwd ms':>11} {'peak MiB':>9} {'fwd GB/s':>9}")
    for r in result["rows"]:
        if "error" in r:
            print(f"{r['T']:>6} {r['name']:<22} {r['error']}")
            continue
        print(f"{r['T']:>6} {r['name']:<22} {r['fwd']['median_ms']:8.3f} {r['fwd_bwd']['median_ms']:11.3f}"
              f" {r['fwd_bwd_peak_bytes'] / 2**20:9.0f} {r['fwd_GBps']:9.0f}")
    for row in result["ratios"]:
        print(row)


if __name__ == "__main__":
    main()
