"""Chapter 7: loading stamped results, crossover, timers, the forward cost and memory models (hand
counts and the measured peaks of the stored GPU run), the timing splits of the chunk form, the plots,
and the chunk-size sweep script end to end under Triton's interpreter."""

import json
import math
import pathlib
import time

import matplotlib
import pytest

torch = pytest.importorskip("torch")

from gla_ref import bench, torch_ref  # noqa: E402
from gla_ref.viz import plots  # noqa: E402
from gla_ref.testing import as_torch, random_inputs, rel_rmse  # noqa: E402
from gla_ref.testing.scripts import load_script  # noqa: E402

matplotlib.use("Agg")
ROOT = pathlib.Path(__file__).resolve().parents[2]
STAMP = {"date": "2026-01-02", "python": "3.11", "torch": "2.5", "jax": None, "device": "NVIDIA H200"}


# ----------------------------------------------------------------------------- crossover

def test_crossover_of_linear_and_quadratic_curves_is_exact():
    # a = 3 T (linear), b = T² / 1000 (quadratic): equal at T = 3000; log(a/b) is linear in log T,
    # so interpolating between the samples around it is exact
    Ts = [1024, 2048, 4096, 8192]
    a = [3 * T for T in Ts]
    b = [T * T / 1000 for T in Ts]
    assert bench.crossover_T(Ts, a, b) == pytest.approx(3000, rel=1e-12)


def test_crossover_by_hand_and_edge_cases():
    # log(a/b) = log 2 at T=1, -log 2 at T=4: the zero halfway in log T, at T = 2
    assert bench.crossover_T([1, 4], [2.0, 1.0], [1.0, 2.0]) == pytest.approx(2.0)
    # a equal to b at a measured length: that length
    assert bench.crossover_T([10, 20, 40], [5, 4, 3], [1, 4, 9]) == pytest.approx(20)
    # only the first sign change counts
    assert bench.crossover_T([1, 2, 4, 8], [2, 1, 2, 1], [1, 2, 1, 2]) == pytest.approx(math.sqrt(2))
    assert bench.crossover_T([1, 2], [1.0, 1.0], [2.0, 3.0]) is None  # a already below b
    assert bench.crossover_T([1, 2], [3.0, 4.0], [1.0, 2.0]) is None  # a never falls to b


@pytest.mark.parametrize("Ts,a,b", [([1, 2], [1], [1, 2]), ([1], [1], [1]), ([2, 1], [1, 1], [1, 1]),
                                    ([1, 1], [1, 1], [1, 1]), ([1, 2], [0, 1], [1, 1])])
def test_crossover_rejects_bad_curves(Ts, a, b):
    with pytest.raises(ValueError):
        bench.crossover_T(Ts, a, b)


# ----------------------------------------------------------------------------- results files

def _write(path, data):
    path.write_text(json.dumps(data))
    return path


def test_load_results_requires_the_stamp(tmp_path):
    rows = [{"T": 1, "name": "x", "fwd": {"median_ms": 1.0}}]
    with pytest.raises(ValueError, match="no 'env' stamp"):
        bench.load_results(_write(tmp_path / "a.json", {"rows": rows}))
    with pytest.raises(ValueError, match="date"):
        bench.load_results(_write(tmp_path / "b.json", {"env": {**STAMP, "date": None}, "rows": rows}))
    with pytest.raises(ValueError, match="device"):
        bench.load_results(_write(tmp_path / "c.json", {"env": {k: v for k, v in STAMP.items() if k != "device"},
                                                        "rows": rows}))
    with pytest.raises(ValueError, match="torch or jax"):
        bench.load_results(_write(tmp_path / "d.json", {"env": {**STAMP, "torch": None}, "rows": rows}))
    with pytest.raises(ValueError, match="rows"):
        bench.load_results(_write(tmp_path / "e.json", {"env": STAMP, "rows": {}}))
    assert bench.load_results(_write(tmp_path / "f.json", {"env": STAMP, "rows": rows}))["rows"] == rows


def test_stored_results_carry_the_stamp():
    stored = sorted((ROOT / "benchmarks" / "results").glob("*_bench_*.json"))
    assert stored, "no stored benchmark results"
    for path in stored:
        assert bench.load_results(path)["env"]["device"]


