"""Why ``fused_chunk_gla``'s gate gradient drifts with T in bf16: its backward's arithmetic, emulated on a CPU.

    python benchmarks/fused_dg_error_model.py [--T 1024 4096 16384] [--out PATH] [--smoke]

On the H200, the fused kernel's bf16 dg moved away from float64 as T grew (relative RMSE 5.7e-3 at T = 4096,
1.0e-2 at 16384) while its dq, dk and dv did not (``fused_tf32_rounding_nvidia_h200.json``). This script
repeats the backward of ``gla_ref/triton/fused_chunk/backward.py`` for one head in PyTorch, chunk by chunk in the
kernels' order, with the same products: the four matmuls that take a float32 operand on the tensor cores
(dO Sᵀ, (K ⊙ exp(b_C − b))ᵀ V, V dSᵀ and (Q ⊙ exp b)ᵀ dO) see their operands as TF32, truncated (as
Triton hands them to the tensor cores) or rounded to nearest; every other product is float32, as the kernels' IEEE and three-TF32 matmuls nearly are. The inputs are bf16 values;
the reference is the same function in float64 on the same values, so what is measured is the arithmetic's
error alone (the GPU table's float64 reference also sees the inputs before rounding, about 3.5e-3 more).

Variants (rows): ``truncated`` (the kernels), ``rounded``, ``float32`` (no TF32 at all), and
``identity every M``: truncated operands, but the sum of dB over the later tokens is restarted every M tokens
from ``Σ_v S ⊙ dS`` at that boundary (the state leaving the token, kept by the forward sweep, times its
gradient: chapter 6's identity, which ``chunk_gla`` uses at every chunk), so it runs over at most M tokens.
The initial state and the final-state cotangent are zero. Writes
``benchmarks/results/fused_dg_error_model_cpu.json`` (``--smoke``: a tiny head, a temporary file).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gla_ref import bench, testing  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def tf32_truncated(x: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` with its 13 low mantissa bits cleared: TF32 by truncation, towards zero."""
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def tf32_nearest(x: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` rounded to the nearest TF32 value (halfway cases away from zero, as PTX ``cvt.rna``)."""
    return ((x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def backward(q, k, v, g, do, chunk_size: int, operand=None, every=None):
    """dq, dk, dg of one head (``q, k, g: [T, K]``, ``v, do: [T, V]``, T a multiple of ``chunk_size``) in
    the fused kernels' order and in the inputs' dtype. ``operand`` maps each TF32 matmul's float32 operands
    (default: unchanged); ``every`` (tokens, a multiple of the chunk): restart dg's running sum there from
    ``Σ_v S ⊙ dS``."""
    T, K = q.shape
    C, scale = chunk_size, K ** -0.5
    op = operand or (lambda x: x)
    mm = lambda a, b: op(a) @ op(b)  # noqa: E731  a TF32 matmul
    chunks = [slice(n * C, n * C + C) for n in range(T // C)]
    lower = torch.tril(torch.ones(C, C, dtype=q.dtype))
    b = [lower @ g[c] for c in chunks]  # cumulative gates inside each chunk (an exact matmul in the kernels)
    decay = [torch.exp(bn[:, None, :] - bn[None, :, :]) * lower[:, :, None] for bn in b]  # [i, j, key], j ≤ i
    dq, dk, dg = torch.empty_like(q), torch.empty_like(k), torch.empty_like(q)
    S, kept = torch.zeros(K, v.shape[1], dtype=q.dtype), {}
    for n, c in enumerate(chunks):  # the dq kernel: a forward sweep rebuilding S
        intra = torch.einsum("ij,jd,ijd->id", do[c] @ v[c].T, k[c], decay[n])
        dq[c] = (mm(do[c], S.T) * torch.exp(b[n]) + intra) * scale
        S = S * torch.exp(b[n][-1])[:, None] + mm((k[c] * torch.exp(b[n][-1] - b[n])).T, v[c])
        if every and (c.stop % every == 0):
            kept[n] = S
    dS, later = torch.zeros_like(S), torch.zeros(K, dtype=q.dtype)
    for n in reversed(range(len(chunks))):  # the dk kernel: a reverse sweep carrying dS and the running sum
        c = chunks[n]
        intra = torch.einsum("ij,id,ijd->jd", do[c] @ v[c].T, q[c] * scale, decay[n])
        dk[c] = intra + mm(v[c], dS.T) * torch.exp(b[n][-1] - b[n])
        if n in kept:
            later = (kept[n] * dS).sum(1)
        dB = q[c] * dq[c] - k[c] * dk[c]
        dg[c] = later + dB.flip(0).cumsum(0).flip(0)
        later = later + dB.sum(0)
        dS = dS * torch.exp(b[n][-1])[:, None] + mm((q[c] * scale * torch.exp(b[n])).T, do[c])
    return dq, dk, dg


def variants(everies) -> dict:
    """Row name -> (operand map, every)."""
    out = {"truncated": (tf32_truncated, None), "rounded": (tf32_nearest, None), "float32": (None, None)}
    out.update({f"identity every {m}": (tf32_truncated, m) for m in everies})
    return out


def head(T, K, V, seed):
    """bf16-valued q, k, v, dO (as float32) and float32 log-gates of the paper's strength (logsigmoid / 16)."""
    gen = torch.Generator().manual_seed(seed)
    bf16 = lambda x: x.to(torch.bfloat16).float()  # noqa: E731
    q, k = (bf16(torch.randn(T, K, generator=gen)) for _ in range(2))
    v, do = (bf16(torch.randn(T, V, generator=gen)) for _ in range(2))
    return q, k, v, torch.nn.functional.logsigmoid(torch.randn(T, K, generator=gen)) / 16, do


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--smoke", action="store_true", help="K = V = 16, T = 64 and 128, a temporary file")
    args = parser.parse_args(argv)
    K = V = 16 if args.smoke else 128
    C, everies = 16, ([32] if args.smoke else [256, 1024])
    Ts = [64, 128] if args.smoke else args.T
    rows = []
    for T in Ts:
        x = head(T, K, V, seed=T)
        ref = backward(*(t.double() for t in x), C)
        for name, (operand, every) in variants(everies).items():
            out = backward(*x, C, operand, every)
            rows.append({"T": T, "K": K, "V": V, "chunk_size": C, "variant": name,
                         **{n: testing.rel_rmse(r, o) for n, o, r in zip(("dq", "dk", "dg"), out, ref)}})
            print({k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    result = {"env": bench.environment(), "setting": {"K": K, "V": V, "chunk_size": C, "inputs": "bf16 values",
                                                      "gates": "logsigmoid(randn) / 16"}, "rows": rows}
    path = bench.write_result(result, "fused_dg_error_model", RESULTS, args.out, args.smoke)
    print("wrote", path)
    return path


if __name__ == "__main__":
    main()
