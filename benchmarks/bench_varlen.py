"""A packed batch of mixed lengths (``cu_seqlens``) against the same sequences padded, and against FLA's varlen
``chunk_gla``: time and memory on a CUDA GPU, bf16.

``python benchmarks/bench_varlen.py [--H 16] [--K 128] [--V 128] [--out PATH] [--smoke]``

The N sequences (lengths in ``LENGTHS``: a one-token sequence, lengths that are not multiples of the chunk, one
long document) are run three ways, forward and forward+backward:

* ``packed``: ``gla_ref.triton.chunk_gla`` on one ``B = 1`` batch of all tokens with ``cu_seqlens``;
* ``padded``: the same kernel on a ``[N, max length]`` batch, each sequence zero-padded at its end (the way to batch
  without varlen support; the padded tokens cost time and memory and their outputs are thrown away);
* ``fla.packed``: FLA's ``chunk_gla`` with the same ``cu_seqlens`` (when ``fla-core`` is installed).

Before timing, the packed output and final states are compared with each sequence run alone and with the padded
run (relative RMSE), and FLA's with ours. Writes ``benchmarks/results/varlen_<device>.json`` stamped by
``bench.environment()`` (FLA's version included). ``--smoke`` runs tiny float32 shapes on any device.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from gla_ref import bench, device
from gla_ref.bench.inputs import VARLEN_LENGTHS as LENGTHS, pad, unpad

RESULTS = pathlib.Path(__file__).parent / "results"
SMOKE_LENGTHS = (37, 1, 16, 50)


def make_packed(lengths, H, K, V, dtype, dev, seed=0):
    """q, k, v, g of all sequences packed in one B = 1 batch, and their int64 offsets
    (:func:`gla_ref.bench.packed_inputs`, no gradients)."""
    inputs, offsets = bench.packed_inputs(lengths, H, K, V, "gla", dtype, dev, seed=seed, requires_grad=False)
    return tuple(inputs), offsets


def candidates(offsets, lengths):
    """name -> (prepare(packed inputs) -> inputs, run(inputs) -> (o, final states))."""
    from gla_ref.triton import chunk_gla

    runs = {
        "packed": (lambda xs: xs, lambda q, k, v, g: chunk_gla(q, k, v, g, cu_seqlens=offsets, output_final_state=True)),
        "padded": (lambda xs: [pad(x, lengths) for x in xs],
                   lambda q, k, v, g: chunk_gla(q, k, v, g, output_final_state=True)),
    }
    try:
        from fla.ops.gla import chunk_gla as fla_chunk_gla
    except ImportError as err:
        print(f"FLA not available ({err}); skipping it")
    else:
        runs["fla.packed"] = (lambda xs: xs, lambda q, k, v, g: fla_chunk_gla(
            q, k, v, g, cu_seqlens=offsets, output_final_state=True))
    return runs


def leaves_of(xs):
    """Detached copies of the inputs that require grad (each candidate differentiates its own)."""
    return [x.detach().clone().requires_grad_(True) for x in xs]


def checks(packed_inputs, offsets, lengths, runs):
    """Relative RMSE of o and the final states: packed vs each sequence alone, padded, FLA."""
    import torch

    from gla_ref.testing import rel_rmse
    from gla_ref.triton import chunk_gla

    with torch.no_grad():
        o, ht = runs["packed"][1](*packed_inputs)
        alone = [chunk_gla(*(x[:, a:b] for x in packed_inputs), output_final_state=True)
                 for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
        out = {"packed vs alone: o": rel_rmse(torch.cat([a[0] for a in alone], 1).float(), o.float()),
               "packed vs alone: final state": rel_rmse(torch.cat([a[1] for a in alone]), ht)}
        o_p, ht_p = runs["padded"][1](*runs["padded"][0](packed_inputs))
        out["packed vs padded: o"] = rel_rmse(unpad(o_p, lengths).float(), o.float())
        out["packed vs padded: final state"] = rel_rmse(ht_p, ht)
        if "fla.packed" in runs:
            o_f, ht_f = runs["fla.packed"][1](*packed_inputs)
            out["fla.packed vs packed: o"] = rel_rmse(o.float(), o_f.float())
            out["fla.packed vs packed: final state"] = rel_rmse(ht.float(), ht_f.float())
    return out


def measure(run, inputs, on_gpu):
    import torch

    leaves = leaves_of(inputs)
    do = torch.randn_like(run(*leaves)[0])

    def fwd():
        with torch.no_grad():
            run(*leaves)

    def fwd_bwd():
        run(*leaves)[0].backward(do)

    if not on_gpu:
        return {key: {"median_ms": bench.time_wall(f, warmup=0, rep=1)["median_ms"]} for key, f in
                (("fwd", fwd), ("fwd_bwd", fwd_bwd))}
    out = {"first_fwd_bwd_ms": bench.time_wall(fwd_bwd, warmup=0, rep=1, sync=lambda _: torch.cuda.synchronize())["first_ms"],
           "fwd": bench.time_cuda(fwd), "fwd_bwd": bench.time_cuda(fwd_bwd, grad_to_none=leaves)}
    out["fwd_peak_bytes"] = bench.peak_memory_cuda(fwd)
    out["fwd_bwd_peak_bytes"] = bench.peak_memory_cuda(fwd_bwd)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--K", type=int, default=128)
    parser.add_argument("--V", type=int, default=128)
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--smoke", action="store_true", help="tiny float32 shapes on any device, to a temp path")
    args = parser.parse_args(argv)
    on_gpu = bench.start_gpu_run(parser, args.smoke)  # tuning lines, the interpreter on a CPU
    import torch

    t0 = time.perf_counter()
    lengths = SMOKE_LENGTHS if args.smoke else LENGTHS
    H, K, V = (2, 16, 24) if args.smoke else (args.H, args.K, args.V)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    inputs, offsets = make_packed(lengths, H, K, V, dtype, device.torch_device())
    runs = candidates(offsets, lengths)
    env = bench.environment()
    result = {"env": env, "shape": {"H": H, "K": K, "V": V, "dtype": str(dtype).removeprefix("torch."),
                                     "lengths": list(lengths), "tokens": sum(lengths),
                                     "padded_tokens": len(lengths) * max(lengths)},
              "checks_rel_rmse": checks(inputs, offsets, lengths, runs), "rows": []}
    print(json.dumps(result["checks_rel_rmse"], indent=1), flush=True)
    for name, (prepare, run) in runs.items():
        res = measure(run, prepare(inputs), on_gpu)
        result["rows"].append({"name": name, "T": sum(lengths), **res})
        print(name, {k: round(v["median_ms"], 3) for k, v in res.items() if k in ("fwd", "fwd_bwd")},
              f"peak {res.get('fwd_bwd_peak_bytes', 0) / 2**20:.0f} MiB", flush=True)
        if on_gpu:
            torch.cuda.empty_cache()
    result["wall_s"] = time.perf_counter() - t0
    path = bench.write_result(result, "varlen", RESULTS, args.out, args.smoke)
    print(f"wrote {path} in {result['wall_s']:.0f} s")
    return path


if __name__ == "__main__":
    main()
