"""benchmarks/speed_vs_fla.py end to end in its CPU smoke mode (Triton's interpreter, float32, tiny shapes)."""

import argparse

import pytest

from bench_scripts import load_script

from gla_ref import bench

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


def test_a_run_cut_short_keeps_the_lengths_it_finished(tmp_path, monkeypatch):
    """The device stops a command at its time limit: the file is written after every T, not only per shape."""
    script = _script()
    measure, calls = script.measure, []

    class Stopped(Exception):
        pass

    def stop_in_second_T(*args, **kwargs):
        if len(calls) == len(script.OURS):  # every candidate of the first T has run
            raise Stopped
        calls.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(script, "measure", stop_in_second_T)
    out = tmp_path / "cut.json"
    with pytest.raises(Stopped):
        script.main(["--smoke", "--out", str(out)])
    kept = bench.load_results(out)
    assert {r["T"] for r in kept["rows"]} == {script.SMOKE["T"][0]} and len(kept["rows"]) == len(script.OURS)
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
    the walk it relies on (first_call.autotuners) on the real package: each kernel once, by its home."""
    script = _script()
    real = script.autotuners()
    assert "chunk_state.chunk_state_fwd_kernel" in real and "chunk_intra.chunk_intra_kernel" in real
    assert len({id(t) for t in real.values()}) == len(real)  # a kernel imported elsewhere is not counted twice

    class StandIn:
        def __init__(self, n):
            self.cache = dict.fromkeys(range(n))

    tuners = {"a": StandIn(2), "b": StandIn(3)}
    monkeypatch.setattr(script, "autotuners", lambda: tuners)
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
