"""Bytes that cross between devices when one sequence is split over P of them: GLA's chain of
states against ring attention, as models, and as read from a compiled JAX program (chapter 9).

Models (per device, one call; with ``backward`` its backward too):

* :func:`state_chain_bytes` — GLA (:mod:`gla_ref.sequence_parallel`): a device in the middle of
  the chain sends one ``[B, H, K, V]`` state forward and one state gradient back. T appears
  nowhere.
* :func:`ring_attention_bytes` — softmax attention by a ring: every device's key and value block of
  T/P tokens visits the P−1 other devices in the forward pass; the backward sends the blocks round
  again and their gradients with them. Grows like T.

* :func:`sequence_parallel_seconds` — a device's time for one training step of the chain, from the one-device
  time at the same T: its share of the work, the extra state passes of its slice, and the hops in turn. What a
  TPU pod would see (no TPU was measured): its ICI link bandwidth and hop latency go in as assumptions.

Measured: :func:`hlo_collectives` lists the collectives of a compiled JAX program's HLO text
(``jitted.lower(...).compile().as_text()``) and :func:`bytes_sent_by_device` adds up what each
device sends. Importing this module loads no framework.
"""

from __future__ import annotations

import itertools
import math
import re

__all__ = ["bytes_sent_by_device", "hlo_collectives", "ring_attention_bytes", "sequence_parallel_seconds",
           "state_chain_bytes"]


def _positive_ints(**values):
    for name, x in values.items():
        if not isinstance(x, int) or isinstance(x, bool) or x < 1:
            raise ValueError(f"{name} must be an int >= 1, got {x!r}")


def state_chain_bytes(B, H, K, V, *, devices, state_bytes=4, backward=True) -> int:
    """Bytes the busiest device sends in one call of the GLA chain over ``devices`` devices.

    Forward, every device but the last sends one ``[B, H, K, V]`` state to the next; with
    ``backward``, every device but the first sends one state gradient to the previous. A device in
    the middle therefore sends two states, the two end devices one (0 for a single device).
    ``state_bytes``: 4 (states travel in float32 whatever the input dtype; 8 for float64).
    Independent of T; the torch module's small header exchange is not counted.
    """
    _positive_ints(B=B, H=H, K=K, V=V, devices=devices, state_bytes=state_bytes)
    states = 0 if devices == 1 else (2 if backward and devices > 2 else 1)
    return states * B * H * K * V * state_bytes


