"""benchmarks/sequence_parallel_bench.py on this machine: the --smoke run (CPU, gloo, two ranks and
two simulated JAX devices, tiny shapes) end to end, how a sweep ends when a group fails (out of
memory on a GPU), the search for the longest T, the summary against the targets, the tolerance check,
and the refusal to run full size without CUDA."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from gla_ref import bench
from gla_ref.testing.scripts import load_script, script_path

SCRIPT = script_path("sequence_parallel_bench")
spb = load_script("sequence_parallel_bench")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("spb") / "smoke.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return bench.load_results(out)


@pytest.mark.slow  # the smoke run (module fixture): 76 s of CPU
def test_smoke_is_stamped_and_names_its_setup(smoke):
    env = smoke["env"]
    assert env["smoke"] is True and env["backend"] == "gloo" and env["NCCL_NVLS_ENABLE"] is None
    assert smoke["shape"] == {**{n: spb.SMOKE[n] for n in "BHKV"}, "dtype": "float32",
                              "chunk_size": spb.SMOKE["chunk_size"]}
    assert smoke["two_devices"] == "run"


@pytest.mark.slow  # the smoke run (module fixture): 76 s of CPU
def test_smoke_accuracy_two_ranks_and_two_jax_devices_against_one_and_float64(smoke):
    acc = [r for r in smoke["rows"] if r.get("kind") == "accuracy"]
    assert sorted((r["framework"], r.get("rank")) for r in acc) == [("jax", None), ("torch", 0), ("torch", 1)]
    for r in acc:
        assert r["ok"] and r["dtype"] == "float32" and r["T"] == spb.SMOKE["acc_T"]
        names = {"o", "dq", "dk", "dv", "dg"}
        names |= set() if r.get("rank") == 0 else {"final_state"}  # the last rank's, or JAX's whole
        names |= set() if r.get("rank") == 1 else {"dinitial_state"}
        assert set(r["errors"]) == names, r
        for errs in r["errors"].values():  # vs one device, vs float64
            assert len(errs) == 2 and all(e < spb.TOL["float32"] for e in errs)


@pytest.mark.slow  # the smoke run (module fixture): 76 s of CPU
def test_smoke_times_every_length_and_bytes_do_not_grow_with_T(smoke):
    timed = [r for r in smoke["rows"] if "fwd_bwd" in r]
    lengths = {"one_device": spb.SMOKE["T"], "two_devices": spb.SMOKE["T"],
               "jax_one_device": spb.SMOKE["jax_T"], "jax_two_devices": spb.SMOKE["jax_T"]}
    assert sorted((r["name"], r["T"]) for r in timed) == sorted((n, T) for n, Ts in lengths.items() for T in Ts)
    assert smoke["longest_T"] == {n: max(Ts) for n, Ts in lengths.items()}
    assert not [r for r in smoke["rows"] if r.get("kind") == "search"]  # nothing runs out of memory on a CPU
    for r in timed:
        assert 0 < r["fwd_bwd"]["p20_ms"] <= r["fwd_bwd"]["median_ms"] <= r["fwd_bwd"]["p80_ms"]
    state = 4 * spb.SMOKE["B"] * spb.SMOKE["H"] * spb.SMOKE["K"] * spb.SMOKE["V"]
    for r in (r for r in timed if r["name"] == "two_devices"):  # per step: one state each way plus the header
        assert r["bytes_sent"] == r["bytes_received"] == r["bytes_predicted"] == [state + 88] * 2
        assert r["peak_bytes"] is None  # no CUDA here
    for r in (r for r in timed if r["name"] == "jax_two_devices"):  # a hop each way, the final state's psum
        assert r["bytes_sent"] == [4 * state] * 2  # and its transpose, dh0's sum: two-device all-reduces
    Ts, ms = bench.series(smoke, "two_devices")
    assert Ts == spb.SMOKE["T"] and len(ms) == len(Ts)
    summary = smoke["summary"]
    assert summary["targets"] == spb.TARGETS
    assert sorted(summary["torch"]["fwd_bwd_ratio"]) == sorted(str(T) for T in spb.SMOKE["T"])
    assert summary["torch"]["meets"]["fwd_bwd"] is None  # no length of 64K or more was timed


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


@pytest.mark.parametrize("limit,ok,failed,step,expected", [
    (1_200_000, 2 ** 20, 2 ** 21, 2 ** 16, (1_179_648, 1_245_184, [1_572_864, 1_310_720, 1_179_648, 1_245_184])),
    (100_000, 2 ** 14, None, 2 ** 14, (98_304, 114_688, [32_768, 65_536, 131_072, 98_304, 114_688])),
    (10 ** 9, 2 ** 20, None, 2 ** 16, (2 ** 22, None, [2 ** 21, 2 ** 22])),  # capped by max_T
    (1000, None, None, 2 ** 16, (None, 2 ** 16, [2 ** 16])),  # not even the first step runs
])
def test_search_bisects_to_the_step_between_a_length_that_ran_and_one_that_failed(limit, ok, failed, step, expected):
    longest, first_failed, probes = spb.search_longest(lambda T: T <= limit, ok, failed, step=step, max_T=2 ** 22)
    assert (longest, first_failed, [T for T, _ in probes]) == expected
    assert all(ran == (T <= limit) for T, ran in probes)


def test_a_good_guess_ends_the_search_in_two_probes():
    longest, first_failed, probes = spb.search_longest(lambda T: T <= 1_200_000, 2 ** 20, 2 ** 21, step=2 ** 16,
                                                       max_T=2 ** 22, guess=1_190_000)
    assert (longest, first_failed, probes) == (1_179_648, 1_245_184, [(1_179_648, True), (1_245_184, False)])
    longest, _, probes = spb.search_longest(lambda T: T <= 1_200_000, 2 ** 20, None, step=2 ** 16, max_T=2 ** 22,
                                            guess=1_300_000)  # too high: its neighbour below, then bisection
    assert longest == 1_179_648 and [T for T, _ in probes][:2] == [1_245_184, 1_179_648]


def test_memory_guess_extrapolates_the_peak_per_token():
    rows = [{"name": "one_device", "T": T, "fwd_bwd": {}, "peak_bytes": 1000 + 10 * T, "device_bytes": 10 ** 6}
            for T in (1000, 2000)]
    assert spb.memory_guess(rows, "one_device") == int(2000 + (0.98e6 - 21000) / 10)
    assert spb.memory_guess(rows[:1], "one_device") is None and spb.memory_guess(rows, "two_devices") is None


def test_search_row_records_a_failure_that_is_not_out_of_memory():
    def probe(T):
        raise RuntimeError("rank 0 of 2 exited: NCCL error")

    rows = [{"name": "two_devices", "T": 64, "fwd_bwd": {"median_ms": 1.0}}]
    row = spb.search_row("two_devices", "torch", probe, rows, step=16, max_T=1024)
    assert row["kind"] == "search" and "NCCL error" in row["error"] and "longest_T" not in row


def test_summary_judges_the_targets():
    def row(name, T, ms, peak):
        return {"name": name, "T": T, "fwd_bwd": {"median_ms": ms}, "peak_bytes": peak}

    rows = [row("one_device", 2 ** 16, 10.0, 100), row("two_devices", 2 ** 16, 5.5, 52),
            row("one_device", 2 ** 15, 5.0, 50), row("two_devices", 2 ** 15, 4.0, 26)]  # T < 64K: not judged
    longest = {"one_device": 2 ** 20, "two_devices": 2 ** 20 * 19 // 10}
    s = spb.summarize(rows, longest)
    assert s["torch"]["fwd_bwd_ratio"] == {2 ** 15: 0.8, 2 ** 16: 0.55}
    assert s["torch"]["meets"] == {"fwd_bwd": True, "peak": True, "longest_T": True}
    assert s["jax"]["meets"] == {"fwd_bwd": None, "peak": None, "longest_T": None}
    rows[1]["peak_bytes"] = 60
    assert spb.summarize(rows, longest)["torch"]["meets"]["peak"] is False


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
