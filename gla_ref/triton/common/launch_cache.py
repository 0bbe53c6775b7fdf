"""The host side of a launch: a shortcut past Triton's dispatch for a launch that has been seen before.

``kernel[grid](*args)`` is not free on the host. Triton's autotuner builds its key from the arguments and
looks up its config; the JIT binds every argument, classifies it (dtype, 16-byte alignment, integer value
class), hashes that into a cache key and finds the compiled binary; only then does the launch itself happen.
On the H200's host that costs 47 µs a launch through the autotuner and 35 µs through the JIT alone, where the
compiled binary, called directly, takes 23 µs (``chunk_output_kernel``, 128 × 128 heads). A forward and
backward step of :func:`gla_ref.triton.chunk_gla` launches ten kernels, and at B = 8, H = 16, T = 1K the GPU
runs them in 1.05 ms while the host needs 1.7 ms to issue them: at short sequences the host sets the pace.

:func:`cached_run` keeps, per kernel, the compiled binary (and the autotuner's config) of each launch
under a key of its own, :func:`launch_key`, which separates at least as finely as Triton does: the current
device, and for every argument a tensor's dtype and address modulo 16 (Triton compiles for 16-byte-aligned
pointers when they are), any other value by its type and value (Triton compiles for an integer's class
only: 1, multiples of 16, the rest). The first launch under a key goes through Triton (autotuning,
compiling) and hands back the binary; later ones evaluate the grid with the config's block sizes and call
the binary with the arguments in the kernel's order, as Triton's own JIT does after its lookup. A new
sequence length is a new key: one pass through Triton's path, then the shortcut again.

The shortcut leaves out what Triton's JIT checks on every call besides the lookup: its pre-run hooks and
its check that the global variables a kernel read when it was compiled still hold the same values. The
kernels of ``gla_ref.triton`` register no hooks and read only module constants. A kernel whose ``configs``
are changed after it has launched keeps serving what it stored: clear its ``launches`` as well (the
config sweep pins configs in fresh processes, before any launch).

Nothing changes under Triton's CPU interpreter (there is no binary to keep), for a launch that only
compiles (``warmup``), for a config with a ``pre_hook``, or with ``GLA_REF_LAUNCH_CACHE=0`` (every launch
then takes Triton's path; the benchmarks compare the two). Checked on Triton 3.6 (H200): the GPU tests
compare every kernel output and gradient through both paths.
"""

from __future__ import annotations

import os

import torch
from triton.compiler.compiler import CompiledKernel
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

SWITCH = "GLA_REF_LAUNCH_CACHE"
"""Environment variable: ``0`` sends every launch through Triton's autotuner and JIT (read at each launch)."""

MAX_KEYS = 1024
"""Keys kept per kernel; the table starts afresh past it (packed batches bring a new length per batch)."""

LAUNCH_OPTIONS = ("grid", "warmup")
"""What ``kernel[grid](...)`` adds to a kernel's own arguments on their way to ``run``."""


def enabled() -> bool:
    """Whether a launch seen before may take the shortcut now (:data:`SWITCH` is not ``0``). The benchmarks
    record it; under Triton's interpreter no kernel has the shortcut either way."""
    return os.environ.get(SWITCH) != "0"


def launch_key(args, kwargs) -> tuple:
    """What tells one compiled binary of a kernel from another (see the module docstring): the current
    device, then per argument, positional ones first and keywords by name, a tensor's dtype and address
    modulo 16, and anything else's type and value."""
    def part(x):
        if isinstance(x, torch.Tensor):
            return x.dtype, x.data_ptr() % 16
        return type(x), x

    return (torch.cuda.current_device(), tuple(part(x) for x in args),
            tuple((name, part(x)) for name, x in kwargs.items() if name not in LAUNCH_OPTIONS))


def cached_run(kernel, slow_run, args, kwargs):
    """``kernel.run`` (what ``kernel[grid](...)`` calls) with the shortcut: ``slow_run`` is Triton's own
    ``run``, taken for a launch whose :func:`launch_key` is new, or that the shortcut cannot reproduce."""
    if kwargs.get("warmup") or not enabled():
        return slow_run(*args, **kwargs)
    key = launch_key(args, kwargs)
    known = kernel.launches.get(key)
    if known is None:
        compiled = slow_run(*args, **kwargs)
        if len(kernel.launches) >= MAX_KEYS:
            kernel.launches.clear()
        kernel.launches[key] = _entry(kernel, compiled, args, kwargs)
        return compiled
    if not known:
        return slow_run(*args, **kwargs)
    compiled, config = known
    named = dict(zip(kernel.arg_names, args), **kwargs)
    if config is not None:
        kernel.best_config = config
        named.update(config.kwargs)
    grid = kwargs["grid"]
    grid = tuple(grid(named) if callable(grid) else grid) + (1, 1)
    compiled[grid[:3]](*[named[name] for name in kernel.arg_names])
    return compiled


def _entry(kernel, compiled, args, kwargs):
    """``(binary, config)`` for the shortcut, or False: no binary (the interpreter's run), a config with a
    pre_hook, or a parameter left to its default (the shortcut passes exactly what it was given)."""
    config = kernel.best_config if isinstance(kernel, Autotuner) else None
    given = set(kernel.arg_names[:len(args)]) | set(kwargs) | set(config.kwargs if config else ())
    usable = (isinstance(compiled, CompiledKernel) and (config is None or config.pre_hook is None)
              and given.issuperset(kernel.arg_names))
    return (compiled, config) if usable else False


class CachedAutotuner(Autotuner):
    """An autotuned kernel with the launch shortcut (:func:`cached_run`)."""

    def run(self, *args, **kwargs):
        return cached_run(self, super().run, args, kwargs)


class CachedJIT(JITFunction):
    """A jitted kernel with the launch shortcut (:func:`cached_run`)."""

    def run(self, *args, **kwargs):
        return cached_run(self, super().run, args, kwargs)


def cache_launches(kernel):
    """Give a compiled kernel (``@triton.jit``, or ``triton.autotune`` over one) the launch shortcut, in
    place (a subclass with no state of its own, so the swap is allowed), and return it. A kernel that will run
    in Triton's interpreter is returned as it is."""
    inner = kernel.fn if type(kernel) is Autotuner else kernel
    if type(inner) is not JITFunction:
        return kernel
    kernel.__class__ = CachedAutotuner if type(kernel) is Autotuner else CachedJIT
    kernel.launches = {}
    return kernel