def test_latest_results_picks_the_newest_stamp(tmp_path):
    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    _write(res / "x_bench_b.json", {"env": {**STAMP, "date": "2026-03-01"}, "rows": [{}, {}, {}]})
    _write(res / "x_bench_a.json", {"env": {**STAMP, "date": "2026-05-01"}, "rows": [{}, {}]})
    _write(res / "x_bench_a_partial.json", {"env": {**STAMP, "date": "2026-05-01"}, "rows": [{}]})
    _write(res / "y_bench_c.json", {"env": {**STAMP, "date": "2027-01-01"}, "rows": []})
    path, data = bench.latest_results("x_bench", res)  # the newest date, then the most rows
    assert path.name == "x_bench_a.json" and data["env"]["date"] == "2026-05-01"
    assert bench.latest_results("z_bench", res) is None


def test_results_dir_is_the_checkouts_and_every_kind_has_its_script(tmp_path, monkeypatch):
    assert bench.results_dir() == ROOT / "benchmarks" / "results"  # imported from this checkout
    names = [p.name for p in bench.results_dir().glob("*.json")]  # <prefix>_<device>.json (cpu, nvidia_h200)
    for prefix, script in bench.SCRIPTS.items():
        assert (ROOT / "benchmarks" / script.split()[0]).is_file(), script  # a script, maybe with arguments
    assert [n for n in names if not any(n.startswith(prefix + "_") for prefix in bench.SCRIPTS)] == []
    monkeypatch.chdir(tmp_path)  # not read from the working directory
    assert bench.latest_results("triton_bench")[0].parent == ROOT / "benchmarks" / "results"


def test_hint_is_a_runnable_command_naming_the_script():
    from gla_ref.runtime import repository_url

    text = bench.hint("grad_memory")
    assert f"git clone {repository_url()}" in text and "python benchmarks/grad_memory.py" in text
    with pytest.raises(ValueError, match="prefix"):
        bench.hint("nonsense")


def test_series_sorts_and_skips_failed_rows():
    result = {"rows": [{"T": 4, "name": "k", "fwd": {"median_ms": 3.0}, "peak": 40},
                       {"T": 2, "name": "k", "fwd": {"median_ms": 1.0}, "peak": 20},
                       {"T": 8, "name": "k", "error": "out of memory"},
                       {"T": 2, "name": "other", "fwd": {"median_ms": 9.0}}]}
    assert bench.series(result, "k", "fwd") == ([2, 4], [1.0, 3.0])
    assert bench.series(result, "k", "peak") == ([2, 4], [20, 40])
    assert bench.series(result, "missing", "fwd") == ([], [])
    assert bench.common_series(result, ["k", "other"], "fwd") == ([2], {"k": [1.0], "other": [9.0]})
    assert bench.common_series(result, ["k"], "peak") == ([2, 4], {"k": [20, 40]})


# ----------------------------------------------------------------------------- timers and peaks

def test_time_wall_counts_calls_and_times_inside_sync():
    calls = []
    t = bench.time_wall(lambda: calls.append(1), warmup=2, rep=5)
    assert len(calls) == 1 + 2 + 5 and len(t["runs_ms"]) == 5
    assert t["p20_ms"] <= t["median_ms"] <= t["p80_ms"]
    # the work an asynchronous call leaves behind (here: a 20 ms sleep in sync) is timed only with sync
    lazy = bench.time_wall(lambda: "handle", warmup=0, rep=3)
    synced = bench.time_wall(lambda: "handle", warmup=0, rep=3, sync=lambda h: time.sleep(0.02))
    assert synced["median_ms"] >= 20 > lazy["median_ms"]


def test_time_wall_first_call_is_reported_apart():
    state = {"compiled": False}

    def fn():
        if not state["compiled"]:
            time.sleep(0.05)
            state["compiled"] = True

    t = bench.time_wall(fn, warmup=0, rep=3)
    assert t["first_ms"] >= 50 > max(t["runs_ms"])


@pytest.mark.parametrize("kw", [{"warmup": -1}, {"rep": 0}, {"rep": 1.5}, {"warmup": True}])
def test_time_wall_rejects_bad_counts(kw):
    with pytest.raises(ValueError):
        bench.time_wall(lambda: None, **kw)


def test_matmul_tflops_rejects_a_bad_dtype_before_touching_a_gpu():
    with pytest.raises(ValueError, match="dtype"):
        bench.matmul_tflops_cuda(64, "float64")
    with pytest.raises(ValueError, match="n must be"):
        bench.matmul_tflops_cuda(0)


