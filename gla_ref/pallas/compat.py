"""The one place that knows which Pallas names moved between JAX releases (0.10 to 0.12).

Every launcher asks this module for compiler parameters, memory spaces and interpreter
settings, so a rename in a future JAX release is fixed here and nowhere else:

* TPU compiler parameters: ``pltpu.CompilerParams`` (older: ``pltpu.TPUCompilerParams``);
* Triton compiler parameters: ``plgpu.CompilerParams`` of ``jax.experimental.pallas.triton``
  (older: ``TritonCompilerParams``). Passing them also forces the Triton backend on GPU, where
  some releases made Mosaic GPU the default of a bare ``pl.pallas_call``;
* VMEM scratch: ``pltpu.VMEM`` (older: ``pltpu.TPUMemorySpace.VMEM``);
* the TPU interpreter: ``pltpu.InterpretParams`` and its race detector, whose options grew
  over releases (only the ones this JAX knows are passed);
* lowering Triton kernels on a machine without a GPU: from JAX 0.11 the Triton lowering asks
  the device for its compute capability, so an abstract GPU must be named;
* the Mosaic GPU interpreter: its parameters (public ``plgpu.InterpretGPUParams`` from JAX 0.11,
  private before), its reset, and whether it reads transposed refs (JAX 0.11+).
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import jax
from jax.experimental import pallas as pl


def _first_attr(module, *names):
    for name in names:
        if hasattr(module, name):
            return getattr(module, name)
    raise ImportError(f"{module.__name__} has none of {names} (jax {jax.__version__})")


def pltpu():
    """``jax.experimental.pallas.tpu`` (imported on first use)."""
    from jax.experimental.pallas import tpu

    return tpu


def plgpu():
    """``jax.experimental.pallas.triton`` (imported on first use)."""
    from jax.experimental.pallas import triton

    return triton


def tpu_compiler_params(*semantics: str):
    """Mosaic compiler parameters with one ``"parallel"``/``"arbitrary"`` entry per grid axis."""
    tpu = pltpu()
    named = {"parallel": getattr(tpu, "PARALLEL", "parallel"),
             "arbitrary": getattr(tpu, "ARBITRARY", "arbitrary")}
    cls = _first_attr(tpu, "CompilerParams", "TPUCompilerParams")
    return cls(dimension_semantics=tuple(named[s] for s in semantics))


def triton_compiler_params(num_warps: int = 4, num_stages: int = 2):
    """Triton compiler parameters; their type selects the Triton backend on GPU."""
    cls = _first_attr(plgpu(), "CompilerParams", "TritonCompilerParams")
    return cls(num_warps=num_warps, num_stages=num_stages)


def vmem(shape, dtype):
    """A VMEM scratch buffer (TPU on-chip memory) of this shape and dtype."""
    tpu = pltpu()
    space = tpu.VMEM if hasattr(tpu, "VMEM") else tpu.TPUMemorySpace.VMEM
    return space(shape, dtype)


def squeezed():
    """The block-shape entry for an axis the kernel does not see (``pl.Squeezed()`` or None)."""
    return pl.Squeezed() if hasattr(pl, "Squeezed") else None


def tpu_interpret_params(*, detect_races: bool = True, random_seed: int | None = 0, num_cores: int = 1):
    """``pltpu.InterpretParams`` that emulate a TPU on the CPU as strictly as this JAX can.

    Uninitialised memory (scratch included) is filled with NaN, the "parallel" grid points run
    in a seeded random order and may be shared among ``num_cores`` emulated cores, out-of-bounds
    reads raise, and the race detector is on. Returns None when this JAX has no TPU interpreter.
    """
    tpu = pltpu()
    if not hasattr(tpu, "InterpretParams"):
        return None
    return _with_known_options(tpu.InterpretParams, detect_races=detect_races, uninitialized_memory="nan",
                               out_of_bounds_reads="raise", random_seed=random_seed, num_cores_or_threads=num_cores)


def _with_known_options(cls, **wanted):
    """``cls(**wanted)`` with only the options this JAX's ``cls`` takes (they grew over releases)."""
    known = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in wanted.items() if k in known})


