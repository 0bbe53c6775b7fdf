"""The benchmark registry and its runner (gla_ref.bench: inputs, candidates, measures, suites, runner).

The CPU smoke runs every runnable suite with --smoke (tiny float32 shapes under Triton's and Pallas'
interpreters, 1-2 rows each; no timing is asserted) and checks the file's stamp and rows; the runner's
bookkeeping (resume, --only, budget, commits, out-of-memory skips) is checked with a stand-in measure."""

import json
import subprocess
import sys

import pytest

from gla_ref import bench
from gla_ref.bench import inputs, measures, runner, suites
from gla_ref.bench.candidates import CANDIDATES

RUNNABLE = [s.name for s in suites.SUITES.values() if not s.planned]
PLANNED = [s.name for s in suites.SUITES.values() if s.planned]
STAMP = ("commit", "date", "device", "python", "torch", "triton", "jax", "ptxas", "fla")


def test_importing_the_registry_loads_no_framework():
    code = ("import sys, gla_ref.bench, gla_ref.bench.runner, gla_ref.bench.candidates, gla_ref.bench.measures, "
            "gla_ref.bench.suites, gla_ref.bench.inputs, gla_ref.bench.ranks; "
            "print([m for m in ('torch', 'jax', 'triton') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_issue_names_every_suite_and_the_last_three_are_planned():
    assert RUNNABLE == ["headline", "paper", "varlen", "long", "pallas", "sequence_parallel"]
    assert PLANNED == ["decode", "throughput", "mqar"]


def test_list_shows_each_suite_its_status_cost_and_chapter(capsys):
    from gla_ref.bench.__main__ import main

    main(["list"])
    out = capsys.readouterr().out
    for s in suites.SUITES.values():
        line = next(line for line in out.splitlines() if line.startswith(s.name + " "))
        assert ("planned, no runner yet" if s.planned else "runnable") in line
        assert "(est.)" in line and s.chapter in line
    main(["list", "--verbose"])
    verbose = capsys.readouterr().out
    assert measures.METHODS["peak"] in verbose and "fla.chunk_gla" in verbose


@pytest.mark.parametrize("name", PLANNED)
def test_run_refuses_a_planned_suite_naming_what_is_missing(name, capsys, tmp_path):
    from gla_ref.bench.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["run", name, "--smoke", "--out", str(tmp_path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "planned, no runner yet" in err and suites.SUITES[name].planned in err
    assert not list(tmp_path.iterdir())


def test_every_task_names_a_registered_candidate_with_its_gate_and_a_unique_key():
    for s in suites.SUITES.values():
        assert set(s.candidates) <= set(CANDIDATES), s.name
        if s.planned:
            continue
        for smoke in (False, True):
            tasks = s.tasks(smoke)
            assert tasks and len({t.key for t in tasks}) == len(tasks), (s.name, smoke)
            for t in tasks:
                assert t.point["gate"] in CANDIDATES[t.name].gates, t.key
                assert set(t.measures) <= set(measures.MEASURES), t.key
        assert 1 <= len(s.tasks(True)) <= 2, s.name


def test_headline_covers_the_four_shapes_at_1k_to_16k_with_the_first_call_at_each_first_T():
    tasks = suites.suite("headline").tasks()
    assert {(t.point["K"], t.point["V"]) for t in tasks} == set(inputs.HEADLINE_SHAPES)
    assert {t.point["T"] for t in tasks} == {1024, 2048, 4096, 8192, 16384}
    assert {t.name for t in tasks} >= {"chunk_gla", "fla.chunk_gla", "fla.chunk_simple_gla"}
    assert all(("first" in t.measures) == (t.point["T"] == 1024) for t in tasks)
    assert {t.point["gate"] for t in tasks if "simple" in t.name} == {"scalar"}


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNABLE)
def test_smoke_of_every_runnable_suite_writes_a_stamped_file_with_every_row(name, tmp_path):
    path = bench.run_suite(name, smoke=True, out=tmp_path, echo=lambda text: None)
    assert path.parent == tmp_path and path.name.startswith(f"{name}_")
    result = bench.load_results(path)
    assert all(key in result["env"] for key in STAMP)
    assert result["suite"] == name and result["smoke"] and result["complete"] and not result["pending"]
    assert set(result["methods"]) <= set(measures.METHODS) and result["gate"] == inputs.PAPER_GATE
    assert [r["key"] for r in result["rows"]] == [t.key for t in suites.suite(name).tasks(smoke=True)]
    for row in result["rows"]:
        assert not [k for k in row if k.endswith("error")], row
        assert row["commit"] == result["env"]["commit"]
        assert "unavailable" in row or "fwd" in row or "fwd_bwd" in row, row
    if name == "headline":  # FLA cannot run here: reported in its row, not a crash
        ours, fla = result["rows"]
        assert ours["first_fwd_bwd_s"] > 0 and "roofline_fraction" in ours
        assert fla["unavailable"].startswith("FLA's Triton kernels: CUDA only")


def _fake_measure(calls, stop_at=None, oom_from=None):
    """A stand-in for runner.measure_task: records its tasks, raises ``Killed`` at call ``stop_at`` (a run cut
    short), runs out of memory from T = ``oom_from``."""
    class Killed(BaseException):
        pass

    def fake(task, suite, on_gpu, device_name):
        if stop_at is not None and len(calls) == stop_at:
            raise Killed
        calls.append(task.key)
        if oom_from and task.point.get("T", 0) >= oom_from:
            return {"fwd_bwd_error": "out of memory: CUDA out of memory"}
        return {"fwd": {"median_ms": 1.0}, "fwd_bwd": {"median_ms": 2.0 if "fla" in task.name else 1.0},
                "fwd_bwd_peak_bytes": 100}
    return fake, Killed


@pytest.fixture
def on_a_gpu(monkeypatch):
    """The runner as on an H200 (its full plans), with the commit pinned."""
    monkeypatch.setattr(runner, "setup_device", lambda: (True, "NVIDIA H200"))
    monkeypatch.setattr(runner, "release_gpu", lambda: None)
    monkeypatch.setattr(bench.timing, "environment", lambda: {"commit": "abc", "date": "2026-11-28", "python": "3",
                                                              "torch": "2", "device": "NVIDIA H200"})
    monkeypatch.setattr(runner, "measure_task", None)
    return monkeypatch


def test_a_killed_run_resumes_without_repeating_a_row(on_a_gpu, tmp_path):
    calls = []
    fake, Killed = _fake_measure(calls, stop_at=7)
    on_a_gpu.setattr(runner, "measure_task", fake)
    with pytest.raises(Killed):
        bench.run_suite("headline", out=tmp_path, only=["KxV=64x64"], echo=lambda text: None)
    path = tmp_path / "headline_nvidia_h200.json"
    cut = json.loads(path.read_text())
    assert len(cut["rows"]) == 7 and len(cut["pending"]) == 1 and not cut["complete"]
    fake, _ = _fake_measure(calls)
    on_a_gpu.setattr(runner, "measure_task", fake)
    bench.run_suite("headline", out=tmp_path, only=["KxV=64x64"], echo=lambda text: None)
    done = json.loads(path.read_text())
    keys = [t.key for t in suites.suite("headline").tasks() if t.point["K"] == 64]
    assert [r["key"] for r in done["rows"]] == keys and calls == keys  # each measured once, the cut one again
    assert not [k for r in done["rows"] for k in r if k.endswith("error")]
    assert not done["pending"] and not done["complete"] and done["planned_rows"] == 120  # --only: one shape of four
    ratio = next(r for r in done["ratios"] if r["K"] == 64 and r["T"] == 1024)
    assert ratio["chunk_gla/fla.chunk_gla fwd_bwd"] == 0.5


def test_a_row_cut_short_twice_is_recorded_and_skipped(on_a_gpu, tmp_path):
    for _ in range(2):
        fake, Killed = _fake_measure([], stop_at=0)
        on_a_gpu.setattr(runner, "measure_task", fake)
        with pytest.raises(Killed):
            bench.run_suite("varlen", out=tmp_path, echo=lambda text: None)
    calls = []
    on_a_gpu.setattr(runner, "measure_task", _fake_measure(calls)[0])
    bench.run_suite("varlen", out=tmp_path, echo=lambda text: None)
    rows = json.loads((tmp_path / "varlen_nvidia_h200.json").read_text())["rows"]
    assert rows[0]["error"].startswith("cut short in 2 runs") and len(calls) == len(rows) - 1


def test_a_kernel_fault_ends_the_run_with_its_row_recorded_and_the_next_run_goes_on(on_a_gpu, tmp_path):
    calls = []
    fake = _fake_measure(calls)[0]

    def faulting(task, *args):
        out = fake(task, *args)
        return {"fwd_error": "AcceleratorError: CUDA error: misaligned address"} if len(calls) == 2 else out

    on_a_gpu.setattr(runner, "measure_task", faulting)
    with pytest.raises(runner.RunError, match="run the same command again"):
        bench.run_suite("varlen", out=tmp_path, echo=lambda text: None)
    bench.run_suite("varlen", out=tmp_path, echo=lambda text: None)
    rows = json.loads((tmp_path / "varlen_nvidia_h200.json").read_text())["rows"]
    assert len(calls) == 3 and "misaligned" in rows[1]["fwd_error"] and "fwd" in rows[2]


def test_a_new_commit_starts_afresh_unless_resume(on_a_gpu, tmp_path):
    calls = []
    on_a_gpu.setattr(runner, "measure_task", _fake_measure(calls)[0])
    bench.run_suite("varlen", out=tmp_path, echo=lambda text: None)
    bench.run_suite("varlen", out=tmp_path, echo=lambda text: None)  # complete at this commit: nothing to do
    assert len(calls) == 3
    env = {"commit": "def", "date": "2026-11-29", "python": "3", "torch": "2", "device": "NVIDIA H200"}
    on_a_gpu.setattr(bench.timing, "environment", lambda: dict(env))
    bench.run_suite("varlen", out=tmp_path, resume=True, echo=lambda text: None)
    kept = json.loads((tmp_path / "varlen_nvidia_h200.json").read_text())
    assert len(calls) == 3 and kept["commits"] == ["abc", "def"] and {r["commit"] for r in kept["rows"]} == {"abc"}
    bench.run_suite("varlen", out=tmp_path, echo=lambda text: None)  # the file now says "def": nothing to do
    assert len(calls) == 3
    on_a_gpu.setattr(bench.timing, "environment", lambda: dict(env, commit="ghi"))
    bench.run_suite("varlen", out=tmp_path, echo=lambda text: None)
    fresh = json.loads((tmp_path / "varlen_nvidia_h200.json").read_text())
    assert len(calls) == 6 and {r["commit"] for r in fresh["rows"]} == {"ghi"} and fresh["commits"] == ["ghi"]


def test_only_budget_and_a_file_another_script_wrote(on_a_gpu, tmp_path):
    calls = []
    on_a_gpu.setattr(runner, "measure_task", _fake_measure(calls)[0])
    bench.run_suite("headline", out=tmp_path, only=["name=chunk_gla,name=fla.chunk_gla", "KxV=128x256,T=1024"],
                    echo=lambda text: None)
    assert calls == ["name=chunk_gla B=8 T=1024 H=16 K=128 V=256 dtype=bfloat16 gate=gla",
                     "name=fla.chunk_gla B=8 T=1024 H=16 K=128 V=256 dtype=bfloat16 gate=gla"]
    with pytest.raises(ValueError, match="no row has the field"):
        bench.run_suite("headline", out=tmp_path, only=["colour=red"], echo=lambda text: None)
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        runner.parse_only(["T1024"])
    said = []
    bench.run_suite("paper", out=tmp_path, budget_s=0, echo=said.append)
    assert len(calls) == 2 and any(line.startswith("stopped:") for line in said)
    old = tmp_path / "long_nvidia_h200.json"
    old.write_text(json.dumps({"env": {}, "rows": []}))
    with pytest.raises(runner.RunError, match="--fresh replaces it"):
        bench.run_suite("long", out=tmp_path, echo=lambda text: None)


def test_after_running_out_of_memory_longer_sequences_are_skipped(on_a_gpu, tmp_path):
    calls = []
    on_a_gpu.setattr(runner, "measure_task", _fake_measure(calls, oom_from=2 ** 20)[0])
    bench.run_suite("long", out=tmp_path, only=["name=chunk_gla"], echo=lambda text: None)
    rows = json.loads((tmp_path / "long_nvidia_h200.json").read_text())["rows"]
    assert [r["T"] for r in rows if "skipped" in r] == [2 ** 21, 2 ** 22]
    assert rows[-1]["skipped"] == f"out of memory at T={2 ** 20}" and len(calls) == len(rows) - 2


def test_peak_memory_starts_every_step_with_no_gradients_and_reports_the_spread():
    class Leaf:
        grad = "stale"

    leaves, seen, sizes = [Leaf(), Leaf()], [], iter([30, 10, 20])

    def counter(step):
        seen.append([x.grad for x in leaves])
        step()
        return next(sizes)

    def step():
        for x in leaves:
            x.grad = "new"

    out = measures.peak_memory(step, leaves, 3, counter=counter)
    assert seen == [[None, None]] * 3 and [x.grad for x in leaves] == [None, None]
    assert out == {"bytes": 20, "spread_bytes": 20, "runs_bytes": [30, 10, 20]}
    with pytest.raises(ValueError, match="repeats"):
        measures.peak_memory(step, leaves, 0, counter=counter)


def test_the_roofline_fraction_is_the_cost_models_bound_over_the_time():
    point = {"B": 8, "T": 4096, "H": 16, "K": 128, "V": 128, "dtype": "bfloat16", "gate": "gla"}
    bound = bench.roofline(bench.forward_cost("chunk_gla", 8, 4096, 16, 128, 128), bench.datasheet_peaks("NVIDIA H200"))
    assert measures.roofline_fraction("chunk_gla", point, 2.0, "NVIDIA H200") == pytest.approx(bound["bound_ms"] / 2.0)
    assert measures.roofline_fraction("chunk_gla", point, 2.0, "cpu") is None
    assert measures.roofline_fraction(None, point, 2.0, "NVIDIA H200") is None
    assert measures.roofline_fraction("chunk_gla", {**point, "chunk_size": 32}, 2.0, "NVIDIA H200") is None


def test_inputs_draw_q_k_v_then_the_papers_gate_from_one_generator():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    q, k, v, g = inputs.torch_inputs(2, 5, 3, 4, 6, "gla", "float32", "cpu", seed=7)
    gen = torch.Generator().manual_seed(7)
    want = [torch.randn(2, 5, 3, 4, generator=gen), torch.randn(2, 5, 3, 4, generator=gen),
            torch.randn(2, 5, 3, 6, generator=gen), F.logsigmoid(torch.randn(2, 5, 3, 4, generator=gen)) / 16]
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, g), want)) and all(x.requires_grad for x in (q, k, v, g))
    assert inputs.torch_inputs(1, 5, 3, 4, 6, "scalar", "float32", "cpu")[3].shape == (1, 5, 3)
    assert inputs.torch_inputs(1, 5, 3, 4, 6, "const", "float32", "cpu")[3].shape == (3,)
    assert inputs.torch_inputs(1, 5, 3, 4, 6, "none", "float32", "cpu")[3] is None
    (q, k, v, g), offsets = inputs.packed_inputs((3, 1, 5), 2, 4, 6, device="cpu", dtype="float32")
    assert q.shape == (1, 9, 2, 4) and offsets.tolist() == [0, 3, 4, 9]
    padded = inputs.pad(v.detach(), (3, 1, 5))
    assert padded.shape == (3, 5, 2, 6) and torch.equal(inputs.unpad(padded, (3, 1, 5)), v.detach())
    assert inputs.parse_shape("128x256") == (128, 256)
    with pytest.raises(ValueError, match="KxV"):
        inputs.parse_shape("128")


