"""What the benchmarks measure, each in one place: forward, forward+backward, peak memory, first call, roofline.

:func:`measure` takes a candidate made for a point (:func:`gla_ref.bench.candidates.instantiate`) and the
names of the measures a suite asks for, and returns the row's numbers, each part tried on its own so that a
backward that refuses still leaves the forward's numbers (its error under ``<part>_error``). The methods,
in words, travel in every result file (:data:`METHODS`), beside the numbers they produced.

Importing this module loads no framework.
"""

from __future__ import annotations

import os
import statistics
import time

MEASURES = ("first", "fwd", "fwd_bwd", "peak", "roofline")
"""The measures a suite can ask for, in the order they run (``first`` in a fresh process before the rest)."""

PEAK_REPEATS = 3

METHODS = {
    "fwd": "the forward under torch.no_grad: median and 20/80 % quantiles (ms) of triton.testing.do_bench (CUDA "
           "events, L2 flushed between runs, after its warm-up: compile and autotune excluded); JAX: the jitted "
           "forward, compiled ahead of time (fwd_compile_ms) then timed on the host clock, every call ended by "
           "jax.block_until_ready; on a CPU (--smoke) one call on the host clock, a check that it runs, not a speed",
    "fwd_bwd": "o = f(q, k, v, g); o.backward(do) with do ~ N(0, 1) drawn once; the gradients of q, k, v, g set to "
               "None before every timed run (do_bench's grad_to_none), so each run allocates them as a training "
               "step does; JAX: jax.grad of <o, do> with respect to q, k, v, g, jitted; timed as fwd",
    "peak": f"peak memory as training allocates it: before each step the gradients of q, k, v, g are None (as "
            f"after optimizer.zero_grad(set_to_none=True)); after a synchronise the allocator's peak counter is "
            f"reset, and the step's peak is torch.cuda.max_memory_allocated() minus what was allocated before it "
            f"(the inputs and do): what the step itself allocates — saved activations, temporaries, the output "
            f"and the new gradients. Ours and the peers' alike, after their timing runs (compiled and tuned), "
            f"{PEAK_REPEATS} times: *_peak_bytes is the median, *_peak_spread_bytes max − min, *_peak_runs_bytes "
            f"all of them. JAX: XLA's plan for the compiled step (compiled.memory_analysis(): temporaries plus "
            f"outputs, the gradients included), which does not vary. Sequence parallel: the largest rank's",
    "first": "wall time (s) of the first forward+backward in a fresh Python process (nothing compiled or tuned in "
             "memory) with an empty Triton cache (TRITON_CACHE_DIR a new folder; JAX's persistent cache off): "
             "compilation and autotuning included; first_process_s: the whole child, imports too",
    "roofline": "roofline_fraction = bound_ms / fwd median_ms, bound_ms from gla_ref.bench.models.roofline of the "
                "candidate's forward cost model (gla_ref.bench.models.forward_cost: tensor-core FLOPs at the bf16 "
                "peak plus float32 FLOPs at the fp32 peak, against the compulsory HBM bytes at the bandwidth, the "
                "larger) at the device's datasheet peaks (gla_ref.bench.models.DATASHEET_PEAKS); 1 is the roof. "
                "None where the device has no datasheet entry or the candidate no cost model (or a chunk size "
                "other than its model's)",
}
"""Each measure's method, written into every result file (``methods``) and shown by ``python -m gla_ref.bench list``."""


def describe_error(err: BaseException) -> str:
    """A one-line record of an exception; running out of device memory (torch or JAX) reads ``out of memory``."""
    text = f"{type(err).__name__}: {err}"
    oom = "OutOfMemory" in type(err).__name__ or "out of memory" in text.lower() or "RESOURCE_EXHAUSTED" in text
    first = next((line for line in text.splitlines() if line.strip()), text)[:300]
    return f"out of memory: {first}" if oom else first


def is_oom(row: dict) -> bool:
    """Whether a row ran out of device memory in any part."""
    return any(str(v).startswith("out of memory") for k, v in row.items() if k.endswith("error"))


