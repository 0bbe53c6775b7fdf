"""Timers and the stamp of a measurement: CUDA events, JAX with its compile time apart, wall clock.

Each timer imports its framework when called. :func:`environment` is the stamp every stored result
carries (device, versions, ptxas, date).
"""

from __future__ import annotations

import os
import sys

from gla_ref.bench.models import check_positive_ints


def show_tuning() -> None:
    """Have the Triton kernels print a line each time they autotune for a new shape
    (``GLA_REF_SHOW_TUNING=1``): on a GPU a benchmark's first call at a shape compiles for minutes, and
    the reader should see it happen. Kept if the variable is already set (``0`` silences it)."""
    os.environ.setdefault("GLA_REF_SHOW_TUNING", "1")


def start_gpu_run(parser, smoke: bool) -> bool:
    """The opening of a benchmark script with a ``--smoke`` mode: tuning lines on, Triton's interpreter
    chosen before Triton is first imported (on a CPU), and a parser error unless there is a CUDA GPU
    or ``smoke`` is set. Returns whether a CUDA GPU is present."""
    from gla_ref import device

    show_tuning()
    device.use_triton_interpreter()
    import torch

    on_gpu = torch.cuda.is_available()
    if not (on_gpu or smoke):
        parser.error("this benchmark needs a CUDA GPU (--smoke exercises it on a CPU)")
    return on_gpu


def environment() -> dict:
    """Commit (:func:`repository_commit`), date, device, library versions (FLA's too, None when absent) and
    ptxas: the stamp every stored result carries."""
    import datetime
    import platform

    info = {"commit": repository_commit(), "date": datetime.date.today().isoformat(),
            "python": platform.python_version()}
    from importlib import metadata

    for name in ("torch", "triton", "jax", "jaxlib"):  # installed versions, read without importing (JAX takes seconds)
        try:
            info[name] = sys.modules[name].__version__ if name in sys.modules else metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    info["fla"] = _fla_version()
    try:
        import torch

        info["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            info["ptxas"] = _ptxas_in_effect(torch.cuda.get_device_capability())
    except ImportError:
        info["device"] = "cpu"
    return info


def repository_commit():
    """The commit of the code being measured: ``GLA_REF_COMMIT`` when set (a copy of the tree without ``.git``,
    as on a remote GPU machine, must be told), else ``git rev-parse --short=12 HEAD`` in the checkout gla_ref
    was imported from, with ``+dirty`` when its tracked files differ from that commit; None outside a checkout."""
    import pathlib
    import subprocess

    if os.environ.get("GLA_REF_COMMIT"):
        return os.environ["GLA_REF_COMMIT"]
    root = pathlib.Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True,  # noqa: E731
                                        timeout=30, check=True).stdout.strip()
        commit = git("rev-parse", "--short=12", "HEAD")
        return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _fla_version():
    """The installed flash-linear-attention kernels' version (the ``fla-core`` or
    ``flash-linear-attention`` distribution), or None: every result that compares with FLA names it."""
    from importlib import metadata

    for dist in ("fla-core", "flash-linear-attention"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _ptxas_in_effect(capability):
    """The ptxas that assembles the Triton kernels on this GPU (None where Triton is not installed)."""
    try:
        from gla_ref.triton.common import ptxas
    except ImportError:
        return None
    return ptxas.in_effect(capability)


def time_cuda(fn, *, warmup=25, rep=100, grad_to_none=None) -> dict:
    """Median and 20/80 % quantiles (ms) of a CUDA callable, by ``triton.testing.do_bench``.

    do_bench warms up, flushes the L2 cache between runs and times with CUDA events. Pass the
    inputs of a backward as ``grad_to_none``: their ``.grad`` is reset before each run, so the time
    excludes autograd adding each new gradient into the old one.
    """
    from triton.testing import do_bench

    p20, median, p80 = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.2, 0.5, 0.8], grad_to_none=grad_to_none)
    return {"median_ms": median, "p20_ms": p20, "p80_ms": p80}


def cuda_graph(fn, warmup: int = 3):
    """``(graph, out)``: the kernels of one call of ``fn`` captured in a CUDA graph, and what that call returned.

    ``fn`` runs ``warmup`` times on a side stream first: autotuning, compiling and the first allocations
    happen there, since nothing may tune, synchronise or read a device value on the host while a stream
    is being captured. ``graph.replay()`` then launches every captured kernel again at the cost of one
    launch on the host, on the same buffers: the tensors ``fn`` read, and ``out`` with any gradients
    the call assigned (set ``.grad`` to None before, so that the captured backward allocates them from
    the graph's own pool). Where the host's launch path sets the pace (short sequences: chapter 7),
    replay times the kernels alone. ``chunk_gla``, ``fused_chunk_gla``, ``chunk_simple_gla`` and
    ``fused_recurrent_gla`` capture whole, forward and backward, except with ``cu_seqlens`` (its offsets
    are read on the host) or under ``gla_ref.device.debug(True)`` (its value checks synchronise).
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


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


def copy_bandwidth_cuda(nbytes: int = 2**30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read and written."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src))["median_ms"]
    return 2 * nbytes / (ms * 1e-3) / 1e9


def matmul_tflops_cuda(n: int = 8192, dtype: str = "bfloat16") -> float:
    """Measured rate (TFLOP/s) of an ``n × n`` by ``n × n`` matmul on the GPU: 2n³ FLOPs over the median
    time. ``"float32"`` runs with TF32 off, on the CUDA cores: the ceiling of full-precision work."""
    import torch

    check_positive_ints(n=n)
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