def test_datasheet_peaks():
    h200 = bench.datasheet_peaks("NVIDIA H200")
    assert h200 == {"bf16_TFLOPs": 989.0, "fp32_TFLOPs": 67.0, "hbm_GBps": 4800.0}
    h200["hbm_GBps"] = 0  # a copy: the table is not changed
    assert bench.datasheet_peaks("NVIDIA H200")["hbm_GBps"] == 4800.0
    assert bench.datasheet_peaks("NVIDIA H100 PCIe") is None  # not the SXM part: no guess


# ----------------------------------------------------------------------------- cost models

def test_chunk_gla_stage_costs_by_hand():
    # B=H=1, T=C=32, c=16, K=V=16: one chunk of two sub-chunks; q, k, v, o have 512 elements each
    s = bench.chunk_gla_stage_costs(1, 32, 1, 16, 16, C=32, c=16)
    # g (4 bytes) and q, k (2 each) read; b (4 bytes), Q ⊙ Λ and K ⊙ Γ (2 each) written
    assert s["cumsum"] == {"tc_flops": 0, "fp32_flops": 0, "bytes": 512 * 16}
    # KᵀV: 2·32·16·16 FLOPs; K ⊙ Γ, v in bf16 (2·512·2), the chunk's last b row (16·4), one 16×16 state
    # in bf16 (512)
    assert s["state"] == {"tc_flops": 16384, "fp32_flops": 0, "bytes": 2048 + 64 + 512}
    # one off-diagonal 16×16 tile of QKᵀ (2·16·16·16) on tensor cores, two diagonal ones in float32;
    # q, k read (2048), b (2048), A (32·32, bf16) written
    assert s["intra"] == {"tc_flops": 8192, "fp32_flops": 16384, "bytes": 2048 + 2048 + 2048}
    # (Q ⊙ Λ) S: 2·32·16·16; A V over the three lower tiles: 3·2·16·16·16; Q ⊙ Λ (1024), the state,
    # A, v read and o written
    assert s["output"] == {"tc_flops": 16384 + 24576, "fp32_flops": 0, "bytes": 1024 + 512 + 2048 + 2048}
    # states_in_fp32=True: the state written by one kernel and read by the other takes 1024 bytes
    s32 = bench.chunk_gla_stage_costs(1, 32, 1, 16, 16, C=32, c=16, state_bytes=4)
    assert {k: s32[k]["bytes"] - s[k]["bytes"] for k in s} == {"cumsum": 0, "state": 512, "intra": 0, "output": 512}
    # a float32 A (builds before it was stored in the input dtype): 2048 more bytes written and read
    sa = bench.chunk_gla_stage_costs(1, 32, 1, 16, 16, C=32, c=16, a_bytes=4)
    assert {k: sa[k]["bytes"] - s[k]["bytes"] for k in s} == {"cumsum": 0, "state": 0, "intra": 2048, "output": 2048}
    with pytest.raises(ValueError, match="state_bytes"):
        bench.chunk_gla_stage_costs(1, 32, 1, 16, 16, C=32, state_bytes=0)
    with pytest.raises(ValueError, match="a_bytes"):
        bench.chunk_gla_stage_costs(1, 32, 1, 16, 16, C=32, a_bytes=0)


@pytest.mark.parametrize("B,T,H,K,V,C", [(2, 1000, 3, 64, 32, 64), (8, 4096, 16, 128, 128, 32)])
def test_chunk_gla_forward_cost_adds_its_stages_and_the_flop_split(B, T, H, K, V, C):
    stages = bench.chunk_gla_stage_costs(B, T, H, K, V, C=C)
    split = bench.two_level_flop_split(T, C, 16, K, V)
    assert sum(s["tc_flops"] for s in stages.values()) == B * H * split["half_matmul"]
    assert sum(s["fp32_flops"] for s in stages.values()) == B * H * split["full_precision"]
    if C == 64:
        total = bench.forward_cost("chunk_gla", B, T, H, K, V)
        assert total["bytes"] == sum(s["bytes"] for s in stages.values())


