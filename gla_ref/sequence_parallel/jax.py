"""Sequence-parallel chunkwise GLA in JAX: T split over one axis of a device mesh (``shard_map``),
each device's slice run by the Pallas kernels (:mod:`gla_ref.pallas`).

Each device d of mesh axis ``axis`` holds the slice ``[d·T/P, (d+1)·T/P)`` of q, k, v, g (P devices
on that axis; other mesh axes may split B and H). Inside one ``shard_map``, every device runs the
same program, :func:`_device_slice`, whose slice is one ``jax.custom_vjp`` (:func:`_slice_function`):

**Forward.** (1) The state the slice builds from a zero state, ``S_zero`` ``[B, H, K, V]``, by the
Pallas state kernel alone (:func:`gla_ref.pallas.chunk.state_pass`), and the slice's total
log-decay ``log γ_d = Σ_{t in slice} g_t`` ``[B, H, K]`` (one reduction of g). (2) The chain of
states, :func:`_state_chain`: ``S_in(0)`` is the initial state (or zero) and
``S_in(d+1) = diag(γ_d) S_in(d) + S_zero(d)``, P−1 ``lax.ppermute`` hops, hop j moving one state
from device j to device j+1. (3) The slice's whole chunk pass from the state it received,
:func:`gla_ref.pallas.chunk_gla` with ``initial_state=S_in`` (state kernel, output kernel); the
last device's final state is the sequence's.

**Backward** (the custom VJP's rule): (1') the reverse state kernel alone from a zero final-state
cotangent (:func:`gla_ref.pallas.chunk.state_grad_pass`) gives the slice's own part of the
gradient of its incoming state, ``dS_in_local``; (2') the chain backwards, P−1 hops from device
j+1 to device j: ``dS_out(P−1)`` is the final state's cotangent and
``dS_out(d−1) = dS_in(d) = diag(γ_d) dS_out(d) + dS_in_local(d)``; (3') the slice's whole backward
(:func:`gla_ref.pallas.chunk.chunk_gla_bwd`: the kernels of ``chunk_gla``'s own VJP, without its
forward) with ``dS_out`` as its final state's cotangent: dq, dk, dv, and dg with the term of the
outgoing state through the slice's decays, exactly as for one device's final state.

So every device runs the one-device kernels on T/P tokens plus one state pass and one reverse state
pass. In SPMD every device runs the same program, so device 0 and the last device run them too;
on two devices that costs nothing on the critical path (the last device waits for device 0's state
pass either way: the output kernel needs the incoming state). Every device keeps what one device's
``chunk_gla`` keeps for its tokens (q, k, v, and g as float32) plus two ``[B, H, K, V]`` states and
``log γ``.

**A chain, not an all-gather.** LASP-2 all-gathers every device's ``(γ, S_zero)`` and combines
them locally: one collective instead of P−1 dependent hops, but P−1 states arrive at every device
(O(P·K·V) bytes each) and a ring all-gather has P−1 steps too. The chain moves one state into
and out of a device per direction and each hop's work is one small fused op, so on two devices the
two are the same program and on P devices the chain sends P−1 times fewer bytes for a latency of
P−1 hops (:func:`gla_ref.sequence_parallel.costs.sequence_parallel_seconds` models it).

**Communication.** Forward: every device but the last sends one state of ``B_l·H_l·K·V`` floats
(``B_l``, ``H_l`` = its share of the batch and heads), every device but the first receives one:
O(K·V) per device, independent of T. With ``output_final_state``, one all-reduce (``psum``) of a
state of that size hands the last device's outgoing state to every device (the others add zeros).
Backward: the P−1 hops again, in the opposite direction; one all-reduce of a state for the
gradient of ``initial_state`` (replicated over ``axis``, so its gradient is summed over it), one of
``H_l`` floats for a constant gate ``[H]``, and, with ``output_final_state``, the transpose of the
forward's ``psum``, one more all-reduce of a state. (That one exists because the ``shard_map`` runs
without its varying-axes types, ``check_vma=False``: jax 0.10 asks every ``pallas_call`` inside a
typed ``shard_map`` for the types of its outputs, which the launchers do not give; untyped, a
replicated output's cotangent reaches each device divided by P and the transposed ``psum`` sums
it back.) The gate's total decay never travels: each device uses its own
(tests/sequence_parallel/test_sequence_parallel_jax.py checks that the compiled program holds
these collectives and no others). The ``shard_map`` is manual over ``axis``, ``batch_axis`` and ``head_axis``
only: inputs replicated over any other mesh axis stay XLA's to place, so their gradients are not summed
over it. The slice length ``T/P`` need not be a multiple of
``chunk_size``: each device pads its last chunk, as the one-device kernels do.

**On a TPU pod** (no TPU was available to measure): the same program, the Pallas kernels on the
Mosaic TPU launcher. A device's time is the one-device time of T/P tokens plus a state pass and a
reverse state pass, plus 2(P−1) hops of one ``4·B·H·K·V``-byte state over ICI (1 MiB for B=1,
H=16, K=V=128: about 10–20 µs a hop at 50–100 GB/s a link plus the hop's latency), which does not
grow with T: :func:`gla_ref.sequence_parallel.costs.sequence_parallel_seconds` is that model.
"""

