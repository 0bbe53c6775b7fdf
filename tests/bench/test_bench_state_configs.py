"""benchmarks/state_configs.py on a CPU: its TMA variant of the forward's state step gives the library's states bit
for bit (Triton's interpreter runs tensor descriptors, zero-filling rows past T), its winners and ratios, and its
refusal to run without a GPU (the sweep times configs on a GPU)."""

import pytest

torch = pytest.importorskip("torch")

from gla_ref.testing import as_torch, random_inputs  # noqa: E402
from gla_ref.testing.scripts import load_script  # noqa: E402


@pytest.fixture(scope="module")
def state_configs():
    module = load_script("state_configs")
    module.use_torch_allocator()
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter check; the GPU sweep compares on the device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("B, T, H, K, V, C", [(2, 70, 3, 64, 48, 64), (1, 1, 2, 32, 16, 16), (2, 130, 2, 40, 24, 32)])
def test_tma_states_equal_the_library(state_configs, dtype, B, T, H, K, V, C):
    import triton

    from gla_ref.triton.chunk.cumsum import chunk_gates_and_operands
    from gla_ref.triton.chunk.state import chunk_state_fwd

    x = as_torch(random_inputs(B, T, H, K, V, "gla", seed=T + K, tau=4), dtype=dtype, device="cpu")
    b, _, kt = chunk_gates_and_operands(x["q"], x["k"], x["g"], 0.3, C)
    h, _ = chunk_state_fwd(kt, x["v"], b, None, False, C, decayed=True)
    bk, bv = min(32, triton.next_power_of_2(K)), min(64, triton.next_power_of_2(V))
    kernel = triton.autotune([triton.Config({"BK": bk, "BV": bv})], key=["K"])(state_configs.tma_state_kernel)
    got = state_configs.tma_states(kernel, kt, x["v"], b, C)
    assert h.dtype == got.dtype == dtype and torch.equal(h, got)


def test_summary_names_winners_and_ratios(state_configs):
    timings = {"32x128/w4/s2": 2.0, "64x64/w4/s2": 3.0, "64x64/w4/s3": 1.5, "16x64/w4/s3": 1.2}
    now = {"fwd": ["32x128/w4/s2", "64x64/w4/s3"], "bwd": ["64x64/w4/s2"]}
    got = state_configs.summarise("fwd_decayed", timings, now)
    assert got["best_config"] == "16x64/w4/s3" and got["before_config"] == "32x128/w4/s2"
    assert got["library_config"] == "64x64/w4/s3"
    assert got["best/before"] == pytest.approx(0.6) and got["library/before"] == pytest.approx(0.75)
    bwd = state_configs.summarise("bwd", timings, now)   # the backward kernel's lists: before, two 64x64 of them
    assert bwd["before_config"] == "64x64/w4/s3" and bwd["library_config"] == "64x64/w4/s2"
    assert bwd["library/before"] == pytest.approx(2.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script would run (and write its result)")
def test_refuses_to_run_without_a_gpu(state_configs, capsys):
    with pytest.raises(SystemExit):
        state_configs.main(["--T", "64"])
    assert "needs a CUDA GPU" in capsys.readouterr().err
