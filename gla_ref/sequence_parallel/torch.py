"""Sequence-parallel chunkwise GLA in PyTorch: each rank of a ``torch.distributed`` group owns a
contiguous slice of T, in rank order.

Rank r holds tokens ``[t_r, t_{r+1})`` of q, k, v, g (slices may differ in length). The forward,
as one :class:`torch.autograd.Function`:

1. **Local, from zero** (no communication): the chunk form on the slice with a zero state gives
   ``o_zero``, the slice's own state ``S_zero`` ``[B, H, K, V]`` and the cumulative log-gate
   from the slice start ``b`` ``[B, T_r, H, K]``, whose last row is the slice's total log-decay.
2. **Chain of states**: rank 0 starts from ``initial_state`` (zero when None); rank r receives
   ``S_in`` from rank r−1, sends ``S_out = diag(exp b_last) S_in + S_zero`` to rank r+1 at once,
3. then **finishes** its outputs: ``o = o_zero + scale · (q ⊙ exp b) S_in``.

The backward runs the chain the other way: rank r receives ``dS_out`` from rank r+1 (the last
rank starts from the final state's gradient), sends ``dS_in = diag(exp b_last) dS_out +
scale · (q ⊙ exp b)ᵀ do`` to rank r−1 at once (rank 0 keeps it as the gradient of
``initial_state``), and only then backpropagates through its local pieces, recomputed under
autograd (activation recomputation: the forward saves its inputs and ``S_in`` only). On CPU the
local pieces come from :func:`gla_ref.reference.torch.chunk_gla`, on CUDA from
:func:`gla_ref.triton.chunk_gla` with an NCCL group (a path the CPU tests do not run).

**Communication.** A sequential chain of send/recv: one message per hop, the ``[B, H, K, V]``
state, ``4·B·H·K·V`` bytes (8 per entry for float64 input), forward r → r+1 and backward
r+1 → r. The total log-decay never travels: each rank uses its own. Before any of it, the ranks
exchange a 7-integer header (an ``all_gather``, ``56·(P−1)`` bytes each way) so that a bad input
on any rank raises a ValueError or TypeError on every rank instead of leaving the others blocked
in ``recv``. Per call (forward and backward) a rank therefore sends and receives at most two
states plus the header: O(K·V), independent of T. :func:`bytes_per_call` gives the exact figure
and :func:`count_traffic` measures it. The price of the chain is latency: P−1 hops one after the
other (an ``all_gather`` of (decay, state) pairs would take one collective but move P−1 states
to every rank).

Every rank must call :func:`chunk_gla` with the same options, and must run the backward through
its output whenever any rank does (otherwise the chain waits). A gate of shape ``[H]`` is a
replicated parameter: each rank returns the gradient of its own slice, to be summed over ranks
(an ``all_reduce``), as for any replicated parameter.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gla_ref.reference import torch as torch_ref
from gla_ref._validate import (FLOAT_DTYPES, check_chunk_sizes, check_flag, check_inputs, check_scale,
                              dtype_name)

__all__ = ["chunk_gla", "count_traffic", "bytes_per_call", "Traffic"]

_HEADER = 7
"""int64 entries of the header every rank shares before the chain: error flag, B, H, K, V,
dtype, gate rank."""


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
    """This rank's place in the group, and the counted send/recv/all_gather it uses."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.first, self.last = self.rank == 0, self.rank == self.size - 1

    def _global(self, rank):
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def send(self, x, to):
        x = x.contiguous()
        dist.send(x, self._global(to), group=self.group)
        _count(sent=x.numel() * x.element_size())

    def recv(self, like, frm):
        x = torch.empty_like(like, memory_format=torch.contiguous_format)
        dist.recv(x, self._global(frm), group=self.group)
        _count(received=x.numel() * x.element_size())
        return x

    def all_gather(self, x):
        rows = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(rows, x, group=self.group)
        nbytes = (self.size - 1) * x.numel() * x.element_size()
        _count(sent=nbytes, received=nbytes)
        return torch.stack(rows)


