"""Worker for test_sequence_parallel_jax.py (beside it), run in a fresh process whose JAX sees 8 CPU
devices (XLA_FLAGS=--xla_force_host_platform_device_count=8, set before jax is imported).

Usage: ``python _sp_jax_worker.py CASES_JSON``. Prints one JSON line mapping each case id to what
it measured: relative RMSEs (``[vs jax_ref.chunk_gla, vs the float64 recurrence]`` per tensor)
and the collective ops of the compiled program (as a regular expression here finds them, and as
``gla_ref.sequence_parallel.costs`` reads them), or the error a bad call raised.
"""

from __future__ import annotations

import json
import re
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from gla_ref import jax_ref
from gla_ref.sequence_parallel import costs
from gla_ref.sequence_parallel.jax import chunk_gla
from gla_ref.testing import as_jax, random_inputs, recurrence64, recurrence64_grads, rel_rmse

COLLECTIVE = re.compile(r"= (\(.*?\)|\S+) (all-gather|all-reduce|collective-permute|all-to-all|"
                        r"reduce-scatter|collective-broadcast)(?:-start)?\(")
ARRAY = re.compile(r"[a-z]+\d+\[[\d,]*\]")


def collectives(hlo):
    """``[kind, operand shape]`` for every array a collective op of compiled HLO moves (an op on a
    tuple counts once per element)."""
    return [[kind, shape] for result, kind in COLLECTIVE.findall(hlo) for shape in ARRAY.findall(result)]


def read_by_costs(hlo):
    """What ``costs.hlo_collectives`` (chapter 9 counts bytes with it) reads from the same HLO: per op
    ``[kind, operand shapes, replica groups, (source, target) pairs]``, or the error it raised."""
    try:
        ops = costs.hlo_collectives(hlo)
    except ValueError as err:
        return {"error": str(err)}
    return {"ops": [[op["kind"], [f"{t}[{','.join(map(str, dims))}]" for t, dims in op["shapes"]],
                     op.get("groups"), op.get("pairs")] for op in ops]}


def make_mesh(axes):
    """``axes``: [[name, size], ...] in mesh order, over the first devices."""
    sizes = [size for _, size in axes]
    devices = np.array(jax.devices()[:int(np.prod(sizes))]).reshape(sizes)
    return Mesh(devices, tuple(name for name, _ in axes))


def inputs(case):
    return random_inputs(**case["shape"], gate=case["gate"], initial_state=case["h0"])


def sharded_run(xj, do, dS, mesh, axes, chunk_size):
    """The sharded form's forward and backward as one compiled program: returns (o, S, {input
    name: gradient}) for the loss Σ o·do + Σ S·dS, and the program's compiled HLO text."""
    names = [n for n in xj if xj[n] is not None]
    f = partial(chunk_gla, mesh=mesh, output_final_state=True, chunk_size=chunk_size, **axes)

    @jax.jit
    def run(args, do, dS):
        (o, S), vjp = jax.vjp(lambda *a: f(**dict(zip(names, a))), *args)
        return o, S, vjp((do, dS))

    compiled = run.lower(tuple(xj[n] for n in names), do, dS).compile()
    o, S, grads = compiled(tuple(xj[n] for n in names), do, dS)
    return o, S, dict(zip(names, grads)), compiled.as_text()


@partial(jax.jit, static_argnames="chunk_size")
def reference_run(q, k, v, g, h0, do, dS, *, chunk_size):
    """jax_ref.chunk_gla on one device with the gate as [B, T, H, K] and h0 always given (zeros for
    None: the same function), so every case of one shape shares a compilation."""
    def f(*args):
        return jax_ref.chunk_gla(*args[:4], initial_state=args[4], output_final_state=True,
                                 chunk_size=chunk_size)

    (o, S), vjp = jax.vjp(f, q, k, v, g, h0)
    return o, S, vjp((do, dS))


def reduce_gate_grad(dg, gate):
    """The gradient w.r.t. g's own shape from the one w.r.t. its [B, T, H, K] expansion."""
    return {"const": lambda: dg.sum(axis=(0, 1, 3)), "scalar": lambda: dg.sum(axis=3),
            "gla": lambda: dg}[gate]()


def accuracy(case):
    """Relative RMSEs ``[vs jax_ref.chunk_gla, vs recurrence64]`` of o, the final state and every
    gradient, and the collective ops (kind, operand shape) of the compiled forward + backward."""
    x = inputs(case)
    xj = as_jax(x)
    B, T, H, K = x["q"].shape
    V = x["v"].shape[-1]
    rng = np.random.default_rng(1)
    do, dS = rng.standard_normal((B, T, H, V)), rng.standard_normal((B, H, K, V))
    cot = (jnp.asarray(do, jnp.float32), jnp.asarray(dS, jnp.float32))
    mesh = make_mesh(case["mesh"])
    o, S, grads, hlo = sharded_run(xj, *cot, mesh, case.get("axes", {}), case["chunk_size"])
    g4 = jax_ref.expand_gate(xj["g"], B, T, H, K)
    h0 = jnp.zeros((B, H, K, V)) if xj["initial_state"] is None else xj["initial_state"]
    o_ref, S_ref, (dq, dk, dv, dg4, dh0) = reference_run(xj["q"], xj["k"], xj["v"], g4, h0, *cot,
                                                         chunk_size=case["chunk_size"])
    ref = {"q": dq, "k": dk, "v": dv, "initial_state": dh0}
    if x["g"] is not None:
        ref["g"] = reduce_gate_grad(dg4, case["gate"])
    o64, S64 = recurrence64(**x)
    grads64 = recurrence64_grads(**x, do=do, dS=dS)
    errors = {"o": [rel_rmse(o_ref, o), rel_rmse(o64, o)],
              "final_state": [rel_rmse(S_ref, S), rel_rmse(S64, S)]}
    for name, d in grads.items():
        errors["d" + name] = [rel_rmse(ref[name], d), rel_rmse(grads64[name], d)]
    return {"errors": errors, "dtype": str(o.dtype), "collectives": collectives(hlo), "costs": read_by_costs(hlo)}


def bad_call(case):
    """The (exception type, message) a call with a bad argument raises, or None if it returns."""
    x = as_jax(inputs(case))
    mesh = make_mesh(case["mesh"])
    try:
        chunk_gla(**x, mesh=mesh, chunk_size=case["chunk_size"], **case.get("axes", {}))
    except (TypeError, ValueError) as err:
        return [type(err).__name__, str(err)]
    return None


def run(case):
    return {"accuracy": accuracy, "bad_call": bad_call}[case["kind"]](case)


def main():
    cases = json.loads(sys.argv[1])
    print(json.dumps({"devices": jax.device_count(),
                      "results": {cid: run(case) for cid, case in cases.items()}}))


if __name__ == "__main__":
    main()
