"""The Mosaic GPU launcher on a Hopper GPU: accuracy against float64, then speed against Triton.

    python benchmarks/pallas_mosaic_gpu_check.py                 # H100/H200: accuracy, then timing
    python benchmarks/pallas_mosaic_gpu_check.py --T 4096 8192   # timing lengths (default 4096 8192 16384)
    python benchmarks/pallas_mosaic_gpu_check.py --smoke         # any machine: interpreter accuracy, no timing

Accuracy: ``chunk_gla`` with ``launcher="mosaic_gpu"`` (compiled) and, beside it, ``launcher="gpu"``
(the Pallas Triton backend), bf16 inputs, B=2, H=2, K=V=64, chunk 64, gates logsigmoid(x)/16, initial
and final state, T = 256 and 2048: relative RMSE of o, the final state, dq, dk, dv, dg and dh0
against the float64 recurrence on the same bf16-rounded inputs (``check_variant`` of
tests/test_pallas.py, the tests' own checker). float32 rows: the Triton-backend launcher, and the
Mosaic GPU launcher's refusal (it takes bfloat16 only; its docstring says why).

Timing: B=8, H=16, K=V=128, bf16, chunk 64, forward and forward+backward of
``pallas chunk_gla`` on both launchers and of ``gla_ref.triton.chunk_gla`` (PyTorch, through DLPack),
with the compile time (XLA ahead-of-time; Triton's first call) apart from the run times. A case that
fails (e.g. out of memory, or a Mosaic GPU compile error on the first real run) is recorded with its
error and the script goes on.

Writes ``benchmarks/results/pallas_mosaic_gpu_<device>.json`` stamped by ``bench.environment()``
(``--smoke``: a temporary file).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from gla_ref import bench  # noqa: E402

NAMES = ("pallas chunk_gla mosaic_gpu", "pallas chunk_gla gpu", "triton chunk_gla")
ACCURACY = {"B": 2, "H": 2, "K": 64, "V": 64, "tau": 16.0}
TIMING = {"B": 8, "H": 16, "K": 128, "V": 128, "chunk": 64, "dtype": "bfloat16", "warmup": 5, "rep": 50}


def _error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return next((line for line in text.splitlines() if line.strip()), text)[:300]


def accuracy_rows(Ts, smoke: bool):
    """One row per (launcher, dtype, T): the relative RMSE of every tensor, or the error raised."""
    import jax.numpy as jnp
    from test_pallas import check_variant

    from gla_ref.pallas import _compat

    rows = []
    for launcher in ("mosaic_gpu", "gpu"):
        for dtype in (jnp.bfloat16, jnp.float32):
            for T in Ts:
                interpret = False
                if smoke:
                    interpret = _compat.gpu_interpret_params() if launcher == "mosaic_gpu" else True
                row = {"launcher": launcher, "dtype": jnp.dtype(dtype).name, "T": T,
                       "mode": "interpreted" if smoke else "compiled"}
                try:
                    if launcher == "mosaic_gpu":
                        _compat.reset_gpu_interpreter()
                    errors = check_variant("chunk", chunk_size=64, dtype=dtype, launcher=launcher,
                                           interpret=interpret, tol=1.0, T=T, **ACCURACY)
                    row["rel_rmse"] = {k: float(e) for k, e in errors.items()}
                except (TypeError, ValueError) as err:  # the launcher refuses (float32 on Mosaic GPU)
                    row["refused"] = _error(err)
                rows.append(row)
                print(row, flush=True)
    return rows


def _time_pallas(launcher, mode, T):
    import jax
    import jax.numpy as jnp
    from pallas_harness import _pallas_bench_inputs

    from gla_ref.pallas import chunk_gla

    p = TIMING
    q, k, v, g, do = _pallas_bench_inputs(p["B"], T, p["H"], p["K"], p["V"], p["dtype"], "gla")

    def fn(q, k, v, g):
        return chunk_gla(q, k, v, g, chunk_size=p["chunk"], launcher=launcher, interpret=False)[0]

    if mode == "fwd":
        return bench.time_jax(jax.jit(fn), q, k, v, g, warmup=p["warmup"], rep=p["rep"])

    def loss(q, k, v, g, do):
        return (fn(q, k, v, g).astype(jnp.float32) * do.astype(jnp.float32)).sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    return bench.time_jax(grads, q, k, v, g, do, warmup=p["warmup"], rep=p["rep"])


def _time_triton(mode, T):
    from pallas_harness import _pallas_bench_inputs, _time_triton_on

    p = TIMING
    q, k, v, g, do = _pallas_bench_inputs(p["B"], T, p["H"], p["K"], p["V"], p["dtype"], "gla")
    return _time_triton_on("triton chunk_gla", mode, q, k, v, g, do, p["chunk"], p["warmup"], p["rep"], None)


def timing_rows(Ts):
    rows = []
    for T in Ts:
        for name in NAMES:
            for mode in ("fwd", "fwd+bwd"):
                row = {"T": T, "name": f"{name} {mode}"}
                try:
                    t = _time_triton(mode, T) if name.startswith("triton") else _time_pallas(name.split()[-1], mode, T)
                    row.update({k: t[k] for k in ("compile_ms", "first_ms", "median_ms", "p20_ms", "p80_ms")})
                except Exception as err:  # noqa: BLE001 (record it, measure the rest)
                    row["error"] = _error(err)
                rows.append(row)
                print(row, flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[4096, 8192, 16384], help="timing lengths")
    parser.add_argument("--accuracy-T", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--smoke", action="store_true", help="interpreter accuracy at T=80 only, no timing")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    import jax

    from gla_ref.pallas import _compat

    if not args.smoke and not _compat.mosaic_gpu_runs_here():
        parser.error(f"needs a Hopper GPU and a JAX with Mosaic GPU (found {jax.devices()[0].device_kind}); "
                     "use --smoke on other machines")
    if args.smoke:
        with jax.default_device(jax.devices("cpu")[0]):
            accuracy = accuracy_rows([80], smoke=True)
        timing = []
    else:
        accuracy, timing = accuracy_rows(args.accuracy_T, smoke=False), timing_rows(args.T)
    about = ("gla_ref.pallas.chunk_gla on the Mosaic GPU launcher (its four non-fused kernels on Mosaic GPU) and "
             "on the Triton-backend launcher; accuracy: relative RMSE against the float64 "
             f"recurrence on the same bf16-rounded inputs, {ACCURACY}, chunk 64; timing: {TIMING}, compile_ms "
             "apart (XLA ahead-of-time compile; for Triton its first call)")
    result = {"env": bench.environment(), "about": about, "accuracy": accuracy, "rows": timing}
    path = bench.write_result(result, "pallas_mosaic_gpu", ROOT / "benchmarks" / "results", args.out,
                              smoke=args.smoke)
    print("wrote", path)
    return path


if __name__ == "__main__":
    main()
