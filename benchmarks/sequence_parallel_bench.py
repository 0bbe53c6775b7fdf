"""Sequence parallelism on GPUs: one sequence on two GPUs against one (issue 18; drawn in chapter 9).

    python benchmarks/sequence_parallel_bench.py          # CUDA: results/sequence_parallel_<device>.json
    python benchmarks/sequence_parallel_bench.py --smoke  # any machine: CPU and gloo, tiny shapes, a temp file

No ``torchrun``: the ranks are processes this script starts with
:func:`gla_ref.sequence_parallel.local.launch` (NCCL on GPUs, rank r on GPU r, NVLink multicast off
with ``NCCL_NVLS_ENABLE=0``; gloo on the CPU). One command measures, for one GPU and for two:

1. **Accuracy** (``kind: accuracy``, in the two-rank group, before its timings):
   :func:`gla_ref.sequence_parallel.torch.chunk_gla` forward and backward (loss ``Σ o·dO + Σ S·dS``,
   with an initial state) against :func:`gla_ref.triton.chunk_gla` on one device on the same inputs,
   and against :func:`gla_ref.torch_ref.chunk_gla` in float64: o, final state, dq, dk, dv, dg and dh0,
   per rank, for each dtype of ``--dtypes``. Every error must be below :data:`TOL` (the run still
   writes its file, then exits with an error).
2. **Time, memory, bytes** (``name: one_device`` and ``two_devices``), for every T of ``--T``: one
   training step (forward and backward, no final state) at B=1, H=16, K=V=128 in bf16 by default;
   ``fwd_bwd`` is the median and 20/80 % quantiles of the wall-clock step time, the slowest rank's
   time for each step (the ranks start each step together, after a barrier); ``peak_bytes`` the
   largest ``torch.cuda.max_memory_allocated`` of a rank over the timed steps (its inputs, their
   gradients and dO included; null on the CPU); ``bytes_sent`` and ``bytes_received`` per rank,
   measured by :func:`~gla_ref.sequence_parallel.torch.count_traffic`, and ``bytes_predicted`` by
   :func:`~gla_ref.sequence_parallel.torch.bytes_per_call`. A T that fails (out of memory) ends the
   sweep with a row holding ``error``.
3. **Longest trainable T** (``kind: search``, CUDA only): from the sweep's last length that ran and
   first that failed (doubling further if none failed), a bisection down to ``--search-step`` tokens,
   each probe one training step in a fresh group of processes (a rank out of memory ends its group).
   ``longest_T[name]`` is the longest length that ran, searched or swept.
4. **JAX** (``framework: jax``, in a child process that sees the GPUs; two simulated CPU devices with
   ``--smoke``): :func:`gla_ref.sequence_parallel.jax.chunk_gla` (the Pallas kernels) on a two-device
   mesh against :func:`gla_ref.pallas.chunk_gla` on one device — accuracy against one device and
   :func:`gla_ref.jax_ref.chunk_gla` in float64; forward and backward (with an initial state and the
   final state, the program the accuracy check runs) compiled once and timed with
   :func:`gla_ref.bench.time_wall` (``jax_one_device``, ``jax_two_devices``), each device's memory
   (``peak_bytes``: XLA's own count of the compiled program's arguments, outputs and temporaries on a
   device, and ``peak_in_use_bytes`` from the allocator), the bytes each device sends as read from the
   compiled program (:mod:`gla_ref.sequence_parallel.costs`), and the longest T by the same search.
5. **Summary** (``summary``): two devices against one at each T both ran, per framework: time ratio,
   peak-memory ratio, longest-T ratio, with the targets of issue 18 (time ≤ 0.6× for T ≥ 64K, peak
   ≤ 0.55×, longest T ≥ 1.8×) and whether they hold.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gla_ref import bench  # noqa: E402
from gla_ref.sequence_parallel import local  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SCRIPT = pathlib.Path(__file__).resolve()
FULL = dict(B=1, H=16, K=128, V=128, T=[2 ** e for e in range(14, 23)], acc_T=4096,
            jax_T=[2 ** 16, 2 ** 18, 2 ** 20, 2 ** 21], dtype="bfloat16", dtypes=["bfloat16", "float32"], warmup=3,
            rep=10, chunk_size=64, search_step=2 ** 16, search_max_T=2 ** 24)
SMOKE = dict(B=1, H=1, K=16, V=16, T=[16, 32], acc_T=32, jax_T=[32], dtype="float32", dtypes=["float32"],
             warmup=1, rep=2, chunk_size=16, search_step=16, search_max_T=64)
"""Tiny shapes for a CPU (Triton's and Pallas' interpreters): slices of 8 and 16 tokens, one JAX program a setup."""
TOL = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 5e-3}
"""Largest relative RMSE allowed between two ranks and one device (and float64), by dtype: the
kernels' own rounding (chapter 4 measured about 4e-3 for bf16 and 4e-7 for fp32 against float64 on
an H200); a broken chain of states gives errors of order one."""
TARGETS = {"fwd_bwd_ratio": 0.6, "fwd_bwd_from_T": 65536, "peak_ratio": 0.55, "longest_T_ratio": 1.8}
"""Issue 18's targets for two GPUs against one: time at most 0.6× (T ≥ 64K), peak memory per device at most
0.55×, longest trainable T at least 1.8×."""
NAMES = {1: "one_device", 2: "two_devices"}
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""NVLink multicast off for the ranks (NCCL, PyTorch, NVSHMEM), as the registry's multi-GPU measures keep it."""
SMOKE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
"""The CPU JAX child's compiler flags with --smoke: the interpreted Pallas kernels compile in half the time."""