def chunk_gla(q, k, v, g=None, *, group=None, scale=None, initial_state=None, output_final_state=False,
              chunk_size=64):
    """This rank's slice of chunkwise GLA over a sequence split across the ranks of ``group``.

    q, k ``[B, T_r, H, K]``; v ``[B, T_r, H, V]``; g log forget gates (≤ 0): None, ``[H]``,
    ``[B, T_r, H]`` or ``[B, T_r, H, K]`` — the rank's own tokens, rank order being sequence order
    (``group=None``: the default group; gloo for CPU tensors, NCCL for CUDA ones).
    ``initial_state`` ``[B, H, K, V]`` on rank 0 only (None elsewhere). B, H, K, V, the dtype and
    the gate's rank must agree across ranks; the slice lengths T_r ≥ 1 may differ.

    Returns ``(o, final_state)``: o ``[B, T_r, H, V]`` in q's dtype; ``final_state``
    ``[B, H, K, V]`` (float32, float64 for float64 input) on the last rank when
    ``output_final_state``, None on the others. Differentiable w.r.t. q, k, v, g and
    ``initial_state``. A bad input on any rank raises ValueError/TypeError on every rank.
    """
    chain = _Chain(group)
    error, header = _check_local(q, k, v, g, initial_state, scale, chunk_size, output_final_state,
                                 chain.rank)
    _agree(chain, error, header)
    scale = check_scale(scale, q.shape[-1])
    o, S = _SequenceParallelGLA.apply(q, k, v, g, initial_state, chain, scale, int(chunk_size))
    return o, (S if output_final_state and chain.last else None)


def _uses_triton(q):
    return q.device.type == "cuda"


def _check_local(q, k, v, g, h0, scale, chunk_size, output_final_state, rank):
    """This rank's inputs checked: ``(error or None, header)`` — the header (see ``_HEADER``) is
    what the ranks must agree on."""
    try:
        for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("initial_state", h0)):
            if x is not None and not isinstance(x, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        dims = check_inputs(q, k, v, g, h0)
        if h0 is not None and rank != 0:
            raise ValueError(f"initial_state is given on rank 0 only (the state entering the "
                             f"sequence), got one on rank {rank}")
        check_chunk_sizes(chunk_size)
        check_flag("output_final_state", output_final_state)
        check_scale(scale, dims.K)
        if _uses_triton(q):
            _check_triton(q, k, v, g, h0, chunk_size)
        else:
            torch_ref._check_values(q=q, k=k, v=v, g=g, initial_state=h0)
    except (TypeError, ValueError) as err:
        return err, [1] + [0] * (_HEADER - 1)
    gate_rank = 0 if g is None else g.ndim
    return None, [0, dims.B, dims.H, dims.K, dims.V, FLOAT_DTYPES.index(dtype_name(q)), gate_rank]


def _check_triton(q, k, v, g, h0, chunk_size):
    """The Triton kernel's own limits (K ≤ 256, V ≤ 4096, no float64, chunk size 16/32/64, one device;
    values only under ``gla_ref.device.debug``), checked before the chain starts."""
    from gla_ref.triton.common.host import check_chunk_size, prepare

    prepare(q, k, v, g, h0, gate_ranks=(None, 1, 3, 4))
    check_chunk_size(chunk_size)


def _agree(chain, error, header):
    """All ranks share their headers; every rank raises if any rank's input is bad or the ranks
    disagree on B, H, K, V, dtype or gate rank. ``error`` is this rank's own exception."""
    nccl = dist.get_backend(chain.group) == "nccl"  # NCCL moves CUDA tensors only
    dev = torch.device("cuda", torch.cuda.current_device()) if nccl else None
    table = chain.all_gather(torch.tensor(header, dtype=torch.int64, device=dev)).cpu()
    if error is not None:
        raise error
    bad = table[:, 0].nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"chunk_gla: the input on rank(s) {bad} is invalid (the error is raised "
                         f"there); every rank of the group stops")
    shared = table[:, 1:]
    if (shared != shared[0]).any():
        rows = {r: tuple(row) for r, row in enumerate(shared.tolist())}
        raise ValueError(f"q, k, v, g must have the same B, H, K, V, dtype and gate rank on every "
                         f"rank; got (B, H, K, V, dtype index, gate rank) by rank: {rows}")


