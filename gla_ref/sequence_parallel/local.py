"""Process groups on one machine, started from Python (no ``torchrun``): for notebooks, tests and
benchmarks of :mod:`gla_ref.sequence_parallel.torch`.

:func:`launch` starts ``world_size`` Python processes, each of which joins one
``torch.distributed`` group over 127.0.0.1 (gloo for CPU tensors; NCCL with rank r on GPU r),
calls the function named by ``target`` with its rank and sends back what it returned (pickled; NCCL
groups use high-priority streams, so that a state sent between two kernels does not wait for the
kernels queued after its send to free the GPU). A
rank that fails stops the others at once, and the whole group is stopped after ``timeout``
seconds, so a chain whose neighbour died never leaves the caller waiting.

:func:`chunk_gla_on_ranks` uses it to run :func:`gla_ref.sequence_parallel.torch.chunk_gla`,
forward and backward, on a whole sequence cut into one slice per rank, and returns every rank's
outputs and gradients stitched back into whole-sequence arrays, with the bytes each rank sent and
received, to be compared with a single-process reference.

Importing this module loads no framework; the ranks import torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import pickle
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

__all__ = ["chunk_gla_on_ranks", "free_port", "launch"]

_PACKAGE_PARENT = str(pathlib.Path(__file__).resolve().parents[2])
"""The folder holding ``gla_ref``: put on the ranks' ``PYTHONPATH`` so they import this copy."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(target, world_size, *, kwargs=None, backend="gloo", timeout=120.0, env=None, echo=False):
    """Run ``target(rank=r, world_size=world_size, **kwargs)`` in ``world_size`` processes that
    form one ``torch.distributed`` group; returns the list of their return values, by rank.

    ``target``: ``"package.module:function"`` or ``"path/to/file.py:function"``. ``kwargs`` must
    pickle (NumPy arrays, numbers, lists); so must the return values. ``backend``: ``"gloo"``
    (CPU, loopback) or ``"nccl"`` (rank r calls ``torch.cuda.set_device(r)`` first). ``env``: extra
    environment variables for the ranks (e.g. ``{"NCCL_NVLS_ENABLE": "0"}``). ``echo``: let the
    ranks print to this process's terminal instead of a log kept for error messages.

    Raises RuntimeError (naming the ranks that failed and ending with their logs) when a rank exits
    with an error, TimeoutError when the group has not finished after ``timeout`` seconds; either
    way every rank still running is killed first.
    """
    _check_launch(target, world_size, backend, timeout)
    with tempfile.TemporaryDirectory(prefix="gla_ref_ranks_") as tmp:
        folder = pathlib.Path(tmp)
        (folder / "kwargs.pkl").write_bytes(pickle.dumps(dict(kwargs or {})))
        path = os.pathsep.join(p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)
        child_env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
                     "PYTHONPATH": path, **(env or {})}
        argv = [str(world_size), str(free_port()), target, str(folder), backend, str(timeout)]
        logs = [None if echo else open(folder / f"rank{r}.log", "w") for r in range(world_size)]
        try:
            procs = [subprocess.Popen([sys.executable, "-m", __name__, str(r), *argv], env=child_env,
                                      stdout=log, stderr=subprocess.STDOUT if log else None)
                     for r, log in enumerate(logs)]
            _wait(procs, timeout, folder, echo)
        finally:
            for log in logs:
                if log is not None:
                    log.close()
        return [pickle.loads((folder / f"rank{r}.pkl").read_bytes()) for r in range(world_size)]


