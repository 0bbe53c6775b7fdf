"""gla_ref.sequence_parallel.local (process groups started from Python), .costs (bytes models and
the collectives of compiled HLO) and gla_ref.viz.parallel (the scan schedules of chapter 9).

The multi-process tests start gloo groups on 127.0.0.1 and stop by themselves (timeouts)."""

from __future__ import annotations

import pathlib
import time

import matplotlib
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gla_ref import torch_ref  # noqa: E402
from gla_ref.viz import parallel as plots_parallel  # noqa: E402
from gla_ref.sequence_parallel import costs, local  # noqa: E402
from gla_ref.testing import as_torch, random_inputs, rel_rmse  # noqa: E402

matplotlib.use("Agg")
TARGETS = pathlib.Path(__file__).resolve().parent / "_sp_local_targets.py"


# --- local.launch and local.chunk_gla_on_ranks ---

def _reference(x, do, dS, C):
    """torch_ref.chunk_gla on the whole sequence in float64: o, S and the gradients."""
    t = as_torch(x, torch.float64, requires_grad=True)
    o, S = torch_ref.chunk_gla(**t, output_final_state=True, chunk_size=C)
    ((o * torch.from_numpy(do)).sum() + (S * torch.from_numpy(dS)).sum()).backward()
    out = {"o": o, "final_state": S}
    out.update({"d" + n: t[n].grad for n in t if t[n] is not None})
    return out


def test_chunk_gla_on_ranks_matches_one_process():
    """Two runs in one group of 2 ranks: a GLA gate with an initial state (uneven slices, not
    multiples of C), and a constant [H] gate whose gradient is summed over the ranks."""
    rng = np.random.default_rng(0)
    runs = []
    for gate, h0, lengths in (("gla", True, [7, 10]), ("const", False, [9, 6])):
        x = random_inputs(B=1, T=sum(lengths), H=2, K=4, V=3, gate=gate, initial_state=h0, seed=len(runs))
        runs.append(dict(inputs=x, lengths=lengths, do=rng.standard_normal(x["v"].shape),
                         dS=rng.standard_normal((1, 2, 4, 3)), chunk_size=4, dtype="float64"))
    results = local.chunk_gla_on_ranks(runs, timeout=120)
    for run, got in zip(runs, results):
        ref = _reference(run["inputs"], run["do"], run["dS"], 4)
        if run["inputs"]["initial_state"] is None:
            assert got["dinitial_state"] is None
        for name, want in ref.items():
            assert rel_rmse(want, got[name]) < 1e-12, name
        assert got["sent"] == [p[0] for p in got["predicted"]]
        assert got["received"] == [p[1] for p in got["predicted"]]
        assert len(got["seconds"]) == 2 and all(s > 0 for s in got["seconds"])


def test_a_subgroup_runs_its_own_chain():
    """Ranks 1 and 2 of a world of 3 form a group (group ranks 0 and 1), float64: the group's ranks send to each
    other by their global ranks; rank 0 is not in it."""
    x = random_inputs(B=1, T=9, H=2, K=4, V=3, gate="scalar", initial_state=True, seed=3)
    got = local.launch(f"{TARGETS}:subgroup_chain", 3, kwargs={"inputs": x, "members": [1, 2], "lengths": [4, 5]},
                       timeout=120)
    assert got[0] is None
    ref = _reference(x, np.ones(x["v"].shape), np.ones((1, 2, 4, 3)), 4)
    o = np.concatenate([got[1]["o"], got[2]["o"]], axis=1)
    assert rel_rmse(ref["o"], o) < 1e-12 and rel_rmse(ref["final_state"], got[2]["final_state"]) < 1e-12
    assert rel_rmse(ref["dinitial_state"], got[1]["dinitial_state"]) < 1e-12
    assert rel_rmse(ref["dg"], np.concatenate([got[1]["dg"], got[2]["dg"]], axis=1)) < 1e-12


def test_a_failing_rank_stops_the_group_at_once():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ranks? \[(0, )?1\] of 2 exited") as err:
        local.launch(f"{TARGETS}:fail_while_neighbour_waits", 2, timeout=60)
    assert "rank 1 fails on purpose" in str(err.value)  # the failing rank's own traceback is shown
    assert time.monotonic() - start < 30  # not the 60 s timeout: rank 0, blocked in recv, was killed


def test_a_group_that_runs_too_long_is_killed():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="still running after 3"):
        local.launch(f"{TARGETS}:sleep", 1, kwargs={"seconds": 300}, timeout=3)
    assert time.monotonic() - start < 15


@pytest.mark.parametrize("kwargs,words", [
    (dict(target="no_colon", world_size=2), "target must be"),
    (dict(target="a:b:c", world_size=2), "target must be"),
    (dict(target="m:f", world_size=0), "world_size must be"),
    (dict(target="m:f", world_size=2, backend="mpi"), "backend must be"),
    (dict(target="m:f", world_size=2, timeout=0), "timeout must be"),
])
def test_launch_rejects_bad_arguments(kwargs, words):
    with pytest.raises(ValueError, match=words):
        local.launch(**kwargs)


