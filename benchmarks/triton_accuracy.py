"""Accuracy table of every Triton kernel against the float64 reference, on a CUDA GPU.

``python benchmarks/triton_accuracy.py [KERNEL ...] [--shapes all|heads] [--out PATH]`` (default: every kernel,
every shape) writes ``benchmarks/results/triton_accuracy_<device>.json`` (or PATH; ``--shapes heads``, only the
GLA paper's heads and V = 1024, writes ``head_sizes_accuracy_<device>.json``) and prints one row per (kernel, dtype, shape):
the relative RMSE of o, the final state and every gradient. Naming kernels re-measures those and keeps the
stored rows of the others; separate ``--out`` files let several kernels run in parallel processes.
The pass/fail bounds live in the tests (tests/triton/test_triton_*.py); this script records the numbers.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from gla_ref import bench, testing, torch_ref
from gla_ref import triton as gla_triton

RESULTS = pathlib.Path(__file__).parent / "results"
SHAPES = [  # (B, T, H, K, V): realistic, then awkward, then the GLA paper's heads and a wide V
    (4, 4096, 8, 128, 128),
    (1, 1, 2, 20, 24),
    (2, 63, 3, 100, 72),
    (2, 1000, 2, 64, 256),
    (2, 2048, 4, 128, 256),  # 340M (and v1's d = 1024): 4 heads, K = d/2/4, V = d/4
    (1, 2048, 4, 256, 512),  # 1.3B: d = 2048, 4 heads
    (1, 700, 2, 64, 1024),   # V = 1024, T not a multiple of the chunk
]
KERNELS = {  # name -> (gate kind, call)
    "fused_recurrent_gla": ("gla", gla_triton.fused_recurrent_gla),
    "fused_chunk_gla": ("gla", gla_triton.fused_chunk_gla),
    "chunk_gla": ("gla", gla_triton.chunk_gla),
    "chunk_simple_gla[g]": ("scalar", lambda q, k, v, g, **kw: gla_triton.chunk_simple_gla(q, k, v, g=g, **kw)),
    "chunk_simple_gla[g_gamma]": ("const", lambda q, k, v, g, **kw: gla_triton.chunk_simple_gla(q, k, v, g_gamma=g, **kw)),
}
NAMES = ("o", "final_state", "dq", "dk", "dv", "dg", "dh0")


def run(fn, x, do, dht):
    """Outputs and gradients of one call: o, final state, then d(q, k, v, g, h0)."""
    o, ht = fn(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"], output_final_state=True)
    leaves = [x[n] for n in ("q", "k", "v", "g", "initial_state")]
    wants = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad([o, ht], wants, [do.to(o.dtype), dht], allow_unused=True)
    grads = iter(grads)
    return [o, ht] + [next(grads) if t.requires_grad else None for t in leaves]


def inputs(gate, shape, dtype, device):
    """Seeded inputs ``(B, T, H, K, V)`` in ``dtype`` and in float64 (both leaves), and the float64
    cotangents of o and the final state."""
    raw = testing.random_inputs(*shape, gate=gate, seed=1, tau=16.0, initial_state=True)
    x, x64 = (testing.as_torch(raw, dtype=dt, device=device, requires_grad=True) for dt in (dtype, torch.float64))
    if gate == "const":  # g_gamma is a fixed hyper-parameter of the kernel
        x["g"].requires_grad_(False)
        x64["g"].requires_grad_(False)
    gen = torch.Generator(device=device).manual_seed(2)
    do = torch.randn(x["v"].shape, device=device, dtype=torch.float64, generator=gen)
    dht = torch.randn(x["initial_state"].shape, device=device, dtype=torch.float64, generator=gen)
    return x, x64, do, dht


def errors(ref, out) -> dict:
    """Relative RMSE of each output and gradient against the reference (None where either is absent)."""
    return {n: (None if r is None or o is None else testing.rel_rmse(r, o)) for n, r, o in zip(NAMES, ref, out)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kernels", nargs="*", metavar="KERNEL", help=f"any of {', '.join(KERNELS)}")
    parser.add_argument("--shapes", choices=("all", "heads"), default="all",
                        help="every shape, or only the paper's heads and V = 1024 (the last three)")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    bench.show_tuning()  # a line per kernel autotuned: the first call at a shape takes minutes
    if set(args.kernels) - set(KERNELS):
        parser.error(f"unknown kernel(s) {sorted(set(args.kernels) - set(KERNELS))}; choose from {list(KERNELS)}")
    env = bench.environment()
    slug = bench.slug(env["device"])
    RESULTS.mkdir(exist_ok=True)
    shapes = SHAPES if args.shapes == "all" else SHAPES[-3:]
    path = args.out or RESULTS / f"{'triton' if args.shapes == 'all' else 'head_sizes'}_accuracy_{slug}.json"
    rows, refs = [], {}
    names = args.kernels or list(KERNELS)
    if path.exists() and args.kernels:  # a partial re-run adds to the stored rows
        rows = [r for r in json.loads(path.read_text())["rows"] if r["kernel"] not in names]
    for name in names:
        gate, fn = KERNELS[name]
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for shape in shapes:
                x, x64, do, dht = inputs(gate, shape, dtype, "cuda")
                if (gate, shape) not in refs:  # the float64 reference depends on the inputs only
                    refs[gate, shape] = run(torch_ref.chunk_gla, x64, do, dht)
                errs = errors(refs[gate, shape], run(fn, x, do, dht.float()))
                rows.append({"kernel": name, "dtype": str(dtype).replace("torch.", ""), "shape": shape, **errs})
                print(rows[-1], flush=True)
                path.write_text(json.dumps({"env": env, "rows": rows}, indent=1))  # kept if a run is cut short
    print("wrote", path)


if __name__ == "__main__":
    main()
