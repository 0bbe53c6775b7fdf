"""Sequence parallelism on GPUs: one sequence on two GPUs against one (issue 18; drawn in chapter 9).

    python benchmarks/sequence_parallel_bench.py          # CUDA: results/sequence_parallel_<device>.json
    python benchmarks/sequence_parallel_bench.py --smoke  # any machine: CPU and gloo, tiny shapes, a temp file

No ``torchrun``: the ranks are processes this script starts with
:func:`gla_ref.sequence_parallel.local.launch` (NCCL on GPUs, rank r on GPU r, NVLink multicast off
with ``NCCL_NVLS_ENABLE=0``; gloo on the CPU). A rank that runs out of memory ends its group, and
the sweep of that setup stops there. What is measured, in this order:

1. **Accuracy** (``kind: accuracy``, before the two-rank timings, in the same group): on two ranks,
   :func:`gla_ref.sequence_parallel.torch.chunk_gla` forward and backward (loss ``Σ o·dO + Σ S·dS``)
   against the one-device ``chunk_gla`` (:func:`gla_ref.triton.chunk_gla` on a GPU,
   :func:`gla_ref.torch_ref.chunk_gla` on the CPU) on the same inputs, and against
   ``torch_ref.chunk_gla`` in float64: o, final state, dq, dk, dv, dg and dh0, per rank, for each
   dtype of ``--dtypes``. Every error must be below :data:`TOL` (the run still writes its file,
   then exits with an error).
2. **Time and memory** (``name: one_device`` and ``two_devices``), for every T of ``--T``: one
   training step (forward and backward, no final state) at B=1, H=16, K=V=128 in bf16 by default;
   ``fwd_bwd`` is the median and 20/80 % quantiles of the wall-clock step time, the slowest rank's
   time for each step (the ranks start each step together, after a barrier); ``peak_bytes`` the
   largest ``torch.cuda.max_memory_allocated`` of a rank (inputs included; null on the CPU);
   ``bytes_sent`` and ``bytes_received`` per rank, measured by
   :func:`~gla_ref.sequence_parallel.torch.count_traffic`, and ``bytes_predicted`` by
   :func:`~gla_ref.sequence_parallel.torch.bytes_per_call`. A T that fails (out of memory) gives a
   row with ``error`` instead, and the setup's longest T is recorded under ``longest_T``.
3. **JAX** (``framework: jax``), where JAX sees two devices of one kind (two GPUs; two CPU devices
   with ``--smoke``): :func:`gla_ref.sequence_parallel.jax.chunk_gla` on a two-device mesh against
   :func:`gla_ref.jax_ref.chunk_gla` on one device, accuracy for each dtype, then the forward and
   backward timed (``jax_one_device``, ``jax_two_devices``) with :func:`gla_ref.bench.time_jax`
   until a length fails.
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
FULL = dict(B=1, H=16, K=128, V=128, T=[2 ** e for e in range(14, 23)], acc_T=4096, jax_max_T=65536,
            dtype="bfloat16", dtypes=["bfloat16", "float32"], warmup=3, rep=10, chunk_size=64)
SMOKE = dict(B=1, H=2, K=16, V=16, T=[64, 128], acc_T=48, jax_max_T=64, dtype="float32", dtypes=["float32"],
             warmup=1, rep=3, chunk_size=16)
TOL = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 5e-3}
"""Largest relative RMSE allowed between two ranks and one device (and float64), by dtype: the
kernels' own rounding (chapter 4 measured about 4e-3 for bf16 and 4e-7 for fp32 against float64 on
an H200); a broken chain of states gives errors of order one."""
NAMES = {1: "one_device", 2: "two_devices"}


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
    """The one-device chunk_gla: the Triton kernel on a GPU, the PyTorch reference on the CPU."""
    if q.device.type == "cuda":
        from gla_ref import triton as gla_triton

        return gla_triton.chunk_gla(q, k, v, g, **kw)
    from gla_ref import torch_ref

    return torch_ref.chunk_gla(q, k, v, g, **kw)


def _grads(fn, x, do, dS):
    """``{o, final_state, dq, dk, dv, dg, dinitial_state}`` of ``fn(**x)`` for the loss Σ o·dO + Σ S·dS
    (S None: no such term; an input without a gradient gives None)."""
    leaves = {n: None if t is None else t.detach().requires_grad_() for n, t in x.items()}
    o, S = fn(**leaves)
    loss = (o.float() * do.float()).sum() + (0 if S is None else (S * dS).sum())
    loss.backward()
    out = {"o": o.detach(), "final_state": None if S is None else S.detach()}
    out.update({"d" + n: None if t is None else t.grad for n, t in leaves.items()})
    return out


def accuracy_rows(rank, world_size, *, shape, T, dtypes, chunk_size):
    """This rank's errors, per dtype: its slice of o and of the gradients, the final state (last
    rank) and dh0 (rank 0), each ``[vs one device, vs float64]``."""
    import torch

    from gla_ref import torch_ref
    from gla_ref.sequence_parallel import torch as sp
    from gla_ref.testing import rel_rmse

    lo, hi = rank * T // world_size, (rank + 1) * T // world_size
    rows = []
    for name in dtypes:
        dev, dtype = _setup(name)
        x, do, dS = _inputs(**shape, T=T, dtype=dtype, dev=dev, seed=0)
        one = _grads(lambda **a: _one_device(**a, output_final_state=True, chunk_size=chunk_size), x, do, dS)
        x64 = {n: t.double() for n, t in x.items()}
        f64 = _grads(lambda **a: torch_ref.chunk_gla(**a, output_final_state=True, chunk_size=chunk_size),
                     x64, do.double(), dS.double())
        mine = {n: t[:, lo:hi] for n, t in x.items() if n != "initial_state"}
        mine["initial_state"] = x["initial_state"] if rank == 0 else None
        two = _grads(lambda **a: sp.chunk_gla(**a, output_final_state=True, chunk_size=chunk_size),
                     mine, do[:, lo:hi], dS)
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


def _time_slice(tokens, world_size, *, shape, dtype, chunk_size, warmup, rep, seed):
    """This rank's training step on a slice of ``tokens``: ``{"ms": [rep step times], "peak": bytes or
    None, "sent", "received": bytes per step}``. One device runs the one-device chunk_gla; several
    run the sequence-parallel one, each step starting after a barrier."""
    import torch
    import torch.distributed as dist

    from gla_ref.sequence_parallel import torch as sp

    dev, dt = _setup(dtype)
    cuda = dev.type == "cuda"
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
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with sp.count_traffic() as moved:
        ms = [timed() for _ in range(rep)]
    peak = torch.cuda.max_memory_allocated() if cuda else None
    return {"ms": ms, "peak": peak, "sent": moved.sent // rep, "received": moved.received // rep}


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
           "peak_bytes": None if None in peaks else max(peaks),
           "bytes_sent": [r["sent"] for r in every], "bytes_received": [r["received"] for r in every],
           "bytes_predicted": predicted}
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


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
        for T in cfg["Ts"]:
            row = _jax_timing(cfg, mesh, devices, T)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            if "error" in row:
                break
    return rows


def _jax_inputs(cfg, T, dtype, seed=0):
    import jax.numpy as jnp
    import numpy as np

    from gla_ref.testing import random_inputs

    s = cfg["shape"]
    x = random_inputs(B=s["B"], T=T, H=s["H"], K=s["K"], V=s["V"], gate="gla", tau=16.0, seed=seed,
                      initial_state=True)
    rng = np.random.default_rng(seed + 1)
    do = rng.standard_normal(x["v"].shape)
    x = {n: jnp.asarray(a, dtype if n in "qkv" else jnp.float32) for n, a in x.items()}
    return x, jnp.asarray(do, dtype)


def _jax_step(cfg, mesh, devices, with_state):
    """A jitted forward + backward: (o, final state or None, gradients of q, k, v, g[, h0])."""
    from functools import partial

    import jax

    from gla_ref import jax_ref
    from gla_ref.sequence_parallel import jax as sp_jax

    C = cfg["chunk_size"]
    f = (partial(jax_ref.chunk_gla, chunk_size=C) if devices == 1
         else partial(sp_jax.chunk_gla, mesh=mesh, chunk_size=C))
    argnums = (0, 1, 2, 3, 4) if with_state else (0, 1, 2, 3)

    @jax.jit
    def step(q, k, v, g, h0, do):
        def loss(q, k, v, g, h0):
            o, S = f(q, k, v, g, initial_state=h0 if with_state else None, output_final_state=with_state)
            return (o.astype("float32") * do.astype("float32")).sum() + (0.0 if S is None else S.sum()), (o, S)

        grads, (o, S) = jax.grad(loss, argnums=argnums, has_aux=True)(q, k, v, g, h0)
        return o, S, grads

    return step


def _jax_accuracy(cfg, mesh, name):
    import jax.numpy as jnp

    from gla_ref.testing import rel_rmse

    x, do = _jax_inputs(cfg, cfg["acc_T"], getattr(jnp, name))
    args = (x["q"], x["k"], x["v"], x["g"], x["initial_state"], do)
    o1, S1, g1 = _jax_step(cfg, mesh, 1, True)(*args)
    o2, S2, g2 = _jax_step(cfg, mesh, 2, True)(*args)
    errors = {"o": rel_rmse(o1, o2), "final_state": rel_rmse(S1, S2)}
    errors.update({f"d{n}": rel_rmse(a, b) for n, a, b in zip(("q", "k", "v", "g", "initial_state"), g1, g2)})
    return {"kind": "accuracy", "framework": "jax", "dtype": name, "T": cfg["acc_T"], "devices": 2,
            "errors": {n: [e] for n, e in errors.items()}, "device": str(mesh.devices.flat[0].device_kind)}


def _jax_timing(cfg, mesh, devices, T):
    import jax.numpy as jnp

    x, do = _jax_inputs(cfg, T, getattr(jnp, cfg["dtype"]), seed=1)
    name = "jax_one_device" if devices == 1 else "jax_two_devices"
    row = {"name": name, "framework": "jax", "T": T, "devices": devices, "dtype": cfg["dtype"]}
    try:
        t = bench.time_jax(_jax_step(cfg, mesh, devices, False), x["q"], x["k"], x["v"], x["g"], None, do,
                           warmup=cfg["warmup"], rep=cfg["rep"])
    except Exception as err:  # out of device memory, or a compile failure: recorded, and the sweep stops
        return {**row, "error": f"{type(err).__name__}: {str(err)[:300]}"}
    return {**row, "fwd_bwd": {k: t[k] for k in ("median_ms", "p20_ms", "p80_ms")}, "compile_ms": t["compile_ms"]}


def run_jax(cfg, smoke, timeout):
    """The JAX part in a child process; its rows (or one 'skipped' / 'error' row)."""
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if smoke:  # two simulated CPU devices
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny shapes, output in a temporary folder")
    p.add_argument("--T", type=int, nargs="+", help="sequence lengths (whole sequence)")
    p.add_argument("--acc-T", type=int, help="sequence length of the accuracy check")
    p.add_argument("--dtypes", nargs="+", help="dtypes of the accuracy check")
    p.add_argument("--dtype", help="dtype of the timings")
    p.add_argument("--jax-max-T", type=int, help="longest T the JAX part times (its one-device reference, "
                   "jax_ref.chunk_gla, holds a C x C x K block per chunk; default 65536, 64 with --smoke)")
    p.add_argument("--no-jax", action="store_true", help="skip the JAX part")
    p.add_argument("--timeout", type=float, default=500.0, help="seconds each group of ranks may run")
    p.add_argument("--echo", action="store_true", help="show the ranks' output as they run")
    p.add_argument("--out", type=pathlib.Path, help="JSON path (default results/sequence_parallel_<device>.json)")
    p.add_argument("--jax-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    base = SMOKE if args.smoke else FULL
    for key in ("T", "acc_T", "dtypes", "dtype", "jax_max_T"):
        if getattr(args, key) is None:
            setattr(args, key, base[key])
    args.warmup, args.rep, args.chunk_size = base["warmup"], base["rep"], base["chunk_size"]
    args.shape = {n: base[n] for n in "BHKV"}
    if any(T % 2 for T in [*args.T, args.acc_T]):
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
    backend, env = ("nccl", {"NCCL_NVLS_ENABLE": "0"}) if cuda else ("gloo", {})
    bench.show_tuning()
    start = time.perf_counter()
    two = args.smoke or gpus >= 2
    rows = run_sweep(args, args.shape, 1, backend, env)
    if two:
        rows += run_sweep(args, args.shape, 2, backend, env, accuracy=True)
    if not args.no_jax:
        cfg = dict(shape=args.shape, Ts=[T for T in args.T if T <= args.jax_max_T], acc_T=args.acc_T,
                   dtypes=args.dtypes, dtype=args.dtype, chunk_size=args.chunk_size, warmup=args.warmup,
                   rep=args.rep)
        jax_rows = run_jax(cfg, args.smoke, args.timeout)
        rows += [judge(r) if r.get("kind") == "accuracy" else r for r in jax_rows]
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
    env_stamp = {**bench.environment(), "smoke": args.smoke, "backend": backend, "gpus": gpus,
                 "NCCL_NVLS_ENABLE": env.get("NCCL_NVLS_ENABLE"), "wall_s": round(time.perf_counter() - start, 1)}
    result = {"env": env_stamp, "shape": {**args.shape, "dtype": args.dtype, "chunk_size": args.chunk_size},
              "two_devices": "run" if two else f"not run: {gpus} GPU(s) visible", "longest_T": longest,
              "rows": rows}
    default_dir = pathlib.Path(tempfile.gettempdir()) if args.smoke else RESULTS
    name = bench.slug(env_stamp["device"])
    path = args.out or default_dir / f"sequence_parallel_{'smoke_' if args.smoke else ''}{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    bad = [r for r in rows if r.get("kind") == "accuracy" and not r.get("ok")]
    print(f"{len(rows)} rows in {env_stamp['wall_s']} s; longest T {longest}; wrote {path}")
    if bad:
        print(f"{len(bad)} accuracy rows above tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