def test_chunk_gla_on_ranks_rejects_lengths_that_do_not_cover_T():
    x = random_inputs(B=1, T=8, H=1, K=2, V=2)
    with pytest.raises(ValueError, match=r"must be positive and sum to T=8"):
        local.chunk_gla_on_ranks([dict(inputs=x, lengths=[4, 3])])
    with pytest.raises(ValueError, match="same number of ranks"):
        local.chunk_gla_on_ranks([dict(inputs=x, lengths=[4, 4]), dict(inputs=x, lengths=[2, 2, 4])])


# --- costs ---

def test_state_chain_bytes_count_states_not_tokens():
    state = 2 * 3 * 4 * 5 * 4
    assert costs.state_chain_bytes(2, 3, 4, 5, devices=1) == 0
    assert costs.state_chain_bytes(2, 3, 4, 5, devices=2) == state  # each end sends one way only
    assert costs.state_chain_bytes(2, 3, 4, 5, devices=8) == 2 * state  # a middle device: both ways
    assert costs.state_chain_bytes(2, 3, 4, 5, devices=8, backward=False) == state
    assert costs.state_chain_bytes(2, 3, 4, 5, devices=8, state_bytes=8) == 4 * state


def test_ring_attention_bytes_grow_with_T():
    block = 1 * 1024 * 16 * (128 + 128) * 2  # T/P = 1024 tokens of keys and values, bf16
    assert costs.ring_attention_bytes(1, 4096, 16, 128, 128, devices=4, backward=False) == 3 * block
    assert costs.ring_attention_bytes(1, 4096, 16, 128, 128, devices=4) == 9 * block
    assert costs.ring_attention_bytes(1, 8192, 16, 128, 128, devices=4) == 18 * block
    assert costs.ring_attention_bytes(1, 4096, 16, 128, 128, devices=1) == 0
    with pytest.raises(ValueError, match="split evenly"):
        costs.ring_attention_bytes(1, 10, 1, 1, 1, devices=4)
    with pytest.raises(ValueError, match="devices must be an int >= 1"):
        costs.state_chain_bytes(1, 1, 1, 1, devices=0)


def test_sequence_parallel_seconds_adds_the_share_the_extra_passes_and_the_hops():
    state = 1 * 16 * 128 * 128 * 4  # 1 MiB
    m = costs.sequence_parallel_seconds(0.1, 1, 16, 128, 128, devices=16, state_pass_fraction=0.2,
                                        link_bytes_per_s=1e11, hop_latency_s=5e-6)
    hop = 5e-6 + state / 1e11
    assert m["compute_s"] == pytest.approx(0.1 / 16 * 1.2) and m["chain_s"] == pytest.approx(30 * hop)
    assert m["total_s"] == pytest.approx(m["compute_s"] + m["chain_s"])
    assert m["speedup"] == pytest.approx(0.1 / m["total_s"])
    one = costs.sequence_parallel_seconds(0.1, 1, 16, 128, 128, devices=1, state_pass_fraction=0.2,
                                          link_bytes_per_s=1e11, hop_latency_s=5e-6)
    assert one == {"compute_s": 0.1, "chain_s": 0.0, "total_s": 0.1, "speedup": 1.0}
    with pytest.raises(ValueError, match="link_bytes_per_s must be positive"):
        costs.sequence_parallel_seconds(0.1, 1, 1, 1, 1, devices=2, state_pass_fraction=0, link_bytes_per_s=0,
                                        hop_latency_s=0)


HLO = """
  %ppermute.6 = f32[1,2,8,8]{3,2,1,0} collective-permute(%fusion.1), channel_id=1, source_target_pairs={{0,1}}, metadata={op_name="x"}
  %cp-start = (bf16[4,16]{1,0}, bf16[4,16]{1,0}, u32[], u32[]) collective-permute-start(%p), channel_id=2, source_target_pairs={{1,2},{2,3}}
  %cp-done = bf16[4,16]{1,0} collective-permute-done(%cp-start)
  %psum.8 = f32[1,2,8,8]{3,2,1,0} all-reduce(%fusion.2), channel_id=3, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %ar.2 = (f32[2]{0}, f64[3]{0}) all-reduce(%a, %b), channel_id=4, replica_groups=[2,2]<=[4], to_apply=%add
  %add.1 = f32[1,2,8,8]{3,2,1,0} add(%x, %y)
"""


def test_hlo_collectives_reads_kinds_shapes_bytes_and_devices():
    ops = costs.hlo_collectives(HLO)
    assert [op["kind"] for op in ops] == ["collective-permute", "collective-permute", "all-reduce", "all-reduce"]
    assert ops[0] == {"kind": "collective-permute", "shapes": [("f32", (1, 2, 8, 8))], "nbytes": 512,
                      "pairs": [(0, 1)]}
    assert ops[1]["shapes"] == [("bf16", (4, 16))] and ops[1]["nbytes"] == 128  # the operand only
    assert ops[1]["pairs"] == [(1, 2), (2, 3)]
    assert ops[2]["groups"] == [[0, 1, 2, 3]]
    assert ops[3]["nbytes"] == 2 * 4 + 3 * 8 and ops[3]["groups"] == [[0, 1], [2, 3]]
    sent = costs.bytes_sent_by_device(ops, 4)
    ring4, ring2 = 2 * 3 / 4 * 512, 2 * 1 / 2 * 32
    assert sent == [512 + ring4 + ring2, 128 + ring4 + ring2, 128 + ring4 + ring2, ring4 + ring2]


