"""benchmarks/cuda_graphs.py on a CPU: its ratios per mode, and its refusal to run without a GPU (its timings
and the replays they compare run on a GPU: tests/triton/test_triton_cuda_graphs.py checks the replays there)."""

import pytest

torch = pytest.importorskip("torch")

from gla_ref.testing.scripts import load_script  # noqa: E402



@pytest.fixture(scope="module")
def cuda_graphs():
    return load_script("cuda_graphs")


def row(name, T, fwd, fwd_bwd):
    """A row as the script stores it: per pass, the eager and the replayed median (None: capture failed)."""
    def timed(ms):
        return None if ms is None else {"median_ms": ms}
    return {"K": 64, "V": 64, "T": T, "name": name,
            "fwd": {"eager": timed(fwd[0]), "graph": timed(fwd[1])},
            "fwd_bwd": {"eager": timed(fwd_bwd[0]), "graph": timed(fwd_bwd[1])}}


def test_ratios_are_ours_over_fla_in_each_mode_apart(cuda_graphs):
    rows = [row("chunk_gla", 1024, (0.4, 0.15), (1.2, 0.5)), row("fla.chunk_gla", 1024, (0.8, 0.2), (2.0, None)),
            row("fused_chunk_gla", 1024, (0.3, 0.1), (1.0, 0.4))]
    got = cuda_graphs.ratios(rows)
    eager = {k: v for k, v in got["eager"][0].items() if k.startswith("chunk_gla/")}
    graph = {k: v for k, v in got["graph"][0].items() if "/" in k}
    assert eager == pytest.approx({"chunk_gla/fla.chunk_gla fwd": 0.5, "chunk_gla/fla.chunk_gla fwd_bwd": 0.6})
    # FLA's backward was not captured: only the forward has a replayed ratio
    assert graph == pytest.approx({"chunk_gla/fla.chunk_gla fwd": 0.75, "fused_chunk_gla/fla.chunk_gla fwd": 0.5})


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script would run (and write its result)")
def test_refuses_to_run_without_a_gpu(cuda_graphs, capsys):
    with pytest.raises(SystemExit):
        cuda_graphs.main(["--T", "64"])
    assert "needs a CUDA GPU" in capsys.readouterr().err