def _check_launch(target, world_size, backend, timeout):
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise ValueError(f"target must be 'module:function' or 'file.py:function', got {target!r}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


def _tail(folder, rank, echo, chars=3000):
    if echo:
        return "(its output went to this terminal)"
    return (folder / f"rank{rank}.log").read_text(errors="replace")[-chars:]


_GRACE = 5.0
"""Seconds the other ranks are given to exit once one has failed: a rank that raises often makes
its neighbours fail too (a closed connection), sometimes before it has exited itself, and the
error should show the first cause."""


def _wait(procs, timeout, folder, echo):
    """Poll the ranks until all exit 0; on the first failure (after a short grace for the others to
    exit) or at the deadline, kill the rest and raise."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(code == 0 for code in codes):
                return
            if any(code not in (None, 0) for code in codes):
                deadline = min(deadline, time.monotonic() + _GRACE)
                if all(code is not None for code in codes) or time.monotonic() > deadline:
                    _raise_failed(codes, folder, echo)
            elif time.monotonic() > deadline:
                waiting = [r for r, code in enumerate(codes) if code is None]
                raise TimeoutError(f"ranks {waiting} of {len(procs)} still running after {timeout} s; "
                                   f"rank {waiting[0]}'s log ends:\n{_tail(folder, waiting[0], echo)}")
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _raise_failed(codes, folder, echo):
    failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
    logs = "\n".join(f"--- rank {r}'s log ends:\n{_tail(folder, r, echo, 3000 // len(failed))}" for r in failed)
    plural = "s" * (len(failed) > 1)
    raise RuntimeError(f"rank{plural} {failed} of {len(codes)} exited with code{plural} "
                       f"{[codes[r] for r in failed]}\n{logs}")


def _resolve(target):
    """The function ``target`` names (``module:function`` or ``file.py:function``)."""
    where, name = target.split(":")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(pathlib.Path(where).stem, where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def _rank_main(argv):
    """One rank: join the group, call the target, pickle its result next to the kwargs."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank, world_size, port = (int(a) for a in argv[:3])
    target, folder, backend, timeout = argv[3], pathlib.Path(argv[4]), argv[5], float(argv[6])
    if backend == "nccl":
        torch.cuda.set_device(rank)
    options = {}
    if backend == "nccl":  # high-priority NCCL streams: a send is not held up behind the kernels queued after it
        options["pg_options"] = dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout), **options)
    try:
        fn = _resolve(target)
        kwargs = pickle.loads((folder / "kwargs.pkl").read_bytes())
        result = fn(rank=rank, world_size=world_size, **kwargs)
    finally:
        dist.destroy_process_group()
    part = folder / f"rank{rank}.pkl.part"
    part.write_bytes(pickle.dumps(result))
    part.rename(folder / f"rank{rank}.pkl")


# --- chunk_gla on local ranks ---

def chunk_gla_on_ranks(runs, *, timeout=120.0):
    """Run :func:`gla_ref.sequence_parallel.torch.chunk_gla` on local gloo ranks, one call (and
    its backward) per entry of ``runs``, all in one group of processes; returns one dict per run.

    Each run is a dict: ``inputs`` — the whole sequence as :func:`gla_ref.testing.random_inputs`
    gives it (NumPy ``q, k, v [B, T, H, ·]``, ``g`` None / ``[H]`` / ``[B, T, H]`` /
    ``[B, T, H, K]``, ``initial_state`` ``[B, H, K, V]`` or None); ``lengths`` — tokens per rank,
    summing to T (their count is the world size, the same for every run); optional ``do``
    ``[B, T, H, V]`` and ``dS`` ``[B, H, K, V]`` — cotangents of o and of the final state (no
    backward without ``do``); ``dtype`` — ``"float32"`` (default), ``"float16"`` (both the Triton
    kernels, interpreted on a CPU) or ``"float64"`` (the PyTorch reference); ``chunk_size``
    (default 64), ``scale`` (default None) and ``output_final_state`` (default True), passed to
    every rank; ``ranks`` — ``{rank: {keyword: value}}`` to give some ranks other keywords (to see
    what a mismatch does).

    Each result holds whole-sequence NumPy arrays (float64): ``o`` ``[B, T, H, V]`` (the ranks'
    slices in order), ``final_state`` (from the last rank; None without ``output_final_state``) and,
    with ``do``, ``dq, dk, dv``, ``dg`` (a ``[H]`` gate's gradient summed over the ranks; None without
    a gate) and ``dinitial_state`` (rank 0; None without an initial state); and per rank: ``sent``,
    ``received`` (bytes measured by :func:`~gla_ref.sequence_parallel.torch.count_traffic`),
    ``predicted`` (``(sent, received)`` from :func:`~gla_ref.sequence_parallel.torch.bytes_per_call`)
    and ``seconds``. A run whose call raised ValueError or TypeError on some rank gives
    ``{"raised": [[type name, message] or None, by rank]}`` instead (the group goes on with the next run).
    """
    runs = list(runs)
    sizes = {len(run["lengths"]) for run in runs}
    if len(sizes) != 1:
        raise ValueError(f"every run must split the sequence over the same number of ranks, got {sorted(sizes)}")
    for i, run in enumerate(runs):
        T = run["inputs"]["q"].shape[1]
        if sum(run["lengths"]) != T or min(run["lengths"]) < 1:
            raise ValueError(f"runs[{i}]['lengths'] = {run['lengths']} must be positive and sum to T={T}")
        if run.get("dtype", "float32") not in _DTYPES:
            raise ValueError(f"runs[{i}]['dtype'] must be one of {_DTYPES}, got {run['dtype']!r}")
    per_rank = launch(f"{__name__}:_rank_runs", sizes.pop(), kwargs={"runs": runs}, timeout=timeout)
    return [_stitch(run, [ranks[i] for ranks in per_rank]) for i, run in enumerate(runs)]