from __future__ import annotations

import functools
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gla_ref import pallas
from gla_ref._validate import check_chunk_sizes, check_flag, check_inputs, check_scale
from gla_ref.pallas import chunk as pallas_chunk
from gla_ref.reference import jax as jax_ref


__all__ = ["chunk_gla"]


def chunk_gla(q, k, v, g=None, *, mesh, axis="seq", batch_axis=None, head_axis=None, scale=None,
              initial_state=None, output_final_state=False, chunk_size=64, launcher=None, interpret=None):
    """Chunkwise GLA with T split over mesh axis ``axis``; the same results as
    :func:`gla_ref.pallas.chunk_gla` on one device.

    q, k ``[B, T, H, K]``; v ``[B, T, H, V]`` (float32 or bfloat16, the Pallas kernels' dtypes);
    g log forget gates (≤ 0) of shape None, ``[H]``, ``[B, T, H]`` or ``[B, T, H, K]`` (run as
    ``[B, T, H, K]``); ``initial_state`` ``[B, H, K, V]`` or None. ``mesh`` a
    :class:`jax.sharding.Mesh`; T is split over its axis ``axis`` (T must divide evenly by that
    axis' size), B over ``batch_axis`` and H over ``head_axis`` when they name mesh axes; inputs
    are replicated over any other mesh axis. Inputs laid out otherwise are resharded under jit.
    ``chunk_size``: a power of two ≥ 16; ``launcher`` and ``interpret`` as for
    :func:`gla_ref.pallas.chunk_gla` (default: the device's own launcher, interpreted on a CPU).

    Returns ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype, sharded like q;
    ``final_state`` ``[B, H, K, V]`` (float32) when ``output_final_state`` else None. Jittable and
    differentiable w.r.t. q, k, v, g and ``initial_state``. Raises ValueError/TypeError naming the
    argument for bad shapes, dtypes, mesh axes or a T that does not split evenly; gate values are
    checked under ``gla_ref.device.debug(True)`` outside jit (an invalid gate otherwise makes the
    outputs NaN, as in the kernels).
    """
    dims = check_inputs(q, k, v, g, initial_state)
    devices = _check_mesh(mesh, axis, batch_axis, head_axis, dims)
    check_chunk_sizes(chunk_size)
    check_flag("output_final_state", output_final_state)
    scale = check_scale(scale, dims.K)
    pallas_chunk.check_head_dims(dims.K, dims.V)
    pallas_chunk.check_options(q, k, v, scale, chunk_size, output_final_state)
    pallas_chunk.check_values(q=q, k=k, v=v, g=g, initial_state=initial_state)
    return _sharded_chunk_gla(q, k, v, g, initial_state, mesh=mesh, axis=axis, batch_axis=batch_axis,
                              head_axis=head_axis, devices=devices, scale=scale, chunk_size=int(chunk_size),
                              final=bool(output_final_state), launcher=launcher, interpret=interpret)


