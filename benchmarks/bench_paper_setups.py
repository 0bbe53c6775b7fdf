"""The GLA paper's own speed benchmarks, rerun at the paper's shapes on this GPU.

``python benchmarks/bench_paper_setups.py [--setup v1_fig2_left icml_fig2] [--T 1024 ...] [--out PATH] [--smoke]``

Two setups, each timed forward+backward (and forward alone) with peak memory, bf16:

* ``v1_fig2_left`` — the first arXiv version's Fig. 2 (left): batch 32, model width d = 1024. GLA with 4 heads
  (per head K = d/2/4 = 128, V = d/4 = 256) by ``gla_ref.triton.chunk_gla`` (states materialised) and
  ``fused_chunk_gla`` (state on chip), against causal softmax attention with 16 heads of 64 (FlashAttention-2
  class: SDPA's flash backend, and SDPA's cuDNN backend beside it).
* ``icml_fig2`` — the ICML version's Fig. 2: batch 32, 16 heads of 64, chunk 64, *plain linear attention*
  (FlashLinearAttention, no gate) with materialised states (``chunk_simple_gla`` with no gate) and without
  (``fused_chunk_gla`` with no gate), the pure-PyTorch chunk form (``torch_ref.chunk_gla``, C = 64), and the
  same two attention backends.

Before timing, each setup checks its kernels against each other (relative RMSE of o). Writes
``benchmarks/results/paper_setups_<device>.json`` stamped by ``bench.environment()`` (no FLA here: the
paper compares with attention). ``--smoke`` runs tiny float32 shapes on any device (CPU: Triton's
interpreter and the host clock; the attention backends are then recorded as unavailable) to a temp path.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from gla_ref import bench, device

RESULTS = pathlib.Path(__file__).parent / "results"
SETUPS = {
    "v1_fig2_left": {"paper": "arXiv 2312.06635v1, Fig. 2 (left): fwd+bwd time, FlashAttention-2 (CUDA) vs GLA (Triton)",
                     "B": 32, "gla": {"H": 4, "K": 128, "V": 256, "gate": "gla"}, "attention": {"H": 16, "D": 64},
                     "candidates": ["chunk_gla", "fused_chunk_gla", "sdpa_flash", "sdpa_cudnn"]},
    "icml_fig2": {"paper": "ICML 2024 version, Fig. 2: speed and memory, FlashLinearAttention w/ and w/o "
                           "materialisation vs FlashAttention-2 and a pure-PyTorch chunk form, C = 64",
                  "B": 32, "gla": {"H": 16, "K": 64, "V": 64, "gate": "none"}, "attention": {"H": 16, "D": 64},
                  "candidates": ["linear_materialised", "linear_non_materialised", "torch_chunk", "sdpa_flash",
                                 "sdpa_cudnn"]},
}
WHAT = {
    "chunk_gla": "gla_ref.triton.chunk_gla (GLA gates, states materialised, C = 64)",
    "fused_chunk_gla": "gla_ref.triton.fused_chunk_gla (GLA gates, state on chip, C = 16)",
    "linear_materialised": "gla_ref.triton.chunk_simple_gla(g=None): linear attention, states materialised, C = 64",
    "linear_non_materialised": "gla_ref.triton.fused_chunk_gla(g=None, chunk_size=64): linear attention, state on chip",
    "torch_chunk": "gla_ref.torch_ref.chunk_gla(g=None, chunk_size=64): the chunk form in PyTorch (I/O-unaware)",
    "sdpa_flash": "torch SDPA, SDPBackend.FLASH_ATTENTION, causal",
    "sdpa_cudnn": "torch SDPA, SDPBackend.CUDNN_ATTENTION, causal",
}
SMOKE = {"B": 1, "T": [32, 64], "gla": {"H": 2, "K": 16, "V": 32}, "attention": {"H": 2, "D": 16}}


def kernels():
    """name -> function(q, k, v, g) -> o."""
    import torch.nn.functional as F

    from gla_ref import torch_ref
    from gla_ref.triton import chunk_gla, chunk_simple_gla, fused_chunk_gla

    def sdpa(backend):
        def run(q, k, v, g):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(getattr(SDPBackend, backend)):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True)
            return o.transpose(1, 2)
        return run

    return {
        "chunk_gla": lambda q, k, v, g: chunk_gla(q, k, v, g)[0],
        "fused_chunk_gla": lambda q, k, v, g: fused_chunk_gla(q, k, v, g)[0],
        "linear_materialised": lambda q, k, v, g: chunk_simple_gla(q, k, v, chunk_size=64)[0],
        "linear_non_materialised": lambda q, k, v, g: fused_chunk_gla(q, k, v, chunk_size=64)[0],
        "torch_chunk": lambda q, k, v, g: torch_ref.chunk_gla(q, k, v, None, chunk_size=64)[0],
        "sdpa_flash": sdpa("FLASH_ATTENTION"),
        "sdpa_cudnn": sdpa("CUDNN_ATTENTION"),
    }


def make_inputs(name, setup, B, T, dtype, dev, seed=0):
    """q, k, v (and GLA log-gates of the paper's strength, logsigmoid/16) for one candidate."""
    attention = name.startswith("sdpa")
    H, K, V = ((setup["attention"]["H"], setup["attention"]["D"], setup["attention"]["D"]) if attention
               else (setup["gla"]["H"], setup["gla"]["K"], setup["gla"]["V"]))
    gate = "gla" if setup["gla"].get("gate") == "gla" and not attention else "none"
    q, k, v, g = bench.torch_inputs(B, T, H, K, V, gate, dtype, dev, seed=seed)  # q, k, v, then g: one generator
    return (q, k, v, g), [x for x in (q, k, v, g) if x is not None]


def measure(fn, args, leaves, on_gpu):
    """fwd and fwd+bwd times (ms) and the fwd+bwd peak bytes of one candidate."""
    import torch

    do = torch.randn_like(args[2])

    def fwd():
        with torch.no_grad():
            fn(*args)

    def fwd_bwd():
        fn(*args).backward(do)

    if on_gpu:
        out = {"fwd": bench.time_cuda(fwd, warmup=5, rep=20),
               "fwd_bwd": bench.time_cuda(fwd_bwd, warmup=5, rep=20, grad_to_none=leaves)}
        out["fwd_bwd_peak_bytes"] = bench.peak_memory_cuda(fwd_bwd)
        out["fwd_peak_bytes"] = bench.peak_memory_cuda(fwd)
    else:
        out = {key: {"median_ms": bench.time_wall(f, warmup=0, rep=1)["median_ms"]}
               for key, f in (("fwd", fwd), ("fwd_bwd", fwd_bwd))}
    for x in leaves:
        x.grad = None
    return out


def agreement(setup, B, T, dtype, dev, names):
    """Relative RMSE of each GLA candidate's o against the first one's, on the same inputs."""
    from gla_ref.testing import rel_rmse

    fns = kernels()
    gla = [n for n in names if not n.startswith("sdpa")]
    args, _ = make_inputs(gla[0], setup, B, T, dtype, dev)
    ref = fns[gla[0]](*args).detach().float()
    return {f"{n} vs {gla[0]}": rel_rmse(ref, fns[n](*args).detach().float()) for n in gla[1:]}


def run_setup(key, setup, Ts, B, dtype, dev, on_gpu):
    import torch

    fns = kernels()
    rows = []
    for T in Ts:
        for name in setup["candidates"]:
            try:
                args, leaves = make_inputs(name, setup, B, T, dtype, dev)
                res = measure(fns[name], args, leaves, on_gpu)
            except torch.OutOfMemoryError:
                res = {"error": "out of memory"}
            except RuntimeError as err:  # no flash/cuDNN kernel on this device or for this shape
                res = {"error": str(err).strip().splitlines()[0][:200]}
            rows.append({"setup": key, "T": T, "name": name, **res})
            if on_gpu:
                torch.cuda.empty_cache()
            shown = {k: round(v["median_ms"], 3) for k, v in res.items() if k in ("fwd", "fwd_bwd")}
            peak = res.get("fwd_bwd_peak_bytes")
            print(f"{key} T={T:>6} {name:<24} {shown or res.get('error')}"
                  + (f" peak {peak / 2**20:.0f} MiB" if peak else ""), flush=True)
    return rows


def summary(result):
    """Crossover lengths against each attention backend, and memory ratios against the flash backend."""
    out = {}
    for key in result["setups"]:
        rows = {"rows": [r for r in result["rows"] if r["setup"] == key]}
        gla = [n for n in SETUPS[key]["candidates"] if not n.startswith("sdpa")]
        s = {"crossover_T": {}, "peak_over_flash": {}}
        for ours in gla:
            for att in ("sdpa_flash", "sdpa_cudnn"):
                Ts, c = bench.common_series(rows, [ours, att])
                if len(Ts) >= 2:
                    s["crossover_T"][f"{ours} vs {att}"] = bench.crossover_T(Ts, c[ours], c[att])
            Ts, c = bench.common_series(rows, [ours, "sdpa_flash"], "fwd_bwd_peak_bytes")
            s["peak_over_flash"][ours] = {T: a / b for T, a, b in zip(Ts, c[ours], c["sdpa_flash"])}
        out[key] = s
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    parser.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--smoke", action="store_true", help="tiny float32 shapes on any device, to a temp path")
    args = parser.parse_args(argv)
    on_gpu = bench.start_gpu_run(parser, args.smoke)  # tuning lines, the interpreter on a CPU
    import torch

    t0 = time.perf_counter()
    dev = device.torch_device()
    dtype = torch.float32 if args.smoke else torch.bfloat16
    env = bench.environment()
    result = {"env": env, "dtype": str(dtype).removeprefix("torch."), "smoke": args.smoke, "what": WHAT,
              "setups": {}, "rows": [], "checks_rel_rmse": {}}
    for key in args.setup:
        setup = SETUPS[key] if not args.smoke else {**SETUPS[key], **{k: SMOKE[k] for k in ("B", "attention")},
                                                    "gla": {**SETUPS[key]["gla"], **SMOKE["gla"]}}
        Ts = SMOKE["T"] if args.smoke else args.T
        result["checks_rel_rmse"][key] = agreement(setup, setup["B"], Ts[0], dtype, dev, setup["candidates"])
        result["rows"] += run_setup(key, setup, Ts, setup["B"], dtype, dev, on_gpu)
        result["setups"][key] = {k: setup[k] for k in ("paper", "B", "gla", "attention", "candidates")}
    result["summary"] = summary(result)
    result["wall_s"] = time.perf_counter() - t0
    path = bench.write_result(result, "paper_setups", RESULTS, args.out, args.smoke)
    print(json.dumps(result["checks_rel_rmse"], indent=1))
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {path} in {result['wall_s']:.0f} s")
    return path


if __name__ == "__main__":
    main()
