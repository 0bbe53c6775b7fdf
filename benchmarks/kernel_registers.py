"""What fused_chunk_gla's four kernels take of a Hopper SM, read without a GPU: registers, spills, shared memory.

    python benchmarks/kernel_registers.py [--shapes 128x128 256x512] [--chunk-size 16] [--tile narrow|wide]
                                          [--shared-only] [--out PATH]

A kernel needs no device to be compiled, only a target and an assembler. Each kernel is compiled here for sm_90
at every autotune config, with the tiles its launcher picks (:func:`gla_ref.triton.fused_chunk.forward.launch_meta`)
for bf16 inputs and float32 gates. The compiled kernel's metadata gives the shared memory a block takes, and
``ptxas -v`` on its PTX (the ptxas Triton assembles with, :func:`gla_ref.triton.common.ptxas.triton_ptxas`) the
registers a thread uses and the bytes it spills to local memory. Chapter 7 found the programs that hold 256 keys
spilling on the H200; these numbers say so before any device time is spent, and say whether a change frees
registers. The counts come from this machine's Triton and ptxas: another version of either may allocate otherwise.

``--tile wide`` gives the programs that hold every key (the forward and dv kernels) the wide tile, the launcher's
pick on a full GPU at chunk size 16 (:func:`~gla_ref.triton.fused_chunk.forward.value_block`); ``narrow``, the
default, the tile it picks otherwise. The dq and dk programs have one tile. ``--shared-only`` skips ptxas (the
shared-memory test runs that way). Prints one row per kernel and config; ``--out`` writes them as JSON, stamped by
``bench.environment()`` (``-`` prints the rows as JSON, the last line of the output).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KERNELS = (("fused_chunk_fwd", "_fwd_kernel", "K"), ("fused_chunk_bwd", "_bwd_dv_kernel", "K"),
           ("fused_chunk_bwd", "_bwd_dq_kernel", "V"), ("fused_chunk_bwd", "_bwd_dk_kernel", "V"))
"""(module, kernel, the dimension its programs hold whole) for the four kernels of fused_chunk_gla."""
POINTERS = {"q", "k", "v", "o", "do", "dq", "dk", "dv", "g", "dg"}
SCALARS = {"scale": "fp32", "T": "i32", "part_stride": "i64"}


def compiled_kernels():
    """The fused kernels' modules, imported as compiled kernels (JITFunction) rather than the interpreter's
    functions, which they would be on a machine without CUDA; call before anything imports Triton."""
    import gla_ref.device

    gla_ref.device.has_cuda = lambda: True
    from gla_ref.triton.fused_chunk import backward as fused_chunk_bwd, forward as fused_chunk_fwd

    return {"fused_chunk_fwd": fused_chunk_fwd, "fused_chunk_bwd": fused_chunk_bwd}


def source(fn, const: dict):
    """The Triton source of ``fn`` with ``const`` as its constexprs and every other argument typed: bf16
    tensors, float32 gates, and the scalars' types."""
    from triton.compiler import ASTSource

    sig = {a: "constexpr" if a in const else
           ("*fp32" if a in ("g", "dg") else "*bf16") if a in POINTERS else SCALARS[a] for a in fn.arg_names}
    return ASTSource(fn=fn, signature=sig,
                     constexprs={(fn.arg_names.index(a),): x for a, x in const.items() if a in fn.arg_names})


def ptxas_report(ptx: str) -> dict:
    """Registers a thread and spill bytes of one kernel's PTX, by ``ptxas -v`` for sm_90a."""
    from gla_ref.triton.common.ptxas import triton_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        out = subprocess.run([triton_ptxas(90)[0], "-arch=sm_90a", "-v", str(path), "-o", str(path.with_suffix(".o"))],
                             capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if regs is None or spills is None:
        raise RuntimeError(f"ptxas -v printed no register or spill count:\n{text}")
    return {"registers": int(regs.group(1)), "spill_store_bytes": int(spills.group(1)),
            "spill_load_bytes": int(spills.group(2))}


def measure(K: int, V: int, C: int, tile: str = "narrow", shared_only: bool = False) -> list[dict]:
    """One row per kernel and autotune config at head shape K × V and chunk size C (see the module docstring);
    the dq and dk kernels are left out with ``tile="wide"``, which does not change them."""
    modules = compiled_kernels()
    fwd = modules["fused_chunk_fwd"]
    sm_count = fwd.sm_count
    if tile == "wide":  # one SM: every grid fills it, so the programs holding every key take the wide tile
        fwd.sm_count = lambda x: 1
    try:
        return _rows(modules, K, V, C, tile, shared_only)
    finally:
        fwd.sm_count = sm_count


def _rows(modules, K, V, C, tile, shared_only):
    """:func:`measure`'s rows, with the launcher's SM count already set for ``tile``."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    fwd = modules["fused_chunk_fwd"]
    rows = []
    for module, name, whole in KERNELS:
        if tile == "wide" and whole == "V":
            continue
        fn = getattr(modules[module], name)
        while not isinstance(fn, JITFunction):
            fn = fn.fn
        q, v = (torch.empty(1, 1, 4, D, dtype=torch.bfloat16, device="meta") for D in (K, V))
        _, meta = fwd.launch_meta(q, v, C, whole)
        meta.pop("T")
        const = dict(meta, FPREC="tf32x3", RESTART=modules["fused_chunk_bwd"].RESTART, HALVES=True, USE_G=True,
                     USE_H0=False, STORE_HT=False, USE_DHT=False, PTX=True, STATE_FP32=False,
                     h0=None, ht=None, dht=None, dh0=None)
        src = source(fn, const)
        for config in fwd.configs():
            kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": config.num_warps, "num_stages": config.num_stages})
            row = {"kernel": name, "K": K, "V": V, "C": C, "tile": tile, "BK": meta["BK"], "BV": meta["BV"],
                   "num_warps": config.num_warps, "num_stages": config.num_stages,
                   "shared_bytes": kernel.metadata.shared}
            if not shared_only:
                row.update(ptxas_report(kernel.asm["ptx"]))
            rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["128x128", "256x512"], help="KxV head shapes")
    parser.add_argument("--chunk-size", type=int, default=16)
    parser.add_argument("--tile", choices=("narrow", "wide"), default="narrow")
    parser.add_argument("--shared-only", action="store_true", help="no ptxas: shared memory only")
    parser.add_argument("--out", help="JSON path, or - for the rows as JSON on the last line")
    args = parser.parse_args(argv)
    rows = []
    for shape in args.shapes:
        K, V = map(int, shape.split("x"))
        rows += measure(K, V, args.chunk_size, args.tile, args.shared_only)
    for r in rows:
        regs = "" if args.shared_only else (f" {r['registers']:>3} registers, spills {r['spill_store_bytes']:>5} B"
                                             f" stored / {r['spill_load_bytes']:>5} B loaded,")
        print(f"{r['kernel']:<15} {r['K']}x{r['V']} C={r['C']} BK={r['BK']:<3} BV={r['BV']:<3} "
              f"{r['num_warps']} warps {r['num_stages']} stages:{regs} {r['shared_bytes'] / 1024:.0f} KiB shared")
    if args.out == "-":
        print(json.dumps(rows))
    elif args.out:
        from gla_ref import bench

        env = bench.environment()
        env["device"] = "sm_90 compiled on a CPU (no device)"
        pathlib.Path(args.out).write_text(json.dumps({"env": env, "setting": vars(args), "rows": rows}, indent=1))
        print("wrote", args.out)


if __name__ == "__main__":
    main()