_DTYPES = ("float32", "float16", "float64")


def _slice(x, lo, hi, rank):
    """Rank ``rank``'s inputs: tokens [lo, hi) of q, k, v and of a per-token gate; a ``[H]`` gate
    whole; the initial state on rank 0 only."""
    part = {n: x[n][:, lo:hi] for n in ("q", "k", "v")}
    g = x.get("g")
    part["g"] = None if g is None else (g if g.ndim == 1 else g[:, lo:hi])
    part["initial_state"] = x.get("initial_state") if rank == 0 else None
    return part


def _rank_runs(rank, world_size, runs):
    """Target of :func:`chunk_gla_on_ranks`: this rank's part of every run, as NumPy arrays."""
    import torch

    from gla_ref.sequence_parallel import torch as sp
    from gla_ref.testing import as_torch

    out = []
    for run in runs:
        lo, hi = sum(run["lengths"][:rank]), sum(run["lengths"][:rank + 1])
        backward = run.get("do") is not None
        dtype = getattr(torch, run.get("dtype", "float32"))
        t = as_torch(_slice(run["inputs"], lo, hi, rank), dtype, requires_grad=backward)
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        kwargs = {**t, "chunk_size": run.get("chunk_size", 64), "scale": run.get("scale"),
                  "output_final_state": run.get("output_final_state", True)}
        for name, value in run.get("ranks", {}).get(rank, {}).items():  # arrays as tensors (states' dtype)
            kwargs[name] = torch.as_tensor(value, dtype=state_dtype) if isinstance(value, np.ndarray) else value
        start = time.perf_counter()
        try:
            with sp.count_traffic() as moved:
                o, S = sp.chunk_gla(**kwargs)
                if backward:
                    outs, cots = [o], [torch.as_tensor(run["do"][:, lo:hi], dtype=o.dtype)]
                    if S is not None and run.get("dS") is not None:
                        outs.append(S)
                        cots.append(torch.as_tensor(run["dS"], dtype=S.dtype))
                    torch.autograd.backward(outs, cots)
        except (TypeError, ValueError) as err:
            out.append({"raised": [type(err).__name__, str(err)]})
            continue
        B, _, H, K = t["q"].shape
        predicted = sp.bytes_per_call(B, H, K, t["v"].shape[-1], rank=rank, world_size=world_size,
                                      dtype=dtype, backward=backward)
        mine = {"o": o, "final_state": S}
        if backward:
            mine.update({"d" + n: None if t[n] is None else t[n].grad for n in t})
        out.append({**{n: None if x is None else x.detach().double().numpy() for n, x in mine.items()},
                    "sent": moved.sent, "received": moved.received,
                    "predicted": (predicted.sent, predicted.received),
                    "seconds": time.perf_counter() - start})
    return out


def _stitch(run, ranks):
    """Whole-sequence arrays from the ranks' parts of one run (see :func:`chunk_gla_on_ranks`)."""
    if any("raised" in r for r in ranks):
        return {"raised": [r.get("raised") for r in ranks]}
    result = {"o": np.concatenate([r["o"] for r in ranks], axis=1), "final_state": ranks[-1]["final_state"]}
    if run.get("do") is not None:
        for n in ("dq", "dk", "dv"):
            result[n] = np.concatenate([r[n] for r in ranks], axis=1)
        g = run["inputs"].get("g")
        if g is None:
            result["dg"] = None
        elif g.ndim == 1:  # a replicated parameter: each rank's gradient is its slice's share
            result["dg"] = np.sum([r["dg"] for r in ranks], axis=0)
        else:
            result["dg"] = np.concatenate([r["dg"] for r in ranks], axis=1)
        result["dinitial_state"] = ranks[0]["dinitial_state"]
    for key in ("sent", "received", "predicted", "seconds"):
        result[key] = [r[key] for r in ranks]
    return result


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
