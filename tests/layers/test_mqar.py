"""MQAR (gla_ref.tasks.mqar): the generator's invariants, a training step that lowers the loss, the sweep's
rows, and benchmarks/mqar_sweep.py --smoke writing a result that bench.load_results accepts.

Shapes are tiny (T ≤ 64, d = 16) so the CPU runs them in seconds.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from gla_ref import bench
from gla_ref.tasks import mqar

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASK = dict(seq_len=64, num_pairs=8, vocab_size=64)


def _examples(n=200, seed=0, **kw):
    task = {**TASK, **kw}
    return mqar.make_mqar(n, task["seq_len"], task["num_pairs"], task["vocab_size"], seed)


def test_each_query_answer_is_the_value_paired_with_its_key():
    inputs, targets = _examples()
    P, T = TASK["num_pairs"], TASK["seq_len"]
    keys, values = mqar.vocabulary(TASK["vocab_size"])
    assert inputs.shape == targets.shape == (200, T) and inputs.dtype == targets.dtype == np.int64
    for x, y in zip(inputs, targets):
        pairs = dict(zip(x[0:2 * P:2].tolist(), x[1:2 * P:2].tolist()))
        assert len(pairs) == P and len(set(pairs.values())) == P  # distinct keys, distinct values
        assert all(k in keys for k in pairs) and all(v in values for v in pairs.values())
        q = np.flatnonzero(y != mqar.IGNORE_INDEX)
        assert len(q) == P and (q >= 2 * P).all() and (q % 2 == 0).all()  # after the pairs, even offsets
        assert sorted(x[q].tolist()) == sorted(pairs)  # every key asked exactly once
        assert all(y[t] == pairs[x[t]] for t in q)  # the answer is the value that followed the key
        rest = np.setdiff1d(np.arange(2 * P, T), q)
        assert (x[rest] == 0).all()  # fillers elsewhere


def test_no_leakage_and_seeds_reproducible():
    inputs, targets = _examples()
    P = TASK["num_pairs"]
    q = targets != mqar.IGNORE_INDEX
    # the answer never appears in the input after the pairs: not at the query, not after it
    after = inputs[:, 2 * P:]
    assert not np.isin(after, np.arange(TASK["vocab_size"] // 2, TASK["vocab_size"])).any()
    # targets only at query positions (keys), never at a value or a filler
    assert (inputs[q] < TASK["vocab_size"] // 2).all() and (inputs[q] > 0).all()
    again = _examples()
    assert np.array_equal(inputs, again[0]) and np.array_equal(targets, again[1])
    other = _examples(seed=1)[0]
    assert not np.array_equal(inputs, other)
    cfg = mqar.MQARConfig(**TASK, batch_size=64, num_test=64)
    train_rows = {r.tobytes() for step in range(4) for r in cfg.batch(step)[0]}
    assert not train_rows & {r.tobytes() for r in cfg.test_set()[0]}  # held-out set disjoint from training
    assert not np.array_equal(cfg.batch(0)[0], cfg.batch(1)[0])


def test_query_gaps_follow_the_power_law():
    inputs, targets = _examples(n=4000, seq_len=64, num_pairs=2)
    slots = (np.flatnonzero((targets != mqar.IGNORE_INDEX).ravel()) % 64 - 4) // 2
    counts = np.bincount(slots, minlength=30)
    assert counts.sum() == 8000 and counts[0] > 2 * counts[10] > 0  # small gaps likelier, large still drawn


@pytest.mark.parametrize("kw, match", [
    (dict(seq_len=30, num_pairs=8), "at least 4"),
    (dict(num_pairs=40, seq_len=200), "distinct keys"),
    (dict(vocab_size=3), "vocab_size"),
    (dict(num_pairs=0), "num_pairs"),
])
def test_bad_task_is_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        _examples(**kw)


def test_config_schedule_and_checks():
    cfg = mqar.MQARConfig(steps=100, warmup=0.1)
    assert cfg.lr_factor(0) == pytest.approx(0.1) and cfg.lr_factor(9) == 1.0
    assert cfg.lr_factor(99) < 0.01
    with pytest.raises(ValueError, match="batch_size"):
        mqar.MQARConfig(batch_size=0)


@pytest.mark.parametrize("short_conv", [False, True])
def test_training_lowers_the_loss_and_evaluates(short_conv):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    cfg = mqar.MQARConfig(seq_len=16, num_pairs=2, vocab_size=16, steps=40, batch_size=16, lr=1e-2, num_test=32)
    model = mqar.build_model("gla", 16, cfg.vocab_size, seed=0, short_conv=short_conv)
    before = mqar.evaluate(model, *cfg.test_set())
    out = mqar.train(model, cfg)
    assert len(out["losses"]) == 40 and out["examples"] == 640
    assert np.mean(out["losses"][-5:]) < np.mean(out["losses"][:5]) - 0.3
    assert out["test_loss"] < before["loss"] and 0.0 <= out["accuracy"] <= 1.0
    x, y = cfg.test_set()
    assert mqar.evaluate(model, x, y)["queries"] == int((y != mqar.IGNORE_INDEX).sum())


def test_sweep_rows_and_summary():
    pytest.importorskip("torch")
    cfg = mqar.MQARConfig(seq_len=16, num_pairs=2, vocab_size=16, steps=2, batch_size=4, num_test=8)
    seen = []
    rows = mqar.sweep(cfg, mixers=("linear", "gla"), widths=(16,), pairs=(2, 3), seeds=(0, 1), on_row=seen.append)
    assert rows == seen and len(rows) == 8
    assert [r["seed"] for r in rows] == [0] * 4 + [1] * 4  # seed-major order
    assert {r["num_pairs"] for r in rows} == {2, 3}
    table = mqar.summarize(rows)
    assert set(table) == {(m, P, 16) for m in ("linear", "gla") for P in (2, 3)}
    assert all(t["n"] == 2 and t["min"] <= t["mean"] <= t["max"] for t in table.values())
    gla = [r for r in rows if r["mixer"] == "gla"][0]
    assert gla["params"] > [r for r in rows if r["mixer"] == "linear"][0]["params"]  # the gate's weights
    same = mqar.run("gla", 16, dataclasses.replace(cfg, seed=0))
    assert same["accuracy"] == gla["accuracy"] and same["loss_curve"] == gla["loss_curve"]  # seeded


def test_short_conv_is_the_default_and_recorded():
    pytest.importorskip("torch")
    from gla_ref.layers.torch import ShortConvolution

    def convs(model):
        return sum(isinstance(m, ShortConvolution) for m in model.modules())

    assert convs(mqar.build_model("linear", 16, 16)) == 6  # q, k, v in each of the two layers
    assert convs(mqar.build_model("linear", 16, 16, short_conv=False)) == 0
    with pytest.raises(TypeError, match="short_conv must be a bool"):
        mqar.build_model("gla", 16, 16, short_conv="yes")
    cfg = mqar.MQARConfig(seq_len=16, num_pairs=2, vocab_size=16, steps=1, batch_size=2, num_test=4)
    with_conv, without = (mqar.run("retnet", 16, cfg, short_conv=c) for c in (True, False))
    assert with_conv["short_conv"] is True and without["short_conv"] is False
    assert with_conv["params"] - without["params"] == 2 * 4 * (2 * 8 + 16)  # W·(2·d_k + d_v) per layer


def test_plot_accuracy_draws_a_panel_per_pair_count():
    import matplotlib

    matplotlib.use("Agg")
    rows = [{"mixer": m, "hidden_size": d, "num_pairs": P, "seq_len": 64, "seed": s, "accuracy": a}
            for m, a in (("linear", 0.1), ("gla", 0.9)) for d in (32, 64) for P in (4, 8) for s in (0, 1)]
    axes = mqar.plot_accuracy(rows)
    assert len(axes) == 2 and len(axes[0].get_lines()) >= 2


def test_smoke_script_writes_a_loadable_result(tmp_path):
    out = tmp_path / "mqar_smoke.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mqar_sweep.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = bench.load_results(out)
    assert len(result["rows"]) == len(mqar.MIXERS) and result["complete"] is True
    assert {r["mixer"] for r in result["rows"]} == set(mqar.MIXERS)
    assert proc.stdout.count("acc") >= len(mqar.MIXERS)  # a progress line per run
    env = json.loads(out.read_text())["env"]
    assert env["smoke"] is True and env["short_conv"] is True
    assert all(r["short_conv"] is True for r in result["rows"])
    assert "mqar" in bench.SCRIPTS and bench.SCRIPTS["mqar"] == "mqar_sweep.py"


def test_sweep_script_starts_no_run_past_its_budget(monkeypatch):
    """The scheduler of mqar_sweep.py with a fake clock: each run takes 10 s; with a 25 s budget the
    third run would end past it (20 s spent + 10 s longest > 25), so two of five run."""
    import types

    from gla_ref.testing.scripts import load_script

    script = load_script("mqar_sweep")
    clock = {"now": 0.0}
    monkeypatch.setattr(script, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    monkeypatch.setattr(script, "_init_worker", lambda threads: None)

    def fake_run(job):
        clock["now"] += 10.0
        return {"job": job, "seconds": 10.0}

    monkeypatch.setattr(script, "run_one", fake_run)
    seen = []
    args = types.SimpleNamespace(workers=1, budget_s=25.0)
    rows = script.execute(list(range(5)), args, seen.append)
    assert [r["job"] for r in rows] == [0, 1] and rows == seen
    assert len(script.execute(list(range(5)), types.SimpleNamespace(workers=1, budget_s=0.0), seen.append)) == 5


def test_importing_mqar_loads_no_framework():
    code = ("import sys, gla_ref.tasks.mqar; "
            "print(sorted(m for m in ('torch', 'jax', 'triton', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
