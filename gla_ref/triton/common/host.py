"""What every Triton launcher shares: input checks, value checks, packed batches, autotune configs."""

from __future__ import annotations

import concurrent.futures
import functools
import os
from typing import NamedTuple

import torch
import triton

from gla_ref import device, specs
from gla_ref._validate import MAX_K, MAX_V  # noqa: F401 (the limits every kernel shares, named here too)
from gla_ref._validate import Dims, check_chunk_sizes, check_gate_values, check_head_dims, check_inputs, read_offsets
from gla_ref.triton.common import ptxas
from gla_ref.triton.common.launch_cache import LAUNCH_OPTIONS, cache_launches

try:
    from triton.runtime._async_compile import AsyncCompileMode
except ImportError:  # Triton < 3.4 compiles inside the autotuner only
    AsyncCompileMode = None


def prepare(q, k, v, g=None, initial_state=None, *, gate_ranks=(4,), cu_seqlens=None) -> Dims:
    """Validate a launch before any kernel runs: shapes, dtypes, one device, and (in debug mode) values.

    With ``cu_seqlens`` (the host copy :func:`prepare_packed` reads, a NumPy int64 array ``[N + 1]`` of
    offsets of a packed batch, B = 1: :func:`gla_ref._validate.check_cu_seqlens`) the initial state is
    ``[N, H, K, V]``. Under Triton's CPU interpreter, bfloat16 inputs are refused (TypeError): its bf16
    ``tl.dot`` returns garbage (values near 1e10) without an error.
    """
    dims = check_inputs(q, k, v, g, initial_state, gate_ranks=gate_ranks, cu_seqlens=cu_seqlens)
    check_head_dims(dims.K, dims.V)
    tensors = {"q": q, "k": k, "v": v, "g": g, "initial_state": initial_state}
    for name, x in tensors.items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x is not None and x.dtype == torch.float64:
            raise TypeError(f"{name}: Triton kernels take float16, bfloat16 or float32, got float64")
    for name, x in tensors.items():
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}: all inputs must share a device")
    if not torch.compiler.is_compiling():  # traced by torch.compile: the custom operator checks when it runs
        launch_checks(tensors)
    return dims


def launch_checks(tensors: dict) -> None:
    """What depends on the machine and on the values, checked where the kernels will run: CUDA tensors when
    there is a GPU; no bfloat16 under the interpreter; an assembler that compiles these kernels correctly
    (:mod:`~gla_ref.triton.common.ptxas`); in debug mode, the values. ``tensors`` maps names to inputs (q first)."""
    q = tensors["q"]
    if q.device.type != "cuda" and not device.triton_interpret():
        raise ValueError(f"q is on {q.device}: Triton kernels need CUDA tensors when a GPU is present")
    if device.triton_interpret():
        refuse_interpreted_bf16(tensors)
    if q.device.type == "cuda":
        props = device_properties(q.device.index)
        ptxas.check((props.major, props.minor))
    if device.is_debug():
        check_values(tensors)


@functools.lru_cache(maxsize=None)
def device_properties(index: int):
    """torch's properties of CUDA device ``index`` (compute capability, SM count), asked once: each
    query costs µs, and launches ask on every call."""
    return torch.cuda.get_device_properties(index)


def sm_count(x: torch.Tensor) -> int | None:
    """Streaming multiprocessors of the CUDA device holding ``x``; None off CUDA."""
    if x.device.type != "cuda":
        return None
    return device_properties(x.device.index).multi_processor_count


def refuse_interpreted_bf16(tensors: dict) -> None:
    """Triton's CPU interpreter computes bfloat16 ``tl.dot`` wrongly (finite garbage, ~1e10): refuse bf16."""
    for name, x in tensors.items():
        if x is not None and x.dtype == torch.bfloat16:
            raise TypeError(f"{name} is bfloat16, which Triton's CPU interpreter computes wrongly (its bf16 "
                            "tl.dot returns garbage): on a CPU pass float32 or float16, or run on a CUDA GPU")


# ----------------------------------------------------------------------------- packed batches

