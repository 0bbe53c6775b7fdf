"""The state kernels' tiles one config at a time, and a TMA variant of the forward's: which config wins where.

    python benchmarks/state_configs.py [--shapes 64x64 128x128 128x256 256x512] [--T 2048 16384] [--out PATH]

Step 2 of chunk GLA walks the chunks of one head in order, one program per ``BK × BV`` block of the state
(:mod:`gla_ref.triton.chunk.state`): the only sequential loop of the algorithm, so its block shape decides how
many programs share the GPU and its pipeline depth how many chunks' loads are in flight while one chunk's
matmul runs. At B=8, H=16, bf16 q, k, v and float32 gates of the paper's strength, every config of
:data:`CANDIDATES` (block, warps, pipeline stages) is timed for four launches:

* ``fwd_decayed``: ``chunk_state_fwd_kernel`` as chunk_gla's forward runs it (K ⊙ Γ from step 1, one b row a
  chunk, states stored in bf16);
* ``fwd_decayed_tma``: the same step written with tensor descriptors (``tma_state_kernel``, this file only):
  on Hopper its tiles of K ⊙ Γ and v arrive by TMA and its states leave by TMA stores;
* ``fwd_fp32``: ``chunk_state_fwd_kernel`` as the backward recomputes the states (k and b, float32 states);
* ``bwd``: ``chunk_state_bwd_kernel`` (dh, float32).

Each launch goes through an autotuner over all the candidates whose block fits the head (the library's pruning);
the times are its own (``triton.testing.do_bench`` medians, one per config). A row also names the winner among
the config lists the library had before this sweep (:data:`BEFORE`) and among those it has now, and the largest
difference between the winner's output and the library's launch (0: the same bits). Writes
``benchmarks/results/state_configs_<device>.json`` stamped by ``bench.environment()``.
"""

from __future__ import annotations

import argparse
import pathlib
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

