"""benchmarks/fused_dg_error_model.py: its emulated backward is the fused kernels' algorithm (float64 against
autograd through the reference), its TF32 maps are what they claim, and a smoke run writes its rows."""

import json

import pytest

torch = pytest.importorskip("torch")

from gla_ref import torch_ref  # noqa: E402
from gla_ref.testing.scripts import load_script  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return load_script("fused_dg_error_model")


@pytest.mark.parametrize("every", [None, 32])
def test_backward_in_float64_is_the_gradient(model, every):
    """Without TF32, with or without the identity's restarts, dq, dk and dg are autograd's through
    ``torch_ref.chunk_gla`` (one head, T = 48 in chunks of 16, K ≠ V)."""
    q, k, v, g, do = (t.double() for t in model.head(48, 8, 12, seed=3))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, g)]
    o, _ = torch_ref.chunk_gla(*(t[None, :, None] for t in leaves))
    dq, dk, _, dg = torch.autograd.grad(o, leaves, do[None, :, None])
    ours = model.backward(q, k, v, g, do, 16, every=every)
    for got, want in zip(ours, (dq, dk, dg)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_tf32_maps_keep_ten_mantissa_bits():
    model = load_script("fused_dg_error_model")
    x = torch.tensor([1 + 2 ** -10 + 2 ** -12, 1 + 2 ** -11 + 2 ** -13, -(1 + 2 ** -11 + 2 ** -13)])
    assert model.tf32_truncated(x).tolist() == [1 + 2 ** -10, 1.0, -1.0]  # towards zero
    assert model.tf32_nearest(x).tolist() == [1 + 2 ** -10, 1 + 2 ** -10, -(1 + 2 ** -10)]  # to nearest


def test_smoke_run_writes_every_variant(model):
    path = model.main(["--smoke"])
    rows = json.loads(path.read_text())["rows"]
    by = {(r["T"], r["variant"]): r for r in rows}
    assert {v for _, v in by} == {"truncated", "rounded", "float32", "identity every 32"}
    for T in (64, 128):
        assert by[T, "float32"]["dg"] < 1e-5 < by[T, "truncated"]["dg"]  # TF32 operands cost dg accuracy