# --- the ranks (run in processes started by local.launch) ---

def _setup(dtype_name):
    """The device this rank runs on and the torch dtype."""
    import torch

    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return dev, getattr(torch, dtype_name)


def _inputs(B, T, H, K, V, dtype, dev, seed, on_device=False):
    """Seeded q, k, v (dtype), GLA log-gates logsigmoid(x)/16 and an initial state (float32), and
    the cotangents dO (dtype) and dS (float32) on ``dev``. Made on the CPU and moved, so every rank
    gets the same numbers, unless ``on_device`` (long timing inputs: made where they are used)."""
    import torch
    import torch.nn.functional as F

    where = dev if on_device else torch.device("cpu")
    gen = torch.Generator(device=where).manual_seed(seed)

    def randn(*shape, dt=torch.float32):
        return torch.randn(*shape, generator=gen, device=where, dtype=dt).to(dev)

    x = {"q": randn(B, T, H, K, dt=dtype), "k": randn(B, T, H, K, dt=dtype), "v": randn(B, T, H, V, dt=dtype),
         "g": F.logsigmoid(randn(B, T, H, K)) / 16, "initial_state": randn(B, H, K, V)}
    return x, randn(B, T, H, V, dt=dtype), randn(B, H, K, V)


def _one_device(q, k, v, g, **kw):
    """The one-device chunk_gla: the Triton kernels (on a CPU, Triton's interpreter), the PyTorch reference for
    float64."""
    import torch

    if q.dtype == torch.float64:
        from gla_ref import torch_ref

        return torch_ref.chunk_gla(q, k, v, g, **kw)
    from gla_ref import triton as gla_triton

    return gla_triton.chunk_gla(q, k, v, g, **kw)


def _grads(fn, x, do, dS):
    """``{o, final_state, dq, dk, dv, dg, dinitial_state}`` of ``fn(**x)`` for the loss Σ o·dO + Σ S·dS
    (S None: no such term; an input without a gradient gives None)."""
    import torch

    leaves = {n: None if t is None else t.detach().requires_grad_() for n, t in x.items()}
    o, S = fn(**leaves)
    outs, cots = [o], [do.to(o.dtype)]
    if S is not None:
        outs.append(S)
        cots.append(dS.to(S.dtype))
    torch.autograd.backward(outs, cots)
    out = {"o": o.detach(), "final_state": None if S is None else S.detach()}
    out.update({"d" + n: None if t is None else t.grad for n, t in leaves.items()})
    return out


