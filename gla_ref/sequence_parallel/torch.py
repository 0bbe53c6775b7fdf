"""Sequence-parallel chunkwise GLA in PyTorch: each rank of a ``torch.distributed`` group owns a
contiguous slice of T, in rank order, and runs it with the Triton kernels end to end.

Rank r of P holds tokens ``[t_r, t_{r+1})`` of q, k, v, g (slices may differ in length). Its slice
is the single-device :func:`gla_ref.triton.chunk_gla` split into its kernels
(:class:`~gla_ref.sequence_parallel.torch_slices.TritonSlice`), with the chain of states run
between them, as one :class:`torch.autograd.Function` (:class:`_SequenceParallelGLA`).

**Forward** (``γ_r = exp Σ_{t in slice r} g_t``, the slice's total decay, ``[B, H, K]``):

1. *gates*: the chunk-local cumulative log-gate ``b`` (float32; log Λ of book/notation.md) and the decayed operands
   ``scale·q ⊙ Λ``, ``k ⊙ Γ`` (input dtype), one kernel;
2. *the state the slice builds from zero*, ``S_zero``, by the state kernel, and ``log γ_r`` summed
   from the ``⌈T_r/C⌉`` last rows of b's chunks — only on the ranks in the middle of the chain;
3. *the chain*: rank 0 starts from ``initial_state`` (zero when None); rank r > 0 receives
   ``S_in`` from rank r−1 and a middle rank sends ``S_out = diag(γ_r) S_in + S_zero`` to rank r+1
   at once (one small op a hop). Rank 0 sends the final state of its own state pass (step 4)
   instead: it knows its ``S_in`` from the start, so it needs no step 2;
4. *the slice's chunk pass from S_in*: the state kernel from ``S_in`` (rank 0: from
   ``initial_state``), the intra-chunk kernel, the output kernel — the single-device forward. The
   last rank's state pass gives the final state. A rank that waits for ``S_in`` runs the
   intra-chunk kernel while it waits.

**Backward** (``dS_out`` is the gradient of the state leaving the slice; the last rank's is the
final state's cotangent):

1. the states ``S_[i]`` entering the slice's chunks recomputed in float32 from ``S_in`` (after step
   2's send on the last rank: the reverse state pass does not read them);
2. the last rank runs the reverse state kernel from ``dS_out`` first and sends the ``dh0`` it gives,
   ``dS_in``, to rank r−1 at once. A middle rank runs it from zero first (``dS_in_local``),
   receives ``dS_out`` from rank r+1 and sends ``dS_in = diag(γ_r) dS_out + dS_in_local`` at once
   (the recurrence is linear in its starting value, and ``dS_out`` reaches ``S_in`` through the
   slice's chunk decays, whose product is γ_r); rank 0 receives ``dS_out`` only. A rank that waits
   runs step 1 and the intra-chunk gradient kernels (dA and the intra-chunk dq, dk) meanwhile;
3. the slice's backward with ``dS_out`` as the final state's cotangent: the reverse state kernel
   from ``dS_out``, dv, then the inter-chunk dq, dk and the gate gradient — the single-device
   backward, so dg holds the term of the outgoing state ``S_out = diag(γ_r) S_in + S_zero``
   through every gate of the slice, exactly as for one device's final state. Rank 0's ``dh0`` is
   the gradient of ``initial_state``.

So the last rank and rank 0 run the single-device forward and backward on their slices plus one
receive or send; a middle rank adds one state pass and one reverse state pass. Every rank keeps
what one device keeps for its tokens (q, k, v, A in the input dtype, b in float32) plus one
float32 ``[B, H, K, V]`` state. float64 inputs (no Triton kernel takes them) run the same steps
through :func:`gla_ref.reference.torch.chunk_gla` (:class:`~gla_ref.sequence_parallel.torch_slices.ReferenceSlice`),
which checks the chain's algebra to float64 rounding.

**Communication.** Before anything else, the ranks exchange an 11-integer header (an
``all_gather``, ``88·(P−1)`` bytes each way; for NCCL's default group over a gloo twin of it, so that
the host need not wait for the GPU to read it): an error flag, B, H, K, V, the dtype, the gate's
rank, the chunk size, ``output_final_state``, the scale (its float64 bits) and whether the call
records a graph. A bad input on any rank, or ranks that disagree on any of these, raises a
ValueError or TypeError on every rank, before any kernel and instead of leaving a neighbour waiting
in ``recv``. Then one ``[B, H, K, V]`` state per hop, ``4·B·H·K·V`` bytes (8 for float64), forward
r → r+1 and backward r+1 → r. T appears nowhere: :func:`bytes_per_call` gives the exact figure
and :func:`count_traffic` measures it. The chain's latency is P−1 hops, each one small op. Sends
do not hold up the sender's kernels (``isend``), and a receive is posted before the kernels that run
while its state travels (``irecv``), so on NCCL the transfer overlaps them.

Every rank must call :func:`chunk_gla` with the same options, and must run the backward through
its output whenever any rank does (otherwise the chain waits). A gate of shape ``[H]`` is a
replicated parameter: each rank returns the gradient of its own slice, to be summed over ranks
(an ``all_reduce``), as for any replicated parameter. Gates ``[H]``, ``[B, T, H]`` and None run
the GLA kernels on the gate broadcast to ``[B, T, H, K]``.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gla_ref._validate import (FLOAT_DTYPES, check_chunk_sizes, check_flag, check_inputs, check_scale,
                              dtype_name)
from gla_ref.reference import torch as torch_ref
from gla_ref.sequence_parallel.torch_slices import slice_ops

__all__ = ["chunk_gla", "count_traffic", "bytes_per_call", "Traffic", "HEADER_FIELDS"]

HEADER_FIELDS = ("error", "B", "H", "K", "V", "dtype", "gate rank", "chunk_size", "output_final_state", "scale",
                 "records a graph")
"""The int64 entries of the header every rank shares before the chain (the scale as its float64 bits)."""
_HEADER = len(HEADER_FIELDS)


@dataclass
class Traffic:
    """Bytes one rank sends and receives (payload only, as the collectives see it)."""

    sent: int = 0
    received: int = 0


_COUNTERS: list[Traffic] = []


@contextlib.contextmanager
def count_traffic():
    """Count the bytes this rank sends and receives inside the block, forward and backward (an
    ``all_gather`` counts the P−1 rows that leave this rank and the P−1 that arrive)::

        with count_traffic() as traffic:
            o, S = chunk_gla(q, k, v, g)
            o.sum().backward()
        traffic.sent, traffic.received
    """
    traffic = Traffic()
    _COUNTERS.append(traffic)
    try:
        yield traffic
    finally:
        _COUNTERS.remove(traffic)


def bytes_per_call(B, H, K, V, *, rank, world_size, dtype=torch.float32, backward=True) -> Traffic:
    """The bytes rank ``rank`` of ``world_size`` sends and receives in one :func:`chunk_gla` call
    (and its backward when ``backward``): the header, plus one ``[B, H, K, V]`` state per hop.

    ``dtype`` is q's dtype (states travel in float32, float64 for float64 input). T appears
    nowhere: the volume does not grow with the sequence.
    """
    state = B * H * K * V * (8 if dtype == torch.float64 else 4)
    header = (world_size - 1) * _HEADER * 8  # all_gather: each rank's row reaches the others
    first, last = rank == 0, rank == world_size - 1
    sends = (not last) + backward * (not first)  # forward to rank + 1, backward to rank − 1
    receives = (not first) + backward * (not last)
    return Traffic(sent=header + sends * state, received=header + receives * state)


def _count(sent=0, received=0):
    for traffic in _COUNTERS:
        traffic.sent += sent
        traffic.received += received


class _Chain:
    """This rank's place in the group, and the counted send/recv/all_gather it uses.

    Sends do not wait (``isend``: on NCCL the compute stream goes on with the next kernel while the state
    travels); :meth:`finish_sends` waits for them at the end of a forward or backward. A receive is posted
    (``irecv``) before the kernels that run while the state travels and waited for just before the kernel that
    reads it, so on NCCL the transfer overlaps those kernels."""

    def __init__(self, group):
        self.group = group
        self.header_group = _header_group(group)
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.first, self.last = self.rank == 0, self.rank == self.size - 1
        self.middle = not (self.first or self.last)
        self.sending = []

    def _global(self, rank):
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def send(self, x, to):
        x = x.contiguous()
        self.sending.append((dist.isend(x, self._global(to), group=self.group), x))  # x lives until sent
        _count(sent=x.numel() * x.element_size())

    def finish_sends(self):
        for work, _ in self.sending:
            work.wait()
        self.sending.clear()

    def post_recv(self, like, frm):
        """Post a receive into a tensor like ``like``; returns a function that waits for it and returns it."""
        x = torch.empty_like(like, memory_format=torch.contiguous_format)
        work = dist.irecv(x, self._global(frm), group=self.group)
        _count(received=x.numel() * x.element_size())

        def wait():
            work.wait()
            return x
        return wait

    def all_gather_header(self, header):
        """Every rank's header (a list of ints), as an int64 table on the CPU, over :func:`_header_group`."""
        cuda = dist.get_backend(self.header_group) == "nccl"  # NCCL moves CUDA tensors only
        x = torch.tensor(header, dtype=torch.int64,
                         device=torch.device("cuda", torch.cuda.current_device()) if cuda else None)
        rows = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(rows, x, group=self.header_group)
        nbytes = (self.size - 1) * x.numel() * x.element_size()
        _count(sent=nbytes, received=nbytes)
        return torch.stack(rows).cpu()


