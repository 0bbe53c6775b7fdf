"""benchmarks/grad_memory.py on this machine: the --smoke path (tiny shapes; peaks only with CUDA),
the agreement check between the three routes to d log α, and the refusal to run full size on a CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from gla_ref import bench, device  # noqa: E402
from gla_ref.testing.scripts import load_script  # noqa: E402

gm = load_script("grad_memory")


def test_smoke_writes_every_route_and_they_agree(tmp_path):
    out = tmp_path / "gm.json"
    gm.main(["--smoke", "--out", str(out)])
    result = bench.load_results(out)
    assert result["env"]["smoke"] is True and result["env"]["dtype"] == "float32"
    rows = result["rows"]
    assert {(r["T"], r["name"]) for r in rows} == {(T, n) for T in gm.SMOKE["T"] for n in gm.ROUTES}
    for r in rows:
        assert r["rel_rmse_vs_states"] < gm.TOL
        assert (r["peak_bytes"] is None) == (not device.has_cuda())


def test_a_route_that_disagrees_fails_the_run(monkeypatch):
    real = gm.routes

    def wrong_closed_form(x, do):
        fns = real(x, do)
        fns["closed_form"] = lambda: -fns["states"]()
        return fns

    monkeypatch.setattr(gm, "routes", wrong_closed_form)
    with pytest.raises(AssertionError, match="closed_form gate gradient differs"):
        gm.measure_shape(1, 20, 2, 8, cuda=False)


def test_full_run_needs_cuda(monkeypatch):
    monkeypatch.setattr(gm.device, "has_cuda", lambda: False)
    with pytest.raises(SystemExit, match="needs CUDA"):
        gm.main([])
