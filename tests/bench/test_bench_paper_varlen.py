"""The paper-setup and varlen benchmark scripts end to end in their CPU smoke modes (Triton's
interpreter, float32, tiny shapes): rows for every candidate, agreement checks that hold, the stamp."""

import json
import pathlib

import pytest

torch = pytest.importorskip("torch")

from gla_ref import bench  # noqa: E402
from gla_ref.testing.scripts import load_script  # noqa: E402

def _script(name):
    return load_script(name)


def test_paper_setups_smoke(tmp_path):
    script = _script("bench_paper_setups")
    path = script.main(["--smoke", "--setup", "icml_fig2", "--out", str(tmp_path / "p.json")])
    result = bench.load_results(path)
    assert "fla" in result["env"]
    names = {r["name"] for r in result["rows"]}
    assert names == set(script.SETUPS["icml_fig2"]["candidates"])
    assert {r["T"] for r in result["rows"]} == set(script.SMOKE["T"])
    timed = [r for r in result["rows"] if not r["name"].startswith("sdpa")]
    assert all(r["fwd_bwd"]["median_ms"] > 0 for r in timed)  # the GLA kernels always run here
    assert all(err < 1e-5 for err in result["checks_rel_rmse"]["icml_fig2"].values())
    assert set(result["summary"]["icml_fig2"]) == {"crossover_T", "peak_over_flash"}


def test_paper_setups_inputs_follow_the_paper_shapes():
    script = _script("bench_paper_setups")
    v1 = script.SETUPS["v1_fig2_left"]
    (q, k, v, g), leaves = script.make_inputs("chunk_gla", {**v1, "B": 1}, 1, 8, torch.float32, "cpu")
    assert q.shape == (1, 8, 4, 128) and v.shape == (1, 8, 4, 256) and g.shape == (1, 8, 4, 128)
    assert len(leaves) == 4 and bool((g <= 0).all())
    (q, k, v, g), leaves = script.make_inputs("sdpa_flash", {**v1, "B": 1}, 1, 8, torch.float32, "cpu")
    assert q.shape == (1, 8, 16, 64) and g is None and len(leaves) == 3
    icml = script.SETUPS["icml_fig2"]
    (q, k, v, g), _ = script.make_inputs("linear_materialised", icml, 1, 8, torch.float32, "cpu")
    assert q.shape == (1, 8, 16, 64) and g is None


def test_varlen_pad_and_unpad_round_trip():
    script = _script("bench_varlen")
    lengths = (3, 1, 5)
    x = torch.arange(9.0).reshape(1, 9, 1)
    padded = script.pad(x, lengths)
    assert padded.shape == (3, 5, 1)
    assert padded[1, 1:].abs().sum() == 0 and padded[0, :3, 0].tolist() == [0.0, 1.0, 2.0]
    assert torch.equal(script.unpad(padded, lengths), x)


def test_varlen_smoke(tmp_path):
    script = _script("bench_varlen")
    path = script.main(["--smoke", "--out", str(tmp_path / "v.json")])
    result = bench.load_results(path)
    assert {r["name"] for r in result["rows"]} >= {"packed", "padded"}
    assert result["shape"]["tokens"] == sum(script.SMOKE_LENGTHS)
    assert all(err < 1e-5 for err in result["checks_rel_rmse"].values())
    assert json.loads(pathlib.Path(path).read_text())["shape"]["padded_tokens"] == 4 * 50


def test_every_stored_result_that_compares_with_fla_names_its_version():
    compared = 0
    for path in sorted(bench.results_dir().glob("*.json")):
        result = json.loads(path.read_text())
        names = {str(r.get("name") or r.get("impl") or "") for r in result.get("rows", []) if isinstance(r, dict)}
        if any(n.startswith("fla") for n in names):
            compared += 1
            assert result["env"].get("fla"), f"{path.name} compares with FLA but does not stamp its version"
    assert compared >= 2  # triton_bench and chunk_profile at least


def test_write_result_places_stored_smoke_and_explicit_results(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    result = {"env": {"device": "NVIDIA H200"}, "rows": [{"x": 1}]}
    stored = bench.write_result(result, "kind", tmp_path / "results")
    assert stored == tmp_path / "results" / "kind_nvidia_h200.json"
    smoke = bench.write_result(result, "kind", tmp_path / "results", smoke=True)
    assert smoke == tmp_path / "tmp" / "kind_smoke_nvidia_h200.json"
    chosen = bench.write_result(result, "kind", tmp_path / "results", out=tmp_path / "a" / "b.json", smoke=True)
    assert chosen == tmp_path / "a" / "b.json"
    assert all(json.loads(p.read_text()) == result for p in (stored, smoke, chosen))