def test_a_missing_peer_is_reported_never_raised_as_a_crash(monkeypatch):
    """A peer that needs CUDA, asked for on a machine without it (on a GPU machine, one pretending to have none)."""
    pytest.importorskip("torch")
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    point = {"B": 1, "T": 8, "H": 1, "K": 16, "V": 16, "dtype": "float32", "gate": "gla"}
    for name in ("fla.chunk_gla", "fla.fused_recurrent_gla"):
        with pytest.raises(bench.Unavailable, match="CUDA only"):
            bench.instantiate(name, point)
    assert runner.measure_task(suites.Task("sdpa_flash", {**point, "gate": "none"}, ("fwd",)),
                               suites.suite("paper"), False, "cpu") == {
        "unavailable": "SDPA's flash and cuDNN backends: CUDA only, and this machine has no CUDA GPU"}
    with pytest.raises(ValueError, match="takes the gates"):
        bench.instantiate("chunk_simple_gla", point)


def test_the_benchmarks_readme_maps_every_script_and_describes_every_suite():
    from gla_ref.testing.scripts import BENCHMARKS

    text = (BENCHMARKS / "README.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in text.splitlines() if line.startswith("| `")}
    assert {p.name for p in BENCHMARKS.glob("*.py")} <= rows
    for s in suites.SUITES.values():
        assert s.name in rows and f"~{s.minutes:g} (est.)" in text and s.kind in text
    assert "python3 -m gla_ref.bench run headline" in text


def test_a_suite_reads_its_own_file_not_a_longer_kind_that_starts_like_it(tmp_path):
    env = {"date": "2026-11-28", "python": "3", "torch": "2", "device": "NVIDIA H200"}
    for name in ("paper_setups_nvidia_h200.json", "pallas_bench_nvidia_h200.json"):
        (tmp_path / name).write_text(json.dumps({"env": env, "rows": [{"x": 1}]}))
    assert bench.latest_results("paper", tmp_path) is None and bench.latest_results("pallas", tmp_path) is None
    (tmp_path / "paper_nvidia_h200.json").write_text(json.dumps({"env": env, "suite": "paper", "rows": []}))
    assert bench.latest_results("paper", tmp_path)[1]["suite"] == "paper"
    assert bench.latest_results("paper_setups", tmp_path) is not None
    assert "python -m gla_ref.bench run headline" in bench.hint("headline")


def test_the_budget_expects_the_slowest_row_of_the_same_kind():
    tasks = suites.suite("headline").tasks()
    by_key = {t.key: t for t in tasks}
    first, later = tasks[0], tasks[len(suites.HEADLINE)]  # chunk_gla at the first T (with its first call), then not
    assert "first" in first.measures and "first" not in later.measures and first.name == later.name
    rows = [{"key": first.key, "name": first.name, "row_s": 300.0},
            {"key": tasks[1].key, "name": tasks[1].name, "row_s": 200.0}]
    assert runner.expected_s(later, rows, by_key) == 0.0  # nothing alike measured yet
    rows.append({"key": later.key, "name": later.name, "row_s": 9.0})
    assert runner.expected_s(later, rows, by_key) == 9.0
    assert runner.expected_s(tasks[2], rows, by_key) == 300.0  # another candidate's first call: the slowest such