class Varlen(NamedTuple):
    """A checked packed batch (FLA's ``cu_seqlens``), as the kernels' ``IS_VARLEN`` path reads it.

    ``cu_seqlens`` int64 ``[N + 1]``, contiguous, on q's device: the caller's tensor when it is one
    already, else a copy of the checked values. ``chunk_indices`` int32 ``[NT, 2]``: row p is
    (sequence, chunk inside it) of chunk program p, each sequence cut into ``⌈T_n / C⌉`` chunks from
    its own first token (none for an empty sequence); ``chunk_offsets`` int32 ``[N + 1]``: the row of
    each sequence's first chunk, the last entry being NT. Both are None without a chunk size.
    """
    cu_seqlens: torch.Tensor
    N: int
    C: int | None
    NT: int
    chunk_indices: torch.Tensor | None
    chunk_offsets: torch.Tensor | None


def prepare_packed(q, k, v, g=None, initial_state=None, *, gate_ranks=(4,), cu_seqlens=None,
                   chunk_size=None) -> tuple[Dims, Varlen | None]:
    """:func:`prepare` for a launcher that takes ``cu_seqlens``; returns ``(dims, varlen)``, varlen
    None without offsets and its chunk table None without a chunk size.

    ``cu_seqlens`` follows :func:`gla_ref._validate.read_offsets` (the rule of every form): int32 or
    int64, ``[N + 1]``, a tensor on q's device of any stride, or a NumPy array; offsets may repeat (an
    empty sequence: no rows of o, its final state its initial state). It is read on the host once (a
    device-to-host copy: for a CUDA tensor the one sync of a packed call; the backward reuses the
    table) and checked on that copy by :func:`prepare` before anything is built. The kernels read a
    contiguous int64 copy on q's device unless the caller's tensor is one (then no copy). The table
    costs ``8·NT + 4·(N + 1)`` bytes, copied to the device once per call.
    """
    host = None
    if cu_seqlens is not None:
        host = read_offsets(cu_seqlens, array_type=torch.Tensor, array_name="torch.Tensor",
                            device=q.device if isinstance(q, torch.Tensor) else None)
    dims = prepare(q, k, v, g, initial_state, gate_ranks=gate_ranks, cu_seqlens=host)
    if cu_seqlens is None:
        return dims, None
    N = len(host) - 1
    offsets = device_offsets(cu_seqlens, host, q.device)
    if chunk_size is None:
        return dims, Varlen(offsets, N, None, 0, None, None)
    host = torch.from_numpy(host)
    chunks = cdiv(host[1:] - host[:-1], chunk_size)          # ⌈T_n / C⌉ chunks per sequence (0 if empty)
    seq = torch.repeat_interleave(torch.arange(N), chunks)
    first = torch.cumsum(chunks, 0) - chunks
    table = torch.stack([seq, torch.arange(len(seq)) - first[seq]], 1).to(torch.int32)
    starts = torch.cat([first, chunks.sum()[None]]).to(torch.int32)
    return dims, Varlen(offsets, N, chunk_size, len(seq), table.to(q.device), starts.to(q.device))


def device_offsets(cu_seqlens, host, where: torch.device) -> torch.Tensor:
    """What the kernels read for ``cu_seqlens``: a contiguous int64 tensor on ``where`` (they load
    ``cu_seqlens + i`` as if contiguous). The caller's tensor when it is one already; otherwise (int32,
    a strided view, a NumPy array) a copy of ``host``, its checked values."""
    if (isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dtype == torch.int64 and cu_seqlens.is_contiguous()
            and cu_seqlens.device == where):
        return cu_seqlens
    return torch.from_numpy(host).to(where)


def varlen_args(varlen: Varlen | None) -> dict:
    """Keyword arguments of a kernel's packed path: ``cu_seqlens``, ``chunk_indices``, ``IS_VARLEN``."""
    if varlen is None:
        return dict(cu_seqlens=None, chunk_indices=None, IS_VARLEN=False)
    return dict(cu_seqlens=varlen.cu_seqlens, chunk_indices=varlen.chunk_indices, IS_VARLEN=True)


