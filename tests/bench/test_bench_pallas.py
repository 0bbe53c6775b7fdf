"""benchmarks/bench_pallas.py: the per-case worker processes, their time limits and error rows, and
one real smoke run on this machine's device (CPU: Pallas and Triton interpreters, tiny shapes)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from gla_ref import bench
from gla_ref.testing.scripts import load_script

bp = load_script("bench_pallas")

harness = bp.harness  # benchmarks/pallas_harness.py, as the script imports it
MODES = list(harness.BENCH_MODES)


def _row(name, mode, T=64, ms=1.0):
    return {"T": T, "name": f"{name} {mode}", "compile_ms": 10.0, "first_ms": 12.0, "median_ms": ms,
            "p20_ms": ms, "p80_ms": ms}


def _out(*lines):
    return "\n".join(lines) + "\n"


def test_parse_worker_keeps_rows_and_names_the_phase_the_limit_cut():
    name = "pallas chunk_gla"
    out = _out("noise from a library", "STAGE 0.5 fwd compile", "STAGE 3.0 fwd run",
               "ROW " + json.dumps(_row(name, "fwd")), "STAGE 40.0 fwd+bwd compile")
    rows, timeouts = bp.parse_worker(out, "", None, name, 64, MODES, limit=120.0)
    assert rows[0] == _row(name, "fwd")
    assert rows[1] == {"T": 64, "name": f"{name} fwd+bwd",
                       "error": "compile did not finish in 80 s (case limit 120 s)"}
    assert timeouts == {"fwd+bwd"}


def test_parse_worker_run_timeout_crash_and_unreached_mode():
    name = "jax_ref.chunk_gla"
    rows, timeouts = bp.parse_worker(_out("STAGE 1.0 fwd compile", "STAGE 9.0 fwd run"), "", None, name, 64,
                                     MODES, limit=30.0)
    assert rows[0]["error"] == "run did not finish in 21 s (case limit 30 s)"
    assert rows[1]["error"] == "not run: the case's 30 s were spent by an earlier mode"
    assert timeouts == set()
    rows, _ = bp.parse_worker("", "Traceback ...\nSegmentation fault\n", -11, name, 64, MODES, limit=30.0)
    assert [r["error"] for r in rows] == ["worker exited with code -11: Segmentation fault"] * 2


def test_describe_error_marks_out_of_memory():
    oom = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4.00GiB")
    assert bp.describe_error(oom).startswith("OOM: RuntimeError: RESOURCE_EXHAUSTED")
    assert bp.describe_error(ValueError("bad\nsecond line")) == "ValueError: bad"


def test_run_limited_kills_at_the_limit_and_keeps_what_was_printed():
    code = "import time; print('STAGE 0.0 fwd compile', flush=True); time.sleep(60)"
    t0 = time.perf_counter()
    out, err, returncode = bp.run_limited([sys.executable, "-c", code], None, limit=2.0)
    assert time.perf_counter() - t0 < 10
    assert returncode is None and "STAGE 0.0 fwd compile" in out


FAKE_WORKER = """
import json, sys, time
name, T = sys.argv[1], int(sys.argv[2])
for mode in sys.argv[3:]:
    print(f"STAGE 0.0 {mode} compile", flush=True)
    if name == "pallas chunk_gla" and mode == "fwd+bwd":
        time.sleep(60)  # a compile that never ends
    row = {"T": T, "name": f"{name} {mode}", "compile_ms": 1.0, "first_ms": 1.0, "median_ms": 0.5,
           "p20_ms": 0.5, "p80_ms": 0.5}
    print("ROW " + json.dumps(row), flush=True)
"""


def _fake_args(**kw):
    args = bp.parse_args(["--smoke", "--limit", "3", "--budget", "60"])
    args.T = [64, 128]
    for key, value in kw.items():
        setattr(args, key, value)
    return args


def test_run_all_skips_a_mode_whose_compile_timed_out_and_respects_the_budget(monkeypatch, tmp_path):
    fake = tmp_path / "fake_worker.py"
    fake.write_text(FAKE_WORKER)
    monkeypatch.setattr(bp, "worker_cmd",
                        lambda name, T, modes, args: [sys.executable, str(fake), name, str(T), *modes])
    names = ["pallas chunk_gla", "jax_ref.chunk_gla"]
    t0 = time.perf_counter()
    rows = {(r["T"], r["name"]): r for r in bp.run_all(_fake_args(), names)}
    assert time.perf_counter() - t0 < 20  # one 3 s limit hit, not two
    assert rows[64, "pallas chunk_gla fwd"]["median_ms"] == 0.5
    assert rows[64, "pallas chunk_gla fwd+bwd"]["error"].startswith("compile did not finish")
    assert rows[128, "pallas chunk_gla fwd"]["median_ms"] == 0.5
    assert rows[128, "pallas chunk_gla fwd+bwd"]["error"] == "not run: compile did not finish at T=64"
    assert all("median_ms" in rows[T, f"jax_ref.chunk_gla {m}"] for T in (64, 128) for m in MODES)
    # a budget smaller than one case: nothing starts, every row says why
    spent = bp.run_all(_fake_args(budget=bp.MIN_CASE_S - 1), names)
    assert len(spent) == 8 and all(r["error"].startswith("not run: the") for r in spent)


def test_merge_rows_replaces_only_what_was_measured_again():
    old = [_row("a", "fwd", T=1024, ms=1.0), _row("a", "fwd", T=2048, ms=2.0)]
    new = [_row("a", "fwd", T=1024, ms=3.0)]
    merged = {(r["T"], r["name"]): r["median_ms"] for r in bp.merge_rows(old, new)}
    assert merged == {(1024, "a fwd"): 3.0, (2048, "a fwd"): 2.0}


def test_time_pallas_gla_rejects_unknown_candidates():
    with pytest.raises(ValueError, match="name must be one of"):
        harness.time_pallas_gla("pallas chunk", "fwd", 64)
    with pytest.raises(ValueError, match="mode one of"):
        harness.time_pallas_gla("jax_ref.chunk_gla", "bwd", 64)


@pytest.mark.slow
def test_smoke_run_writes_the_chapter_schema(tmp_path):
    """The real thing at tiny shapes: a Pallas kernel (g_gamma inputs), the reference and a Triton
    kernel, each in its worker, forward and forward+backward, into a JSON chapter 5 can read."""
    out = tmp_path / "smoke.json"
    names = ["pallas chunk_simple_gla g_gamma", "jax_ref.chunk_gla", "triton fused_chunk_gla"]
    bp.main(["--smoke", "--only", *names, "--warmup", "0", "--rep", "1", "--out", str(out)])
    result = bench.load_results(out)
    assert result["env"]["smoke"] is True and result["env"]["shape"]["dtype"] == "float32"
    rows = {r["name"]: r for r in result["rows"]}
    assert set(rows) == {f"{n} {m}" for n in names for m in MODES}
    for name, row in rows.items():
        assert "error" not in row, f"{name}: {row.get('error')}"
        assert row["T"] == 32 and row["compile_ms"] > 0 and row["p20_ms"] <= row["median_ms"] <= row["p80_ms"]


def test_full_run_needs_cuda(monkeypatch):
    from gla_ref import device

    monkeypatch.setattr(device, "has_cuda", lambda: False)
    with pytest.raises(SystemExit, match="needs CUDA"):
        bp.main([])