def reset_tpu_interpreter() -> None:
    """Forget the TPU interpreter's state (its race record included), where this JAX has one."""
    reset = getattr(pltpu(), "reset_tpu_interpret_mode_state", None)
    if reset is not None:
        reset()


def races_found() -> bool | None:
    """Whether the TPU interpreter's race detector saw a race since the last reset (None: unknown)."""
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as state
    except ImportError:
        return None
    races = getattr(state, "races", None)
    return None if races is None else bool(races.races_found)


@contextlib.contextmanager
def abstract_gpu(device_kind: str = "NVIDIA H100"):
    """Lower (not run) GPU kernels on a machine without one, for this GPU model.

    JAX 0.11+ reads the target GPU from an abstract mesh's device; JAX 0.10 assumes a default
    compute capability, and this context does nothing when there is no ``AbstractDevice``.
    """
    AbstractDevice = getattr(jax.sharding, "AbstractDevice", None)
    if AbstractDevice is None:
        yield
        return
    gpu = AbstractDevice(device_kind=device_kind, num_cores=None, platform="gpu")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=gpu)):
        yield


# ---------------------------------------------------------------- Mosaic GPU (Hopper)

def mosaic_gpu():
    """``jax.experimental.pallas.mosaic_gpu`` (imported on first use)."""
    from jax.experimental.pallas import mosaic_gpu as mgpu

    return mgpu


@functools.cache
def _load_takes_index() -> bool:
    """Whether ``plgpu.load`` needs its index argument: JAX 0.10 requires it, 0.11 makes it optional (and
    warns when it is given), 0.12 has none."""
    idx = inspect.signature(mosaic_gpu().load).parameters.get("idx")
    return idx is not None and idx.default is inspect.Parameter.empty


def mosaic_gpu_load(ref, layout):
    """The whole SMEM ``ref`` as a register array in ``layout`` (``plgpu.load``), on every JAX since 0.10."""
    return mosaic_gpu().load(ref, (), layout=layout) if _load_takes_index() else mosaic_gpu().load(ref, layout=layout)


def gpu_interpret_params(*, detect_races: bool = True):
    """Parameters of the Mosaic GPU interpreter (SMEM, TMA copies, barriers and ``wgmma`` simulated
    on the CPU): ``plgpu.InterpretGPUParams`` from JAX 0.11, the private class before. Uninitialised
    memory is NaN, out-of-bounds reads raise, and the race detector is on where this JAX has one.
    Returns None when this JAX has no Mosaic GPU interpreter."""
    cls = getattr(mosaic_gpu(), "InterpretGPUParams", None)
    if cls is None:
        try:
            from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams as cls
        except ImportError:
            return None
    return _with_known_options(cls, detect_races=detect_races, uninitialized_memory="nan", out_of_bounds_reads="raise")


def reset_gpu_interpreter() -> None:
    """Forget the Mosaic GPU interpreter's state; JAX needs this after an exception inside it."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import reset_gpu_interpret_mode_state
    except ImportError:
        return
    reset_gpu_interpret_mode_state()


def gpu_interpreter_reads_transposed_refs() -> bool:
    """Whether the Mosaic GPU interpreter reads a transposed view (``ref.transpose``) (JAX 0.11+: its
    ``to_access``); JAX 0.10's reads only index transforms, so a launcher gives it a transposed copy."""
    try:
        from jax._src.pallas.mosaic.interpret import utils
    except ImportError:
        return False
    return hasattr(utils, "to_access")


def mosaic_gpu_runs_here() -> bool:
    """True when JAX's default device (:func:`gla_ref.device.jax_default_device`, so not inside a
    ``jax.default_device`` context naming the CPU) is a Hopper GPU (compute capability 9.0) and this JAX
    has Pallas' Mosaic GPU backend."""
    from gla_ref.device import jax_default_device

    try:
        dev = jax_default_device()
        mosaic_gpu()
    except (RuntimeError, ImportError):
        return False
    return dev.platform == "gpu" and str(getattr(dev, "compute_capability", "")).startswith("9.")