def accuracy_rows(rank, world_size, *, shape, T, dtypes, chunk_size):
    """This rank's errors, per dtype: its slice of o and of the gradients, the final state (last
    rank) and dh0 (rank 0), each ``[vs one device, vs float64]``."""
    import torch

    from gla_ref.sequence_parallel import torch as sp
    from gla_ref.testing import rel_rmse

    lo, hi = rank * T // world_size, (rank + 1) * T // world_size
    rows = []
    for name in dtypes:
        dev, dtype = _setup(name)
        x, do, dS = _inputs(**shape, T=T, dtype=dtype, dev=dev, seed=0)
        kw = dict(output_final_state=True, chunk_size=chunk_size)
        one = _grads(lambda **a: _one_device(**a, **kw), x, do, dS)
        x64 = {n: t.double() for n, t in x.items()}
        f64 = _grads(lambda **a: _one_device(**a, **kw), x64, do.double(), dS.double())
        mine = {n: t[:, lo:hi] for n, t in x.items() if n != "initial_state"}
        mine["initial_state"] = x["initial_state"] if rank == 0 else None
        two = _grads(lambda **a: sp.chunk_gla(**a, **kw), mine, do[:, lo:hi], dS)
        errors = {}
        for key, got in two.items():
            if got is None:
                continue
            whole = key in ("final_state", "dinitial_state")
            refs = [r[key] if whole else r[key][:, lo:hi] for r in (one, f64)]
            errors[key] = [rel_rmse(ref, got) for ref in refs]
        rows.append({"kind": "accuracy", "framework": "torch", "dtype": name, "T": T, "rank": rank,
                     "devices": world_size, "errors": errors, "device": str(dev)})
        del x, one, f64, two
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def measure_rank(rank, world_size, *, shape, Ts, dtype, chunk_size, warmup, rep, out, accuracy=None):
    """One rank of a setup: the accuracy rows first when ``accuracy`` (``{"T", "dtypes"}``) is
    given, then one training step timed at each T (the rank's slice: T / world_size tokens). Rank 0
    appends every row to ``out`` (JSON lines) as soon as it has it, so the rows survive a later
    out-of-memory."""
    import torch
    import torch.distributed as dist

    if accuracy is not None:
        mine = accuracy_rows(rank, world_size, shape=shape, chunk_size=chunk_size, **accuracy)
        every = [None] * world_size
        dist.all_gather_object(every, mine)
        if rank == 0:
            with open(out, "a") as f:
                f.writelines(json.dumps(row) + "\n" for rows in every for row in rows)
    for T in Ts:
        mine = _time_slice(T // world_size, world_size, shape=shape, dtype=dtype, chunk_size=chunk_size,
                           warmup=warmup, rep=rep, seed=rank + 1)
        every = [mine]
        if world_size > 1:
            every = [None] * world_size
            dist.all_gather_object(every, mine)
        if rank == 0:
            _write_timing_row(out, T, world_size, shape, every, dtype)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # this length's tensors are gone with _time_slice's frame


def probe_rank(rank, world_size, *, shape, T, dtype, chunk_size):
    """One training step on this rank's slice of T tokens (a search probe): its peak memory, or None on the CPU."""
    return _time_slice(T // world_size, world_size, shape=shape, dtype=dtype, chunk_size=chunk_size, warmup=0,
                       rep=1, seed=rank + 1)["peak"]


