"""Peak GPU memory of the gate gradient d log α: stored states against the closed form (chapter 6).

    python benchmarks/grad_memory.py            # a CUDA GPU: results/grad_memory_<device>.json
    python benchmarks/grad_memory.py --smoke    # any machine: tiny shapes, the checks, a temporary file

For each shape (B, T, H, K = V; float32) the gate gradient of ``⟨o, do⟩`` is computed three ways:

* ``states``: every S_t and dS_t stored, :func:`gla_ref.reference.grads.gla_states` and
  :func:`~gla_ref.reference.grads.gla_state_grads`, then :func:`~gla_ref.reference.grads.gate_grad_from_states`;
* ``autograd``: autograd of :func:`gla_ref.torch_ref.recurrent_gla` with respect to g, which saves
  the state of every step for the way back;
* ``closed_form``: :func:`gla_ref.reference.grads.gate_grad_closed_form` from q, k, dq and dk (dq and dk come
  out of any backward pass; here from :func:`gla_ref.reference.grads.gla_bwd_chunk`, outside the measurement).

``peak_bytes`` is :func:`gla_ref.bench.peak_memory_cuda`: the most memory allocated while one route
runs, above what was allocated before it (the inputs, and dq, dk for the closed form). Every route's
gradient is checked against the ``states`` one. Without CUDA (``--smoke``) the routes run and are
checked on the CPU, and ``peak_bytes`` is null.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gla_ref import bench, device, torch_ref  # noqa: E402
from gla_ref.reference import grads
from gla_ref.testing import as_torch, random_inputs, rel_rmse  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FULL = {"T": [256, 1024, 4096, 8192], "D": [64, 128], "B": 2, "H": 8}
SMOKE = {"T": [16, 40], "D": [8], "B": 1, "H": 2}
ROUTES = ("states", "autograd", "closed_form")
TOL = 1e-3
"""Largest relative RMSE allowed between two routes' gradients (float32, sums over up to T terms)."""


def make_inputs(B, T, H, D, dev):
    """Seeded float32 q, k, v, g (the testing module's gates) and the output cotangent do."""
    x = as_torch(random_inputs(B=B, T=T, H=H, K=D, V=D, gate="gla", seed=T), dtype=torch.float32, device=dev)
    do = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(T + 1)).to(dev)
    return {n: x[n] for n in "qkvg"}, do


def routes(x, do):
    """name -> a function computing d log α by that route (dq, dk for the closed form made first)."""
    q, k, v, g = (x[n] for n in "qkvg")

    def states():
        return grads.gate_grad_from_states(g, grads.gla_states(k, v, g), grads.gla_state_grads(q, g, do))

    def autograd():
        g_leaf = g.detach().requires_grad_()
        o, _ = torch_ref.recurrent_gla(q, k, v, g_leaf)
        return torch.autograd.grad((o * do).sum(), g_leaf)[0]

    chunked = grads.gla_bwd_chunk(q, k, v, g, do, chunk_size=64)
    dq, dk = chunked["dq"], chunked["dk"]
    del chunked

    def closed_form():
        return grads.gate_grad_closed_form(q, k, dq, dk)

    return {"states": states, "autograd": autograd, "closed_form": closed_form}


def measure(fn, cuda):
    """``(result, peak bytes or None, seconds)`` of one call."""
    box = {}

    def run():
        box["out"] = fn()

    t0 = time.perf_counter()
    if cuda:
        peak = bench.peak_memory_cuda(run)
    else:
        run()
        peak = None
    return box["out"], peak, time.perf_counter() - t0


def measure_shape(B, T, H, D, cuda):
    """One row per route for one shape; raises AssertionError if a route's gradient disagrees."""
    dev = "cuda" if cuda else "cpu"
    x, do = make_inputs(B, T, H, D, dev)
    rows, ref = [], None
    for name, fn in routes(x, do).items():
        dg, peak, seconds = measure(fn, cuda)
        ref = dg if ref is None else ref
        err = rel_rmse(ref, dg)
        assert err < TOL, f"{name} gate gradient differs from the states route by {err:.1e} (B={B} T={T} H={H} D={D})"
        rows.append({"B": B, "T": T, "H": H, "K": D, "V": D, "name": name, "peak_bytes": peak,
                     "seconds": round(seconds, 4), "rel_rmse_vs_states": err})
        del dg
        if cuda:
            torch.cuda.empty_cache()
    return rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", type=int, nargs="+", help=f"sequence lengths (default {FULL['T']})")
    p.add_argument("--D", type=int, nargs="+", help=f"head sizes K = V (default {FULL['D']})")
    p.add_argument("--B", type=int, help=f"batch (default {FULL['B']})")
    p.add_argument("--H", type=int, help=f"heads (default {FULL['H']})")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on any device, a temporary output")
    p.add_argument("--out", type=pathlib.Path, help="JSON path (default results/grad_memory_<device>.json)")
    args = p.parse_args(argv)
    for key, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None):
    args = parse_args(argv)
    bench.show_tuning()  # a line per kernel autotuned: the first call at a shape takes minutes
    cuda = device.has_cuda()
    if not cuda and not args.smoke:
        sys.exit("grad_memory.py measures GPU memory and needs CUDA; on a CPU run it with --smoke")
    start, rows = time.perf_counter(), []
    for D in args.D:
        for T in args.T:
            shape_rows = measure_shape(args.B, T, args.H, D, cuda)
            for r in shape_rows:
                peak = "n/a (no CUDA)" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:10.1f} MiB"
                print(f"T={T:>5} K=V={D:<4} {r['name']:<12} peak {peak}  {r['seconds']:.2f} s", flush=True)
            rows += shape_rows
    env = {**bench.environment(), "dtype": "float32", "smoke": args.smoke,
           "wall_s": round(time.perf_counter() - start, 1)}
    name = bench.slug(env["device"])
    default_dir = pathlib.Path(tempfile.gettempdir()) if args.smoke else RESULTS
    path = args.out or default_dir / f"grad_memory_{'smoke_' if args.smoke else ''}{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"env": env, "routes": list(ROUTES), "rows": rows}, indent=1))
    print(f"{len(rows)} rows in {env['wall_s']} s; wrote {path}")


if __name__ == "__main__":
    main()