def peak_memory(step, leaves, repeats: int = PEAK_REPEATS, counter=None) -> dict:
    """Peak bytes of ``step()`` as a training step allocates them (:data:`METHODS` ``["peak"]``), ``repeats``
    times: every leaf's ``.grad`` is None before each step and again after the last. ``counter(step)`` measures
    one step (default :func:`gla_ref.bench.timing.peak_memory_cuda`). Returns ``{"bytes": median,
    "spread_bytes": max − min, "runs_bytes": [...]}``."""
    from gla_ref.bench.timing import peak_memory_cuda

    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    counter = counter or peak_memory_cuda
    runs = []
    for _ in range(repeats):
        for x in leaves:
            x.grad = None
        runs.append(int(counter(step)))
    for x in leaves:
        x.grad = None
    return {"bytes": int(statistics.median_low(runs)), "spread_bytes": max(runs) - min(runs), "runs_bytes": runs}


def roofline_fraction(cost, point: dict, fwd_ms, device: str):
    """The roofline fraction of a forward (:data:`METHODS` ``["roofline"]``, the one definition the results
    use): ``bound_ms / fwd_ms`` with ``bound_ms`` from :func:`gla_ref.bench.models.roofline` of
    ``models.forward_cost(cost, B, T, H, K, V, act_bytes)`` at ``models.datasheet_peaks(device)``. None when
    ``cost`` is None, the device has no datasheet peaks, the point has no time, or a chunk size other than
    the model's default."""
    from gla_ref.bench import models

    peaks = models.datasheet_peaks(device)
    default_C = {"fused_chunk_gla": 16}.get(cost, 64)
    if cost is None or peaks is None or not fwd_ms or point.get("chunk_size", default_C) != default_C:
        return None
    if point.get("gate") == "none" and cost != "sdpa_flash":
        return None  # the cost models read gates; a gate-free run moves less
    B, T, H, K, V = (point[key] for key in ("B", "T", "H", "K", "V"))
    if cost == "sdpa_flash" and "attention" in point:
        H, K, V = point["attention"]["H"], point["attention"]["D"], point["attention"]["D"]
    act_bytes = 4 if point.get("dtype") == "float32" else 2
    return models.roofline(models.forward_cost(cost, B, T, H, K, V, act_bytes=act_bytes), peaks, fwd_ms)["fraction"]


def _timer(on_gpu, warmup, rep):
    """``timed(fn, leaves) -> {"median_ms", "p20_ms", "p80_ms"}``: do_bench on a GPU, one host-clock call on a CPU."""
    from gla_ref.bench.timing import time_cuda

    def timed(fn, leaves=None):
        if on_gpu:
            return time_cuda(fn, warmup=warmup, rep=rep, **({"grad_to_none": leaves} if leaves else {}))
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1e3
        return {"median_ms": ms, "p20_ms": ms, "p80_ms": ms}
    return timed


def _parts(parts, out, clear=()):
    """Run each ``(key, fn)`` of ``parts``, merging what it returns into ``out``; an exception lands in
    ``out[key + "_error"]`` and the next part still runs. ``clear``: leaves whose gradients are reset after each."""
    for key, part in parts:
        try:
            out.update(part())
        except Exception as err:  # recorded in the row: one refusal must not end the suite
            out[f"{key}_error"] = describe_error(err)
        finally:
            for x in clear:
                x.grad = None
    return out