def num_chunks(T: int, chunk_size: int, varlen: Varlen | None) -> int:
    """Chunks on the chunk axis of a grid: ``⌈T/C⌉`` a batch row, or every chunk of a packed batch."""
    if varlen is None:
        return cdiv(T, chunk_size)
    assert varlen.C == chunk_size, "the chunk table was built for another chunk size"
    return varlen.NT


def num_sequences(B: int, varlen: Varlen | None) -> int:
    """Sequences (batch rows, or packed sequences): the leading size of states and initial states."""
    return B if varlen is None else varlen.N


GATE_NAMES = ("g", "g_gamma")
"""Arguments holding log-gates: checked by :func:`gla_ref._validate.check_gate_values` (finite, ≤ 0)."""


def check_values(tensors: dict) -> None:
    """Finite inputs and valid log-gates (finite, ≤ 0; the message names the first bad position, as
    the references do). Needs a device sync: only under gla_ref.device.debug."""
    for name, x in tensors.items():
        if x is None:
            continue
        if name in GATE_NAMES:
            check_gate_values(name, x)
        elif not torch.isfinite(x).all():
            raise ValueError(f"{name} contains NaN or inf")


SHOW_TUNING = "GLA_REF_SHOW_TUNING"
"""Environment variable: when ``1``, a line is printed each time Triton is about to time the autotune
configs of a kernel for a new key (on a GPU the first call at a new shape spends minutes there).
Chapters turn it on through :func:`gla_ref.runtime.setup`; benchmark scripts set it themselves."""


COMPILE_WORKERS = "GLA_REF_COMPILE_WORKERS"
"""Environment variable: how many threads compile a kernel's autotune configs side by side before the
autotuner times them one by one (default: one per config, at most 8; ``1`` compiles them one at a time
inside the autotuner, as Triton does on its own)."""


def precompile(kernel, configs: list, args: dict) -> None:
    """Compile ``kernel`` for every config in ``configs`` at once, on threads, through Triton's
    ``AsyncCompileMode`` (Triton ≥ 3.4): the autotuner then finds each binary in the kernel's cache and only
    times it. Nothing happens under the interpreter, for a single config, with ``GLA_REF_COMPILE_WORKERS=1``
    or where this Triton lacks the mode. A config that fails to compile is passed over here
    (``ignore_errors``) and fails again, with its error, when the autotuner reaches it, which handles it
    as it always does."""
    workers = int(os.environ.get(COMPILE_WORKERS, "0") or 0) or min(8, len(configs))
    if device.triton_interpret() or len(configs) < 2 or workers < 2 or AsyncCompileMode is None:
        return
    with concurrent.futures.ThreadPoolExecutor(workers) as pool, AsyncCompileMode(pool, ignore_errors=True):
        for config in configs:
            kernel.warmup(**args, **config.all_kwargs(), grid=(1,))


def autotune(configs: list, key: list, **blocks):
    """``triton.autotune`` over ``configs`` keyed by the argument names ``key``, pruning before timing:
    ``blocks`` maps a block size to the dimension it tiles (``BK="K"``), and configs whose block exceeds
    that dimension padded to a power of two (at least 32) are dropped — larger blocks only add masked
    work. Launches after the first with the same arguments' kinds skip Triton's dispatch
    (:mod:`gla_ref.triton.common.launch_cache`). Under ``GLA_REF_SHOW_TUNING=1`` it prints which kernel is being tuned, for which key, over how
    many configs."""
    def prune(candidates, named_args, **kwargs):
        args = {**named_args, **kwargs}  # constexpr dims arrive as keywords in some Triton versions
        kept = [c for c in candidates
                if all(c.kwargs[b] <= block(args[d], least=32) for b, d in blocks.items())]
        kept = kept or candidates[:1]
        if os.environ.get(SHOW_TUNING) == "1" and len(kept) > 1:
            shape = ", ".join(f"{name}={args.get(name)}" for name in key)
            print(f"autotuning {prune.kernel}: {len(kept)} configs for {shape} ...", flush=True)
        precompile(prune.jit, kept, {name: x for name, x in args.items() if name not in LAUNCH_OPTIONS})
        return kept

    def decorate(kernel):
        prune.kernel = getattr(kernel, "__name__", "a kernel")
        prune.jit = kernel
        tuner = triton.autotune(configs=configs, key=key, prune_configs_by={"early_config_prune": prune})(kernel)
        return cache_launches(tuner)

    return decorate