def _check_mesh(mesh, axis, batch_axis, head_axis, dims):
    """Validate the mesh and the axis names against the shapes; returns the size of ``axis``."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    names = tuple(mesh.axis_names)
    if axis not in names:
        raise ValueError(f"axis={axis!r} must name an axis of mesh, whose axes are {names}")
    for arg, name, size, dim in (("batch_axis", batch_axis, dims.B, "B"),
                                 ("head_axis", head_axis, dims.H, "H")):
        if name is None:
            continue
        if name not in names or name == axis:
            raise ValueError(f"{arg}={name!r} must be None or a mesh axis other than axis={axis!r} "
                             f"(mesh axes: {names})")
        if size % mesh.shape[name]:
            raise ValueError(f"{arg}={name!r} has {mesh.shape[name]} devices, which must divide "
                             f"{dim}={size}")
    if batch_axis is not None and batch_axis == head_axis:
        raise ValueError(f"batch_axis and head_axis must be different mesh axes, both are {head_axis!r}")
    devices = mesh.shape[axis]
    if dims.T % devices:
        raise ValueError(f"q has T={dims.T} tokens, which must split evenly over the {devices} "
                         f"devices of mesh axis {axis!r}")
    return devices


def _specs(g, h0, axis, batch_axis, head_axis, final):
    """in_specs for (q, k, v, g, h0) and out_specs for o, or (o, final state) when ``final``."""
    x = P(batch_axis, axis, head_axis, None)
    gate = {3: P(batch_axis, axis, head_axis), 4: x}
    state = P(batch_axis, head_axis, None, None)
    ins = (x, x, x, None if g is None else gate[g.ndim], None if h0 is None else state)
    return ins, ((x, state) if final else x)


@partial(jax.jit, static_argnames=("mesh", "axis", "batch_axis", "head_axis", "devices", "scale",
                                   "chunk_size", "final", "launcher", "interpret"))
def _sharded_chunk_gla(q, k, v, g, h0, *, mesh, axis, batch_axis, head_axis, devices, scale,
                       chunk_size, final, launcher, interpret):
    if g is not None and g.ndim == 1:  # [H] → [B, T, H]: each device reads its slice, and the
        g = jnp.broadcast_to(g, q.shape[:3])  # gradient is summed ([H] per device) outside shard_map
    in_specs, out_specs = _specs(g, h0, axis, batch_axis, head_axis, final)
    body = partial(_device_slice, axis=axis, devices=devices, scale=scale, chunk_size=chunk_size,
                   final=final, launcher=launcher, interpret=interpret)
    manual = frozenset(a for a in (axis, batch_axis, head_axis) if a is not None)  # other axes: left to XLA
    shard = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, axis_names=manual,
                          check_vma=False)  # see the module docstring
    out = shard(q, k, v, g, h0)
    return out if final else (out, None)


def _device_slice(q, k, v, g, h0, *, axis, devices, scale, chunk_size, final, launcher, interpret):
    """One device's work on its slice ``[B_l, T/P, H_l, ·]``: returns o, and with ``final`` also
    the final state (the state leaving the last device, summed over ``axis`` from a mask)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    me = lax.axis_index(axis)
    # zeros that vary over the mesh axes like q and k (shard_map types the custom VJP's inputs so)
    g4 = jnp.zeros_like(q, dtype=jnp.float32) if g is None else jax_ref.expand_gate(g, B, T, H, K)
    S0 = jnp.zeros_like(k, shape=(B, H, K, V), dtype=jnp.float32)
    if h0 is not None:  # replicated over axis: one select makes it vary, so dh0 is summed once
        S0 = jnp.where(me == 0, h0.astype(jnp.float32), S0)
    run = _slice_function(axis, devices, scale, chunk_size, launcher, interpret)
    o, S_out = run(q, k, v, g4, S0)
    if not final:
        return o
    return o, lax.psum(jnp.where(me == devices - 1, S_out, 0), axis)