def test_fused_and_simple_costs_by_hand():
    # B=H=1, T=C=16, K=V=16: QKᵀ in float32 (2·16·16·16), the rest (KᵀV, Q S, P V) on tensor cores;
    # q, k, v, o in bf16 (256 elements, 512 bytes each) and g in float32 (1024)
    assert bench.fused_chunk_gla_cost(1, 16, 1, 16, 16) == {"tc_flops": 3 * 8192, "fp32_flops": 8192,
                                                            "bytes": 4 * 512 + 1024}
    # simple GLA at K = V = d is the chunkwise count of chapter 1, all on tensor cores
    cost = bench.chunk_simple_gla_cost(2, 300, 3, 64, 64, C=64)
    assert cost["tc_flops"] == 2 * 3 * bench.flops_chunkwise(300, 64, 64) and cost["fp32_flops"] == 0
    # bytes with T=C=16, K=V=16, B=H=1: gate 16·(4+4); state: k, v (1024), b (64), one bf16 state (512);
    # output: q, k, v, o (2048), b (64), the state (512); with float32 states 2 · 512 more
    assert bench.chunk_simple_gla_cost(1, 16, 1, 16, 16, C=16)["bytes"] == 128 + 1600 + 2624
    assert bench.chunk_simple_gla_cost(1, 16, 1, 16, 16, C=16, state_bytes=4)["bytes"] == 128 + 2112 + 3136


def test_sdpa_cost_is_the_causal_half_of_attention():
    # T=3, d=2 by hand: 6 causal pairs, each 2·2 FLOPs for q·k and 2·2 for the weight times v
    assert bench.sdpa_causal_cost(1, 3, 1, 2, 2)["tc_flops"] == 6 * 8
    for T, d in [(3, 2), (1024, 128)]:
        flops = bench.sdpa_causal_cost(2, T, 4, d, d)["tc_flops"]
        assert flops == 8 * (bench.flops_attention(T, d) + 4 * T * d) // 2
    # q, k, v, o in bf16 and one float32 log-sum-exp per query
    assert bench.sdpa_causal_cost(1, 3, 1, 2, 2)["bytes"] == 4 * 6 * 2 + 3 * 4


def test_forward_cost_and_allocations_reject_unknown_names():
    with pytest.raises(ValueError, match="name must be one of"):
        bench.forward_cost("fla.chunk_gla", 1, 16, 1, 16, 16)
    with pytest.raises(ValueError, match="name must be one of"):
        bench.forward_allocations("sdpa_flash", 1, 16, 1, 16, 16)
    with pytest.raises(ValueError):
        bench.chunk_gla_stage_costs(1, 16, 1, 16, 16, C=24, c=16)


def test_allocations_by_hand():
    # B=2, T=100, H=1, K=V=8, bf16: b 2·100·8·4, ⌈100/64⌉ = 2 states of 8×8 per sequence in the
    # input dtype (bf16: 128 bytes; float32 with states_in_fp32: 256), A 2·100·64·2 (float32 in older
    # builds: a_bytes=4), o 2·100·8·2, and scale·Q ⊙ Λ from step 1 2·100·8·2 (none in builds before it)
    assert bench.forward_allocations("chunk_gla", 2, 100, 1, 8, 8) == {"b": 6400, "qt": 3200, "states": 2 * 2 * 128,
                                                                        "A": 25600, "o": 3200}
    assert "qt" not in bench.forward_allocations("chunk_gla", 2, 100, 1, 8, 8, decayed=False)
    with pytest.raises(ValueError, match="K ⊙ Γ outweighs"):  # K ⊙ Γ (512 bytes a token) > A + o (128 + 128)
        bench.forward_allocations("chunk_gla", 2, 100, 1, 256, 64)
    assert bench.forward_allocations("chunk_gla", 2, 100, 1, 8, 8, a_bytes=4)["A"] == 51200
    assert bench.forward_allocations("chunk_gla", 2, 100, 1, 8, 8, state_bytes=4)["states"] == 2 * 2 * 256
    assert bench.forward_allocations("chunk_simple_gla", 2, 100, 1, 8, 8, act_bytes=4)["states"] == 2 * 2 * 256
    assert bench.forward_allocations("fused_chunk_gla", 2, 100, 1, 8, 8) == {"o": 3200}


