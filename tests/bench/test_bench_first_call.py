"""benchmarks/first_call.py: its CPU smoke path end to end (a fresh process per kernel, Triton's interpreter,
float32), and the record of what an autotuner tuned, read from a stand-in with a real tuner's attributes."""

import argparse
import importlib
from types import SimpleNamespace

import pytest


from gla_ref import bench
from gla_ref.testing.scripts import load_script

def _script():
    return load_script("first_call")


@pytest.mark.slow
def test_first_call_smoke(tmp_path):
    script = _script()
    path = script.main(["--smoke", "--out", str(tmp_path / "f.json")])
    result = bench.load_results(path)
    rows = result["rows"]
    assert [r["name"] for r in rows] == list(script.KERNELS)
    for row in rows:
        assert "error" not in row, row.get("error")
        assert [r["T"] for r in row["then"]] == list(script.SMOKE["then"])
        assert row["first"]["fwd_bwd_ms"] > 0 and row["process_s"] > row["import_s"] > 0
        assert row["retuned"] == []  # the interpreter keeps one config: nothing tunes
        assert "chunk.state.chunk_state_fwd_kernel" in row["autotuned_kernels"]
        for label in row["autotuned_kernels"]:  # "module.kernel", the module below gla_ref.triton
            module, kernel = label.rsplit(".", 1)
            assert hasattr(importlib.import_module(f"gla_ref.triton.{module}"), kernel), label


def test_tunings_reports_new_keys_and_config_timings():
    import triton

    script = _script()
    fast, slow = triton.Config({"BV": 64}, num_warps=4, num_stages=2), triton.Config({"BV": 32}, num_warps=8)
    tuner = SimpleNamespace(cache={(128, "torch.bfloat16"): fast}, configs_timings={fast: [0.5, 0.4, 0.6], slow: [0.9]},
                            bench_time=1.5)
    before = {"m.k": {(128, "torch.bfloat16")}}
    assert script.tunings({"m.k": tuner}, before) == []  # nothing new: not tuned
    tuner.cache[(256, "torch.bfloat16")] = slow
    (row,) = script.tunings({"m.k": tuner}, before)
    assert row["kernel"] == "m.k" and row["keys"] == [["256", "torch.bfloat16"]] and row["bench_s"] == 1.5
    assert row["best"] == {"kwargs": {"BV": 32}, "num_warps": 8, "num_stages": slow.num_stages, "num_ctas": 1}
    assert [t["ms"] for t in row["configs_timings"]] == [[0.5, 0.4, 0.6], [0.9]]


def test_shapes_and_lengths_are_checked():
    script = _script()
    assert script.parse_shapes("64x64,128X256") == [(64, 64), (128, 256)]
    for bad in ("128", "0x64", "axb"):
        with pytest.raises(argparse.ArgumentTypeError, match="--shapes"):
            script.parse_shapes(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        script.parse_ints("2048,-1")
    with pytest.raises(SystemExit):
        script.main(["--smoke", "--kernels", "chunk_gla,nope"])