def measure_torch(inst, measures, *, on_gpu, warmup=25, rep=100, peak_repeats=PEAK_REPEATS) -> dict:
    """The row of a torch candidate: ``fwd``, ``fwd_bwd`` (timings), ``fwd_peak_*``, ``fwd_bwd_peak_*``."""
    import torch

    run, args, extra, leaves, do = inst.run, inst.args, inst.extra, inst.leaves, inst.do
    timed = _timer(on_gpu, warmup, rep)

    def fwd():
        with torch.no_grad():
            run(*args, **extra)

    def fwd_bwd():
        run(*args, **extra).backward(do)

    def peak(key, fn):
        p = peak_memory(fn, leaves, peak_repeats)
        return {f"{key}_peak_bytes": p["bytes"], f"{key}_peak_spread_bytes": p["spread_bytes"],
                f"{key}_peak_runs_bytes": p["runs_bytes"]}

    backward = not inst.candidate.forward_only
    parts = []
    if "fwd" in measures:
        parts.append(("fwd", lambda: {"fwd": timed(fwd)}))
    if "fwd_bwd" in measures and backward:
        parts.append(("fwd_bwd", lambda: {"fwd_bwd": timed(fwd_bwd, leaves)}))
    if "peak" in measures and on_gpu:
        parts.append(("fwd_peak", lambda: peak("fwd", fwd)))
        if backward:
            parts.append(("fwd_bwd_peak", lambda: peak("fwd_bwd", fwd_bwd)))
    return _parts(parts, {}, leaves)


def measure_jax(inst, measures, *, on_gpu, warmup=5, rep=50) -> dict:
    """The row of a JAX candidate: compiled ahead of time (``*_compile_ms``), then timed on the host clock
    (:func:`gla_ref.bench.timing.time_wall`, each call ended by ``block_until_ready``); the step's memory from
    XLA's plan."""
    import jax
    import jax.numpy as jnp

    from gla_ref.bench.timing import time_wall

    fn, (q, k, v, g), do = inst.run, inst.args, inst.do
    xs = [x for x in (q, k, v, g) if x is not None]
    with_g = g is not None
    call = (lambda q, k, v, g: fn(q, k, v, g)) if with_g else (lambda q, k, v: fn(q, k, v, None))

    def loss(*a):
        return (call(*a[:-1]).astype(jnp.float32) * a[-1].astype(jnp.float32)).sum()

    if not on_gpu:
        warmup, rep = 0, 1

    def timed(key, jitted, *a):
        t0 = time.perf_counter()
        compiled = jitted.lower(*a).compile()
        compile_ms = (time.perf_counter() - t0) * 1e3
        t = time_wall(compiled, *a, warmup=warmup, rep=rep, sync=jax.block_until_ready)
        out = {key: {n: t[n] for n in ("median_ms", "p20_ms", "p80_ms")}, f"{key}_compile_ms": compile_ms,
               f"{key}_first_ms": t["first_ms"]}
        if "peak" in measures:
            stats = compiled.memory_analysis()
            if stats is not None:
                out[f"{key}_peak_bytes"] = int(stats.temp_size_in_bytes + stats.output_size_in_bytes)
                out[f"{key}_peak_spread_bytes"] = 0
        return out

    parts = []
    if "fwd" in measures:
        parts.append(("fwd", lambda: timed("fwd", jax.jit(call), *xs)))
    if "fwd_bwd" in measures:
        grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(xs)))))
        parts.append(("fwd_bwd", lambda: timed("fwd_bwd", grads, *xs, do)))
    return _parts(parts, {})


