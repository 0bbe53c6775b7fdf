"""benchmarks/fused_tiles.py: its two tilings are the launcher's two choices, and its ratios pair them (timings run on a GPU)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gla_ref.testing.scripts import load_script  # noqa: E402
from gla_ref.triton.fused_chunk import forward as fused_chunk_fwd  # noqa: E402


@pytest.fixture(scope="module")
def fused_tiles():
    return load_script("fused_tiles")


def test_narrow_hides_the_sm_count_and_picked_keeps_the_launcher(fused_tiles, monkeypatch):
    monkeypatch.setattr(fused_chunk_fwd, "sm_count", lambda x: 1)  # as if every grid filled the GPU
    q, v = torch.empty(8, 4, 16, 128), torch.empty(8, 4, 16, 256)
    with fused_tiles.tiling("narrow"):
        assert fused_tiles.tiles(q, v) == {"BK": 128, "BV": 64, "programs": 4 * 128}
    with fused_tiles.tiling("picked"):
        assert fused_tiles.tiles(q, v) == {"BK": 128, "BV": 128, "programs": 2 * 128}
    assert fused_chunk_fwd.sm_count(q) == 1  # restored after either


def test_ratios_set_picked_against_narrow_and_fla(fused_tiles):
    rows = [{"K": 128, "V": 256, "T": 2048, "name": name, "fwd": {"median_ms": f}, "fwd_bwd": {"median_ms": b}}
            for name, f, b in (("fused_chunk_gla narrow", 2.0, 8.0), ("fused_chunk_gla picked", 1.6, 7.2),
                               ("fla.chunk_gla", 1.0, 4.8))]
    (r,) = fused_tiles.ratios(rows, fused_tiles.PAIRS)
    assert r["fused_chunk_gla picked/fused_chunk_gla narrow fwd"] == pytest.approx(0.8)
    assert r["fused_chunk_gla picked/fla.chunk_gla fwd_bwd"] == pytest.approx(1.5)
    assert r["fused_chunk_gla narrow/fla.chunk_gla fwd_bwd"] == pytest.approx(8.0 / 4.8)
