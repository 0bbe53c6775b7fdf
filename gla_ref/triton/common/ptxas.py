"""The ptxas that Triton assembles our kernels with, checked once per GPU before the first launch.

Triton lowers a kernel to PTX and hands it to NVIDIA's assembler, ptxas, for the GPU's machine code.
On Hopper (sm_90) the ptxas of CUDA 12.8.93, the one Triton 3.6 bundles, turns some of these kernels
into code that reads shared memory outside its allocation, in some runs and not others: on an H200,
chunk_simple_gla (V = 256, half precision) died with an illegal memory access on 7 of 27 pinned
autotune configs, and compute-sanitizer once caught ``Invalid __shared__ read of size 1024 bytes``
(a tensor-core operand read) in its output kernel. With ptxas 12.9.86, 13.0.88 or 13.2.86 the same
kernels ran clean on every config swept (``benchmarks/results/triton_config_sweep_nvidia_h200.json``,
``memcheck_ptxas12.8_nvidia_h200.txt``).

:func:`check` leaves a good ptxas alone. Given a bad one it points Triton at the first good ptxas
it finds (the CUDA toolkit's, one on PATH, or pip's ``nvidia-cuda-nvcc``) and warns; with none,
or when the user chose the bad one through Triton's environment variable, it raises and says what
to install. ``GLA_REF_PTXAS_CHECK=0`` turns the check off (to reproduce the fault).
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import warnings
from functools import lru_cache

FIRST_GOOD = (12, 9)
"""The oldest ptxas release that assembles these kernels correctly on Hopper."""
SWITCH = "GLA_REF_PTXAS_CHECK"
GOOD = ".".join(map(str, FIRST_GOOD))
REMEDY = (f'pip install "nvidia-cuda-nvcc-cu12==12.9.86" (gla_ref then finds its ptxas), install a CUDA '
          f"toolkit ≥ {GOOD}, or set {{var}} to such a ptxas")


@lru_cache(maxsize=None)
def release(path: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of the ptxas at ``path`` (None if it does not run)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"V(\d+)\.(\d+)\.(\d+)", out)
    return tuple(map(int, found.groups())) if found else None


def triton_ptxas(arch: int) -> tuple[str, str]:
    """The ptxas Triton uses for ``arch`` (e.g. 90) and the environment variable that overrides it:
    Triton 3.6 gives sm_90 its ``ptxas`` (12.8.93), Triton 3.9 its ``ptxas-blackwell`` (13.4.59)."""
    try:
        from triton import knobs
        from triton.backends.nvidia import compiler
    except ImportError:  # Triton before its knobs module (3.3): one ptxas, bundled or TRITON_PTXAS_PATH
        import triton

        bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        return os.environ.get("TRITON_PTXAS_PATH") or bundled, "TRITON_PTXAS_PATH"
    try:
        tool = compiler.get_ptxas(arch)
    except TypeError:  # a Triton whose get_ptxas takes no arch
        tool = compiler.get_ptxas()
    blackwell = getattr(knobs.nvidia, "ptxas_blackwell", None)
    uses_blackwell = blackwell is not None and tool.path == blackwell.path != knobs.nvidia.ptxas.path
    return tool.path, "TRITON_PTXAS_BLACKWELL_PATH" if uses_blackwell else "TRITON_PTXAS_PATH"


def candidates() -> list[str]:
    """ptxas binaries on this machine other than Triton's: the CUDA toolkit's, PATH's, pip's."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    paths = [os.path.join(h, "bin", "ptxas") for h in homes if h] + [shutil.which("ptxas")]
    try:
        import nvidia  # namespace package of NVIDIA's pip wheels (nvidia/cuda_nvcc, nvidia/cu13)

        paths += sorted(p for root in nvidia.__path__ for p in glob.glob(os.path.join(root, "*", "bin", "ptxas")))
    except ImportError:
        pass
    return list(dict.fromkeys(p for p in paths if p and os.path.isfile(p)))


def driver_cuda_major() -> int | None:
    """The major CUDA version the installed driver supports (a newer ptxas's code may not load)."""
    try:
        version = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return version.value // 1000
    except (OSError, AttributeError):
        return None


def usable(path: str) -> bool:
    """A ptxas at least FIRST_GOOD whose code the driver can load."""
    version, driver = release(path), driver_cuda_major()
    return version is not None and version >= FIRST_GOOD and (driver is None or version[0] <= driver)


@lru_cache(maxsize=None)
def check(capability: tuple[int, int]) -> None:
    """Make sure Triton assembles for a GPU of this compute capability with a good ptxas (see above)."""
    if capability[0] != 9 or os.environ.get(SWITCH) == "0":
        return
    path, var = triton_ptxas(capability[0] * 10 + capability[1])
    version = release(path)
    if version is not None and version >= FIRST_GOOD:
        return
    found = "ptxas " + (".".join(map(str, version)) if version else "of unknown version")
    why = (f"Triton would assemble the kernels with {found} at {path}, which miscompiles shared-memory reads of "
           f"these kernels on Hopper (illegal memory accesses; see gla_ref.triton.common.ptxas)")
    if os.environ.get(var):
        raise RuntimeError(f"{why}. {var} chose it: point {var} at ptxas ≥ {GOOD} or unset it. "
                           f"{SWITCH}=0 skips this check.")
    good = next((p for p in candidates() if usable(p)), None)
    if good is None:
        raise RuntimeError(f"{why}, and no ptxas ≥ {GOOD} was found. Fix: {REMEDY.format(var=var)}. "
                           f"{SWITCH}=0 skips this check.")
    os.environ[var] = good
    from triton.backends.nvidia import compiler

    cached = getattr(compiler, "get_ptxas_version", None)  # its answer is part of Triton's cache key
    getattr(cached, "cache_clear", lambda: None)()
    warnings.warn(f"{why}; gla_ref set {var}={good} (ptxas {'.'.join(map(str, release(good)))}) for this "
                  f"process. Set {var} yourself to choose another.", RuntimeWarning, stacklevel=4)  # the user's call


def in_effect(capability: tuple[int, int]) -> str:
    """The release and path of the ptxas the kernels are assembled with on this GPU (after :func:`check`)."""
    check(capability)
    path, _ = triton_ptxas(capability[0] * 10 + capability[1])
    version = release(path)
    return f"{'.'.join(map(str, version)) if version else 'unknown'} ({path})"
