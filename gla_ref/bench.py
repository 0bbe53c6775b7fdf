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
    except ImportError:
        info["device"] = "cpu"
    return info


def time_cuda(fn, *, warmup=25, rep=100) -> dict:
    """Median and 20/80 % quantiles (ms) of a CUDA callable, by ``triton.testing.do_bench``.

    do_bench warms up, flushes the L2 cache between runs and times with CUDA events.
    """
    from triton.testing import do_bench

    p20, median, p80 = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.2, 0.5, 0.8])
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


def time_jax(fn, *args, warmup=5, rep=50) -> dict:
    """Compile time (first call) and median/quantile run time (ms) of a jitted JAX callable.

    Every call ends in ``block_until_ready`` so asynchronous dispatch is not mistaken for speed.
    """
    import time

    import jax
    import numpy as np

    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    compile_ms = (time.perf_counter() - t0) * 1e3
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    runs = []
    for _ in range(rep):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        runs.append((time.perf_counter() - t0) * 1e3)
    p20, median, p80 = np.quantile(runs, [0.2, 0.5, 0.8])
    return {"compile_ms": compile_ms, "median_ms": float(median), "p20_ms": float(p20), "p80_ms": float(p80)}


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


def time_pallas_gla(Ts=(1024, 2048, 4096), B=2, H=16, K=128, V=128, chunk_size=64) -> dict:
    """Forward and forward+backward times of the Pallas kernels, jax_ref under jit and (when PyTorch
    sees CUDA) the Triton kernels, on the same bf16 numbers: ``{"env": ..., "rows": [...]}``.

    Each row is ``{"T", "name", "median_ms", "compile_ms"}`` with names ending in ``fwd`` or ``fwd+bwd``.
    """
    import jax
    import jax.numpy as jnp

    from gla_ref import device, gates, jax_ref
    from gla_ref.pallas import chunk_gla, chunk_simple_gla, fused_chunk_gla

    C = chunk_size
    g_gamma = jnp.asarray(gates.slopes_to_g_gamma(gates.build_slope_tensor(H)), jnp.float32)
    candidates = {
        "pallas chunk_gla": lambda q, k, v, g: chunk_gla(q, k, v, g, chunk_size=C)[0],
        "pallas fused_chunk_gla": lambda q, k, v, g: fused_chunk_gla(q, k, v, g, chunk_size=C)[0],
        "pallas chunk_simple_gla g_gamma": lambda q, k, v, g: chunk_simple_gla(q, k, v, g_gamma=g_gamma,
                                                                                chunk_size=C)[0],
        "jax_ref.chunk_gla": lambda q, k, v, g: jax_ref.chunk_gla(q, k, v, g, chunk_size=C)[0],
    }
    rows = []
    for T in Ts:
        keys = jax.random.split(jax.random.key(0), 5)
        q, k = (jax.random.normal(kk, (B, T, H, K), jnp.bfloat16) for kk in keys[:2])
        v = jax.random.normal(keys[2], (B, T, H, V), jnp.bfloat16)
        g = jax.nn.log_sigmoid(jax.random.normal(keys[3], (B, T, H, K))) / 16
        do = jax.random.normal(keys[4], v.shape, jnp.bfloat16)
        for name, fn in candidates.items():
            loss = lambda *a, fn=fn: (fn(*a).astype(jnp.float32) * do).sum()  # noqa: E731
            for mode, f in [("fwd", jax.jit(fn)), ("fwd+bwd", jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))))]:
                try:
                    t = time_jax(f, q, k, v, g)
                except Exception as err:  # e.g. the reference running out of memory at long T
                    rows.append({"T": T, "name": f"{name} {mode}", "error": type(err).__name__})
                    continue
                rows.append({"T": T, "name": f"{name} {mode}", "median_ms": t["median_ms"],
                             "compile_ms": t["compile_ms"]})
        if device.has_cuda():
            rows += _time_triton_on(q, k, v, g, do, T, C)
    env = {**environment(), "shape": dict(B=B, H=H, K=K, V=V, chunk_size=C, dtype="bfloat16")}
    return {"env": env, "rows": rows}


def _time_triton_on(q, k, v, g, do, T, C) -> list:
    """The Triton kernels on JAX's arrays (shared through DLPack), timed like :func:`time_pallas_gla`."""
    import time

    import torch

    from gla_ref import triton as gla_triton

    tq, tk, tv, tg = (torch.from_dlpack(x).requires_grad_() for x in (q, k, v, g))
    tdo = torch.from_dlpack(do)
    rows = []
    for name, fn in [("triton chunk_gla", gla_triton.chunk_gla), ("triton fused_chunk_gla", gla_triton.fused_chunk_gla)]:
        for mode, call in [("fwd", lambda fn=fn: fn(tq, tk, tv, tg, chunk_size=C)),
                           ("fwd+bwd", lambda fn=fn: fn(tq, tk, tv, tg, chunk_size=C)[0].backward(tdo))]:
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            rows.append({"T": T, "name": f"{name} {mode}", "compile_ms": (time.perf_counter() - t0) * 1e3,
                         "median_ms": time_cuda(call)["median_ms"]})
    return rows