_HEADER_GROUPS: dict = {}


def _header_group(group):
    """The group the header travels in: ``group`` itself, except for NCCL's default group, which gets a gloo
    twin (made once, at the first call, which every rank makes): the header is then read on the host without
    waiting for the GPU. (An NCCL subgroup keeps its own all_gather, which waits for the GPU to reach it:
    a gloo twin of it would have to be made by every rank of the world.)"""
    if group not in (None, dist.group.WORLD) or dist.get_backend(group) != "nccl":
        return group
    if "world" not in _HEADER_GROUPS:
        _HEADER_GROUPS["world"] = dist.new_group(backend="gloo")
    return _HEADER_GROUPS["world"]


def chunk_gla(q, k, v, g=None, *, group=None, scale=None, initial_state=None, output_final_state=False,
              chunk_size=64):
    """This rank's slice of chunkwise GLA over a sequence split across the ranks of ``group``.

    q, k ``[B, T_r, H, K]``; v ``[B, T_r, H, V]``; g log forget gates (≤ 0): None, ``[H]``,
    ``[B, T_r, H]`` or ``[B, T_r, H, K]`` — the rank's own tokens, rank order being sequence order
    (``group=None``: the default group; gloo for CPU tensors, NCCL for CUDA ones).
    ``initial_state`` ``[B, H, K, V]`` on rank 0 only (None elsewhere). B, H, K, V, the dtype, the
    gate's rank, ``scale``, ``chunk_size`` and ``output_final_state`` must agree across ranks; the
    slice lengths T_r ≥ 1 may differ. float32, float16 and bfloat16 run the Triton kernels (CUDA, or
    Triton's interpreter on a CPU: float32 and float16), with their limits (K ≤ 256, chunk size 16,
    32 or 64); float64 runs the PyTorch reference (any chunk size).

    Returns ``(o, final_state)``: o ``[B, T_r, H, V]`` in q's dtype; ``final_state``
    ``[B, H, K, V]`` (float32, float64 for float64 input) on the last rank when
    ``output_final_state``, None on the others. Differentiable w.r.t. q, k, v, g and
    ``initial_state``. A bad input on any rank raises ValueError/TypeError on every rank.
    """
    chain = _Chain(group)
    records = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v, g, initial_state))
    error, header = _check_local(q, k, v, g, initial_state, scale, chunk_size, output_final_state, records,
                                 chain.rank)
    _agree(chain, error, header)
    scale = check_scale(scale, q.shape[-1])
    B, T, H, K = q.shape
    math_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    g4 = torch_ref.expand_gate(g, B, T, H, K, dtype=math_dtype, device=q.device)  # a view for [H], [B, T, H]
    o, S = _SequenceParallelGLA.apply(q, k, v, g4, initial_state, chain, scale, int(chunk_size),
                                      bool(output_final_state))
    return o, (S if output_final_state and chain.last else None)


