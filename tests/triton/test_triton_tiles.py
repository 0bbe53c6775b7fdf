"""Device helpers of ``gla_ref.triton.common.tiles`` that a kernel's float64 comparison covers only in passing: the
reverse cumulative sum as a matmul, and the block barrier around it (Triton's interpreter on a CPU, the compiled
kernel with the PTX barrier on a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

import gla_ref.triton  # noqa: E402, F401  (picks the interpreter on a CPU before any kernel below is defined)
from gla_ref.triton.common.tiles import reverse_cumsum, reverse_cumsum_dot, synced  # noqa: E402


@triton.jit
def _reverse_sums(x, out_dot, out_scan, C: tl.constexpr, D: tl.constexpr, PTX: tl.constexpr):
    offs = tl.arange(0, C)[:, None] * D + tl.arange(0, D)[None, :]
    b_x = synced(tl.load(x + offs), PTX)
    tl.store(out_dot + offs, reverse_cumsum_dot(b_x, C))
    tl.store(out_scan + offs, reverse_cumsum(b_x))


@pytest.mark.parametrize("C, D", [(16, 16), (16, 32), (64, 16)])
def test_reverse_cumsum_dot_matches_the_scan_and_float64(C, D):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(C, D, device=dev, generator=torch.Generator(dev).manual_seed(C + D))
    out_dot, out_scan = torch.empty_like(x), torch.empty_like(x)
    _reverse_sums[(1,)](x, out_dot, out_scan, C=C, D=D, PTX=dev == "cuda")
    want = x.double().flip(0).cumsum(0).flip(0)
    scale = want.abs().max().item()
    assert (out_dot.double() - want).abs().max().item() < 1e-6 * scale * C
    assert (out_scan.double() - want).abs().max().item() < 1e-6 * scale * C
    assert torch.equal(out_dot[-1], x[-1])  # the last row sums one term: exact