def _local_pieces(q, k, v, g, scale, chunk_size):
    """The slice from a zero state: ``o_zero`` ``[B, T_r, H, V]`` and ``S_zero`` ``[B, H, K, V]``
    in the math dtype, and the cumulative log-gate from the slice start ``b`` ``[B, T_r, H, K]``."""
    B, T, H, K = q.shape
    if _uses_triton(q):
        from gla_ref import triton as gla_triton

        g4 = torch_ref.expand_gate(g, B, T, H, K, device=q.device)  # the kernel takes [B, T, H, K]
        o, S = gla_triton.chunk_gla(q, k, v, g4, scale=scale, output_final_state=True,
                                    chunk_size=chunk_size)
    else:
        o, S = torch_ref.chunk_gla(q, k, v, g, scale=scale, output_final_state=True,
                                   chunk_size=chunk_size)
    b = torch_ref.expand_gate(g, B, T, H, K, dtype=S.dtype, device=q.device).to(S.dtype).cumsum(1)
    return o.to(S.dtype), S, b


def _advance(S_in, S_zero, b):
    """The state leaving the slice: ``diag(exp b_last) S_in + S_zero``."""
    return torch.exp(b[:, -1]).unsqueeze(-1) * S_in + S_zero


def _read_state(q, b, S_in, o_zero, scale):
    """The slice's outputs: ``o_zero + scale · (q ⊙ exp b) S_in``, in q's dtype (b ≤ 0)."""
    qb = q.to(b.dtype) * torch.exp(b)
    return (o_zero + scale * torch.einsum("bthk,bhkv->bthv", qb, S_in)).to(q.dtype)


class _SequenceParallelGLA(torch.autograd.Function):
    """Forward: states r → r+1; backward: state gradients r+1 → r (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, g, h0, chain, scale, chunk_size):
        o_zero, S_zero, b = _local_pieces(q, k, v, g, scale, chunk_size)
        if chain.first:
            S_in = torch.zeros_like(S_zero) if h0 is None else h0.to(S_zero.dtype)
        else:
            S_in = chain.recv(S_zero, chain.rank - 1)
        S_out = _advance(S_in, S_zero, b)
        if not chain.last:
            chain.send(S_out, chain.rank + 1)
        ctx.save_for_backward(q, k, v, g, S_in)
        ctx.chain, ctx.scale, ctx.chunk_size = chain, scale, chunk_size
        return _read_state(q, b, S_in, o_zero, scale), S_out

    @staticmethod
    def backward(ctx, do, dS_final):
        q, k, v, g, S_in = ctx.saved_tensors
        chain, scale = ctx.chain, ctx.scale
        inputs = [None if x is None else x.detach().requires_grad_(needs)
                  for x, needs in zip((q, k, v, g), ctx.needs_input_grad)]
        with torch.enable_grad():
            o_zero, S_zero, b = _local_pieces(*inputs, scale, ctx.chunk_size)
        qb = q.to(b.dtype) * torch.exp(b.detach())
        dS_in = scale * torch.einsum("bthk,bthv->bhkv", qb, do.to(b.dtype))  # what o asks of S_in
        dS_out = dS_final if chain.last else chain.recv(S_in, chain.rank + 1)
        dS_in = dS_in + torch.exp(b.detach()[:, -1]).unsqueeze(-1) * dS_out
        if not chain.first:
            chain.send(dS_in, chain.rank - 1)
        dh0 = dS_in if chain.first and ctx.needs_input_grad[4] else None
        return (*_local_grads(inputs, o_zero, S_zero, b, S_in, scale, do, dS_out), dh0, None, None, None)


def _local_grads(inputs, o_zero, S_zero, b, S_in, scale, do, dS_out):
    """dq, dk, dv, dg of this slice (None where not needed) for the cotangents do and dS_out, with
    S_in held fixed (its gradient has already gone to the previous rank)."""
    wanted = [x for x in inputs if x is not None and x.requires_grad]
    if not wanted:
        return [None] * len(inputs)
    with torch.enable_grad():
        outs = (_read_state(inputs[0], b, S_in, o_zero, scale), _advance(S_in, S_zero, b))
    found = iter(torch.autograd.grad(outs, wanted, (do, dS_out)))
    return [next(found) if x is not None and x.requires_grad else None for x in inputs]