def _check_local(q, k, v, g, h0, scale, chunk_size, output_final_state, records, rank):
    """This rank's inputs checked: ``(error or None, header)`` (see :data:`HEADER_FIELDS`)."""
    try:
        for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("initial_state", h0)):
            if x is not None and not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if q.dtype == torch.float64:
            dims = check_inputs(q, k, v, g, h0)
            check_chunk_sizes(chunk_size)
            torch_ref.check_input_values(q=q, k=k, v=v, g=g, initial_state=h0)
        else:
            dims = _check_triton(q, k, v, g, h0, chunk_size)
        if h0 is not None and rank != 0:
            raise ValueError(f"initial_state is given on rank 0 only (the state entering the "
                             f"sequence), got one on rank {rank}")
        final = check_flag("output_final_state", output_final_state)
        scale = check_scale(scale, dims.K)
    except (TypeError, ValueError) as err:
        return err, [1] + [0] * (_HEADER - 1)
    gate_rank = 0 if g is None else g.ndim
    scale_bits = struct.unpack("<q", struct.pack("<d", scale))[0]
    return None, [0, dims.B, dims.H, dims.K, dims.V, FLOAT_DTYPES.index(dtype_name(q)), gate_rank,
                  int(chunk_size), int(final), scale_bits, int(records)]


