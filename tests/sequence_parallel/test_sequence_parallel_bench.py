"""benchmarks/sequence_parallel_bench.py on this machine: the --smoke run (CPU, gloo, two ranks and
two simulated JAX devices, tiny shapes) end to end, how a sweep ends when a group fails (out of
memory on a GPU), the tolerance check, and the refusal to run full size without CUDA."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

from gla_ref import bench

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "sequence_parallel_bench.py"
spec = importlib.util.spec_from_file_location("sequence_parallel_bench", SCRIPT)
spb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(spb)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("spb") / "smoke.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return bench.load_results(out)


def test_smoke_is_stamped_and_names_its_setup(smoke):
    env = smoke["env"]
    assert env["smoke"] is True and env["backend"] == "gloo" and env["NCCL_NVLS_ENABLE"] is None
    assert smoke["shape"] == {**{n: spb.SMOKE[n] for n in "BHKV"}, "dtype": "float32",
                              "chunk_size": spb.SMOKE["chunk_size"]}
    assert smoke["two_devices"] == "run"


def test_smoke_accuracy_two_ranks_and_two_jax_devices_against_one(smoke):
    acc = [r for r in smoke["rows"] if r.get("kind") == "accuracy"]
    assert sorted((r["framework"], r.get("rank")) for r in acc) == [("jax", None), ("torch", 0), ("torch", 1)]
    for r in acc:
        assert r["ok"] and r["dtype"] == "float32" and r["T"] == spb.SMOKE["acc_T"]
        names = {"o", "dq", "dk", "dv", "dg"}
        names |= set() if r.get("rank") == 0 else {"final_state"}  # the last rank's, or JAX's whole
        names |= set() if r.get("rank") == 1 else {"dinitial_state"}
        assert set(r["errors"]) == names, r
        for errs in r["errors"].values():
            assert all(e < spb.TOL["float32"] for e in errs)
            assert len(errs) == (2 if r["framework"] == "torch" else 1)  # torch: vs one device and float64


def test_smoke_times_every_length_and_bytes_do_not_grow_with_T(smoke):
    timed = [r for r in smoke["rows"] if "fwd_bwd" in r]
    lengths = {"one_device": spb.SMOKE["T"], "two_devices": spb.SMOKE["T"],
               "jax_one_device": [spb.SMOKE["jax_max_T"]], "jax_two_devices": [spb.SMOKE["jax_max_T"]]}
    assert sorted((r["name"], r["T"]) for r in timed) == sorted((n, T) for n, Ts in lengths.items() for T in Ts)
    assert smoke["longest_T"] == {n: max(Ts) for n, Ts in lengths.items()}
    for r in timed:
        assert 0 < r["fwd_bwd"]["p20_ms"] <= r["fwd_bwd"]["median_ms"] <= r["fwd_bwd"]["p80_ms"]
    two = [r for r in timed if r["name"] == "two_devices"]
    state = 4 * spb.SMOKE["B"] * spb.SMOKE["H"] * spb.SMOKE["K"] * spb.SMOKE["V"]
    for r in two:  # per step: one state each way plus the 56-byte header, whatever T is
        assert r["bytes_sent"] == r["bytes_received"] == r["bytes_predicted"] == [state + 56] * 2
        assert r["peak_bytes"] is None  # no CUDA here
    Ts, ms = bench.series(smoke, "two_devices")
    assert Ts == spb.SMOKE["T"] and len(ms) == len(Ts)


def test_a_failed_group_ends_the_sweep_with_an_error_row(monkeypatch):
    """A rank that runs out of memory at the second length: the first length's row survives, the
    second gets an error row, and no later length is tried."""
    def launch(target, world_size, *, kwargs, **_):
        row = {"name": "two_devices", "T": kwargs["Ts"][0], "peak_bytes": 1, "bytes_sent": [0, 0],
               "fwd_bwd": {"median_ms": 1.0, "p20_ms": 1.0, "p80_ms": 1.0}}
        pathlib.Path(kwargs["out"]).write_text(json.dumps(row) + "\n")
        raise RuntimeError("rank 1 of 2 exited with code 1; its log ends:\ntorch.OutOfMemoryError: CUDA out of memory")

    monkeypatch.setattr(spb.local, "launch", launch)
    args = spb.parse_args(["--smoke", "--T", "64", "128", "256"])
    rows = spb.run_sweep(args, args.shape, 2, "gloo", {})
    assert [r["T"] for r in rows] == [64, 128]
    assert rows[1]["error"].startswith("out of memory") and "fwd_bwd" not in rows[1]


def test_judge_flags_errors_above_the_dtype_tolerance():
    row = {"framework": "torch", "dtype": "bfloat16", "rank": 0, "errors": {"o": [1e-3, 2e-3], "dq": [0.5, 0.5]}}
    assert spb.judge(row)["ok"] is False
    row["errors"]["dq"] = [1e-2, 1e-2]
    assert spb.judge(row)["ok"] is True


def test_full_run_needs_cuda_and_even_lengths(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs CUDA"):
        spb.main([])
    with pytest.raises(SystemExit):
        spb.parse_args(["--smoke", "--T", "63"])