def test_materialised_allocations_match_the_stored_gpu_peaks():
    path, result = bench.latest_results("triton_bench", ROOT / "benchmarks" / "results")
    sh = result["shape"]
    # bytes of a stored chunk state in that run: results written before chunk_gla stored its states in
    # the input dtype (states_in_fp32 did not exist) record none, and their states were float32; so
    # was A before it was stored in the input dtype
    state, a = sh.get("state_bytes", 4), sh.get("A_bytes", 4)
    checked = 0
    for name in ("chunk_gla", "chunk_simple_gla"):
        for T, peak in zip(*bench.series(result, name, "fwd_peak_bytes")):
            allocs = bench.forward_allocations(name, sh["B"], T, sh["H"], sh["K"], sh["V"], state_bytes=state,
                                               a_bytes=a, decayed=sh.get("decayed_operands", False))
            assert peak == sum(allocs.values())
            checked += 1
    assert checked >= 4, f"{path.name} holds too few forward peaks"


def test_allocations_match_the_peaks_measured_after_step_1_wrote_the_decayed_operands():
    _, result = bench.latest_results("decayed_operands", ROOT / "benchmarks" / "results")
    B, H = result["setting"]["B"], result["setting"]["H"]
    rows = [r for r in result["rows"] if r["name"] == "chunk_gla"]
    for r in rows:  # states and A in bf16, as the kernels store them by default
        assert r["fwd_peak_bytes"] == sum(bench.forward_allocations("chunk_gla", B, r["T"], H, r["K"], r["V"]).values())
    assert len(rows) == 8


def test_roofline_by_hand():
    peaks = {"bf16_TFLOPs": 1000.0, "fp32_TFLOPs": 50.0, "hbm_GBps": 2000.0}
    # 1e12 tensor FLOPs = 1 ms, 1e11 fp32 FLOPs = 2 ms, 4e9 bytes = 2 ms: compute bound at 3 ms
    r = bench.roofline({"tc_flops": 1e12, "fp32_flops": 1e11, "bytes": 4e9}, peaks, ms=6.0)
    assert r["compute_ms"] == pytest.approx(3.0) and r["memory_ms"] == pytest.approx(2.0)
    assert r["limit"] == "compute" and r["fraction"] == pytest.approx(0.5)
    assert r["TFLOPs"] == pytest.approx(1.1e12 / 6e-3 / 1e12) and r["GBps"] == pytest.approx(4e9 / 6e-3 / 1e9)
    assert r["intensity"] == pytest.approx(1.1e12 / 4e9)
    assert bench.roofline({"tc_flops": 0, "fp32_flops": 0, "bytes": 2e9}, peaks)["limit"] == "memory"
    with pytest.raises(ValueError):
        bench.roofline({"tc_flops": 1, "fp32_flops": 0, "bytes": 1}, peaks, ms=0.0)


# ----------------------------------------------------------------------------- timing splits

@pytest.mark.parametrize("C,c", [(16, 16), (32, 16), (64, 16)])
def test_torch_chunk_parts_add_up_to_the_two_level_form(C, c):
    inputs = random_inputs(B=1, T=100, H=2, K=12, V=10, gate="gla", seed=1)  # two chunks or more
    x = as_torch(inputs, dtype=torch.float32)
    parts, combine = bench.torch_chunk_parts(x["q"], x["k"], x["v"], x["g"], C, c)
    o = combine(parts["inter"](), parts["intra"]())
    want, _ = torch_ref.chunk_gla_two_level(x["q"], x["k"], x["v"], x["g"], chunk_size=C, sub_chunk_size=c)
    assert torch.equal(o, want)
    x64 = as_torch(inputs)
    o_ref, _ = torch_ref.recurrent_gla(x64["q"], x64["k"], x64["v"], x64["g"])
    assert rel_rmse(o_ref, o) < 1e-5
    o_intra = parts["intra"]()
    assert rel_rmse(o_ref, combine(torch.zeros_like(o_intra), o_intra)) > 1e-2  # both parts are needed
    with pytest.raises(ValueError):
        bench.torch_chunk_parts(x["q"], x["k"], x["v"], x["g"], 16, 32)


def test_triton_chunk_stages_compose_to_chunk_gla():
    from gla_ref.triton import chunk_gla

    x = as_torch(random_inputs(B=1, T=40, H=2, K=16, V=16, gate="gla", seed=2), dtype=torch.float32)
    stages = bench.triton_chunk_stages(x["q"], x["k"], x["v"], x["g"], 32)
    assert set(stages) == set(bench.chunk_gla_stage_costs(1, 40, 2, 16, 16, C=32))
    assert torch.equal(stages["output"](), chunk_gla(x["q"], x["k"], x["v"], x["g"], chunk_size=32)[0])
    with pytest.raises(ValueError, match="chunk_size"):
        bench.triton_chunk_stages(x["q"], x["k"], x["v"], x["g"], 128)


