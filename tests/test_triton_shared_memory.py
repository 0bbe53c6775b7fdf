"""The fused kernels fit a Hopper block's shared memory at every chunk size and head size they accept.

No GPU is needed: Triton compiles a kernel for sm_90 on a CPU, and the compiled kernel's metadata says how
much shared memory a block takes (the pipeline stages of its loads, its layout conversions). A kernel whose
every autotune config needs more than the 227 KiB a Hopper block can have fails at its first launch on a
GPU (``OutOfResources``), so this is checked here, in a subprocess: under the CPU interpreter, the test
process's kernels are interpreted functions, which do not compile. ``_bwd_dk_kernel`` is not autotuned; it
runs with the config the dq kernel chose, so every config that fits the dq kernel must fit it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

HOPPER_SMEM = 232448  # bytes of shared memory a block may opt into on sm_90 (227 KiB)

_SCRIPT = textwrap.dedent('''
    import json, sys
    import gla_ref.device
    gla_ref.device.has_cuda = lambda: True  # compiled kernels (JITFunction), not the interpreter's
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction
    from gla_ref.triton import fused_chunk_bwd, fused_chunk_fwd

    K, V, C = (int(x) for x in sys.argv[1:4])
    wide = sys.argv[4] == "wide"
    if wide:  # one SM: every grid fills it, so the programs holding every key take the wide tile
        fused_chunk_fwd.sm_count = lambda x: 1
    POINTERS = {"q", "k", "v", "o", "do", "dq", "dk", "dv", "g", "dg"}
    out = {}
    for module, name, whole in ((fused_chunk_fwd, "_fwd_kernel", "K"), (fused_chunk_bwd, "_bwd_dv_kernel", "K"),
                                (fused_chunk_bwd, "_bwd_dq_kernel", "V"), (fused_chunk_bwd, "_bwd_dk_kernel", "V")):
        if wide and whole == "V":
            continue  # the dq and dk programs have one tile
        fn = getattr(module, name)
        while not isinstance(fn, JITFunction):
            fn = fn.fn
        q, v = (torch.empty(1, 1, 4, D, dtype=torch.bfloat16, device="meta") for D in (K, V))
        _, meta = fused_chunk_fwd.launch_meta(q, v, C, whole)  # the tiles the launchers pick
        meta.pop("T")
        const = dict(meta, FPREC="tf32x3", RESTART=fused_chunk_bwd.RESTART, HALVES=True, USE_G=True, USE_H0=False, STORE_HT=False, USE_DHT=False, PTX=True,
                     h0=None, ht=None, dht=None, dh0=None)
        sig = {}
        for arg in fn.arg_names:
            if arg in const:
                sig[arg] = "constexpr"
            elif arg in POINTERS:
                sig[arg] = "*fp32" if arg in ("g", "dg") else "*bf16"
            else:
                sig[arg] = {"scale": "fp32", "T": "i32", "part_stride": "i64"}[arg]
        src = ASTSource(fn=fn, signature=sig,
                        constexprs={(fn.arg_names.index(a),): x for a, x in const.items() if a in fn.arg_names})
        out[name] = {}
        for config in fused_chunk_fwd.configs():
            opts = {"num_warps": config.num_warps, "num_stages": config.num_stages}
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
            out[name][f"{config.num_warps}x{config.num_stages}"] = kernel.metadata.shared
    print(json.dumps(out))
''')


@pytest.mark.parametrize("K, V, C, tile", [(256, 512, 64, "narrow"), (128, 256, 64, "narrow"), (256, 512, 16, "wide")])
def test_fused_kernels_fit_hopper_shared_memory(K, V, C, tile):
    """At least one autotune config of each tuned kernel fits (the autotuner passes over the rest), and the
    dk kernel fits with every config that fits the dq kernel. (K = 256 at C = 64 needs the one-stage config.)
    ``wide``: the forward and dv kernels with the tile :func:`fused_chunk_fwd.value_block` picks on a full grid,
    at the one chunk size it is taken at (C = 64 would not fit: 232 KiB for dv's leanest config)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(K), str(V), str(C), tile], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    smem = json.loads(proc.stdout.strip().splitlines()[-1])
    if tile == "wide":
        assert set(smem) == {"_fwd_kernel", "_bwd_dv_kernel"}
    for name in set(smem) & {"_fwd_kernel", "_bwd_dv_kernel", "_bwd_dq_kernel"}:
        assert min(smem[name].values()) <= HOPPER_SMEM, (name, smem[name])
    for config, used in smem.get("_bwd_dq_kernel", {}).items():
        if used <= HOPPER_SMEM:
            assert smem["_bwd_dk_kernel"][config] <= HOPPER_SMEM, (config, smem)