def ring_attention_bytes(B, T, H, K, V, *, devices, dtype_bytes=2, backward=True) -> int:
    """Bytes each device sends in one call of ring attention over ``devices`` devices (T split
    evenly, H heads for keys and values alike).

    Forward: the key and value block of T/P tokens, ``B·(T/P)·H·(K+V)`` entries, is passed on
    P−1 times so that every query block meets every key block. Backward (``backward``): the blocks
    go round again, and so do their gradients dK, dV, counted here in the blocks' dtype (float32
    accumulators would move more): three blocks per hop in all. Grows linearly with T.
    """
    _positive_ints(B=B, T=T, H=H, K=K, V=V, devices=devices, dtype_bytes=dtype_bytes)
    if T % devices:
        raise ValueError(f"T={T} must split evenly over devices={devices}")
    block = B * (T // devices) * H * (K + V) * dtype_bytes
    return (devices - 1) * block * (3 if backward else 1)


def sequence_parallel_seconds(one_device_s, B, H, K, V, *, devices, state_pass_fraction, link_bytes_per_s,
                              hop_latency_s, state_bytes=4, backward=True) -> dict:
    """A model of one call (with ``backward``, a training step) of the chain on ``devices`` devices, T split evenly,
    from ``one_device_s``, the one-device time at the same T (the kernels' time is linear in T).

    Each device computes ``one_device_s / P`` plus the extra passes over its slice, ``state_pass_fraction`` of
    that (the JAX form runs a state pass and a reverse state pass more than one device does; the torch form's
    end ranks none, its middle ranks both). The chain's hops come in turn, each ``hop_latency_s`` plus one
    ``[B, H, K, V]`` state over a link of ``link_bytes_per_s``: P−1 forward and, with ``backward``, P−1 back,
    all on the step's critical path (a device's output waits for its incoming state). Returns ``compute_s``,
    ``chain_s``, ``total_s`` and ``speedup`` (``one_device_s / total_s``).

    On a TPU pod, say a v5p slice with T split over 16 chips along one ICI ring, with the link bandwidth and hop
    latency as assumptions (about 100 GB/s and 5 µs; not measured here): a 1 MiB state (B=1, H=16, K=V=128,
    float32) costs about 15 µs a hop, 30 hops 0.5 ms a step, against a compute share that falls as 1/P and does not
    depend on the chain. The chain stops paying when ``2(P−1)·hop`` nears ``one_device_s / P``.
    """
    _positive_ints(B=B, H=H, K=K, V=V, devices=devices, state_bytes=state_bytes)
    for name, x in (("one_device_s", one_device_s), ("link_bytes_per_s", link_bytes_per_s)):
        if not x > 0:
            raise ValueError(f"{name} must be positive, got {x!r}")
    if state_pass_fraction < 0 or hop_latency_s < 0:
        raise ValueError("state_pass_fraction and hop_latency_s must be >= 0")
    compute = one_device_s / devices * (1 + (state_pass_fraction if devices > 1 else 0))
    hop = hop_latency_s + B * H * K * V * state_bytes / link_bytes_per_s
    chain = (devices - 1) * hop * (2 if backward else 1)
    return {"compute_s": compute, "chain_s": chain, "total_s": compute + chain,
            "speedup": one_device_s / (compute + chain)}


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
                "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_OP = re.compile(r"=\s*(\(.*?\)|\S+)\s+(all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter|"
                 r"collective-broadcast)(-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_IOTA = re.compile(r"replica_groups=(\[(\d+),(\d+)\]<=\[[\d,]+\](?:T\([\d,]+\))?)")
_MESH = re.compile(r"replica_groups=@?mesh[<\[]([^>\]]*)[>\]](?:\(devices=(.*?)\))?\s*\{([^}]*)\}")
_DEVICES = re.compile(r"\[([\d,]+)\](?:<=\[([\d,]+)\](?:T\(([\d,]+)\))?|([\d,]+))$")


def _nbytes(dtype, dims):
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"unknown HLO element type {dtype!r}")
    n = _DTYPE_BYTES[dtype]
    for d in filter(None, dims.split(",")):
        n *= int(d)
    return n


def _ints(text):
    return [int(i) for i in text.split(",") if i]


def _row_major(sizes):
    """Every coordinate of an array of ``sizes``, in row-major order."""
    return itertools.product(*(range(n) for n in sizes))


def _flat(coord, sizes):
    index = 0
    for i, n in zip(coord, sizes):
        index = index * n + i
    return index


def _device_order(spec, count):
    """The ``count`` devices of an array written ``[dims]<=[shape]T(perm)`` (an iota of ``shape``, transposed by
    ``perm``) or ``[dims]i,j,...`` (listed), row-major; ``None``: the iota 0..count−1. A mesh's devices and iota
    replica groups are both written so."""
    if spec is None:
        return list(range(count))
    m = _DEVICES.match(spec.strip())
    if m is None:
        raise ValueError(f"cannot read the mesh's devices: {spec[:100]}")
    if m.group(4):
        devices = _ints(m.group(4))
    else:
        shape = _ints(m.group(2))
        perm = _ints(m.group(3)) if m.group(3) else list(range(len(shape)))
        moved = [shape[p] for p in perm]  # the transposed array's shape; its entry at c is the iota at c un-permuted
        devices = [_flat([c[perm.index(a)] for a in range(len(shape))], shape) for c in _row_major(moved)]
    if len(devices) != count:
        raise ValueError(f"the devices ({len(devices)}) do not fill the {count} positions: {spec[:100]}")
    return devices


def _mesh_groups(axes_text, devices_spec, group_text):
    """Replica groups written as mesh axes (``mesh['seq'=8] {'seq'}``, ``@mesh<u=2,v=3> {v}``): one group per
    position of the axes left out, its devices along the named axes. Sub-axes (``b:(1)2``) are not read."""
    axes = [(name, int(n)) for name, n in re.findall(r"'?(\w+)'?\s*=\s*(\d+)", axes_text)]
    names, sizes = [a for a, _ in axes], [n for _, n in axes]
    grouped = [g.strip().strip("'") for g in group_text.split(",") if g.strip()]
    if any(g not in names for g in grouped):
        raise ValueError(f"cannot read the mesh axes {grouped} (sub-axes are not read) of mesh {axes}")
    devices = _device_order(devices_spec, math.prod(sizes))
    kept = [names.index(g) for g in grouped]
    rest = [i for i in range(len(names)) if i not in kept]
    groups = []
    for outer in _row_major([sizes[i] for i in rest]):
        group = []
        for inner in _row_major([sizes[i] for i in kept]):
            coord = [0] * len(names)
            for i, c in zip(rest, outer):
                coord[i] = c
            for i, c in zip(kept, inner):
                coord[i] = c
            group.append(devices[_flat(coord, sizes)])
        groups.append(group)
    return groups


def _groups(line):
    """The replica groups of a collective, or None for 'all devices' (``replica_groups={}``). Three notations:
    listed (``{{0,1},{2,3}}``), an iota (``[2,2]<=[4]``) and mesh axes (``mesh['seq'=8] {'seq'}``, what
    jax 0.11 prints; jax 0.10 lists the groups)."""
    m = _GROUPS.search(line)
    if m:
        groups = [[int(i) for i in g.split(",") if i] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
        return groups or None
    m = _IOTA.search(line)
    if m:  # [n_groups, size]<=[shape]T(perm): an iota of shape, transposed by perm, cut into the groups
        count, size = int(m.group(2)), int(m.group(3))
        devices = _device_order(m.group(1), count * size)
        return [devices[i * size:(i + 1) * size] for i in range(count)]
    m = _MESH.search(line)
    if m:
        return _mesh_groups(*m.groups())
    if "replica_groups=" in line:
        raise ValueError(f"cannot read the replica groups of: {line.strip()[:200]}")
    return None


def hlo_collectives(hlo_text):
    """The collectives of compiled HLO text, in the order the text lists them: a list of dicts with ``kind``
    (``"collective-permute"``, ``"all-reduce"``, ...), ``shapes`` (``[(dtype, dims), ...]``, the
    arrays the op moves), ``nbytes`` (their total size) and ``pairs`` (a permute's
    ``(source, target)`` devices) or ``groups`` (the replica groups; None means all devices).

    An asynchronous ``collective-permute-start`` returns a tuple (operand, result, contexts):
    its first array only is counted. ``-done`` ops are not listed (their ``-start`` is).
    """
    found = []
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if m is None:
            continue
        result, kind, start = m.groups()
        arrays = _ARRAY.findall(result)
        if kind == "collective-permute" and start:
            arrays = arrays[:1]
        op = {"kind": kind, "shapes": [(t, tuple(int(d) for d in dims.split(",") if d)) for t, dims in arrays],
              "nbytes": sum(_nbytes(t, dims) for t, dims in arrays)}
        if kind == "collective-permute":
            pairs = _PAIRS.search(line)
            op["pairs"] = [tuple(int(i) for i in p) for p in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1))]
        else:
            op["groups"] = _groups(line)
        found.append(op)
    return found


def bytes_sent_by_device(collectives, devices):
    """Bytes each of ``devices`` devices sends for :func:`hlo_collectives`' list: a permute's
    array once per pair it is the source of (exact); an all-reduce over a group of n devices
    ``2·(n−1)/n`` of its array per member, as a ring all-reduce sends (a model: the library
    picks the algorithm). Other kinds raise ValueError."""
    _positive_ints(devices=devices)
    sent = [0.0] * devices
    for op in collectives:
        if op["kind"] == "collective-permute":
            for source, _ in op["pairs"]:
                sent[source] += op["nbytes"]
        elif op["kind"] == "all-reduce":
            for group in op["groups"] or [list(range(devices))]:
                for d in group:
                    sent[d] += 2 * (len(group) - 1) / len(group) * op["nbytes"]
        else:
            raise ValueError(f"bytes_sent_by_device counts collective-permute and all-reduce, got {op['kind']}")
    return sent