# ----------------------------------------------------------------------------- plots

def _axes():
    import matplotlib.pyplot as plt

    return plt.subplots()[1]


def test_plot_benchmark_curves_names_failures_and_marks():
    def row(T, name, ms):
        return {"T": T, "name": name, "fwd": {"median_ms": ms}}

    result = {"rows": [row(1, "a", 1.0), row(2, "a", 2.0), {"T": 4, "name": "a", "error": "out of memory"},
                       row(1, "b", 4.0), row(2, "b", 8.0)]}
    ax = plots.plot_benchmark_curves(result, ["a", "b"], "fwd", _axes(), scale=1e3, mark=(1.5, "cross"))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["a (out of memory from T=4)", "b"]
    assert list(ax.lines[1].get_ydata()) == [4e3, 8e3]
    assert list(ax.lines[-1].get_xdata()) == [1.5, 1.5]  # the mark
    assert plots.plot_benchmark_curves(result, ["a"], "fwd", _axes(), legend=False).get_legend() is None


def test_plot_chunk_sweep_stacks_parts_and_marks_unsupported():
    sweep = {"rows": [{"C": 16, "impl": "t", "part": "inter", "median_ms": 3.0},
                      {"C": 16, "impl": "t", "part": "intra", "median_ms": 1.0},
                      {"C": 16, "impl": "t", "part": "total", "median_ms": 3.5},
                      {"C": 32, "impl": "u", "part": "total", "median_ms": 2.0}],
             "unsupported": [{"C": 32, "impl": "t", "reason": "no"}]}
    ax = plots.plot_chunk_sweep(sweep, "t", _axes())
    heights = [p.get_height() for p in ax.patches]
    bottoms = [p.get_y() for p in ax.patches]
    assert heights == [3.0, 0.0, 1.0, 0.0] and bottoms == [0.0, 0.0, 3.0, 0.0]
    assert [t.get_text() for t in ax.texts] == ["n/a"]
    assert list(ax.lines[0].get_ydata()) == [3.5, 3.5]


def test_plot_roofline_draws_the_roofs():
    peaks = {"datasheet": {"bf16_TFLOPs": 1000.0, "fp32_TFLOPs": 50.0, "hbm_GBps": 2000.0}}
    ax = plots.plot_roofline({"k": (10.0, 5.0)}, peaks, _axes())
    roof = ax.lines[0]
    x, y = roof.get_xdata(), roof.get_ydata()
    assert y.max() == 1000.0 and y[0] == pytest.approx(x[0] * 2.0)  # 2 TB/s: 2 TFLOP/s per FLOP/byte
    assert list(ax.lines[-1].get_xdata()) == [10.0] and list(ax.lines[-1].get_ydata()) == [5.0]


# ----------------------------------------------------------------------------- the sweep script

def test_chunk_size_sweep_smoke_run(tmp_path):
    script = load_script("bench_chunk_size")
    out = script.main(["--smoke", "--C", "16", "256", "--out", str(tmp_path / "sweep.json")])
    sweep = bench.load_results(out)
    got = {(r["C"], r["impl"], r["part"]) for r in sweep["rows"]}
    assert got == {*((C, "torch", p) for C in (16, 256) for p in ("inter", "intra")),
                   *((16, "triton", p) for p in ("cumsum", "state", "intra", "output", "total")), (16, "fused", "total")}
    assert {(u["C"], u["impl"]) for u in sweep["unsupported"]} == {(256, "triton"), (256, "fused")}
    assert all("chunk_size" in u["reason"] for u in sweep["unsupported"])
    assert max(sweep["checks_rel_rmse_vs_chunk_gla"].values()) < 1e-5
    assert all(r["p20_ms"] <= r["median_ms"] <= r["p80_ms"] for r in sweep["rows"])


def test_slug_names_a_device_for_a_file():
    assert bench.slug("NVIDIA H200") == "nvidia_h200"
    assert bench.slug(" Tesla T4 (PCIe)/16GB ") == "tesla_t4_pcie_16gb"