def _check_triton(q, k, v, g, h0, chunk_size):
    """The shapes and dtypes, and the Triton kernels' own limits (K ≤ 256, V ≤ 4096, chunk size 16/32/64, one
    device, no bf16 in the interpreter; values only under ``gla_ref.device.debug``), checked before the chain
    starts; returns the dimensions."""
    import gla_ref.triton  # noqa: F401  (sets up Triton's interpreter on a machine without CUDA)
    from gla_ref.triton.common.host import check_chunk_size, prepare

    check_chunk_size(chunk_size)
    return prepare(q, k, v, g, h0, gate_ranks=(None, 1, 3, 4))


def _agree(chain, error, header):
    """All ranks share their headers; every rank raises if any rank's input is bad or the ranks
    disagree on any header field. ``error`` is this rank's own exception."""
    table = chain.all_gather_header(header).tolist()
    if error is not None:
        raise error
    bad = [r for r, row in enumerate(table) if row[0]]
    if bad:
        raise ValueError(f"chunk_gla: the input on rank(s) {bad} is invalid (the error is raised "
                         f"there); every rank of the group stops")
    differ = [i for i in range(1, _HEADER) if any(row[i] != table[0][i] for row in table)]
    if differ:
        raise ValueError("chunk_gla: every rank must call with the same " + ", ".join(HEADER_FIELDS[i] for i in differ)
                         + "; by rank: " + "; ".join(f"{HEADER_FIELDS[i]} {_readable(i, [row[i] for row in table])}"
                                                     for i in differ))


def _readable(field, values):
    """A header column as the user wrote it (the dtype's name, the scale as a float)."""
    if HEADER_FIELDS[field] == "scale":
        values = [struct.unpack("<d", struct.pack("<q", x))[0] for x in values]
    elif HEADER_FIELDS[field] == "dtype":
        values = [FLOAT_DTYPES[x] for x in values]
    elif HEADER_FIELDS[field] in ("output_final_state", "records a graph"):
        values = [bool(x) for x in values]
    return dict(enumerate(values))


