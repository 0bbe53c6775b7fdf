"""benchmarks/speed_vs_fla.py end to end in its CPU smoke mode (Triton's interpreter, float32, tiny shapes)."""

import argparse

import pytest


from gla_ref import bench
from gla_ref.testing.scripts import load_script

def _script():
    return load_script("speed_vs_fla")


def test_smoke_rows_retunes_and_keep(tmp_path):
    script = _script()
    first = script.main(["--smoke", "--out", str(tmp_path / "a.json")])
    result = bench.load_results(first)
    assert {r["name"] for r in result["rows"]} == set(script.OURS)
    assert {r["T"] for r in result["rows"]} == set(script.SMOKE["T"])
    assert all(r["fwd_bwd"]["median_ms"] > 0 and not any(k.endswith("error") for k in r) for r in result["rows"])
    assert all("first_fwd_bwd_s" in r for r in result["rows"] if r["T"] == script.SMOKE["T"][0])
    assert result["retunes"] == [{"K": 16, "V": 24, "retunes_after_first_T": 0}]  # 0 always here: see below
    assert "fla" in result["env"] and result["setting"]["launch_shortcut"] is True  # recorded, on by default
    kept = script.main(["--smoke", "--shapes", "32x16", "--T", "17", "--keep", str(first),
                        "--out", str(tmp_path / "b.json")])
    both = bench.load_results(kept)
    assert {(r["K"], r["V"]) for r in both["rows"]} == {(16, 24), (32, 16)}
    assert len(both["retunes"]) == 2 and both["retunes"][1]["retunes_after_first_T"] is None  # one T only


def test_a_run_cut_short_keeps_every_row_it_finished(tmp_path, monkeypatch):
    """The device stops a command at its time limit: the file is written after every candidate, not only per T
    or per shape (a slow first call of one candidate must not take the others' rows with it)."""
    script = _script()
    measure, calls = script.measure, []

    class Stopped(Exception):
        pass

    def stop_at_last_candidate(*args, **kwargs):
        if len(calls) == len(script.OURS) - 1:  # every candidate but the last of the first T has run
            raise Stopped
        calls.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(script, "measure", stop_at_last_candidate)
    out = tmp_path / "cut.json"
    with pytest.raises(Stopped):
        script.main(["--smoke", "--out", str(out)])
    kept = bench.load_results(out)
    assert [r["name"] for r in kept["rows"]] == list(script.OURS[:-1])
    assert {r["T"] for r in kept["rows"]} == {script.SMOKE["T"][0]}
    assert kept["retunes"] == []  # the shape never finished


def test_ratios_pair_ours_with_fla():
    script = _script()
    row = lambda name, ms, peak: {"K": 64, "V": 64, "T": 1024, "name": name, "fwd": {"median_ms": ms},
                                  "fwd_bwd": {"median_ms": 3 * ms}, "fwd_bwd_peak_bytes": peak}
    (r,) = script.ratios([row("chunk_gla", 1.0, 10), row("fla.chunk_gla", 2.0, 20), row("fused_chunk_gla", 4.0, 5)])
    assert r["chunk_gla/fla.chunk_gla fwd"] == 0.5 and r["chunk_gla/fla.chunk_gla fwd_bwd peak"] == 0.5
    assert r["fused_chunk_gla/fla.chunk_gla fwd_bwd"] == 2.0
    assert not any(key.startswith("chunk_simple_gla") for key in r)


def test_shapes_parse_and_refuse_nonsense():
    script = _script()
    assert script.parse_shape("128x256") == (128, 256)
    with pytest.raises(argparse.ArgumentTypeError, match="KxV"):
        script.parse_shape("128")


def test_autotune_entries_counts_each_tuned_key_once(monkeypatch):
    """Under the interpreter a kernel has one config and never fills its cache, so the smoke run's retune
    count is 0 whatever the keys hold; the counter itself is checked here on stand-in autotuners, and
    the walk it relies on (gla_ref.triton.autotuners) on the real package: each kernel once, by its home."""
    from gla_ref.triton.autotuners import autotuners

    script = _script()
    real = autotuners()
    assert "chunk.state.chunk_state_fwd_kernel" in real and "chunk.intra.chunk_intra_kernel" in real
    assert len({id(t) for t in real.values()}) == len(real)  # a kernel imported elsewhere is not counted twice

    class StandIn:
        def __init__(self, n):
            self.cache = dict.fromkeys(range(n))

    tuners = {"a": StandIn(2), "b": StandIn(3)}
    monkeypatch.setattr("gla_ref.triton.autotuners.autotuners", lambda: tuners)
    assert script.autotune_entries() == 5
    tuners["b"].cache["new key"] = None
    assert script.autotune_entries() == 6


