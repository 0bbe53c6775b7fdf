"""Sequence-parallel chunkwise GLA in JAX: T split over one axis of a device mesh (``shard_map``).

Each device d of mesh axis ``axis`` holds the slice ``[d·T/P, (d+1)·T/P)`` of q, k, v, g (P devices
on that axis; other mesh axes may split B and H). Three steps, all inside one ``shard_map``:

1. **Local, from zero** (no communication): :func:`gla_ref.reference.jax.chunk_gla` on the slice with a
   zero initial state gives ``o_zero`` and the slice's own state ``S_zero`` ``[B, H, K, V]``; the
   cumulative log-gate from the slice start, ``b`` ``[B, T/P, H, K]``, gives the slice's total
   log-decay ``b_last = b[:, -1]`` (the slice's ``log γ``).
2. **Chain of states** (``lax.ppermute``): ``S_in(0)`` is the initial state (or zero) and
   ``S_in(d+1) = diag(exp b_last(d)) S_in(d) + S_zero(d)``. Step j moves one state from device j to
   device j+1, so the chain takes P−1 hops, and in each hop a single device sends.
3. **Finish** (no communication): ``o = o_zero + scale · (q ⊙ exp(b)) S_in``.

Why a chain rather than an ``all_gather`` of the (decay, state) pairs followed by a local prefix
combine: the all_gather needs one collective instead of P−1 hops, but each device receives P−1
states (O(P·K·V) per device). The chain keeps the volume at one state per device and is the same
algorithm as :mod:`gla_ref.sequence_parallel.torch`. It also gives the backward for free: JAX
transposes each ``ppermute`` (j → j+1) into (j+1 → j), so the state gradients run the chain in
reverse order.

**Communication.** Forward: every device but the last sends one state of ``B_l·H_l·K·V`` floats
(``B_l``, ``H_l`` = its share of the batch and heads), every device but the first receives one:
O(K·V) per device, independent of T. With ``output_final_state``, one all-reduce (``psum``) of a
state of that size hands the last device's outgoing state to every device (the others add zeros).
Backward: the P−1 hops again, in the opposite direction; one all-reduce of a state for the
gradient of ``initial_state`` (replicated over ``axis``, so its gradient is summed over it), and
one of ``H_l`` floats for a constant gate ``[H]``. The gate's total decay never travels: each
device uses its own (tests/test_sequence_parallel_jax.py checks that the compiled program holds
these collectives and no others). The slice length ``T/P`` need not be a multiple of
``chunk_size``: each device pads its last chunk, as the single-device form does.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gla_ref.reference import jax as jax_ref
from gla_ref._validate import check_chunk_sizes, check_flag, check_inputs, check_scale

try:  # public since jax 0.7; this module supports jax 0.10-0.12
    _shard_map = jax.shard_map
except AttributeError:  # pragma: no cover - older jax
    from jax.experimental.shard_map import shard_map as _shard_map

__all__ = ["chunk_gla"]

_HIGHEST = lax.Precision.HIGHEST


def chunk_gla(q, k, v, g=None, *, mesh, axis="seq", batch_axis=None, head_axis=None, scale=None,
              initial_state=None, output_final_state=False, chunk_size=64):
    """Chunkwise GLA with T split over mesh axis ``axis``; same results as ``jax_ref.chunk_gla``.

    q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g log forget gates (≤ 0) of shape None, ``[H]``,
    ``[B, T, H]`` or ``[B, T, H, K]``; ``initial_state`` ``[B, H, K, V]`` or None. ``mesh`` a
    :class:`jax.sharding.Mesh`; T is split over its axis ``axis`` (T must divide evenly by that
    axis' size), B over ``batch_axis`` and H over ``head_axis`` when they name mesh axes; inputs
    are replicated over any other mesh axis. Inputs laid out otherwise are resharded under jit.

    Returns ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype, sharded like q;
    ``final_state`` ``[B, H, K, V]`` (float32, float64 for float64 input) when
    ``output_final_state`` else None. Jittable and differentiable w.r.t. q, k, v, g and
    ``initial_state``. Raises ValueError/TypeError naming the argument for bad shapes, dtypes,
    mesh axes or a T that does not split evenly.
    """
    dims = check_inputs(q, k, v, g, initial_state)
    devices = _check_mesh(mesh, axis, batch_axis, head_axis, dims)
    check_chunk_sizes(chunk_size)
    check_flag("output_final_state", output_final_state)
    scale = check_scale(scale, dims.K)
    jax_ref._check_values(q=q, k=k, v=v, g=g, initial_state=initial_state)
    return _sharded_chunk_gla(q, k, v, g, initial_state, mesh=mesh, axis=axis, batch_axis=batch_axis,
                              head_axis=head_axis, devices=devices, scale=scale,
                              chunk_size=int(chunk_size), final=bool(output_final_state))


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
                                   "chunk_size", "final"))
def _sharded_chunk_gla(q, k, v, g, h0, *, mesh, axis, batch_axis, head_axis, devices, scale,
                       chunk_size, final):
    if g is not None and g.ndim == 1:  # [H] → [B, T, H]: each device reads its slice, and the
        g = jnp.broadcast_to(g, q.shape[:3])  # gradient is summed ([H] per device) outside shard_map
    in_specs, out_specs = _specs(g, h0, axis, batch_axis, head_axis, final)
    body = partial(_device_slice, axis=axis, devices=devices, scale=scale, chunk_size=chunk_size,
                   final=final)
    out = _shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)(q, k, v, g, h0)
    return out if final else (out, None)


def _device_slice(q, k, v, g, h0, *, axis, devices, scale, chunk_size, final):
    """One device's work on its slice ``[B_l, T/P, H_l, ·]``: returns o, and with ``final`` also
    the final state (the state leaving the last device, summed over ``axis`` from a mask)."""
    B, T, H, K = q.shape
    dt = jnp.float64 if q.dtype == jnp.float64 else jnp.float32  # the math dtype
    # a zero state that varies over the mesh axes like k (shard_map types a scan's carry so)
    zero = jnp.zeros_like(k, shape=(B, H, K, v.shape[-1]), dtype=dt)
    o_zero, S_zero = jax_ref.chunk_gla(q, k, v, g, scale=scale, initial_state=zero,
                                       output_final_state=True, chunk_size=chunk_size)
    b = jnp.cumsum(jax_ref.expand_gate(g, B, T, H, K, dtype=dt).astype(dt), axis=1)
    S_in, S_out = _state_chain(S_zero, b[:, -1], h0, axis, devices)
    qb = q.astype(dt) * jnp.exp(b)  # b ≤ 0: the decay from the slice start to token t
    o = (o_zero.astype(dt) + scale * jnp.einsum("bthk,bhkv->bthv", qb, S_in, precision=_HIGHEST))
    if not final:
        return o.astype(q.dtype)
    is_last = lax.axis_index(axis) == devices - 1
    return o.astype(q.dtype), lax.psum(jnp.where(is_last, S_out, 0), axis)


def _state_chain(S_zero, b_last, h0, axis, devices):
    """The state entering and leaving this device's slice, passed along ``axis`` by P−1 hops.

    ``S_zero`` ``[B, H, K, V]``: the slice's state from zero; ``b_last`` ``[B, H, K]``: its total
    log-decay. Device 0 starts from h0 (zero when None); hop j sends device j's outgoing state to
    device j+1, which keeps it as its incoming state (the other devices drop what they receive).
    """
    me = lax.axis_index(axis)
    gamma = jnp.exp(b_last)[..., None]  # [B, H, K, 1]
    S_in = jnp.zeros_like(S_zero)  # varies over the mesh like S_zero
    if h0 is not None:  # replicated over axis: one select makes it vary, so dh0 is summed once
        S_in = jnp.where(me == 0, h0.astype(S_zero.dtype), S_in)
    for j in range(devices - 1):
        passed = lax.ppermute(gamma * S_in + S_zero, axis, perm=[(j, j + 1)])
        S_in = jnp.where(me == j + 1, passed, S_in)
    return S_in, gamma * S_in + S_zero
