"""Cost models and timing: FLOPs and bytes of each form and kernel, roofline, timers.

The models are plain arithmetic (no framework import); the timers import their framework lazily.
"""

from __future__ import annotations

# --- FLOPs and memory models (chapters 1 and 3) ---

def two_level_flop_split(T, C, c, K, V):
    """FLOPs per head and sequence of the two-level chunkwise GLA forward (Fig. 3 / Fig. 7 of the
    paper), split by where they can run: half-precision matmuls (tensor cores) vs full-precision
    log-space work (Eq. 4). A multiply-add is 2 FLOPs; whole c×c tiles are counted (kernels compute
    a tile, then mask it). With N = ⌈T/C⌉ chunks (the last padded) and n = C/c sub-chunks a chunk:

    * ``state``: ``(K ⊙ Γ)ᵀ V`` per chunk, 2·C·K·V, so 2·N·C·K·V;
    * ``inter_chunk``: ``(Q ⊙ Λ) S`` per chunk, the same 2·N·C·K·V;
    * ``inter_sub_chunk``: the n(n−1)/2 tiles below the diagonal of each chunk's P, 2·c²·K each;
    * ``pv``: P times V over the n(n+1)/2 lower tiles of each chunk (diagonal tiles included:
      P is cast to the input dtype for this product, as kernels do), 2·c²·V each;
    * ``intra_sub_chunk``: the n diagonal tiles of P by Eq. 4, 2·c²·K each, every term also paying
      an exp and a subtraction (not counted) — the only full-precision part.

    Returns those five counts plus ``half_matmul`` (the first four summed), ``full_precision``
    (= ``intra_sub_chunk``) and ``half_fraction`` = half / (half + full). ``c = C`` is the one-level
    log-space form (``chunk_gla``): the whole intra-chunk P in full precision.
    """
    _positive_ints(T=T, C=C, c=c, K=K, V=V)
    if C % c:
        raise ValueError(f"c={c} must divide C={C}")
    N, n = -(-T // C), C // c
    counts = {
        "state": 2 * N * C * K * V,
        "inter_chunk": 2 * N * C * K * V,
        "inter_sub_chunk": N * n * (n - 1) // 2 * 2 * c * c * K,
        "pv": N * n * (n + 1) // 2 * 2 * c * c * V,
        "intra_sub_chunk": N * n * 2 * c * c * K,
    }
    half = counts["state"] + counts["inter_chunk"] + counts["inter_sub_chunk"] + counts["pv"]
    full = counts["intra_sub_chunk"]
    return {**counts, "half_matmul": half, "full_precision": full, "half_fraction": half / (half + full)}


# Chapter 1 counts per head and per sequence (multiply by B·H); a multiply-add is 2 FLOPs, so an
# [m, n] @ [n, p] matmul costs 2·m·n·p. Only matmul FLOPs are counted (mask, softmax, normaliser
# and additions of states are lower order). K = V = d, the head dimension.

def _positive_ints(**sizes):
    for name, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")


def flops_attention(T, d):
    """Parallel (softmax or linear) attention, O(T²d): ``QKᵀ`` is 2·T·T·d, the ``T×T`` weights
    times V another 2·T·T·d, so 4·T²·d. Dense: the causal mask does not remove work here."""
    _positive_ints(T=T, d=d)
    return 4 * T * T * d


def flops_linear_recurrent(T, d):
    """The recurrent form of linear attention, O(Td²): per token ``S += k_tᵀ v_t`` (2·d²) and
    ``o_t = q_t S_t`` (2·d²), so 4·T·d². The reassociated ``Q(KᵀV)`` costs the same."""
    _positive_ints(T=T, d=d)
    return 4 * T * d * d


def flops_chunkwise(T, C, d):
    """The chunkwise form, O(TCd + Td²): per chunk, intra ``(Q Kᵀ ⊙ M) V`` is 4·C²·d and inter
    ``Q S`` plus the state update ``Kᵀ V`` is 4·C·d². With N = ⌈T/C⌉ chunks (the last one padded
    to C, as kernels do) the total is N·(4C²d + 4Cd²) = 4TCd + 4Td² when C divides T.
    C = T is the parallel form plus the state; C = 1 the recurrent form plus the 1×1 "attention"."""
    _positive_ints(T=T, C=C, d=d)
    N = -(-T // C)
    return N * (4 * C * C * d + 4 * C * d * d)


def kv_cache_bytes(T, H, d, dtype_bytes=2):
    """Bytes of a softmax-attention KV cache after T tokens: keys and values, each ``[T, H, d]``,
    per sequence and layer. Grows linearly with T."""
    _positive_ints(T=T, H=H, d=d, dtype_bytes=dtype_bytes)
    return 2 * T * H * d * dtype_bytes


def state_bytes(H, K, V, dtype_bytes=4):
    """Bytes of the linear-attention state, one ``[K, V]`` matrix per head (float32 by default),
    per sequence and layer. Independent of T."""
    _positive_ints(H=H, K=K, V=V, dtype_bytes=dtype_bytes)
    return H * K * V * dtype_bytes


# --- timing and roofline (chapters 4, 5, 7) ---

def environment() -> dict:
    """Device, library versions and date: the stamp every stored result carries."""
    import datetime
    import platform

    info = {"date": datetime.date.today().isoformat(), "python": platform.python_version()}
    for name in ("torch", "triton", "jax", "jaxlib"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    try:
        import torch

        info["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            info["ptxas"] = _ptxas_in_effect(torch.cuda.get_device_capability())
    except ImportError:
        info["device"] = "cpu"
    return info


def slug(text: str) -> str:
    """``text`` as part of a file name: lower case, every run of other characters one underscore
    (``"NVIDIA H200"`` → ``"nvidia_h200"``): how result files name their device."""
    import re

    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _ptxas_in_effect(capability):
    """The ptxas that assembles the Triton kernels on this GPU (None where Triton is not installed)."""
    try:
        from gla_ref.triton import _ptxas
    except ImportError:
        return None
    return _ptxas.in_effect(capability)


def time_cuda(fn, *, warmup=25, rep=100, grad_to_none=None) -> dict:
    """Median and 20/80 % quantiles (ms) of a CUDA callable, by ``triton.testing.do_bench``.

    do_bench warms up, flushes the L2 cache between runs and times with CUDA events. Pass the
    inputs of a backward as ``grad_to_none``: their ``.grad`` is reset before each run, so the time
    excludes autograd adding each new gradient into the old one.
    """
    from triton.testing import do_bench

    p20, median, p80 = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.2, 0.5, 0.8], grad_to_none=grad_to_none)
    return {"median_ms": median, "p20_ms": p20, "p80_ms": p80}


def peak_memory_cuda(fn) -> int:
    """Peak bytes allocated while ``fn`` runs, above what was allocated before it."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def time_jax(fn, *args, warmup=5, rep=50, stage=None) -> dict:
    """Compile time and run times (ms) of a JAX callable (jitted here if it is not yet).

    ``compile_ms`` is the ahead-of-time ``lower(...).compile()`` alone, nothing run: XLA's passes and
    code generation, the Pallas kernels' Triton or Mosaic code included (whatever a backend leaves for
    the first call lands in ``first_ms``). The compiled executable is then timed by
    :func:`time_wall`, each call ending in ``jax.block_until_ready`` so that asynchronous dispatch
    is not mistaken for speed: ``first_ms``, then median and 20/80 % quantiles of ``rep`` calls.
    ``stage(text)``, if given, is called with ``"compile"`` and ``"run"`` as each phase starts.
    """
    import time

    import jax

    report = stage or (lambda text: None)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    report("compile")
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_ms = (time.perf_counter() - t0) * 1e3
    report("run")
    t = time_wall(compiled, *args, warmup=warmup, rep=rep, sync=jax.block_until_ready)
    return {"compile_ms": compile_ms, **{k: t[k] for k in ("first_ms", "median_ms", "p20_ms", "p80_ms")}}


def copy_bandwidth_cuda(nbytes: int = 2**30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read and written."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src))["median_ms"]
    return 2 * nbytes / (ms * 1e-3) / 1e9


def gla_io_bytes(B, T, H, K, V, dtype_bytes=2, gate="gla") -> int:
    """Bytes a GLA forward must read and write at least: q, k, v, the gates (fp32) and o."""
    gate_elems = {"none": 0, "const": H, "scalar": B * T * H, "gla": B * T * H * K}[gate]
    return (2 * B * T * H * K + 2 * B * T * H * V) * dtype_bytes + 4 * gate_elems


PALLAS_BENCH = ("pallas chunk_gla", "pallas fused_chunk_gla", "pallas chunk_simple_gla g_gamma",
                "jax_ref.chunk_gla", "triton chunk_gla", "triton fused_chunk_gla")
"""The candidates of :func:`time_pallas_gla`: the Pallas kernels, the JAX reference under ``jax.jit``
and the Triton kernels of chapter 4 (PyTorch). Rows are named ``"<candidate> <mode>"``."""

BENCH_MODES = ("fwd", "fwd+bwd")


def _pallas_bench_inputs(B, T, H, K, V, dtype, gate):
    """Seeded q, k, v ~ N(0, 1) in ``dtype``, the output cotangent do, and the gates: log σ(N(0, 1))/16
    ``[B, T, H, K]`` for GLA, or the ALiBi slopes of :mod:`gla_ref.gates` as ``g_gamma [H]``."""
    import jax
    import jax.numpy as jnp

    from gla_ref import gates

    dt = jnp.dtype(dtype)
    keys = jax.random.split(jax.random.key(0), 5)
    q, k = (jax.random.normal(key, (B, T, H, K), dt) for key in keys[:2])
    v, do = (jax.random.normal(key, (B, T, H, V), dt) for key in keys[2:4])
    if gate == "const":
        g = jnp.asarray(gates.slopes_to_g_gamma(gates.build_slope_tensor(H)), jnp.float32)
    else:
        g = jax.nn.log_sigmoid(jax.random.normal(keys[4], (B, T, H, K))) / 16
    return q, k, v, g, do


def time_pallas_gla(name, mode, T, *, B=2, H=16, K=128, V=128, chunk_size=64, dtype="bfloat16",
                    warmup=5, rep=50, stage=None) -> dict:
    """Time one candidate of :data:`PALLAS_BENCH` in one mode (``"fwd"`` or ``"fwd+bwd"``) at one T.

    ``"fwd+bwd"`` is the gradient of ``⟨o, do⟩`` with respect to q, k, v and the gates, ``do`` being
    an argument of the jitted function (a captured array would be baked into the program as a
    constant of B·T·H·V numbers). JAX candidates are timed by :func:`time_jax` (``compile_ms`` is
    XLA's compile), Triton ones by :func:`_time_triton_on`. Returns ``{"T", "name", "compile_ms",
    "first_ms", "median_ms", "p20_ms", "p80_ms"}``; errors (out of memory, ...) propagate.
    ``stage(text)`` is called as each phase starts (the benchmark's worker reports progress so).
    """
    import jax
    import jax.numpy as jnp

    from gla_ref import jax_ref
    from gla_ref.pallas import chunk_gla, chunk_simple_gla, fused_chunk_gla

    if name not in PALLAS_BENCH or mode not in BENCH_MODES:
        raise ValueError(f"name must be one of {PALLAS_BENCH} and mode one of {BENCH_MODES}, "
                         f"got {name!r}, {mode!r}")
    C = chunk_size
    gate = "const" if name.endswith("g_gamma") else "gla"
    q, k, v, g, do = _pallas_bench_inputs(B, T, H, K, V, dtype, gate)
    row = {"T": T, "name": f"{name} {mode}"}
    if name.startswith("triton"):
        return {**row, **_time_triton_on(name, mode, q, k, v, g, do, C, warmup, rep, stage)}
    fn = {
        "pallas chunk_gla": lambda q, k, v, g: chunk_gla(q, k, v, g, chunk_size=C)[0],
        "pallas fused_chunk_gla": lambda q, k, v, g: fused_chunk_gla(q, k, v, g, chunk_size=C)[0],
        "pallas chunk_simple_gla g_gamma": lambda q, k, v, g: chunk_simple_gla(q, k, v, g_gamma=g,
                                                                                chunk_size=C)[0],
        "jax_ref.chunk_gla": lambda q, k, v, g: jax_ref.chunk_gla(q, k, v, g, chunk_size=C)[0],
    }[name]
    if mode == "fwd":
        return {**row, **time_jax(jax.jit(fn), q, k, v, g, warmup=warmup, rep=rep, stage=stage)}

    def loss(q, k, v, g, do):
        return (fn(q, k, v, g).astype(jnp.float32) * do.astype(jnp.float32)).sum()

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    return {**row, **time_jax(grads, q, k, v, g, do, warmup=warmup, rep=rep, stage=stage)}


def _time_triton_on(name, mode, q, k, v, g, do, C, warmup, rep, stage) -> dict:
    """A Triton kernel on JAX's arrays (copied through DLPack to PyTorch's device), timed like
    :func:`time_jax` by :func:`time_wall`: ``compile_ms`` is the first call (JIT compilation and
    autotuning of every kernel it launches). ``"fwd"`` runs under ``no_grad``; ``"fwd+bwd"`` is
    ``o.backward(do)`` into q, k, v, g."""
    import torch

    from gla_ref import device
    from gla_ref import triton as gla_triton

    dev = device.torch_device()
    tq, tk, tv, tg = (torch.from_dlpack(x).to(dev).requires_grad_() for x in (q, k, v, g))
    tdo = torch.from_dlpack(do).to(dev)
    fn = {"triton chunk_gla": gla_triton.chunk_gla, "triton fused_chunk_gla": gla_triton.fused_chunk_gla}[name]

    def fwd():
        with torch.no_grad():
            return fn(tq, tk, tv, tg, chunk_size=C)[0]

    def fwd_bwd():
        for x in (tq, tk, tv, tg):
            x.grad = None  # time the gradients, not their accumulation into old ones
        fn(tq, tk, tv, tg, chunk_size=C)[0].backward(tdo)

    sync = (lambda _: torch.cuda.synchronize()) if dev == "cuda" else None
    if stage:
        stage("compile and run")
    t = time_wall(fwd if mode == "fwd" else fwd_bwd, warmup=warmup, rep=rep, sync=sync)
    return {"compile_ms": t["first_ms"], **{k: t[k] for k in ("first_ms", "median_ms", "p20_ms", "p80_ms")}}


# --- chapter 7: benchmarks and roofline ---

DATASHEET_PEAKS = {
    # Dense (no sparsity) bf16 tensor-core and fp32 CUDA-core rates and HBM bandwidth of the SXM parts,
    # from NVIDIA's H100 and H200 datasheets; keys as torch.cuda.get_device_name() returns them.
    "NVIDIA H100 80GB HBM3": {"bf16_TFLOPs": 989.0, "fp32_TFLOPs": 67.0, "hbm_GBps": 3350.0},
    "NVIDIA H200": {"bf16_TFLOPs": 989.0, "fp32_TFLOPs": 67.0, "hbm_GBps": 4800.0},
}
"""Datasheet peaks by device name. Every peaks dict here, measured ones included, has these keys."""

ENV_STAMP = ("device", "date", "python")
"""Keys every stored result's ``env`` must hold (written by :func:`environment`)."""


def datasheet_peaks(device: str):
    """The datasheet peaks of a device named as in a result's ``env["device"]``; None if unknown."""
    peaks = DATASHEET_PEAKS.get(device)
    return None if peaks is None else dict(peaks)


def matmul_tflops_cuda(n: int = 8192, dtype: str = "bfloat16") -> float:
    """Measured rate (TFLOP/s) of an ``n × n`` by ``n × n`` matmul on the GPU: 2n³ FLOPs over the median
    time. ``"float32"`` runs with TF32 off, on the CUDA cores: the ceiling of full-precision work."""
    import torch

    _positive_ints(n=n)
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype must be 'bfloat16', 'float16' or 'float32', got {dtype!r}")
    a, b = (torch.randn(n, n, device="cuda", dtype=getattr(torch, dtype)) for _ in range(2))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ms = time_cuda(lambda: a @ b)["median_ms"]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def time_wall(fn, *args, warmup=3, rep=20, sync=None) -> dict:
    """Host wall-clock time (ms) of ``fn(*args)``: the first call alone (``first_ms``: compilation,
    autotuning and cold caches land there), then ``warmup`` untimed calls, then ``rep`` timed calls
    summarised by ``median_ms``, ``p20_ms`` and ``p80_ms`` (all of them in ``runs_ms``).

    ``sync(result)`` ends every call, e.g. ``jax.block_until_ready`` or ``lambda _:
    torch.cuda.synchronize()``: without it an asynchronous framework returns before its work is
    done, and the clock measures the dispatch only.
    """
    import time

    import numpy as np

    for name, n, least in (("warmup", warmup, 0), ("rep", rep, 1)):
        if not isinstance(n, int) or isinstance(n, bool) or n < least:
            raise ValueError(f"{name} must be an int >= {least}, got {n!r}")
    finish = sync or (lambda result: result)

    def once():
        t0 = time.perf_counter()
        finish(fn(*args))
        return (time.perf_counter() - t0) * 1e3

    first = once()
    for _ in range(warmup):
        once()
    runs = [once() for _ in range(rep)]
    p20, median, p80 = np.quantile(runs, [0.2, 0.5, 0.8])
    return {"first_ms": first, "median_ms": float(median), "p20_ms": float(p20), "p80_ms": float(p80),
            "runs_ms": runs}


def load_results(path) -> dict:
    """A stored benchmark result (JSON). A ValueError unless it carries the stamp of where it was
    measured, ``env`` with :data:`ENV_STAMP` and a torch or jax version, and a list of ``rows``."""
    import json
    import pathlib

    path = pathlib.Path(path)
    data = json.loads(path.read_text())
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        raise ValueError(f"{path.name}: no 'env' stamp; a result must record its device, versions and "
                         "date (gla_ref.bench.environment())")
    missing = [key for key in ENV_STAMP if not env.get(key)]
    if not any(env.get(fw) for fw in ("torch", "jax")):
        missing.append("a torch or jax version")
    if missing:
        raise ValueError(f"{path.name}: the 'env' stamp lacks {', '.join(missing)}")
    if not isinstance(data.get("rows"), list):
        raise ValueError(f"{path.name}: expected a list of rows under 'rows'")
    return data


def latest_results(prefix: str, results_dir=None):
    """``(path, result)`` of the newest ``<prefix>_*.json`` in ``results_dir``: the latest date in its
    stamp, then the most rows (a full run over a partial one of the same day), then the file name.
    By default ``results_dir`` is the first ``benchmarks/results`` found from the working directory
    upwards, then next to the package. None when there is no such file."""
    import pathlib

    if results_dir is None:
        roots = [pathlib.Path.cwd(), *pathlib.Path.cwd().parents, pathlib.Path(__file__).resolve().parents[1]]
        dirs = [root / "benchmarks" / "results" for root in roots]
        results_dir = next((d for d in dirs if d.is_dir()), None)
        if results_dir is None:
            return None
    found = [(p, load_results(p)) for p in sorted(pathlib.Path(results_dir).glob(f"{prefix}_*.json"))]
    return max(found, key=lambda pr: (pr[1]["env"]["date"], len(pr[1]["rows"]), pr[0].name)) if found else None


def series(result: dict, name: str, metric: str = "fwd_bwd"):
    """``(Ts, values)`` of one candidate of a stored result, sorted by T. ``metric`` is a row key: a
    timing dict gives its ``median_ms`` (``"fwd"``, ``"fwd_bwd"``), a number is taken as it is
    (``"fwd_bwd_peak_bytes"``; ``"median_ms"``, ``"compile_ms"`` of Pallas results). Rows without it
    (an error, out of memory) are left out."""
    pts = sorted((r["T"], r[metric]["median_ms"] if isinstance(r[metric], dict) else r[metric])
                 for r in result["rows"] if r.get("name") == name and metric in r)
    return [T for T, _ in pts], [x for _, x in pts]


def common_series(result: dict, names, metric: str = "fwd_bwd"):
    """``(Ts, {name: values})`` of several candidates (:func:`series`) on the lengths they all have."""
    per = {name: dict(zip(*series(result, name, metric))) for name in names}
    Ts = sorted(set.intersection(*(set(p) for p in per.values()))) if per else []
    return Ts, {name: [p[T] for T in Ts] for name, p in per.items()}


def crossover_T(Ts, a, b):
    """The length at which curve ``a`` first falls to curve ``b`` (a linear-time kernel against
    quadratic attention, say): ``log(a/b)`` interpolated linearly in ``log T`` between the two
    measured lengths around its first sign change. None when ``a`` is not above ``b`` at the first
    length, or never falls to it."""
    import math

    if not len(Ts) == len(a) == len(b) or len(Ts) < 2:
        raise ValueError(f"Ts, a and b must have one length >= 2, got {len(Ts)}, {len(a)}, {len(b)}")
    if any(x <= 0 for x in (*Ts, *a, *b)) or any(t1 <= t0 for t0, t1 in zip(Ts, Ts[1:])):
        raise ValueError("Ts must be increasing, and Ts, a and b positive")
    r = [math.log(x / y) for x, y in zip(a, b)]
    if r[0] <= 0:
        return None
    for i in range(len(r) - 1):
        if r[i + 1] <= 0:  # the zero of the line through (log T_i, r_i) and (log T_i+1, r_i+1)
            x0, x1 = math.log(Ts[i]), math.log(Ts[i + 1])
            return math.exp(x0 + r[i] * (x1 - x0) / (r[i] - r[i + 1]))
    return None


# Forward cost models. A cost is {"tc_flops", "fp32_flops", "bytes"} for a whole batch: matmul FLOPs
# on tensor cores (16-bit or TF32 operands), FLOPs of full-precision work off them (Eq. 4 in log
# space), and the compulsory HBM traffic: every kernel reads each input and writes each output
# once (a tile re-read by several programs is taken to hit L2). Elementwise work (exp, masks) is not
# counted. q, k, v, o take act_bytes (bf16: 2); gates and every intermediate are float32.

def _cost(tc_flops=0, fp32_flops=0, nbytes=0):
    return {"tc_flops": tc_flops, "fp32_flops": fp32_flops, "bytes": nbytes}


def _add_costs(costs):
    return _cost(*(sum(c[key] for c in costs) for key in ("tc_flops", "fp32_flops", "bytes")))


def _chunk_state_bytes(B, T, H, K, V, C):
    """The float32 states of every chunk, ``[B, H, ⌈T/C⌉, K, V]``, as chunk_gla materialises them."""
    return B * -(-T // C) * state_bytes(H, K, V)


def chunk_gla_stage_costs(B, T, H, K, V, C=64, c=16, act_bytes=2, gate_bytes=4) -> dict:
    """Cost of each forward kernel of ``gla_ref.triton.chunk_gla`` (chapter 4), the FLOPs from
    :func:`two_level_flop_split`: ``cumsum`` (g → Γ), ``state`` (the inter-chunk recurrence: k, v, Γ
    → a float32 state per chunk), ``intra`` (q, k, Γ → the float32 ``C × C`` blocks A: sub-chunk
    pairs on tensor cores, diagonal tiles in float32) and ``output`` (q, Γ, states, A, v → o by
    ``(Q ⊙ Λ) S + A V``)."""
    _positive_ints(B=B, T=T, H=H, K=K, V=V, C=C, c=c, act_bytes=act_bytes, gate_bytes=gate_bytes)
    f = {key: B * H * n for key, n in two_level_flop_split(T, C, c, K, V).items() if key != "half_fraction"}
    xk, xv = B * T * H * K, B * T * H * V  # elements of q, k or Γ; of v or o
    states, A = _chunk_state_bytes(B, T, H, K, V, C), B * T * H * C * 4
    return {
        "cumsum": _cost(nbytes=xk * (gate_bytes + 4)),
        "state": _cost(f["state"], 0, (xk + xv) * act_bytes + xk * 4 + states),
        "intra": _cost(f["inter_sub_chunk"], f["intra_sub_chunk"], 2 * xk * act_bytes + xk * 4 + A),
        "output": _cost(f["inter_chunk"] + f["pv"], 0, xk * (act_bytes + 4) + states + A + 2 * xv * act_bytes),
    }


def fused_chunk_gla_cost(B, T, H, K, V, C=16, act_bytes=2, gate_bytes=4) -> dict:
    """Cost of ``gla_ref.triton.fused_chunk_gla``'s forward (Alg. 5): q, k, v, g read, o written once in
    its dtype, no state leaving the chip. The whole ``C × C`` block P by Eq. 4 in float32 (``c = C``),
    the rest on tensor cores. (The kernel rebuilds P in each of a head's value blocks: it issues
    those float32 FLOPs ``⌈V/BV⌉`` times; the model counts the algorithm's.)"""
    _positive_ints(B=B, T=T, H=H, K=K, V=V, C=C, act_bytes=act_bytes, gate_bytes=gate_bytes)
    f = two_level_flop_split(T, C, C, K, V)
    xk, xv = B * T * H * K, B * T * H * V
    return _cost(B * H * (f["state"] + f["inter_chunk"] + f["pv"]), B * H * f["intra_sub_chunk"],
                 xk * (2 * act_bytes + gate_bytes) + 2 * xv * act_bytes)


def chunk_simple_gla_cost(B, T, H, K, V, C=64, act_bytes=2, gate_bytes=4) -> dict:
    """Cost of ``gla_ref.triton.chunk_simple_gla``'s forward: a scalar gate per token and head, so
    the intra-chunk block is one ``C × C`` matmul (``c = C``, all on tensor cores); kernels: cumsum,
    state (float32 states per chunk), output (q, k, v, Γ, states → o)."""
    _positive_ints(B=B, T=T, H=H, K=K, V=V, C=C, act_bytes=act_bytes, gate_bytes=gate_bytes)
    f = two_level_flop_split(T, C, C, K, V)
    xk, xv, xg = B * T * H * K, B * T * H * V, B * T * H
    states = _chunk_state_bytes(B, T, H, K, V, C)
    nbytes = (xg * (gate_bytes + 4)                                   # cumsum
              + (xk + xv) * act_bytes + xg * 4 + states               # state
              + (2 * xk + 2 * xv) * act_bytes + xg * 4 + states)      # output
    return _cost(B * H * (f["half_matmul"] + f["full_precision"]), 0, nbytes)


def sdpa_causal_cost(B, T, H, K, V, act_bytes=2) -> dict:
    """Cost of causal softmax attention by a FlashAttention-2-style forward: the ``T(T+1)/2`` pairs of
    the causal triangle at 2K FLOPs (``QKᵀ``) plus 2V (``PV``) each, on tensor cores (the softmax's
    exp not counted); q, k, v read and o written once, one float32 log-sum-exp per query kept for
    the backward. K = V = d gives half of :func:`flops_attention` plus the diagonal's 2Td."""
    _positive_ints(B=B, T=T, H=H, K=K, V=V, act_bytes=act_bytes)
    pairs = T * (T + 1) // 2
    xk, xv = B * T * H * K, B * T * H * V
    return _cost(B * H * pairs * 2 * (K + V), 0, (2 * xk + 2 * xv) * act_bytes + B * H * T * 4)


def forward_cost(name, B, T, H, K, V, act_bytes=2) -> dict:
    """The forward cost of a candidate of ``benchmarks/bench_triton.py`` by its name, at the default
    chunk sizes of its kernel (chunk_gla and chunk_simple_gla 64 with sub-chunks of 16,
    fused_chunk_gla 16)."""
    models = {
        "chunk_gla": lambda: _add_costs(chunk_gla_stage_costs(B, T, H, K, V, act_bytes=act_bytes).values()),
        "fused_chunk_gla": lambda: fused_chunk_gla_cost(B, T, H, K, V, act_bytes=act_bytes),
        "chunk_simple_gla": lambda: chunk_simple_gla_cost(B, T, H, K, V, act_bytes=act_bytes),
        "sdpa_flash": lambda: sdpa_causal_cost(B, T, H, K, V, act_bytes=act_bytes),
    }
    if name not in models:
        raise ValueError(f"name must be one of {sorted(models)}, got {name!r}")
    return models[name]()


def forward_allocations(name, B, T, H, K, V, act_bytes=2) -> dict:
    """Bytes of each tensor that one forward of a ``gla_ref.triton`` kernel allocates at its default
    chunk size (64), no final state asked for. All are alive at once at its end, so their sum is the forward's peak memory above its
    inputs: ``chunk_gla`` Γ, the states of every chunk, A and o; ``chunk_simple_gla`` the summed
    scalar gate, Γ, the states and o; ``fused_chunk_gla`` o alone."""
    _positive_ints(B=B, T=T, H=H, K=K, V=V, act_bytes=act_bytes)
    xk, xv, xg = B * T * H * K, B * T * H * V, B * T * H
    allocs = {
        "chunk_gla": lambda: {"Γ": xk * 4, "states": _chunk_state_bytes(B, T, H, K, V, 64),
                              "A": B * T * H * 64 * 4, "o": xv * act_bytes},
        "chunk_simple_gla": lambda: {"g": xg * 4, "Γ": xg * 4, "states": _chunk_state_bytes(B, T, H, K, V, 64),
                                     "o": xv * act_bytes},
        "fused_chunk_gla": lambda: {"o": xv * act_bytes},
    }
    if name not in allocs:
        raise ValueError(f"name must be one of {sorted(allocs)}, got {name!r}")
    return allocs[name]()


def roofline(cost: dict, peaks: dict, ms=None) -> dict:
    """A cost against a device's peaks (chapter 4's roofline bound with two compute ceilings):
    ``compute_ms`` = tensor-core FLOPs at the bf16 peak plus full-precision FLOPs at the fp32 peak,
    ``memory_ms`` = bytes at the HBM bandwidth, ``bound_ms`` the larger, ``limit`` which one it is,
    ``intensity`` FLOPs per byte.
    Given a measured time ``ms``: achieved ``TFLOPs`` and ``GBps``, and ``fraction`` = bound_ms / ms
    (1 means running at the roof)."""
    compute_ms = (cost["tc_flops"] / peaks["bf16_TFLOPs"] + cost["fp32_flops"] / peaks["fp32_TFLOPs"]) / 1e9
    memory_ms = cost["bytes"] / peaks["hbm_GBps"] / 1e6
    flops = cost["tc_flops"] + cost["fp32_flops"]
    out = {"compute_ms": compute_ms, "memory_ms": memory_ms, "bound_ms": max(compute_ms, memory_ms),
           "limit": "compute" if compute_ms >= memory_ms else "memory", "intensity": flops / cost["bytes"]}
    if ms is not None:
        if not ms > 0:
            raise ValueError(f"ms must be a positive time, got {ms!r}")
        out.update(TFLOPs=flops / ms / 1e9, GBps=cost["bytes"] / ms / 1e6, fraction=out["bound_ms"] / ms)
    return out


def torch_chunk_parts(q, k, v, g, chunk_size=64, sub_chunk_size=16):
    """The pure-PyTorch chunk form (``torch_ref.chunk_gla_two_level``) cut at its two terms, to time
    them apart: ``(parts, combine)``, with ``parts["inter"]()`` the state recurrence and ``Q S``
    (``o_inter``) and ``parts["intra"]()`` the within-chunk product ``(P ⊙ M) V`` (``o_intra``), each a
    call without arguments on inputs prepared once; ``combine(o_inter, o_intra)`` gives ``o``."""
    from gla_ref import torch_ref as R

    R._check_sub_chunk_size(chunk_size, sub_chunk_size)
    q_, k_, v_, g_, h0, scale = R._checked(q, k, v, g, None, None)
    dtype, T = q.dtype, q.shape[1]
    qm, km, vm, gm, h0 = R._to_math(q_, k_, v_, g_, h0, scale)
    qm, km, vm, gm = R._chunked(chunk_size, qm, km, vm, gm)
    b = gm.cumsum(-2)
    parts = {"inter": lambda: R._scan_chunks(qm, km, vm, b, h0)[0],
             "intra": lambda: R._two_level_scores(qm, km, b, sub_chunk_size, None) @ vm}
    return parts, lambda o_inter, o_intra: R._output(o_intra + o_inter, T, dtype)


def triton_chunk_stages(q, k, v, g, chunk_size=64) -> dict:
    """The forward kernels of ``gla_ref.triton.chunk_gla`` as calls without arguments, each on inputs
    computed once here, to time them apart: ``cumsum``, ``state``, ``intra``, ``output`` (the keys of
    :func:`chunk_gla_stage_costs`). ``output()`` is chunk_gla's o. Chunk sizes as chunk_gla accepts."""
    from gla_ref.triton._common import check_chunk_size, prepare, resolve_scale
    from gla_ref.triton.chunk_cumsum import chunk_local_cumsum
    from gla_ref.triton.chunk_intra import chunk_intra_attention
    from gla_ref.triton.chunk_output import chunk_output
    from gla_ref.triton.chunk_state import chunk_state_fwd

    dims = prepare(q, k, v, g, None, gate_ranks=(4,))
    check_chunk_size(chunk_size)
    C, scale = chunk_size, resolve_scale(None, dims.K)
    q, k, v, g = (x.contiguous() for x in (q, k, v, g))
    gc = chunk_local_cumsum(g, C)
    h, _ = chunk_state_fwd(k, v, gc, None, False, C)
    A = chunk_intra_attention(q, k, gc, scale, C)
    return {"cumsum": lambda: chunk_local_cumsum(g, C),
            "state": lambda: chunk_state_fwd(k, v, gc, None, False, C),
            "intra": lambda: chunk_intra_attention(q, k, gc, scale, C),
            "output": lambda: chunk_output(q, v, gc, h, A, scale, C)}
