"""The fused kernels fit a Hopper block's shared memory at every chunk size and head size they accept.

No GPU is needed: Triton compiles a kernel for sm_90 on a CPU, and the compiled kernel's metadata says how
much shared memory a block takes (the pipeline stages of its loads, its layout conversions). A kernel whose
every autotune config needs more than the 227 KiB a Hopper block can have fails at its first launch on a
GPU (``OutOfResources``), so this is checked here, in a subprocess: under the CPU interpreter, the test
process's kernels are interpreted functions, which do not compile. ``_bwd_dk_kernel`` is not autotuned; it
runs with the config the dq kernel chose, so every config that fits the dq kernel must fit it too. The compiling
is ``benchmarks/kernel_registers.py``'s, which also reads registers and spills off ptxas (the last test).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

# each case compiles every autotune config of the fused kernels for sm_90 in a fresh process: 1 to 5 min of CPU
pytestmark = pytest.mark.slow

HOPPER_SMEM = 232448  # bytes of shared memory a block may opt into on sm_90 (227 KiB)

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, "benchmarks")
    import kernel_registers  # compiles each kernel for sm_90 at every autotune config (benchmarks/kernel_registers.py)

    K, V, C = (int(x) for x in sys.argv[1:4])
    out = {}
    for r in kernel_registers.measure(K, V, C, sys.argv[4], shared_only=True):
        out.setdefault(r["kernel"], {})[f"{r['num_warps']}x{r['num_stages']}"] = r["shared_bytes"]
    print(json.dumps(out))
''')


def _run(*args) -> subprocess.CompletedProcess:
    """``args`` run by this Python in the repository root, without the interpreter switch."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


@pytest.mark.parametrize("K, V, C, tile", [(256, 512, 64, "narrow"), (128, 256, 64, "narrow"), (256, 512, 16, "wide")])
def test_fused_kernels_fit_hopper_shared_memory(K, V, C, tile):
    """At least one autotune config of each tuned kernel fits (the autotuner passes over the rest), and the
    dk kernel fits with every config that fits the dq kernel. (K = 256 at C = 64 needs the one-stage config.)
    ``wide``: the forward and dv kernels with the tile :func:`fused_chunk_fwd.value_block` picks on a full grid,
    at the one chunk size it is taken at (C = 64 would not fit: 232 KiB for dv's leanest config)."""
    proc = _run("-c", _SCRIPT, str(K), str(V), str(C), tile)
    assert proc.returncode == 0, proc.stderr[-3000:]
    smem = json.loads(proc.stdout.strip().splitlines()[-1])
    if tile == "wide":
        assert set(smem) == {"_fwd_kernel", "_bwd_dv_kernel"}
    for name in set(smem) & {"_fwd_kernel", "_bwd_dv_kernel", "_bwd_dq_kernel"}:
        assert min(smem[name].values()) <= HOPPER_SMEM, (name, smem[name])
    for config, used in smem.get("_bwd_dq_kernel", {}).items():
        if used <= HOPPER_SMEM:
            assert smem["_bwd_dk_kernel"][config] <= HOPPER_SMEM, (config, smem)


def test_kernel_registers_reads_ptxas():
    """benchmarks/kernel_registers.py at a small head: a row per kernel and config, each with the registers and spill
    bytes ptxas reports and the same shared memory as without ptxas; its JSON comes last."""
    proc = _run("benchmarks/kernel_registers.py", "--shapes", "64x64", "--out", "-")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    kernels = {r["kernel"] for r in rows}
    configs = {k: {(r["num_warps"], r["num_stages"]) for r in rows if r["kernel"] == k} for k in kernels}
    assert set(configs) == {"_fwd_kernel", "_bwd_dv_kernel", "_bwd_dq_kernel", "_bwd_dk_kernel"}
    assert len({frozenset(c) for c in configs.values()}) == 1 and len(configs["_fwd_kernel"]) > 1  # every config, each
    assert all(0 < r["registers"] <= 255 and r["spill_store_bytes"] >= 0 and r["spill_load_bytes"] >= 0 for r in rows)
    smem = json.loads(_run("-c", _SCRIPT, "64", "64", "16", "narrow").stdout.strip().splitlines()[-1])
    assert all(r["shared_bytes"] == smem[r["kernel"]][f"{r['num_warps']}x{r['num_stages']}"] for r in rows)