def _decay(log_gamma, S):
    """``diag(γ) S`` for a state ``[B, H, K, V]`` and the log-decay ``[B, H, K]`` (≤ 0) of a slice."""
    return torch.exp(log_gamma).unsqueeze(-1).to(S.dtype) * S


def _state_like(q, v):
    """An empty ``[B, H, K, V]`` state in the math dtype (float32, float64 for float64 input) next to q."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return torch.empty(q.shape[0], q.shape[2], q.shape[3], v.shape[3], dtype=dtype, device=q.device)


class _SequenceParallelGLA(torch.autograd.Function):
    """Forward: states r → r+1; backward: state gradients r+1 → r (the module docstring's steps)."""

    @staticmethod
    def forward(ctx, q, k, v, g, h0, chain, scale, chunk_size, final):
        ops = slice_ops(q, k, v, g, scale, chunk_size)
        ops.prepare()                                      # 1. gates and decayed operands
        log_gamma = None
        if chain.middle:
            S_zero, log_gamma = ops.zero_state()           # 2. the slice's own state, from zero
        if chain.first:
            S_in = h0
            S_fin = ops.states(S_in, not chain.last or final)  # 4. (rank 0 knows S_in at once)
            if not chain.last:
                chain.send(S_fin, chain.rank + 1)          # 3. rank 0's outgoing state
            ops.intra()
        else:
            arrival = chain.post_recv(_state_like(q, v), chain.rank - 1)  # 3. the chain
            ops.intra()                                    # while the state travels
            S_in = arrival()
            if chain.middle:
                chain.send(_decay(log_gamma, S_in) + S_zero, chain.rank + 1)
            S_fin = ops.states(S_in, chain.last and final)  # 4. the chunk pass from S_in
        o = ops.output()
        chain.finish_sends()
        ctx.save_for_backward(*ops.saved(), S_in, log_gamma)
        ctx.chain, ctx.scale, ctx.chunk_size, ctx.g_dtype = chain, scale, chunk_size, g.dtype
        ctx.ops_type = type(ops)
        ctx.set_materialize_grads(False)
        return o, (S_fin if chain.last and final else None)

    @staticmethod
    def backward(ctx, do, dS_final):
        *saved, S_in, log_gamma = ctx.saved_tensors
        chain, want_dh0 = ctx.chain, ctx.needs_input_grad[4]
        q, v = saved[0], saved[2]
        do = torch.zeros(*q.shape[:3], v.shape[3], dtype=q.dtype, device=q.device) if do is None else do.contiguous()
        ops = ctx.ops_type.restore(saved, S_in, ctx.scale, ctx.chunk_size, ctx.g_dtype)
        if chain.last:
            dS_in = ops.state_grads(do, dS_final, not chain.first or want_dh0)          # 2. and 3. at once
            if not chain.first:
                chain.send(dS_in, chain.rank - 1)
            ops.recompute_states()                         # 1.
            ops.intra_grads(do)
        else:
            if chain.middle:
                dS_local = ops.state_grads(do, None, True, keep=False)                   # 2. from zero
            arrival = chain.post_recv(_state_like(q, v), chain.rank + 1)
            ops.intra_grads(do)                            # while the gradient travels
            ops.recompute_states()                         # 1.
            dS_out = arrival()
            if chain.middle:
                chain.send(_decay(log_gamma, dS_out) + dS_local, chain.rank - 1)
            dS_in = ops.state_grads(do, dS_out, chain.first and want_dh0)               # 3.
        dq, dk, dv, dg = ops.finish(do)
        chain.finish_sends()
        needs = ctx.needs_input_grad
        return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
                dg if needs[3] else None, dS_in if chain.first and want_dh0 else None, None, None, None, None)