def measure_ranks(inst, measures, *, on_gpu, warmup=3, rep=10, timeout=600.0, peak_repeats=PEAK_REPEATS) -> dict:
    """The row of a multi-process candidate: :func:`gla_ref.bench.ranks.time_step` on ``point["devices"]``
    processes (NCCL, NVLink multicast off; gloo on a CPU). ``fwd_bwd``: quantiles over steps of the slowest
    rank's step time; peaks: the largest rank's; bytes each rank sent and received in one step."""
    from gla_ref.sequence_parallel import local

    n = inst.point["devices"]
    kwargs = dict(inst.run, warmup=0 if not on_gpu else warmup, rep=1 if not on_gpu else rep,
                  peak_repeats=peak_repeats if "peak" in measures else 0)
    try:
        ranks = local.launch("gla_ref.bench.ranks:time_step", n, kwargs=kwargs, backend="nccl" if on_gpu else "gloo",
                             timeout=timeout, env={"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                                   "NVSHMEM_DISABLE_NVLS": "1"})
    except Exception as err:  # a rank out of memory ends the group
        return {"fwd_bwd_error": describe_error(err)}
    import numpy as np

    slowest = np.max([r["step_ms"] for r in ranks], axis=0)
    p20, median, p80 = np.quantile(slowest, [0.2, 0.5, 0.8])
    out = {"fwd_bwd": {"median_ms": float(median), "p20_ms": float(p20), "p80_ms": float(p80)},
           "bytes_sent": [r["sent"] for r in ranks], "bytes_received": [r["received"] for r in ranks]}
    peaks = [r["peak"] for r in ranks if r.get("peak")]
    if peaks:
        top = max(peaks, key=lambda p: p["bytes"])
        out.update(fwd_bwd_peak_bytes=top["bytes"], fwd_bwd_peak_spread_bytes=top["spread_bytes"],
                   fwd_bwd_peak_runs_bytes=top["runs_bytes"], fwd_bwd_peak_by_rank_bytes=[p["bytes"] for p in peaks])
    return out


def measure(inst, measures, *, on_gpu, device="cpu", timing=None) -> dict:
    """The numbers of one row: the suite's ``measures`` (``first`` excepted: :func:`first_call`, by the runner)
    of a candidate made for a point, by its framework, then its ``roofline_fraction``. ``timing``: keyword
    arguments of the framework's timer (warm-up and repetitions)."""
    kw = dict(timing or {})
    by = {"torch": measure_torch, "jax": measure_jax, "ranks": measure_ranks}[inst.candidate.framework]
    out = by(inst, measures, on_gpu=on_gpu, **kw)
    if "roofline" in measures and "fwd" in out:
        out["roofline_fraction"] = roofline_fraction(inst.candidate.cost, inst.point, out["fwd"]["median_ms"], device)
    return out


def first_call(name: str, point: dict, *, timeout: float = 900.0) -> dict:
    """The first forward+backward of candidate ``name`` at ``point`` in a fresh process (:data:`METHODS`
    ``["first"]``): ``{"first_fwd_bwd_s", "first_process_s"}``, or ``{"first_error": ...}`` (the child's
    last lines, or that it did not finish in ``timeout`` seconds)."""
    import json
    import signal
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gla_bench_first_") as tmp:
        env = {**os.environ, "TRITON_CACHE_DIR": os.path.join(tmp, "triton_cache"),
               "JAX_ENABLE_COMPILATION_CACHE": "false", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        spec = json.dumps({"name": name, "point": point})
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "gla_ref.bench", "_first", spec], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"first_error": f"did not finish in {timeout:.0f} s"}
        wall = time.perf_counter() - t0
    for line in reversed(out.splitlines()):
        if line.startswith("FIRST "):
            return {**json.loads(line[6:]), "first_process_s": wall}
    tail = " | ".join(line for line in out.splitlines()[-3:] if line.strip())[:300]
    return {"first_error": f"exit {proc.returncode}: {tail}"}


def first_call_child(spec: str) -> None:
    """Inside the fresh process of :func:`first_call`: make the inputs, then time the first forward+backward
    (every kernel compiled and tuned there), printing ``FIRST {json}``."""
    import json

    from gla_ref import device

    device.use_triton_interpreter()
    from gla_ref.bench.candidates import instantiate

    spec = json.loads(spec)
    inst = instantiate(spec["name"], spec["point"])
    if inst.candidate.framework == "jax":
        import jax

        xs = [x for x in inst.args if x is not None]
        fn = inst.run if len(xs) == 4 else (lambda q, k, v: inst.run(q, k, v, None))
        t0 = time.perf_counter()
        jax.block_until_ready(jax.grad(lambda *a: fn(*a).astype("float32").sum(), argnums=0)(*xs))
    else:
        import torch

        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        t0 = time.perf_counter()
        inst.run(*inst.args, **inst.extra).backward(inst.do)
        sync()
    print("FIRST " + json.dumps({"first_fwd_bwd_s": time.perf_counter() - t0}), flush=True)