def _time_slice(tokens, world_size, *, shape, dtype, chunk_size, warmup, rep, seed):
    """This rank's training step on a slice of ``tokens``: ``{"ms": [rep step times], "peak": bytes or
    None, "sent", "received": bytes per step}``. One device runs the one-device chunk_gla; several
    run the sequence-parallel one, each step starting after a barrier."""
    import torch
    import torch.distributed as dist

    from gla_ref.sequence_parallel import torch as sp

    dev, dt = _setup(dtype)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    x, do, _ = _inputs(**shape, T=tokens, dtype=dt, dev=dev, seed=seed, on_device=True)
    x.pop("initial_state")
    leaves = {n: t.requires_grad_() for n, t in x.items()}
    fn = _one_device if world_size == 1 else sp.chunk_gla

    def timed():
        if world_size > 1:
            dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        o, _ = fn(**leaves, chunk_size=chunk_size)
        o.backward(do)
        if cuda:
            torch.cuda.synchronize()
        for t in leaves.values():
            t.grad = None
        return (time.perf_counter() - t0) * 1e3

    for _ in range(warmup):
        timed()
    with sp.count_traffic() as moved:
        ms = [timed() for _ in range(rep)]
    peak = torch.cuda.max_memory_allocated() if cuda else None
    total = torch.cuda.get_device_properties(dev).total_memory if cuda else None
    return {"ms": ms, "peak": peak, "total": total, "sent": moved.sent // rep, "received": moved.received // rep}


def _write_timing_row(out, T, world_size, shape, every, dtype):
    import numpy as np
    import torch

    from gla_ref.sequence_parallel import torch as sp

    slowest = np.max([r["ms"] for r in every], axis=0)  # each step lasts as long as its slowest rank
    p20, med, p80 = (float(v) for v in np.quantile(slowest, [0.2, 0.5, 0.8]))
    peaks = [r["peak"] for r in every]
    predicted = [sp.bytes_per_call(shape["B"], shape["H"], shape["K"], shape["V"], rank=r,
                                   world_size=world_size, dtype=getattr(torch, dtype)).sent
                 for r in range(world_size)] if world_size > 1 else [0]
    row = {"name": NAMES[world_size], "framework": "torch", "T": T, "devices": world_size, "dtype": dtype,
           "fwd_bwd": {"median_ms": med, "p20_ms": p20, "p80_ms": p80},
           "peak_bytes": None if None in peaks else max(peaks), "peak_bytes_by_rank": peaks,
           "device_bytes": every[0]["total"],
           "bytes_sent": [r["sent"] for r in every], "bytes_received": [r["received"] for r in every],
           "bytes_predicted": predicted}
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


# --- the longest trainable T ---

def search_longest(probe, ok, failed, *, step, max_T, guess=None):
    """The longest T for which ``probe(T)`` is True, to ``step`` tokens: ``(longest, first_failed, probes)``.

    ``ok``: a length known to run (or None); ``failed``: one known to fail (or None: doubling from ``ok`` until
    a probe fails or ``max_T`` is passed). Then a bisection between them; every probed length is a multiple
    of ``step``. ``guess`` (e.g. from the peak memory per token, :func:`memory_guess`) is probed first, then its
    neighbour one ``step`` up (if it ran) or down (if not), so that a good guess ends the search in two probes.
    ``probe(T)`` returns True (ran), False (out of memory) or raises (any other failure, which ends the
    search). ``probes``: ``[(T, True/False)]`` in order."""
    probes = []

    def run(T):
        probes.append((T, bool(probe(T))))
        return probes[-1][1]

    if ok is None:
        ok = step
        if not run(ok):
            return None, ok, probes
    pending = [] if guess is None else [guess // step * step]
    neighbour = guess is not None  # after the guess, its neighbour once
    while failed is None or failed - ok > step:
        T = pending.pop() if pending else None
        if T is None or T <= ok or (failed is not None and T >= failed):
            T = 2 * ok if failed is None else (ok + failed) // 2 // step * step
        if failed is None and T > max_T:
            return ok, None, probes
        if T <= ok:
            break
        ran = run(T)
        ok, failed = (T, failed) if ran else (ok, T)
        if neighbour:
            pending.append(T + step if ran else T - step)
            neighbour = False
    return ok, failed, probes


def memory_guess(rows, name):
    """The T at which setup ``name``'s peak memory would reach 98 % of its device, by a straight line through
    its timed rows' ``peak_bytes`` against T (None without two such rows or the device's size)."""
    pts = sorted((r["T"], r["peak_bytes"]) for r in rows
                 if r.get("name") == name and r.get("peak_bytes") and "fwd_bwd" in r)
    capacity = next((r.get("device_bytes") for r in rows if r.get("name") == name and r.get("device_bytes")), None)
    if len(pts) < 2 or not capacity:
        return None
    (T0, p0), (T1, p1) = pts[-2], pts[-1]
    per_token = (p1 - p0) / (T1 - T0)
    return int(T1 + (0.98 * capacity - p1) / per_token) if per_token > 0 else None


def torch_probe(args, devices, backend, env):
    """``probe(T)`` for :func:`search_longest`: one training step at T on ``devices`` ranks, in a fresh group."""
    def probe(T):
        try:
            local.launch(f"{SCRIPT}:probe_rank", devices, backend=backend, env=env, timeout=args.timeout,
                         echo=args.echo, kwargs=dict(shape=args.shape, T=T, dtype=args.dtype,
                                                     chunk_size=args.chunk_size))
        except (RuntimeError, TimeoutError) as err:
            if "out of memory" in str(err).lower():
                print(f"  {NAMES[devices]}: T={T} out of memory", flush=True)
                return False
            raise
        print(f"  {NAMES[devices]}: T={T} ran", flush=True)
        return True
    return probe


def search_row(name, framework, probe, rows, *, step, max_T):
    """A ``kind: search`` row for setup ``name`` from its sweep ``rows`` (timed lengths, error rows)."""
    timed = [r["T"] for r in rows if r.get("name") == name and "fwd_bwd" in r]
    failed = [r["T"] for r in rows if r.get("name") == name and "error" in r and r.get("T")]
    guess = memory_guess(rows, name)
    row = {"kind": "search", "name": name, "framework": framework, "step": step, "max_T": max_T, "guess": guess}
    try:
        longest, first_failed, probes = search_longest(probe, max(timed, default=None), min(failed, default=None),
                                                       step=step, max_T=max_T, guess=guess)
    except Exception as err:  # a failure that is not out of memory: recorded, the search stops
        return {**row, "error": f"{type(err).__name__}: {str(err)[-1500:]}"}
    return {**row, "longest_T": longest, "first_failed_T": first_failed, "probes": probes}


# --- JAX (a child process: XLA_FLAGS must be set before jax is imported) ---

def jax_child(cfg):
    """Rows of the JAX part (see the module docstring); runs on JAX's default backend."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devs = jax.devices()
    if len(devs) < 2:
        return [{"kind": "skipped", "framework": "jax",
                 "reason": f"JAX sees {len(devs)} {jax.default_backend()} device(s); two are needed"}]
    mesh = Mesh(np.array(devs[:2]), ("seq",))
    rows = [_jax_accuracy(cfg, mesh, name) for name in cfg["dtypes"]]
    for devices in (1, 2):
        name = "jax_one_device" if devices == 1 else "jax_two_devices"
        for T in cfg["Ts"]:
            row = _jax_timing(cfg, mesh, devices, T)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if "error" in row:
                break
        if cfg["search"]:
            rows.append(search_row(name, "jax", lambda T: _jax_probe(cfg, mesh, devices, T), rows,
                                   step=cfg["search_step"], max_T=cfg["search_max_T"]))
    return rows


def _jax_inputs(cfg, T, dtype, mesh, devices, seed=0):
    """Inputs with an initial state and the cotangents dO, dS, placed as the step reads them: on device 0, or
    split along T over the mesh (the states replicated)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from gla_ref.testing import random_inputs

    s = cfg["shape"]
    x = random_inputs(B=s["B"], T=T, H=s["H"], K=s["K"], V=s["V"], gate="gla", tau=16.0, seed=seed,
                      initial_state=True)
    rng = np.random.default_rng(seed + 1)
    x["do"], x["dS"] = rng.standard_normal(x["v"].shape), rng.standard_normal(x["initial_state"].shape)
    out = {}
    for n, a in x.items():
        arr = jnp.asarray(a, dtype if n in ("q", "k", "v", "do") else jnp.float32)
        if devices == 1:
            out[n] = jax.device_put(arr, mesh.devices.flat[0])
        else:
            spec = P() if n in ("initial_state", "dS") else P(None, "seq")
            out[n] = jax.device_put(arr, NamedSharding(mesh, spec))
    return out


_COMPILED = {}


def _jax_step(cfg, mesh, devices, x):
    """The compiled forward + backward for inputs ``x`` (with an initial state and the final state):
    ``(o, S, gradients of q, k, v, g, h0)`` from the one-device Pallas chunk_gla or the sequence-parallel one
    on the mesh; compiled once per setup, shape and dtype (the accuracy check and the timing share it)."""
    from functools import partial

    import jax

    from gla_ref import pallas
    from gla_ref.sequence_parallel import jax as sp_jax

    key = (devices, x["q"].shape, str(x["q"].dtype))
    if key not in _COMPILED:
        C = cfg["chunk_size"]
        f = (partial(pallas.chunk_gla, chunk_size=C) if devices == 1
             else partial(sp_jax.chunk_gla, mesh=mesh, chunk_size=C))

        def step(q, k, v, g, h0, do, dS):
            (o, S), vjp = jax.vjp(lambda *a: f(*a[:4], initial_state=a[4], output_final_state=True),
                                  q, k, v, g, h0)
            return o, S, vjp((do, dS))

        for old in [k for k in _COMPILED if k[0] == devices]:  # one program a setup: a long T's is not kept
            del _COMPILED[old]
        _COMPILED[key] = jax.jit(step).lower(*x.values()).compile()
    return _COMPILED[key]


def _jax_accuracy(cfg, mesh, name):
    """Two devices against one (Pallas) and against jax_ref.chunk_gla in float64 on the same inputs."""
    import jax
    import jax.numpy as jnp

    from gla_ref import jax_ref
    from gla_ref.testing import rel_rmse

    names = ("o", "final_state", "dq", "dk", "dv", "dg", "dinitial_state")
    results = []
    for devices in (1, 2):
        x = _jax_inputs(cfg, cfg["acc_T"], getattr(jnp, name), mesh, devices)
        o, S, grads = _jax_step(cfg, mesh, devices, x)(*x.values())
        results.append(dict(zip(names, (o, S, *grads))))
    x = _jax_inputs(cfg, cfg["acc_T"], getattr(jnp, name), mesh, 1)
    with jax.enable_x64(True):
        x64 = {n: jnp.asarray(a, jnp.float64) for n, a in x.items()}
        (o, S), vjp = jax.vjp(lambda *a: jax_ref.chunk_gla(*a[:4], initial_state=a[4], output_final_state=True,
                                                           chunk_size=cfg["chunk_size"]),
                              *(x64[n] for n in ("q", "k", "v", "g", "initial_state")))
        ref64 = dict(zip(names, (o, S, *vjp((x64["do"], x64["dS"])))))
    one, two = results
    errors = {n: [rel_rmse(one[n], two[n]), rel_rmse(ref64[n], two[n])] for n in names}
    return {"kind": "accuracy", "framework": "jax", "dtype": name, "T": cfg["acc_T"], "devices": 2,
            "errors": errors, "device": str(mesh.devices.flat[0].device_kind)}


def _jax_timing(cfg, mesh, devices, T):
    """A ``jax_one_device`` / ``jax_two_devices`` row at T: time, memory per device and bytes per device."""
    import jax.numpy as jnp

    from gla_ref.sequence_parallel import costs

    name = "jax_one_device" if devices == 1 else "jax_two_devices"
    row = {"name": name, "framework": "jax", "T": T, "devices": devices, "dtype": cfg["dtype"]}
    try:
        x = _jax_inputs(cfg, T, getattr(jnp, cfg["dtype"]), mesh, devices, seed=1)
        t0 = time.perf_counter()
        compiled = _jax_step(cfg, mesh, devices, x)
        compile_ms = (time.perf_counter() - t0) * 1e3
        t = bench.time_wall(compiled, *x.values(), warmup=cfg["warmup"], rep=cfg["rep"], sync=_ready)
        memory = compiled.memory_analysis()
        ops = costs.hlo_collectives(compiled.as_text())
    except Exception as err:  # out of device memory, or a compile failure: recorded, and the sweep stops
        return {**row, "error": f"{type(err).__name__}: {str(err)[:300]}"}
    used = [d.memory_stats() or {} for d in mesh.devices.flat[:devices]]
    program = None if memory is None else (memory.argument_size_in_bytes + memory.output_size_in_bytes
                                           + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
    in_use = [u.get("peak_bytes_in_use") for u in used]
    return {**row, "fwd_bwd": {k: t[k] for k in ("median_ms", "p20_ms", "p80_ms")}, "compile_ms": compile_ms,
            "peak_bytes": program, "peak_in_use_bytes": None if None in in_use else max(in_use),
            "device_bytes": used[0].get("bytes_limit"),
            "bytes_sent": costs.bytes_sent_by_device(ops, devices) if devices > 1 else [0]}


def _ready(x):
    import jax

    return jax.block_until_ready(x)


def _jax_probe(cfg, mesh, devices, T):
    """One forward + backward at T (a search probe): True if it ran, False if the device ran out of memory."""
    import jax
    import jax.numpy as jnp

    try:
        x = _jax_inputs(cfg, T, getattr(jnp, cfg["dtype"]), mesh, devices, seed=1)
        jax.block_until_ready(_jax_step(cfg, mesh, devices, x)(*x.values()))
    except Exception as err:
        if "RESOURCE_EXHAUSTED" in str(err) or "out of memory" in str(err).lower():
            return False
        raise
    finally:
        _COMPILED.clear()
    return True


def run_jax(cfg, smoke, timeout):
    """The JAX part in a child process; its rows (or one 'skipped' / 'error' row)."""
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if smoke:  # two simulated CPU devices
        flags = f"--xla_force_host_platform_device_count=2 {SMOKE_XLA_FLAGS}"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
        env["JAX_PLATFORMS"] = "cpu"
    try:
        done = subprocess.run([sys.executable, str(SCRIPT), "--jax-child", json.dumps(cfg)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [{"kind": "error", "framework": "jax", "error": f"no answer after {timeout} s"}]
    if done.returncode != 0:
        return [{"kind": "error", "framework": "jax", "error": done.stderr[-2000:]}]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the parent: launches, checks, writes ---

def judge(row):
    """An accuracy row with ``ok``: every error below the dtype's :data:`TOL` (printed)."""
    tol = TOL[row["dtype"]]
    worst = max(e for errs in row["errors"].values() for e in errs)
    row["ok"] = worst < tol
    print(f"accuracy, {row['framework']} {row['dtype']:>8}{'' if 'rank' not in row else ', rank ' + str(row['rank'])}:"
          f" worst relative RMSE {worst:.1e} ({'ok, below' if row['ok'] else 'ABOVE'} {tol:.0e})", flush=True)
    return row


def run_sweep(args, shape, devices, backend, env, accuracy=False):
    """The rows of one setup (``devices`` ranks): its accuracy rows (judged) when ``accuracy``, then
    its timing rows over args.T. A failed group (out of memory) ends the sweep with an error row for
    the first T that has no row."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "rows.jsonl"
        out.touch()
        error = None
        acc = dict(T=args.acc_T, dtypes=args.dtypes) if accuracy else None
        try:
            local.launch(f"{SCRIPT}:measure_rank", devices, backend=backend, env=env, timeout=args.timeout,
                         echo=args.echo, kwargs=dict(shape=shape, Ts=args.T, dtype=args.dtype, accuracy=acc,
                                                     chunk_size=args.chunk_size, warmup=args.warmup,
                                                     rep=args.rep, out=str(out)))
        except (RuntimeError, TimeoutError) as err:
            error = str(err)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    checked = [judge(r) for r in rows if r.get("kind") == "accuracy"]
    rows = [r for r in rows if r.get("kind") != "accuracy"]
    if accuracy and not checked and error is not None:
        return [{"kind": "accuracy", "framework": "torch", "devices": devices, "error": error[-1500:]}]
    for r in rows:
        peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f} GiB"
        print(f"{r['name']:>12} T={r['T']:>8}: {r['fwd_bwd']['median_ms']:9.2f} ms, peak {peak}, "
              f"bytes sent per rank {r['bytes_sent']}", flush=True)
    if error is not None:
        done = {r["T"] for r in rows}
        failed = next((T for T in args.T if T not in done), None)
        oom = "out of memory" in error.lower()
        rows.append({"name": NAMES[devices], "framework": "torch", "T": failed, "devices": devices,
                     "error": ("out of memory: " if oom else "") + error[-1500:]})
        print(f"{NAMES[devices]}: stopped at T={failed}: {'out of memory' if oom else error[-300:]}", flush=True)
    return checked + rows


def summarize(rows, longest):
    """Two devices against one, per framework, at every T both ran: time and peak-memory ratios, the longest-T
    ratio, and whether issue 18's :data:`TARGETS` hold (None where nothing was measured)."""
    out = {}
    for framework, one, two in (("torch", "one_device", "two_devices"), ("jax", "jax_one_device", "jax_two_devices")):
        by = {n: {r["T"]: r for r in rows if r.get("name") == n and "fwd_bwd" in r} for n in (one, two)}
        Ts = sorted(set(by[one]) & set(by[two]))
        time_ratio = {T: by[two][T]["fwd_bwd"]["median_ms"] / by[one][T]["fwd_bwd"]["median_ms"] for T in Ts}
        peak_ratio = {T: by[two][T]["peak_bytes"] / by[one][T]["peak_bytes"] for T in Ts
                      if by[one][T].get("peak_bytes") and by[two][T].get("peak_bytes")}
        long_ratio = longest[two] / longest[one] if longest.get(one) and longest.get(two) else None
        judged = [time_ratio[T] for T in Ts if T >= TARGETS["fwd_bwd_from_T"]]
        out[framework] = {
            "fwd_bwd_ratio": time_ratio, "peak_ratio": peak_ratio, "longest_T_ratio": long_ratio,
            "meets": {"fwd_bwd": max(judged) <= TARGETS["fwd_bwd_ratio"] if judged else None,
                      "peak": max(peak_ratio.values()) <= TARGETS["peak_ratio"] if peak_ratio else None,
                      "longest_T": long_ratio >= TARGETS["longest_T_ratio"] if long_ratio else None}}
    return {"targets": TARGETS, **out}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny shapes, output in a temporary folder")
    p.add_argument("--T", type=int, nargs="+", help="sequence lengths of the torch sweep (whole sequence)")
    p.add_argument("--jax-T", type=int, nargs="+", help="sequence lengths of the JAX sweep")
    p.add_argument("--acc-T", type=int, help="sequence length of the accuracy check")
    p.add_argument("--dtypes", nargs="+", help="dtypes of the accuracy check")
    p.add_argument("--dtype", help="dtype of the timings")
    p.add_argument("--no-jax", action="store_true", help="skip the JAX part")
    p.add_argument("--no-torch", action="store_true", help="skip the torch part (e.g. to run JAX in a command of "
                   "its own where a command's time is limited: the Pallas programs take a minute or more to compile)")
    p.add_argument("--no-search", action="store_true", help="skip the search for the longest T")
    p.add_argument("--search-step", type=int, help="resolution of the longest-T search (tokens; 65536 by default)")
    p.add_argument("--search-max-T", type=int, help="longest T the search tries (16M by default)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds each group of ranks may run")
    p.add_argument("--echo", action="store_true", help="show the ranks' output as they run")
    p.add_argument("--out", type=pathlib.Path, help="JSON path (default results/sequence_parallel_<device>.json)")
    p.add_argument("--jax-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    base = SMOKE if args.smoke else FULL
    for key in ("T", "jax_T", "acc_T", "dtypes", "dtype", "search_step", "search_max_T"):
        if getattr(args, key) is None:
            setattr(args, key, base[key])
    args.warmup, args.rep, args.chunk_size = base["warmup"], base["rep"], base["chunk_size"]
    args.shape = {n: base[n] for n in "BHKV"}
    if any(T % 2 for T in [*args.T, *args.jax_T, args.acc_T]):
        p.error("every T must be even: two ranks hold T/2 tokens each")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.jax_child:
        print(json.dumps(jax_child(json.loads(args.jax_child))))
        return 0
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        sys.exit("sequence_parallel_bench.py times GPUs and needs CUDA; on a CPU run it with --smoke")
    gpus = torch.cuda.device_count() if cuda else 0
    backend, env = ("nccl", NCCL_ENV) if cuda else ("gloo", {})
    bench.show_tuning()
    start = time.perf_counter()
    two = args.smoke or gpus >= 2
    search = cuda and not args.no_search  # on a CPU nothing runs out of memory
    rows = [] if args.no_torch else run_sweep(args, args.shape, 1, backend, env)
    if two and not args.no_torch:
        rows += run_sweep(args, args.shape, 2, backend, env, accuracy=True)
    for devices in ((1, 2) if two else (1,)) if search and not args.no_torch else ():
        print(f"searching the longest T of {NAMES[devices]} (probes of one step each)", flush=True)
        rows.append(search_row(NAMES[devices], "torch", torch_probe(args, devices, backend, env), rows,
                               step=args.search_step, max_T=args.search_max_T))
    if not args.no_jax:
        cfg = dict(shape=args.shape, Ts=args.jax_T, acc_T=args.acc_T, dtypes=args.dtypes, dtype=args.dtype,
                   chunk_size=args.chunk_size, warmup=args.warmup, rep=args.rep, search=search,
                   search_step=args.search_step, search_max_T=args.search_max_T)
        jax_rows = run_jax(cfg, args.smoke, 6 * args.timeout)
        rows += [judge(r) if r.get("kind") == "accuracy" and "errors" in r else r for r in jax_rows]
        for r in jax_rows:
            if r.get("kind") in ("skipped", "error"):
                print(f"JAX part {r['kind']}: {r.get('reason') or r.get('error')}", flush=True)
            elif "fwd_bwd" in r or "error" in r:
                what = f"{r['fwd_bwd']['median_ms']:9.2f} ms" if "fwd_bwd" in r else r["error"][:200]
                print(f"{r['name']:>16} T={r['T']:>8}: {what}", flush=True)
    longest = {}
    for r in rows:
        if "fwd_bwd" in r:
            longest[r["name"]] = max(longest.get(r["name"], 0), r["T"])
        if r.get("kind") == "search" and r.get("longest_T"):
            longest[r["name"]] = max(longest.get(r["name"], 0), r["longest_T"])
    summary = summarize(rows, longest)
    env_stamp = {**bench.environment(), "smoke": args.smoke, "backend": backend, "gpus": gpus,
                 "NCCL_NVLS_ENABLE": env.get("NCCL_NVLS_ENABLE"), "wall_s": round(time.perf_counter() - start, 1)}
    result = {"env": env_stamp, "shape": {**args.shape, "dtype": args.dtype, "chunk_size": args.chunk_size},
              "two_devices": "run" if two else f"not run: {gpus} GPU(s) visible", "longest_T": longest,
              "summary": summary, "rows": rows}
    default_dir = pathlib.Path(tempfile.gettempdir()) if args.smoke else RESULTS
    name = bench.slug(env_stamp["device"])
    path = args.out or default_dir / f"sequence_parallel_{'smoke_' if args.smoke else ''}{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    for framework in ("torch", "jax"):
        s = summary[framework]
        print(f"{framework}: two devices / one: time {s['fwd_bwd_ratio']}, peak {s['peak_ratio']}, "
              f"longest T {s['longest_T_ratio']}; targets met: {s['meets']}")
    bad = [r for r in rows if r.get("kind") == "accuracy" and not r.get("ok")]
    print(f"{len(rows)} rows in {env_stamp['wall_s']} s; longest T {longest}; wrote {path}")
    if bad:
        print(f"{len(bad)} accuracy rows above tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
