"""gla_ref.sequence_parallel.jax (the Pallas kernels, interpreted on the CPU) on 2 and 4 simulated CPU devices
along the sequence axis, against jax_ref.chunk_gla on one device and the float64 recurrence: outputs, final
states and every gradient; the collectives it compiles to (one K×V state per hop, whatever T); bad arguments.

This process's JAX already has a single CPU device, so the multi-device checks run in one
subprocess (tests/sequence_parallel/_sp_jax_worker.py) whose JAX sees 8; each test reads its part of the result.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from gla_ref import device  # noqa: E402
from gla_ref.sequence_parallel.jax import chunk_gla  # noqa: E402
from gla_ref.testing import as_jax, random_inputs  # noqa: E402
from gla_ref.testing.cases import GRAD_TOL, TOL  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = dict(B=2, H=2, K=4, V=3)
C = 16  # chunk size (the Pallas kernels' smallest); T/P tokens per device are 20, 6 and 16 below

# mesh: [[axis name, size], ...]; axes: which mesh axes split B and H. A constant gate [H] reaches the devices as
# [B, T, H], as a scalar gate does, so it stands for both.
ACCURACY = {
    "P2_heads2_gla_h0_slice20": dict(mesh=[["seq", 2], ["heads", 2]], T=40, gate="gla", h0=True,
                                     axes=dict(head_axis="heads")),  # a chunk and a partial one per device
    "P4_batch2_const_h0_slice6": dict(mesh=[["batch", 2], ["seq", 4]], T=24, gate="const", h0=True,
                                      axes=dict(batch_axis="batch")),  # shorter than a chunk
    "P2_replicated2_none_slice16": dict(mesh=[["rep", 2], ["seq", 2]], T=32, gate="none", h0=False),
}
BAD = {  # raised before anything runs, on meshes of several devices
    "T_does_not_split": (dict(mesh=[["seq", 4]], T=10), "q has T=10"),
    "head_axis_does_not_divide_H": (dict(mesh=[["seq", 2], ["heads", 4]], T=4, axes=dict(head_axis="heads")),
                                    "head_axis='heads' has 4 devices"),
}


def _cases():
    cases = {cid: dict(kind="accuracy", shape={**SHAPE, "T": c["T"]}, chunk_size=C, **c)
             for cid, c in ACCURACY.items()}
    for cid, (c, _) in BAD.items():
        cases[cid] = dict(kind="bad_call", shape={**SHAPE, "T": c["T"]}, gate="gla", h0=False,
                          chunk_size=C, **c)
    return cases


@pytest.fixture(scope="module")
def worker():
    """Run every multi-device case in one subprocess with 8 CPU devices (and a timeout)."""
    flags = ("--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
             "--xla_llvm_disable_expensive_passes=true")  # the interpreted kernels compile in half the time
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, os.path.join(HERE, "_sp_jax_worker.py"), json.dumps(_cases())]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # the module fixture `worker`: 8 simulated devices compiling every case, 32 s of CPU
def test_worker_sees_eight_devices(worker):
    assert worker["devices"] == 8


def _expected_tensors(case):
    names = ["o", "final_state", "dq", "dk", "dv"]
    names += [] if case["gate"] == "none" else ["dg"]
    return names + (["dinitial_state"] if case["h0"] else [])


@pytest.mark.slow  # the module fixture `worker`
@pytest.mark.parametrize("cid", ACCURACY)
def test_matches_single_device_and_recurrence64(worker, cid):
    case, result = ACCURACY[cid], worker["results"][cid]
    assert result["dtype"] == "float32"
    errors = result["errors"]
    assert sorted(errors) == sorted(_expected_tensors(case))  # every output and every gradient
    for name, (vs_ref, vs_64) in errors.items():
        assert vs_ref < 1e-5, f"{name} vs jax_ref.chunk_gla: {vs_ref:.2e}"
        tol = TOL if name in ("o", "final_state") else GRAD_TOL
        assert vs_64 < tol, f"{name} vs recurrence64: {vs_64:.2e}"


def _mesh_size(case, axis):
    return dict(case["mesh"]).get(case.get("axes", {}).get(axis), 1)


@pytest.mark.slow  # the module fixture `worker`
@pytest.mark.parametrize("cid", ACCURACY)
def test_communication_is_one_state_per_hop(worker, cid):
    """The compiled forward + backward moves P−1 states forward and P−1 back (collective-permutes),
    sums the final state once (a psum hands it to every device) and its cotangent once (the psum's
    transpose in a shard_map without varying-axes types), and dh0 once, each a device's [B, H, K, V]
    share, plus the [H] gradient of a constant gate (summed over every axis that splits it: the sequence's and
    the batch's, in one all-reduce or two): T appears nowhere, and nothing else crosses devices."""
    case, ops = ACCURACY[cid], worker["results"][cid]["collectives"]
    P = dict(case["mesh"])["seq"]
    B, H = SHAPE["B"] // _mesh_size(case, "batch_axis"), SHAPE["H"] // _mesh_size(case, "head_axis")
    state = f"f32[{B},{H},{SHAPE['K']},{SHAPE['V']}]"
    expected = [["collective-permute", state]] * (2 * (P - 1))
    expected += [["all-reduce", state]] * (2 + case["h0"])  # the final state's psum and its transpose, dh0
    gate_sums = [op for op in ops if op == ["all-reduce", f"f32[{H}]"]]
    assert sorted(op for op in ops if op not in gate_sums) == sorted(expected)
    most = 1 + ("batch_axis" in case.get("axes", {}))
    assert 1 <= len(gate_sums) <= most if case["gate"] == "const" else not gate_sums


def _seq_rows(case):
    """The devices of each row of the mesh along "seq" (the worker's mesh numbers devices in row-major order)."""
    names, sizes = zip(*case["mesh"])
    ids = np.arange(int(np.prod(sizes))).reshape(sizes)
    return sorted(np.moveaxis(ids, names.index("seq"), -1).reshape(-1, dict(case["mesh"])["seq"]).tolist())


@pytest.mark.slow  # the module fixture `worker`
@pytest.mark.parametrize("cid", ACCURACY)
def test_costs_reads_the_compiled_collectives(worker, cid):
    """gla_ref.sequence_parallel.costs reads this jax's compiled HLO (chapter 9 counts bytes with it; jax 0.10
    lists replica groups, jax 0.11 names the mesh axes, and `make jax-latest` runs this under the newest jax):
    the same ops as the test above finds, every all-reduce of a state over the rows of the mesh along "seq",
    every permute between two devices of one row (a constant gate's [H] gradient is summed over the batch axis
    too, where one splits B)."""
    case, result = ACCURACY[cid], worker["results"][cid]
    assert "error" not in result["costs"], result["costs"]["error"]
    ops = result["costs"]["ops"]
    assert sorted([kind, shape] for kind, shapes, _, _ in ops for shape in shapes) == sorted(result["collectives"])
    rows = _seq_rows(case)
    everyone = [sorted(d for row in rows for d in row)]  # groups None (replica_groups={}): every device
    gate = f"f32[{SHAPE['H'] // _mesh_size(case, 'head_axis')}]"
    for kind, shapes, groups, pairs in ops:
        if kind == "all-reduce" and shapes == [gate]:
            continue
        if kind == "all-reduce":
            assert (sorted(sorted(g) for g in groups) if groups else everyone) == rows, groups
        else:
            assert pairs and all(any({s, t} <= set(row) for row in rows) for s, t in pairs), pairs


@pytest.mark.slow  # the module fixture `worker`
@pytest.mark.parametrize("cid", BAD)
def test_bad_split_is_a_value_error(worker, cid):
    kind, message = worker["results"][cid]
    assert kind == "ValueError" and BAD[cid][1] in message, message


# ----------------------------------------------------------------------------- one device, here

def _one_device(axes=("seq",)):
    return Mesh(np.array(jax.devices()[:1]).reshape((1,) * len(axes)), axes)


@pytest.mark.parametrize("change,error,words", [
    (dict(mesh="seq"), TypeError, "mesh must be a jax.sharding.Mesh"),
    (dict(axis="time"), ValueError, "axis='time'"),
    (dict(batch_axis="seq"), ValueError, "batch_axis='seq'"),
    (dict(mesh=_one_device(("seq", "b")), batch_axis="b", head_axis="b"), ValueError,
     "batch_axis and head_axis"),
    (dict(chunk_size=0), ValueError, "chunk_size"),
    (dict(chunk_size=8), ValueError, "power of two >= 16 for the Pallas kernels"),
    ({n: jnp.zeros((1, 8, 2, d), jnp.float16) for n, d in (("q", 4), ("k", 4), ("v", 3))}, TypeError,
     "float32 or bfloat16 for the Pallas kernels"),
    (dict(scale="1"), TypeError, "scale"),
    (dict(output_final_state=1), TypeError, "output_final_state"),
    (dict(k=jnp.zeros((1, 8, 2, 5))), ValueError, "k must have shape"),
    (dict(g=jnp.zeros((1, 8, 3))), ValueError, "g must have shape"),
    (dict(g=jnp.full((1, 8, 2), 0.5)), ValueError, "g must hold log forget gates"),
    (dict(initial_state=jnp.zeros((1, 2, 4, 4))), ValueError, "initial_state must have shape"),
])
def test_bad_arguments_name_the_argument(change, error, words):
    """Raised before anything is compiled; gate values are checked under gla_ref.device.debug (as the kernels'
    own are: without it an invalid gate makes the outputs NaN)."""
    x = as_jax(random_inputs(B=1, T=8, H=2, K=4, V=3, gate="scalar"))
    with pytest.raises(error, match=re.escape(words)), device.debug(True):
        chunk_gla(**{**x, "mesh": _one_device(), "chunk_size": 16, **change})


def test_package_import_loads_no_framework():
    code = ("import sys, gla_ref.sequence_parallel; "
            "assert not {'torch', 'jax', 'triton'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