from gla_ref import bench  # noqa: E402
from gla_ref.triton.chunk import state as chunk_state  # noqa: E402  (first: on a machine without CUDA it picks Triton's interpreter)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gla_ref.triton.common.host import autotune, cdiv  # noqa: E402
from gla_ref.triton.chunk.cumsum import chunk_gates_and_operands  # noqa: E402
from gla_ref.triton.chunk.state import _decay  # noqa: E402
from gla_ref.triton.common.precision import dot_precision  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SETTING = {"B": 8, "H": 16, "dtype": "bfloat16", "chunk_size": 64}
CANDIDATES = ((16, 64, 4, 3), (32, 32, 2, 3), (32, 32, 4, 3), (32, 64, 4, 2), (32, 64, 4, 3), (32, 64, 4, 4),
              (64, 32, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (32, 128, 4, 2), (32, 128, 4, 3),
              (32, 128, 4, 4), (64, 128, 8, 2), (64, 128, 8, 3), (32, 256, 8, 2), (32, 256, 8, 3), (128, 64, 8, 2))
"""(BK, BV, warps, stages) of every config timed."""
BEFORE = {"fwd": ((32, 128, 4, 2), (64, 64, 4, 2), (64, 128, 8, 2), (32, 256, 8, 2)),
          "bwd": ((64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (32, 256, 8, 2))}
"""The library's config lists before this sweep (chunk_state._fwd_configs and _configs at commit faaf010)."""


def label(bk, bv, warps, stages) -> str:
    """A config as the result names it, ``BKxBV/wWARPS/sSTAGES``."""
    return f"{bk}x{bv}/w{warps}/s{stages}"


def config_label(config) -> str:
    return label(config.kwargs["BK"], config.kwargs["BV"], config.num_warps, config.num_stages)


def summarise(launch: str, timings: dict, now: dict) -> dict:
    """The winner of ``timings`` (label → ms) overall, among :data:`BEFORE`'s list and among ``now``'s (the
    library's lists, labels by kernel ``fwd``/``bwd``), and the winners' ratios to the one before."""
    kind = "bwd" if launch == "bwd" else "fwd"

    def best(labels):
        timed = [x for x in labels if x in timings]
        return min(timed, key=timings.get) if timed else None

    winners = {"best": best(timings), "before": best([label(*c) for c in BEFORE[kind]]), "library": best(now[kind])}
    out = {f"{name}_config": c for name, c in winners.items()}
    out.update({f"{name}_ms": timings[c] for name, c in winners.items() if c})
    if winners["before"]:
        out.update({f"{name}/before": timings[winners[name]] / timings[winners["before"]]
                    for name in ("best", "library") if winners[name]})
    return out


def library_lists() -> dict:
    """The library's current config lists by kernel, as labels."""
    return {"fwd": [config_label(c) for c in chunk_state._fwd_configs()],
            "bwd": [config_label(c) for c in chunk_state._configs()]}


@triton.jit
def tma_state_kernel(kt, v, b, h, B, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, C: tl.constexpr,
                     BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """The forward's decayed state step on tensor descriptors. Grid ``(⌈K/BK⌉, ⌈V/BV⌉, B·H)``, ownership and HBM
    traffic as ``chunk_state_fwd_kernel``'s decayed path (fixed lengths, no initial or final state). The K ⊙ Γ
    and v tiles of a chunk are ``[1, C, 1, BK]`` and ``[1, C, 1, BV]`` boxes of 4-D descriptors (rows past T
    arrive as zeros); the state block leaves through a 3-D descriptor over ``[B·H·NT, K, V]``. Descriptors need
    16-byte-aligned strides: K and V multiples of 8 for 2-byte inputs."""
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    NT = tl.cdiv(T, C)
    d_k = tl.make_tensor_descriptor(kt, shape=[B, T, H, K], strides=[T * H * K, H * K, K, 1], block_shape=[1, C, 1, BK])
    d_v = tl.make_tensor_descriptor(v, shape=[B, T, H, V], strides=[T * H * V, H * V, V, 1], block_shape=[1, C, 1, BV])
    d_h = tl.make_tensor_descriptor(h, shape=[B * H * NT, K, V], strides=[K * V, V, 1], block_shape=[1, BK, BV])
    o_k = i_k * BK + tl.arange(0, BK)
    p_g = b + i_b.to(tl.int64) * T * H * K + i_h * K + o_k
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    for i_n in range(NT):
        d_h.store([i_bh * NT + i_n, i_k * BK, i_v * BV], b_h.to(h.dtype.element_ty).reshape(1, BK, BV))
        b_k = d_k.load([i_b, i_n * C, i_h, i_k * BK]).reshape(C, BK)
        b_v = d_v.load([i_b, i_n * C, i_h, i_v * BV]).reshape(C, BV)
        g_last = tl.load(p_g + (tl.minimum(i_n * C + C, T) - 1) * (H * K), mask=o_k < K, other=0.0)
        b_h = _decay(b_h, g_last, True)
        b_h += tl.dot(tl.trans(b_k), b_v, input_precision=PREC)


def use_torch_allocator():
    """Device-side tensor descriptors need global scratch, which Triton asks of the allocator set here."""
    where = "cuda" if torch.cuda.is_available() else "cpu"
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=where))


def tma_states(kernel, kt, v, b, chunk_size: int):
    """``h [B, H, NT, K, V]`` in kt's dtype from ``kernel`` (the TMA kernel, bare or autotuned), as
    ``chunk_state_fwd(kt, v, b, None, False, chunk_size, decayed=True)[0]`` computes it."""
    B, T, H, K = kt.shape
    V = v.shape[-1]
    h = torch.empty(B, H, cdiv(T, chunk_size), K, V, dtype=kt.dtype, device=kt.device)
    grid = lambda meta: (cdiv(K, meta["BK"]), cdiv(V, meta["BV"]), B * H)
    kernel[grid](kt, v, b, h, B, T, H=H, K=K, V=V, C=chunk_size, PREC=dot_precision(kt))
    return h


def tuners() -> dict:
    """An autotuner over :data:`CANDIDATES` per launch, keyed by (K, V, T) so that every point is timed afresh."""
    configs = [triton.Config({"BK": bk, "BV": bv}, num_warps=w, num_stages=s) for bk, bv, w, s in CANDIDATES]
    tune = lambda kernel: autotune(configs, ["K", "V", "T"], BK="K", BV="V")(kernel)  # one pruning hook each
    fwd, bwd = chunk_state.chunk_state_fwd_kernel.fn, chunk_state.chunk_state_bwd_kernel.fn
    return {"fwd_decayed": tune(fwd), "fwd_decayed_tma": tune(tma_state_kernel), "fwd_fp32": tune(fwd),
            "bwd": tune(bwd)}


def launches(K, V, T, tuned):
    """``{launch: (swept call, the library's call)}`` at one point, on the same inputs."""
    B, H, C = SETTING["B"], SETTING["H"], SETTING["chunk_size"]
    q, k, v, g = (x.detach() for x in bench.torch_inputs(B, T, H, K, V, "gla", torch.bfloat16, "cuda"))
    b, _, kt = chunk_gates_and_operands(q, k, g, K ** -0.5, C)
    do = torch.randn_like(v)
    grid = lambda meta: (cdiv(K, meta["BK"]), cdiv(V, meta["BV"]), B * H)
    fixed = dict(T=T, H=H, K=K, V=V, C=C, GATE_K=True, PREC=dot_precision(k), **chunk_state._varlen_kwargs(None))

    def states(kernel, keys, dtype, decayed):
        h = torch.empty(B, H, cdiv(T, C), K, V, dtype=dtype, device="cuda")
        kernel[grid](keys, v, b, None, h, None, DECAYED=decayed, USE_H0=False, STORE_HT=False, **fixed)
        return h

    def dh():
        out = torch.empty(B, H, cdiv(T, C), K, V, dtype=torch.float32, device="cuda")
        tuned["bwd"][grid](q, b, do, None, out, None, scale=K ** -0.5, USE_DHT=False, STORE_DH0=False, **fixed)
        return out

    lib_decayed = lambda: chunk_state.chunk_state_fwd(kt, v, b, None, False, C, decayed=True)[0]
    return {"fwd_decayed": (lambda: states(tuned["fwd_decayed"], kt, k.dtype, True), lib_decayed),
            "fwd_decayed_tma": (lambda: tma_states(tuned["fwd_decayed_tma"], kt, v, b, C), lib_decayed),
            "fwd_fp32": (lambda: states(tuned["fwd_fp32"], k, torch.float32, False),
                         lambda: chunk_state.chunk_state_fwd(k, v, b, None, False, C, states_in_fp32=True)[0]),
            "bwd": (dh, lambda: chunk_state.chunk_state_bwd(q, b, do, None, K ** -0.5, False, C)[0])}


def run_point(K, V, T, tuned, now) -> list[dict]:
    """A row per launch at one (K, V, T): every candidate's time, the winners, and the winner against the library."""
    rows = []
    for name, (swept, library) in launches(K, V, T, tuned).items():
        out, ref = swept(), library()
        timings = {config_label(c): float(t[0] if isinstance(t, (list, tuple)) else t)
                   for c, t in tuned[name].configs_timings.items()}
        rows.append({"K": K, "V": V, "T": T, "launch": name, "timings_ms": timings, **summarise(name, timings, now),
                     "max_diff_vs_library": float((out.float() - ref.float()).abs().max())})
        print({k: v for k, v in rows[-1].items() if k != "timings_ms"}, flush=True)
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=bench.parse_shape, nargs="+", default=[(64, 64), (128, 128), (128, 256), (256, 512)])
    parser.add_argument("--T", type=int, nargs="+", default=[2048, 16384])
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    bench.start_gpu_run(parser, smoke=False)
    use_torch_allocator()
    tuned, now, start = tuners(), library_lists(), time.perf_counter()
    rows = [row for K, V in args.shapes for T in args.T for row in run_point(K, V, T, tuned, now)]
    result = {"env": bench.environment(), "setting": {**SETTING, "T": args.T}, "candidates": CANDIDATES,
              "before": BEFORE, "library": now, "rows": rows, "wall_s": time.perf_counter() - start}
    print(f"wrote {bench.write_result(result, 'state_configs', RESULTS, out=args.out)}")


if __name__ == "__main__":
    main()
