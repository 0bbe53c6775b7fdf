"""Chapter 4's first Triton kernel (gla_ref.teaching.triton_first_kernel): the chunk-local cumulative log-gate.

Checked against the float64 cumsum restarted at every chunk and against the library's step 1
(chunk_cumsum.chunk_local_cumsum), at awkward sizes: T = 1, T shorter than a chunk, T one past a
chunk boundary, K = 1 and K not a power of two, several batch rows and heads. On a CPU it runs in
Triton's interpreter; with CUDA the same cases run natively, plus one tensor past 2³¹ elements.
"""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gla_ref import device  # noqa: E402
from gla_ref.testing import as_torch, assert_close, random_inputs  # noqa: E402
from gla_ref.teaching import triton_first_kernel as first_kernel  # noqa: E402
from gla_ref.triton.chunk.cumsum import chunk_local_cumsum  # noqa: E402
from gla_ref.teaching.triton_first_kernel import first_chunk_cumsum, first_cumsum_kernel  # noqa: E402

DEV = device.torch_device()
CUDA = torch.cuda.is_available()
TOL = 1e-6  # relative RMSE: float32 sums of at most 64 terms, against float64

SHAPES = [  # (B, T, H, K, C)
    (1, 1, 1, 1, 16),       # one token, one channel
    (2, 37, 3, 20, 16),     # T: two full chunks and a partial one; K not a power of two
    (1, 15, 2, 7, 64),      # T shorter than one chunk
    (1, 65, 1, 24, 64),     # one token past a chunk boundary
    (3, 70, 2, 100, 32),    # K = 100 padded to a block of 128
    (1, 48, 1, 256, 16),    # K at its limit
]


def _gates(B, T, H, K, dtype, seed=0):
    g = random_inputs(B=B, T=T, H=H, K=K, V=1, seed=seed, tau=2.0)["g"]
    return as_torch({"g": g}, dtype=dtype, device=DEV)["g"]


def _reference(g, C):
    """float64 cumsum of the (rounded) gates, restarted every C tokens."""
    return torch.cat([piece.cumsum(1) for piece in g.double().cpu().split(C, dim=1)], dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}C{}".format(*s))
def test_matches_float64_and_the_library_step(shape, dtype):
    B, T, H, K, C = shape
    g = _gates(B, T, H, K, dtype)
    b = first_chunk_cumsum(g, C)
    assert b.dtype == torch.float32 and b.shape == g.shape and b.device == g.device
    assert_close("first kernel vs float64", _reference(g, C), b, TOL)
    lib = chunk_local_cumsum(g, C)
    if device.triton_interpret():  # the same sums in the same order
        assert torch.equal(b, lib)
    else:
        assert_close("first kernel vs chunk_local_cumsum", lib, b, TOL)


def test_every_chunk_restarts_and_only_decreases():
    B, T, H, K, C = 2, 50, 2, 9, 16
    g = _gates(B, T, H, K, torch.float32, seed=3)
    b = first_chunk_cumsum(g, C).cpu()
    starts = list(range(0, T, C))
    assert torch.equal(b[:, starts], g.cpu()[:, starts])  # the first row of a chunk is its own gate
    inside = [t for t in range(T) if t % C]
    assert (b[:, inside] <= b[:, [t - 1 for t in inside]]).all()  # log-gates <= 0: never increases


def test_no_store_outside_the_tensor():
    """Launch on views into a larger buffer filled with a sentinel: masked-off rows (past T) and
    columns (past K) must leave the sentinel where it is."""
    B, T, H, K, C = 1, 21, 2, 5, 16  # T = 21: the second chunk has 11 masked rows; BK = 8: 3 masked columns
    g = _gates(B, T, H, K, torch.float32, seed=5)
    buf = torch.full((B * T * H * K + 4096,), -123.0, device=DEV)
    b = buf[: B * T * H * K].view(B, T, H, K)
    first_cumsum_kernel[(2, B * H)](g, b, T, H=H, K=K, C=C, BK=8)
    assert_close("in place", _reference(g, C), b, TOL)
    assert (buf[B * T * H * K:] == -123.0).all(), "the kernel wrote past the end of its output"


@pytest.mark.parametrize("num_warps, num_stages", [(1, 1), (8, 3)])
def test_launch_options_do_not_change_the_result(num_warps, num_stages):
    g = _gates(2, 40, 2, 12, torch.float32, seed=7)
    ref = first_chunk_cumsum(g, 32)
    got = first_chunk_cumsum(g, 32, num_warps=num_warps, num_stages=num_stages)
    assert_close(f"num_warps={num_warps}, num_stages={num_stages}", ref, got, TOL)


@pytest.mark.parametrize("call, exc, match", [
    (lambda g: first_chunk_cumsum([[1.0]], 16), TypeError, "g must be a torch.Tensor"),
    (lambda g: first_chunk_cumsum(g[0], 16), ValueError, r"g must have shape \[B, T, H, K\]"),
    (lambda g: first_chunk_cumsum(g[:, :0], 16), ValueError, r"g must have shape \[B, T, H, K\]"),
    (lambda g: first_chunk_cumsum(g.double(), 16), TypeError, "g must be float16, bfloat16 or float32"),
    (lambda g: first_chunk_cumsum(g.new_zeros(1, 4, 1, 257), 16), ValueError, "K = 257"),
    (lambda g: first_chunk_cumsum(g, 24), ValueError, "chunk_size"),
    (lambda g: first_chunk_cumsum(g, 16.0), ValueError, "chunk_size"),
    (lambda g: first_chunk_cumsum(g, 16, num_warps=3), ValueError, "num_warps must be a power of two"),
    (lambda g: first_chunk_cumsum(g, 16, num_warps=0), ValueError, "num_warps"),
    (lambda g: first_chunk_cumsum(g, 16, num_stages=True), ValueError, "num_stages"),
])
def test_bad_input_names_the_argument(monkeypatch, call, exc, match):
    g = _gates(1, 8, 1, 4, torch.float32)
    monkeypatch.setattr(first_kernel, "first_cumsum_kernel", None)  # a launch would fail differently
    with pytest.raises(exc, match=match):
        call(g)


def test_the_kernel_is_short_and_uses_pointer_arithmetic():
    src = inspect.getsource(first_cumsum_kernel.fn)
    body = [line for line in src.splitlines() if line.strip() and not line.lstrip().startswith(("@", "def", "#"))]
    assert len(body) <= 10, f"the first kernel should stay about ten lines, has {len(body)}"
    assert "make_block_ptr" not in src and "tl.int64" in src


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU with about 13 GiB free")
def test_offsets_past_two_to_the_31():
    """B·T·H·K > 2³¹: an int32 offset would wrap and write the last chunks into the first."""
    H, K, C = 16, 64, 64
    T = 2**31 // (H * K) + 3 * C + 5
    g = torch.full((1, T, H, K), -1e-3, dtype=torch.float16, device="cuda")
    g[:, -2 * C:] = -0.5
    b = first_chunk_cumsum(g, C)
    tail = slice((T // C - 1) * C, T)  # the last two chunks, the last partial
    assert_close("last chunks", _reference(g[:, tail], C), b[:, tail], TOL)
    assert_close("first chunk", _reference(g[:, :C], C), b[:, :C], TOL)
