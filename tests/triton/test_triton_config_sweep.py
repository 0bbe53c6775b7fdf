"""benchmarks/triton_config_sweep.py: every config of every launched kernel gets its own process,
a process that dies is reported as a fault, and the rows carry the errors against float64."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from gla_ref.testing.scripts import load_script, script_path

SCRIPT = script_path("triton_config_sweep")


def _load():
    return load_script("triton_config_sweep")


@pytest.mark.slow
def test_sweep_covers_every_launched_kernel(tmp_path):
    out = tmp_path / "sweep.json"
    subprocess.run([sys.executable, str(SCRIPT), "chunk_simple_gla[g]", "--dtype", "float32",
                    "--shape", "1", "40", "2", "20", "24", "--steps", "2", "--jobs", "2", "--out", str(out)],
                   check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    kernels = {row["kernel"] for row in result["rows"]}
    assert {"chunk.state.chunk_state_fwd_kernel", "chunk.state.chunk_state_bwd_kernel",
            "chunk_simple.simple_output_kernel", "chunk_simple.simple_bwd_dv_kernel",
            "chunk_simple.simple_bwd_dqkg_kernel"} == kernels
    for row in result["rows"]:
        assert row["status"] == "ok" and max(v for v in row["errors"].values() if v is not None) < 1e-5
        assert row["ptxas"] == result["env"].get("ptxas")  # None without a GPU


def test_a_process_that_dies_is_a_fault():
    args = argparse.Namespace(kernel="no_such_kernel", dtype="float32", shape=[1, 4, 1, 8, 8], steps=1)
    result = _load().run_worker(args)
    assert result["status"] == "fault" and "no_such_kernel" in result["error"]


@pytest.mark.slow
def test_only_sweeps_the_named_kernels(tmp_path):
    out = tmp_path / "sweep.json"
    subprocess.run([sys.executable, str(SCRIPT), "chunk_simple_gla[g_gamma]", "--dtype", "float32",
                    "--shape", "1", "20", "1", "16", "16", "--steps", "1", "--only", "state_fwd", "dv",
                    "--out", str(out)], check=True, capture_output=True, text=True)
    kernels = {row["kernel"] for row in json.loads(out.read_text())["rows"]}
    assert kernels == {"chunk.state.chunk_state_fwd_kernel", "chunk_simple.simple_bwd_dv_kernel"}


@pytest.mark.slow
def test_a_failing_probe_needs_only_and_then_sweeps_what_it_names(tmp_path):
    common = [sys.executable, str(SCRIPT), "no_such_kernel", "--shape", "1", "4", "1", "8", "8", "--steps", "1"]
    refused = subprocess.run(common, capture_output=True, text=True)
    assert refused.returncode != 0 and "--only" in refused.stderr
    out = tmp_path / "sweep.json"
    subprocess.run([*common, "--only", "chunk_state", "--out", str(out)], check=True, capture_output=True, text=True)
    rows = json.loads(out.read_text())["rows"]
    assert {row["kernel"] for row in rows} == {"chunk.state.chunk_state_fwd_kernel", "chunk.state.chunk_state_bwd_kernel"}
    assert all(row["status"] == "fault" for row in rows)  # every worker fails as the probe did


def test_a_finished_run_with_large_or_nan_errors_is_wrong_not_ok():
    sweep = _load()
    row = {"status": "ok", "errors": {"o": 0.0042, "dv": 0.003, "dg": None}}
    assert sweep.judge(row, "bfloat16")["status"] == "ok"
    assert sweep.judge({**row, "errors": {"o": 0.86, "dv": 1.29}}, "bfloat16")["status"] == "wrong"
    assert sweep.judge({**row, "errors": {"o": float("nan")}}, "float16")["status"] == "wrong"
    assert sweep.judge({**row, "errors": {"o": 0.0042}}, "float32")["status"] == "wrong"
    assert sweep.judge({"status": "fault", "error": "illegal memory access"}, "bfloat16")["status"] == "fault"


def test_the_stored_sweep_carries_the_verdict_of_its_numbers():
    sweep = _load()
    data = json.loads((SCRIPT.parent / "results" / "triton_config_sweep_nvidia_h200.json").read_text())
    for row in data["rows"]:
        assert row == sweep.judge(row, data["case"]["dtype"])