def test_a_refused_backward_keeps_the_forward():
    import torch

    script = _script()

    class Refuse(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("backward refused on this GPU\nsecond line")

    inputs = [torch.ones(1, 3, 1, 2, requires_grad=True) for _ in range(4)]
    out = script.measure(lambda q, k, v, g: Refuse.apply(v), inputs, on_gpu=False, first=True)
    assert out["fwd"]["median_ms"] > 0
    assert out["first_error"] == out["fwd_bwd_error"] == "RuntimeError: backward refused on this GPU"
    assert "fwd_bwd" not in out and all(x.grad is None for x in inputs)


_HOLD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from speed_vs_fla import GpuTurns
with GpuTurns(sys.argv[2]):
    start = time.monotonic()
    time.sleep(0.4)
    print(start, time.monotonic())
"""


def test_gpu_turns_are_exclusive_across_processes_and_nest_within_one(tmp_path):
    import pathlib
    import subprocess
    import sys

    script = _script()
    folder = str(pathlib.Path(script.__file__).parent)
    lock = str(tmp_path / "gpu.lock")
    procs = [subprocess.Popen([sys.executable, "-c", _HOLD, folder, lock], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    (a0, a1), (b0, b1) = ([float(x) for x in p.communicate(timeout=60)[0].split()] for p in procs)
    assert a1 <= b0 or b1 <= a0, ((a0, a1), (b0, b1))  # one held the turn, then the other
    turns = script.GpuTurns(lock)
    with turns:
        with turns:
            assert turns.depth == 2 and turns.file is not None
        assert turns.file is not None  # the inner exit keeps the outer turn
    assert turns.depth == 0 and turns.file is None


def test_take_turns_runs_an_autotuners_first_launch_before_its_turn(monkeypatch, tmp_path):
    import triton.testing

    script = _script()
    log = []
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: (fn(), log.append(("timed", script.TURNS.depth)))[1])
    monkeypatch.setattr(script, "TURNS", script.GpuTurns())
    script.take_turns(tmp_path / "gpu.lock", sync=lambda: log.append("sync"))
    triton.testing.do_bench(lambda: log.append("run"))  # an autotuner's call: no turn held yet
    assert log == ["run", "sync", "run", ("timed", 1)]
    log.clear()
    with script.TURNS:  # measure's: already in a turn, nothing runs outside it
        triton.testing.do_bench(lambda: log.append("run"))
    assert log == ["run", ("timed", 2)]


def test_merge_joins_processes_and_refuses_strangers():
    script = _script()
    env = {"device": "GPU X", "torch": "2", "date": "2026-11-27"}
    setting = {"B": 8, "H": 16, "dtype": "bfloat16"}

    def result(K, V, ms, T, date="2026-11-27"):
        rows = [{"K": K, "V": V, "T": T, "name": n, "fwd": {"median_ms": m}} for n, m in (("chunk_gla", ms), ("fla.chunk_gla", 2 * ms))]
        return {"env": dict(env, date=date), "setting": dict(setting, T=[T]), "copy_bandwidth_GBps": 100.0 * K,
                "rows": rows, "retunes": [{"K": K, "V": V, "retunes_after_first_T": 0}], "wall_s": float(V)}

    merged = script.merge([result(64, 64, 1.0, 1024), result(128, 256, 3.0, 2048, date="2026-11-28")])
    assert len(merged["rows"]) == 4 and merged["setting"]["T"] == [1024, 2048] and len(merged["retunes"]) == 2
    assert merged["copy_bandwidth_GBps_per_shape"] == {"64x64": 6400.0, "128x256": 12800.0}
    assert merged["wall_s"] == {"64x64": 64.0, "128x256": 256.0}
    assert [r["chunk_gla/fla.chunk_gla fwd"] for r in merged["ratios"]] == [0.5, 0.5]
    simple = result(64, 64, 1.0, 1024)  # a second process at 64x64, other candidates: keyed apart
    for row, name in zip(simple["rows"], ("chunk_simple_gla", "fla.chunk_simple_gla")):
        row["name"] = name
    simple["copy_bandwidth_GBps"] = 6000.0
    split = script.merge([result(64, 64, 1.0, 1024), simple])
    assert split["copy_bandwidth_GBps_per_shape"] == {"64x64 [chunk_gla fla.chunk_gla]": 6400.0,
                                                      "64x64 [chunk_simple_gla fla.chunk_simple_gla]": 6000.0}
    assert split["ratios"] == [{"K": 64, "V": 64, "T": 1024, "chunk_gla/fla.chunk_gla fwd": 0.5,
                                "chunk_simple_gla/fla.chunk_simple_gla fwd": 0.5}]
    other = result(64, 64, 1.0, 1024)
    other["env"]["device"] = "GPU Y"
    with pytest.raises(ValueError, match="device, versions or setting"):
        script.merge([result(128, 256, 3.0, 2048), other])