def autotune_configs(configs: list) -> list:
    """The configs to autotune over: only the first under the interpreter (it fails with several)."""
    return configs[:1] if device.triton_interpret() else configs


def cdiv(n: int, d: int) -> int:
    """⌈n / d⌉ on the host. (``triton.cdiv`` is a constexpr function, made for kernels: on the host each call
    costs a few µs of unwrapping, and a chunk GLA step makes a few dozen.)"""
    return -(-n // d)


def block(n: int, least: int = 16) -> int:
    """Power-of-two block covering ``n`` ≥ 1 (masks handle the rest), at least ``least``."""
    return max(least, 1 << (n - 1).bit_length())


def check_chunk_size(chunk_size, sizes=(16, 32, 64)) -> int:
    """``chunk_size`` as a Python int: an integer (:func:`gla_ref._validate.check_chunk_sizes`) in ``sizes``
    (tl.dot tiles are ≥ 16; a C × C float32 tile must fit on chip)."""
    check_chunk_sizes(chunk_size)
    if chunk_size not in sizes:
        raise ValueError(f"chunk_size must be one of {sizes}, got {chunk_size!r}")
    return int(chunk_size)


def stateful_function(name, forward, backward, doc):
    """An autograd.Function for the kernels that keep the state on chip: it saves only the inputs and
    the final state, and forwards a tuple of non-tensor options (the direction; the chunk size and the
    state's dtype in the output matmuls) and the packed batch (a :class:`Varlen` or None) to both passes.

    ``forward(q, k, v, g, h0, scale, output_final_state, *options, varlen=varlen) -> (o, ht)``;
    ``backward(q, k, v, g, h0, ht, do, dht, scale, *options, varlen=varlen) -> (dq, dk, dv, dg, dh0)``.
    """
    def fwd(ctx, q, k, v, g, initial_state, scale, output_final_state, options, varlen=None):
        q, k, v = (x.contiguous() for x in (q, k, v))
        g = None if g is None else g.contiguous()
        h0 = None if initial_state is None else initial_state.contiguous()
        o, ht = forward(q, k, v, g, h0, scale, output_final_state, *options, varlen=varlen)
        ctx.save_for_backward(q, k, v, g, h0, ht)
        ctx.scale, ctx.options, ctx.varlen = scale, options, varlen
        return o, ht

    def bwd(ctx, do, dht):
        q, k, v, g, h0, ht = ctx.saved_tensors
        dht = None if dht is None else dht.contiguous()
        grads = backward(q, k, v, g, h0, ht, do.contiguous(), dht, ctx.scale, *ctx.options, varlen=ctx.varlen)
        return (*grads, None, None, None, None)

    return type(name, (torch.autograd.Function,),
                {"__doc__": doc, "__module__": forward.__module__,
                 "forward": staticmethod(fwd), "backward": staticmethod(bwd)})


def block_configs(name: str) -> list:
    """Autotune configs over one block size ``name`` (e.g. ``"BV"``), warps and pipeline stages: the
    three that won for the four kernels using them at every measured head shape
    (``benchmarks/results/config_timings_nvidia_h200.json``; 32-wide blocks and 64 with 8 warps never did),
    and 128 with 4 warps, which took the dv kernel's share of a 256 × 512 step down by 0.6 ms on the H200."""
    return autotune_configs([triton.Config({name: b}, num_warps=w, num_stages=s)
                             for b, w, s in ((specs.BLOCK_CONFIGS_FIRST, 4, 2), (64, 4, 3), (128, 8, 2), (128, 4, 2))])
