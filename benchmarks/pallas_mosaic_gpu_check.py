"""The Mosaic GPU launcher on a Hopper GPU: accuracy against float64, then speed against Triton.

    python benchmarks/pallas_mosaic_gpu_check.py                 # H100/H200: accuracy, then timing
    python benchmarks/pallas_mosaic_gpu_check.py --T 4096 8192   # timing lengths (default 4096 8192 16384)
    python benchmarks/pallas_mosaic_gpu_check.py --kernels --T 4096  # each kernel alone, both launchers
    python benchmarks/pallas_mosaic_gpu_check.py --accuracy-T --cases NAME ...  # timing of some cases only
    python benchmarks/pallas_mosaic_gpu_check.py --accuracy-T 4096 16384 --variants fused --no-timing
    python benchmarks/pallas_mosaic_gpu_check.py --glue --T 4096 16384  # the forward's parts; the gate-sum kernel
    python benchmarks/pallas_mosaic_gpu_check.py --xla-gate-sums ...  # the above with XLA's scan for the gates
    python benchmarks/pallas_mosaic_gpu_check.py --smoke         # any machine: interpreter accuracy, no timing

Accuracy: every Pallas path (:data:`VARIANTS`: ``chunk_gla``, ``fused_chunk_gla`` and
``chunk_simple_gla`` with g or g_gamma in both modes) with ``launcher="mosaic_gpu"`` (compiled) and,
beside it, ``launcher="gpu"`` (the Pallas Triton backend), bf16 inputs, B=2, H=2, K=V=64, chunk 64, gates
logsigmoid(x)/16, initial and final state, T = 256 and 2048: relative RMSE of o, the final state, dq, dk,
dv, dg and dh0 against the float64 recurrence on the same bf16-rounded inputs (``check_variant`` of
tests/pallas/test_pallas.py, the tests' own checker). float32 rows (``chunk_gla``): the Triton-backend launcher,
and the Mosaic GPU launcher's refusal (it takes bfloat16 only; its docstring says why). ``--smoke``:
``fused_chunk_gla`` in bf16 and ``chunk_gla`` in float32 only, at T=80.

Timing (:data:`CASES`): B=8, H=16, bf16, chunk 64, forward and forward+backward of ``pallas chunk_gla``
(K=V=128) on both launchers and of ``gla_ref.triton.chunk_gla`` (PyTorch, through DLPack); the fused
path at K=V=64 (the Mosaic GPU fused kernels take K ≤ 64) beside ``chunk_gla`` and Triton's fused kernel
there; ``chunk_simple_gla`` with g_gamma and with a scalar g (K=V=128) on both launchers, and Triton's
``chunk_simple_gla`` with that g; with the compile time (XLA
ahead-of-time; Triton's first call) apart from the run times. A case that
fails (e.g. out of memory, or a Mosaic GPU compile error on the first real run) is recorded with its
error and the script goes on.

Writes ``benchmarks/results/pallas_mosaic_gpu_<device>.json`` stamped by ``bench.environment()``
(``--smoke``: a temporary file).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from gla_ref import bench  # noqa: E402

VARIANTS = ("chunk", "fused", "simple_chunk", "simple_fused", "gamma_chunk", "gamma_fused")
SMOKE_VARIANTS = ("fused",)
CASES = [
    ("pallas chunk_gla mosaic_gpu", 128), ("pallas chunk_gla gpu", 128), ("triton chunk_gla", 128),
    ("pallas chunk_simple_gla g_gamma mosaic_gpu", 128), ("pallas chunk_simple_gla g_gamma gpu", 128),
    ("pallas fused_chunk_gla mosaic_gpu", 64), ("pallas fused_chunk_gla gpu", 64), ("triton fused_chunk_gla", 64),
    ("pallas chunk_gla mosaic_gpu", 64), ("pallas chunk_gla gpu", 64),
    ("pallas chunk_simple_gla g mosaic_gpu", 128), ("pallas chunk_simple_gla g gpu", 128),
    ("triton chunk_simple_gla g", 128),
]
"""(name, K = V) of each timing case; the name's last word is the Pallas launcher. ``g_gamma``: a constant
decay per head; ``g``: a data-dependent scalar gate per token, ``[B, T, H]``."""
ACCURACY = {"B": 2, "H": 2, "K": 64, "V": 64, "tau": 16.0}
TIMING = {"B": 8, "H": 16, "chunk": 64, "dtype": "bfloat16", "warmup": 5, "rep": 50}


def _error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return next((line for line in text.splitlines() if line.strip()), text)[:300]


def accuracy_rows(Ts, smoke: bool, variants=None):
    """One row per (launcher, variant, dtype, T): the relative RMSE of every tensor, or the error raised.
    ``variants``: the bf16 variants to check (default :data:`VARIANTS`, and ``chunk`` in float32 too)."""
    import jax.numpy as jnp
    from gla_ref.testing.pallas_cases import check_variant

    from gla_ref.pallas import compat

    rows = []
    cases = [(v, jnp.bfloat16) for v in (SMOKE_VARIANTS if smoke else variants or VARIANTS)]
    cases += [] if variants else [("chunk", jnp.float32)]
    for launcher in ("mosaic_gpu", "gpu"):
        for variant, dtype in cases:
            for T in Ts:
                interpret = False
                if smoke:
                    interpret = compat.gpu_interpret_params() if launcher == "mosaic_gpu" else True
                row = {"launcher": launcher, "variant": variant, "dtype": jnp.dtype(dtype).name, "T": T,
                       "mode": "interpreted" if smoke else "compiled"}
                try:
                    if launcher == "mosaic_gpu":
                        compat.reset_gpu_interpreter()
                    errors = check_variant(variant, chunk_size=64, dtype=dtype, launcher=launcher,
                                           interpret=interpret, tol=1.0, T=T, **ACCURACY)
                    row["rel_rmse"] = {k: float(e) for k, e in errors.items()}
                except (TypeError, ValueError) as err:  # the launcher refuses (float32 on Mosaic GPU)
                    row["refused"] = _error(err)
                rows.append(row)
                print(row, flush=True)
    return rows


def _gate(name: str) -> str:
    """The gate a timing case takes (:func:`gla_ref.bench.jax_inputs`'s ``gate``)."""
    if "g_gamma" in name:
        return "const"
    return "scalar" if "chunk_simple_gla g" in name else "gla"


def _time_pallas(name, mode, T, K):
    import jax
    import jax.numpy as jnp

    from gla_ref.bench import jax_inputs
    from gla_ref.pallas import chunk_gla, chunk_simple_gla, fused_chunk_gla

    p, launcher = TIMING, name.split()[-1]
    gate = _gate(name)
    q, k, v, g, do = jax_inputs(p["B"], T, p["H"], K, K, gate, p["dtype"])

    def fn(q, k, v, g):
        kw = {"chunk_size": p["chunk"], "launcher": launcher, "interpret": False}
        if gate == "const":
            return chunk_simple_gla(q, k, v, g_gamma=g, mode="chunk", **kw)[0]
        if gate == "scalar":
            return chunk_simple_gla(q, k, v, g, mode="chunk", **kw)[0]
        return (fused_chunk_gla if "fused" in name else chunk_gla)(q, k, v, g, **kw)[0]

    if mode == "fwd":
        return bench.time_jax(jax.jit(fn), q, k, v, g, warmup=p["warmup"], rep=p["rep"])

    def loss(q, k, v, g, do):
        return (fn(q, k, v, g).astype(jnp.float32) * do.astype(jnp.float32)).sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    return bench.time_jax(grads, q, k, v, g, do, warmup=p["warmup"], rep=p["rep"])


def _time_triton(name, mode, T, K):
    from pallas_harness import _time_triton_on

    from gla_ref.bench import jax_inputs

    p = TIMING
    q, k, v, g, do = jax_inputs(p["B"], T, p["H"], K, K, _gate(name), p["dtype"])
    return _time_triton_on(name, mode, q, k, v, g, do, p["chunk"], p["warmup"], p["rep"], None)


def timing_rows(Ts, rows, save, cases=None):
    """Appends one row per (T, case, mode) to ``rows``, calling ``save()`` after each; ``cases``: the case
    names to time (default every one of :data:`CASES`)."""
    for T in Ts:
        for name, K in CASES:
            if cases and name not in cases:
                continue
            for mode in ("fwd", "fwd+bwd"):
                row = {"T": T, "K": K, "V": K, "name": f"{name} {mode}"}
                try:
                    t = (_time_triton if name.startswith("triton") else _time_pallas)(name, mode, T, K)
                    row.update({k: t[k] for k in ("compile_ms", "first_ms", "median_ms", "p20_ms", "p80_ms")})
                except Exception as err:  # noqa: BLE001 (record it, measure the rest)
                    row["error"] = _error(err)
                rows.append(row)
                save()
                print(row, flush=True)


KERNEL_STEPS = ("state_fwd", "chunk_fwd_o", "state_bwd", "chunk_bwd")
"""The four kernels of the non-fused path (gla_ref.pallas.chunk: forward state_fwd then chunk_fwd_o;
backward state_fwd again, state_bwd, chunk_bwd), each timed alone by ``--kernels``."""


def kernel_rows(T, K, rows, save, launchers=("mosaic_gpu", "gpu"), steps=KERNEL_STEPS):
    """One row per (launcher, kernel) of the non-fused ``chunk_gla`` at B=8, H=16, K=V=``K``, bf16: each
    kernel jitted alone on the inputs the custom VJP gives it (q, k, v, dO in the launcher's layout: ``[B, T, H, D]``
    for Mosaic GPU, its ``TOKEN_MAJOR``, the kernel layout ``[B, H, T, D]`` for the Triton backend; the
    chunk-local cumulative gates), so the time of a step is read per kernel, not guessed from the total.
    ``state_fwd`` and ``chunk_fwd_o`` as the forward runs them (the states in the input dtype on Mosaic GPU,
    :func:`gla_ref.pallas.chunk.output_states`), ``chunk_bwd`` on the backward's float32 states.
    Appends to ``rows``, calling ``save()`` after each; ``launchers`` and ``steps`` select the rows."""
    import jax

    from gla_ref.bench import jax_inputs
    from gla_ref.pallas import chunk as pchunk
    from gla_ref.pallas.launchers import gpu, mosaic_gpu

    p = TIMING
    q, k, v, g, do = jax_inputs(p["B"], T, p["H"], K, K, "gla", p["dtype"])
    b = _gates(g, T, K)
    C, scale = p["chunk"], K ** -0.5
    for name, L in (("mosaic_gpu", mosaic_gpu), ("gpu", gpu)):
        if name not in launchers:
            continue
        kw = {"chunk_size": C, "interpret": False}
        tokens = (q, k, v, do)
        if not getattr(L, "TOKEN_MAJOR", False):
            tokens = tuple(pchunk._to_kernel_layout(x, T, K) for x in tokens)
        qp, kp, vp, dop = tokens
        states_kw = pchunk.output_states(L, q.dtype)
        forward_states = functools.partial(L.state_fwd, want_final=False, **kw, **states_kw)
        h = jax.jit(forward_states)(kp, vp, b, None)[0]
        dso = jax.jit(functools.partial(L.state_bwd, scale=scale, want_dh0=False, **kw))(qp, b, dop, None)[0]
        if states_kw:  # the backward's states are float32
            h_bwd = jax.jit(functools.partial(L.state_fwd, want_final=False, **kw))(kp, vp, b, None)[0]
        else:
            h_bwd = h
        kernel_steps = {
            "state_fwd": (forward_states, (kp, vp, b, None)),
            "chunk_fwd_o": (functools.partial(L.chunk_fwd_o, scale=scale, **kw), (qp, kp, vp, b, h)),
            "state_bwd": (functools.partial(L.state_bwd, scale=scale, want_dh0=False, **kw), (qp, b, dop, None)),
            "chunk_bwd": (functools.partial(L.chunk_bwd, scale=scale, **kw), (qp, kp, vp, b, dop, h_bwd, dso)),
        }
        for step in steps:
            fn, args = kernel_steps[step]
            row = {"T": T, "K": K, "V": K, "launcher": name, "kernel": step}
            try:
                t = bench.time_jax(jax.jit(fn), *args, warmup=p["warmup"], rep=p["rep"])
                row.update({k: t[k] for k in ("compile_ms", "median_ms", "p20_ms", "p80_ms")})
            except Exception as err:  # noqa: BLE001 (record it, measure the rest)
                row["error"] = _error(err)
            rows.append(row)
            save()
            print(row, flush=True)


@contextlib.contextmanager
def gate_kernel(on=True):
    """Within: the Mosaic GPU launcher sums per-key gates by its gate-sum kernel
    (:data:`gla_ref.pallas.chunk.MOSAIC_GPU_GATE_SUMS`, the default) if ``on``, by XLA's scan if not."""
    from gla_ref.pallas import chunk as pchunk

    saved = dict(pchunk.GATE_SUM_KERNELS)
    pchunk.GATE_SUM_KERNELS.clear()
    pchunk.GATE_SUM_KERNELS.update(pchunk.MOSAIC_GPU_GATE_SUMS if on else {})
    try:
        yield
    finally:
        pchunk.GATE_SUM_KERNELS.clear()
        pchunk.GATE_SUM_KERNELS.update(saved)


def _gates(g, T, K, interpret=False):
    """What :func:`gla_ref.pallas.chunk.run` makes of ``g [B, T, H, K]`` for the Mosaic GPU launcher: the chunk-local
    cumulative gates ``b [B, H, T, K]``, float32 (by XLA's scan, or within :func:`gate_kernel` its gate-sum kernel)."""
    from gla_ref.pallas import chunk as pchunk

    plan = pchunk.make_plan("mosaic_gpu", interpret, chunk_size=TIMING["chunk"], scale=None, K=K, fused=False,
                            want_final=False)
    return pchunk._local_cumsum(pchunk._gate_layout(g, plan, T, K, per_key=True), plan)


def gate_kernel_check(T, K, interpret=False):
    """The gate-sum kernel against float64 where it runs (B=8, H=16 of :data:`TIMING`, float32 gates of about
    -0.7 nats a token): the largest error relative to the largest sum, and whether a NaN, a positive and a -inf gate
    each make exactly their chunk's column NaN."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from gla_ref.bench import jax_inputs
    from gla_ref.pallas.launchers.mosaic_gpu import gates as mosaic_gpu_gates

    p, C = TIMING, TIMING["chunk"]
    _, _, _, g, _ = jax_inputs(p["B"], T, p["H"], K, K, "gla", p["dtype"])
    sums = jax.jit(functools.partial(mosaic_gpu_gates.gate_sums, chunk_size=C, interpret=interpret))
    B, H = g.shape[0], g.shape[2]
    exact = np.swapaxes(np.asarray(g, np.float64), 1, 2).reshape(B, H, T // C, C, K).cumsum(3).reshape(B, H, T, K)
    err = float(np.abs(np.asarray(sums(g), np.float64) - exact).max() / np.abs(exact).max())
    nan_ok = []
    for value, (ib, t, ih, kk) in ((jnp.nan, (0, 5, 0, 3)), (0.5, (B - 1, T - 1, H - 1, K - 1)),
                                   (-jnp.inf, (0, T // 2, H - 1, 7))):
        nan = np.isnan(np.asarray(sums(g.at[ib, t, ih, kk].set(value))))
        start = t // C * C
        nan_ok.append(bool(nan[ib, ih, start:start + C, kk].all() and nan.sum() == C))
    return {"T": T, "K": K, "max_abs_err_rel_to_max": err, "invalid_gates_fill_their_chunk_column": nan_ok}


def glue_rows(T, K, rows, save):
    """The forward of ``chunk_gla`` on the Mosaic GPU launcher cut into its parts, one process, B=8, H=16,
    K=V=``K``, bf16: the whole forward, its two kernels alone, and alone the step that
    :func:`gla_ref.pallas.chunk.run` takes before them, beside ``gla_ref.triton.chunk_gla``'s forward. The launcher
    reads q, k, v and writes o in their own ``[B, T, H, D]`` (``TOKEN_MAJOR``), so that step is the gates': the
    chunk-local cumulative sums b, float32, in the kernel layout ``[B, H, T, K]``, by XLA's scan and by
    the gate-sum kernel (:func:`gate_kernel`, the default), and the forward with each. Appends to ``rows``, calling
    ``save()`` after each."""
    import jax

    from gla_ref.bench import jax_inputs

    p = TIMING
    _, _, _, g, _ = jax_inputs(p["B"], T, p["H"], K, K, "gla", p["dtype"])

    def gates():
        return bench.time_jax(jax.jit(functools.partial(_gates, T=T, K=K)), g, warmup=p["warmup"], rep=p["rep"])

    def forward():
        return _time_pallas("pallas chunk_gla mosaic_gpu", "fwd", T, K)

    timings = (("pallas chunk_gla mosaic_gpu fwd", False, forward),
               ("triton chunk_gla fwd", False, lambda: _time_triton("triton chunk_gla", "fwd", T, K)),
               ("glue: g to b", False, gates),
               ("pallas chunk_gla mosaic_gpu fwd, gate-sum kernel", True, forward),
               ("glue: g to b, gate-sum kernel", True, gates))
    for name, kernel, timed in timings:
        row = {"T": T, "K": K, "V": K, "name": name}
        with gate_kernel(kernel):
            t = timed()
        row.update({key: t[key] for key in ("compile_ms", "median_ms", "p20_ms", "p80_ms")})
        rows.append(row)
        save()
        print(row, flush=True)
    kernel_rows(T, K, rows, save, launchers=("mosaic_gpu",), steps=("state_fwd", "chunk_fwd_o"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[4096, 8192, 16384], help="timing lengths")
    parser.add_argument("--accuracy-T", type=int, nargs="*", default=[256, 2048],
                        help="accuracy lengths (none: timing only)")
    parser.add_argument("--smoke", action="store_true", help="interpreter accuracy at T=80 only, no timing")
    parser.add_argument("--kernels", action="store_true",
                        help="instead: time each kernel of the non-fused path alone (both launchers, K=V=128 and 64, the first T)")
    parser.add_argument("--glue", action="store_true",
                        help="instead: the Mosaic GPU forward cut into its kernels and the gates' sums before them, "
                        "by XLA and by the gate-sum kernel, which is also checked against float64 (K=V=128)")
    parser.add_argument("--xla-gate-sums", action="store_true",
                        help="accuracy and timing with the gates summed by XLA's scan, not the gate-sum kernel")
    parser.add_argument("--cases", nargs="+", choices=sorted({name for name, _ in CASES}),
                        help="time only these cases (default all)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS,
                        help="check the accuracy of only these paths, in bf16 (default all, and chunk in float32)")
    parser.add_argument("--no-timing", action="store_true", help="accuracy only")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    import jax

    from gla_ref.pallas import compat

    if not args.smoke and not compat.mosaic_gpu_runs_here():
        parser.error(f"needs a Hopper GPU and a JAX with Mosaic GPU (found {jax.devices()[0].device_kind}); "
                     "use --smoke on other machines")
    about = ("gla_ref.pallas paths (chunk_gla, fused_chunk_gla, chunk_simple_gla) on the Mosaic GPU launcher and "
             "on the Triton-backend launcher; accuracy: relative RMSE against the float64 "
             f"recurrence on the same bf16-rounded inputs, {ACCURACY}, chunk 64; timing: {TIMING}, compile_ms "
             "apart (XLA ahead-of-time compile; for Triton its first call)")
    result = {"env": bench.environment(), "about": about, "accuracy": [], "rows": [], "kernels": []}

    def save():  # after every row: a run stopped at its time limit keeps what it measured
        return bench.write_result(result, "pallas_mosaic_gpu", ROOT / "benchmarks" / "results", args.out,
                                  smoke=args.smoke)

    if args.smoke:
        with jax.default_device(jax.devices("cpu")[0]):
            result["accuracy"] = accuracy_rows([80], smoke=True)
    elif args.glue:
        result["glue"], result["gate_kernel_check"] = [], []
        for T in args.T:
            result["gate_kernel_check"].append(gate_kernel_check(T, 128))
            save()
            print(result["gate_kernel_check"][-1], flush=True)
            glue_rows(T, 128, result["glue"], save)
    elif args.kernels:
        for K in (128, 64):
            kernel_rows(args.T[0], K, result["kernels"], save)
    else:
        result["gate_sum_kernel"] = not args.xla_gate_sums
        with gate_kernel(not args.xla_gate_sums):
            result["accuracy"] = accuracy_rows(args.accuracy_T, smoke=False, variants=args.variants)
            save()
            if not args.no_timing:
                timing_rows(args.T, result["rows"], save, args.cases)
    path = save()
    print("wrote", path)
    return path


if __name__ == "__main__":
    main()