@functools.lru_cache(maxsize=None)
def _slice_function(axis, devices, scale, chunk_size, launcher, interpret):
    """``(q, k, v, g [B, T, H, K], S0) → (o, S_out)`` on one device's slice, as a ``jax.custom_vjp``
    whose forward and backward are the module docstring's steps; S0 is the initial state on device 0
    (zero elsewhere), S_out the state leaving the slice."""
    kw = dict(chunk_size=chunk_size, launcher=launcher, interpret=interpret)

    def forward(q, k, v, g, S0):
        S_zero = pallas_chunk.state_pass(k, v, g, **kw)                    # 1. from zero
        log_gamma = jnp.sum(g.astype(jnp.float32), axis=1)                 # [B, H, K]
        S_in = _state_chain(S_zero, log_gamma, S0, axis, devices)          # 2. the chain
        o, S_out = pallas.chunk_gla(q, k, v, g, scale=scale, initial_state=S_in, output_final_state=True,
                                    **kw)                                  # 3. from S_in
        return (o, S_out), (q, k, v, g, S_in, log_gamma)

    def backward(res, cotangents):
        q, k, v, g, S_in, log_gamma = res
        do, dS_final = cotangents
        dS_local = pallas_chunk.state_grad_pass(q, g, do, scale=scale, **kw)  # 1'. from zero
        dS_out = _gradient_chain(dS_local, log_gamma, dS_final, axis, devices)  # 2'.
        return pallas_chunk.chunk_gla_bwd(q, k, v, g, do, scale=scale, initial_state=S_in,
                                          final_state_grad=dS_out, **kw)    # 3'.

    @jax.custom_vjp
    def run(q, k, v, g, S0):
        return forward(q, k, v, g, S0)[0]

    run.defvjp(forward, backward)
    return run


def _state_chain(S_zero, log_gamma, S0, axis, devices):
    """The state entering this device's slice, passed along ``axis`` by P−1 hops.

    ``S_zero`` ``[B, H, K, V]``: the slice's state from zero; ``log_gamma`` ``[B, H, K]``: its total
    log-decay; ``S0``: device 0's incoming state (zero elsewhere). Hop j sends device j's outgoing
    state ``diag(γ) S_in + S_zero`` to device j+1, which keeps it as its incoming state (the other
    devices drop what they receive).
    """
    me = lax.axis_index(axis)
    gamma = jnp.exp(log_gamma)[..., None]  # [B, H, K, 1]
    S_in = S0
    for j in range(devices - 1):
        passed = lax.ppermute(gamma * S_in + S_zero, axis, perm=[(j, j + 1)])
        S_in = jnp.where(me == j + 1, passed, S_in)
    return S_in


def _gradient_chain(dS_local, log_gamma, dS_final, axis, devices):
    """The gradient of the state leaving this device's slice, passed back along ``axis`` by P−1 hops.

    The last device starts from the final state's cotangent ``dS_final``; hop j sends device j's
    ``dS_in = diag(γ) dS_out + dS_local`` to device j−1, which keeps it as its ``dS_out``.
    """
    me = lax.axis_index(axis)
    gamma = jnp.exp(log_gamma)[..., None]
    dS_out = jnp.where(me == devices - 1, dS_final, jnp.zeros_like(dS_local))
    for j in reversed(range(1, devices)):
        passed = lax.ppermute(gamma * dS_out + dS_local, axis, perm=[(j, j - 1)])
        dS_out = jnp.where(me == j - 1, passed, dS_out)
    return dS_out