# jax 0.11 writes replica groups as mesh axes (this line is from chapter 9 on the H200 machine; jax 0.11.2 on a
# CPU prints the same, jax 0.10.2, which the tests here run, lists the groups)
MESH_LINE = ("%psum_invariant.8 = f32[1,2,8,6]{3,2,1,0} all-reduce(%add_select_fusion), channel_id=1, "
             "replica_groups=mesh['seq'=8] {'seq'}, use_global_device_ids=true, to_apply=%region_31.33")


@pytest.mark.parametrize("groups, expected", [
    ("mesh['seq'=8] {'seq'}", [list(range(8))]),
    ("mesh['rep'=2,'seq'=2] {'seq'}", [[0, 1], [2, 3]]),
    ("@mesh<u=2,v=3> {u}", [[0, 3], [1, 4], [2, 5]]),
    ("@mesh<u=2,v=3> {v,u}", [[0, 3, 1, 4, 2, 5]]),
    ("@mesh<u=2,v=3> {}", [[d] for d in range(6)]),  # no axes: every device alone
    ("@mesh<a=2,b=4>(devices=[2,4]<=[4,2]T(1,0)) {a}", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ("@mesh<o=4>(devices=[4]3,2,1,0) {o}", [[3, 2, 1, 0]]),
])
def test_hlo_collectives_reads_replica_groups_written_as_mesh_axes(groups, expected):
    line = MESH_LINE.replace("mesh['seq'=8] {'seq'}", groups)
    assert costs.hlo_collectives(line)[0]["groups"] == expected


def test_hlo_collectives_reads_a_transposed_iota_of_replica_groups():
    """XLA's own example of an iota list: [2,10]<=[4,5]T(1,0), the iota 0..19 as [4, 5], transposed, in 2 groups."""
    line = MESH_LINE.replace("mesh['seq'=8] {'seq'}", "[2,10]<=[4,5]T(1,0)")
    assert costs.hlo_collectives(line)[0]["groups"] == [[0, 5, 10, 15, 1, 6, 11, 16, 2, 7],
                                                        [12, 17, 3, 8, 13, 18, 4, 9, 14, 19]]


def test_hlo_collectives_reads_the_gpu_line_and_refuses_sub_axes():
    op = costs.hlo_collectives(MESH_LINE)[0]
    assert op["nbytes"] == 4 * 2 * 8 * 6 and op["groups"] == [list(range(8))]
    assert costs.bytes_sent_by_device([op], 8) == [2 * 7 / 8 * op["nbytes"]] * 8
    with pytest.raises(ValueError, match="sub-axes are not read"):
        costs.hlo_collectives(MESH_LINE.replace("{'seq'}", "{'seq':(1)2}"))
    with pytest.raises(ValueError, match="do not fill the 8 positions"):
        costs.hlo_collectives(MESH_LINE.replace("mesh['seq'=8]", "mesh['seq'=8](devices=[4]0,1,2,3)"))


def test_bytes_sent_by_device_refuses_what_it_does_not_model():
    ops = costs.hlo_collectives("%ag = f32[8]{0} all-gather(%x), replica_groups={{0,1}}, dimensions={0}")
    with pytest.raises(ValueError, match="counts collective-permute and all-reduce, got all-gather"):
        costs.bytes_sent_by_device(ops, 2)


# --- plots_parallel ---

@pytest.mark.parametrize("devices", [1, 2, 5, 8])
@pytest.mark.parametrize("order", plots_parallel.SCAN_ORDERS)
def test_scan_schedules_end_with_every_prefix(devices, order):
    rounds, spans = plots_parallel.scan_schedule(devices, order)
    assert spans[-1] == [(0, d) for d in range(devices)]
    assert len(spans) == len(rounds) + 1
    if order == "chain":
        assert rounds == [[(j, j + 1)] for j in range(devices - 1)]
    else:
        assert len(rounds) == int(np.ceil(np.log2(devices)))
        assert all(t - s == 2 ** r for r, pairs in enumerate(rounds) for s, t in pairs)


def test_scan_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="order must be one of"):
        plots_parallel.scan_schedule(4, "ring")
    with pytest.raises(ValueError, match="devices must be an int >= 1"):
        plots_parallel.scan_schedule(0)


def test_drawings_draw_one_arrow_per_message():
    import matplotlib.pyplot as plt

    axes = plots_parallel.draw_scan_orders(8)
    for ax, order in zip(axes, plots_parallel.SCAN_ORDERS):
        rounds, _ = plots_parallel.scan_schedule(8, order)
        arrows = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
        assert len(arrows) == sum(map(len, rounds))
    ax = plots_parallel.draw_state_chain(3)
    assert any("device 2" in t.get_text() for t in ax.texts)
    plt.close("all")
