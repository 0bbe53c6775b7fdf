"""The kernel families as PyTorch custom operators, so that ``torch.compile`` sees a call as one node.

Traced by ``torch.compile``, an ``autograd.Function`` that launches Triton kernels is entered with fake
tensors (shapes, no data) and fails inside the launch code. A custom operator (``torch.library``) is
opaque instead: the compiler takes its outputs' shapes from a *fake* implementation, calls the real one
when the graph runs, and differentiates it with the backward registered beside it. Each family here is
two operators, ``gla_ref::<name>_fwd`` and ``gla_ref::<name>_bwd``, the second called by the first's
autograd formula; neither reads a value on the host, so a compiled step holds no sync (a packed batch's
offsets are read at the family's door, before the operator). The door's checks of shapes and dtypes are
traced; those that read the machine or the values (:func:`~gla_ref.triton.common.host.launch_checks`) run in
the operator, when the compiled graph runs.

A :class:`Door` takes the operators only while ``torch.compile`` traces: an eager call keeps the family's
``autograd.Function``, whose launch path is the one measured (an operator's dispatch costs microseconds
per call, a visible share of a short sequence's step); both run the same forward and backward functions.

Operators take tensors, numbers and lists of numbers only, and never return None: an absent tensor (no
final state, no gate, no initial state) is an empty tensor on the way out, None again at the door. A
packed batch (:class:`~gla_ref.triton.common.host.Varlen`) travels as its three tensors and its sizes.
"""

from typing import Optional

import torch

from gla_ref.triton.common.host import Varlen, launch_checks

Tensor = torch.Tensor


def varlen_parts(varlen: Optional[Varlen]) -> tuple:
    """``(cu_seqlens, chunk_indices, chunk_offsets, [N, C, NT])`` of a packed batch, or Nones and zeros (a list
    argument of an operator is never empty: autograd's check of the backward's structure takes an empty one
    apart)."""
    if varlen is None:
        return None, None, None, [0, 0, 0]
    return varlen.cu_seqlens, varlen.chunk_indices, varlen.chunk_offsets, [varlen.N, varlen.C or 0, varlen.NT]


def varlen_from(cu_seqlens, chunk_indices, chunk_offsets, sizes) -> Optional[Varlen]:
    """The :class:`Varlen` that :func:`varlen_parts` took apart (None without offsets)."""
    if cu_seqlens is None:
        return None
    N, C, NT = sizes
    return Varlen(cu_seqlens, N, C or None, NT, chunk_indices, chunk_offsets)


def _or_empty(x, like: Tensor, dtype=torch.float32) -> Tensor:
    return like.new_empty(0, dtype=dtype) if x is None else x


def _or_none(x: Tensor, present: bool):
    return x if present else None


class Door:
    """What a family's door calls: ``function`` (an ``autograd.Function``) in eager mode, ``op`` (a
    :class:`FamilyOp`) while ``torch.compile`` traces; both take the same ``apply`` arguments."""

    def __init__(self, function, op):
        self.function, self.op = function, op

    def apply(self, *args):
        return (self.op if torch.compiler.is_compiling() else self.function).apply(*args)


class FamilyOp:
    """A kernel family as a pair of custom operators; :meth:`apply` takes the arguments of its
    ``autograd.Function``: ``(q, k, v, g, initial_state, scale, output_final_state, options, varlen)``.

    ``forward(q, k, v, g, h0, scale, output_final_state, *options, varlen=varlen) -> (o, ht, *residuals)`` and
    ``backward(q, k, v, g, h0, ht, *residuals, do, dht, scale, *options, varlen=varlen) -> (dq, dk, dv, dg,
    dh0)`` are the family's passes. ``residuals(q, k, v, g, *options)`` gives empty tensors shaped like what
    the forward keeps besides its inputs and final state (none for the families that keep the state on chip,
    ``fused_chunk`` and ``fused_recurrent``; b and A for ``chunk``). ``option_types`` converts the options
    back from the integers an operator carries (``(bool,)`` for the direction, ``(int, bool)`` for chunk size
    and state dtype).
    """

    def __init__(self, name: str, forward, backward, option_types: tuple, residuals=None):
        self.option_types, self.residuals = option_types, residuals or (lambda *args: ())
        self.fwd = torch.library.custom_op(f"gla_ref::{name}_fwd", self._fwd_impl(forward), mutates_args=())
        self.bwd = torch.library.custom_op(f"gla_ref::{name}_bwd", self._bwd_impl(backward), mutates_args=())
        self.fwd.register_fake(self._fwd_fake)
        self.bwd.register_fake(_bwd_fake)
        self.fwd.register_autograd(self._backward, setup_context=_save)

    def _options(self, options):
        return tuple(kind(x) for kind, x in zip(self.option_types, options))

    def _fwd_impl(self, forward):
        def fwd(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], h0: Optional[Tensor], scale: float,
                output_final_state: bool, options: list[int], cu_seqlens: Optional[Tensor],
                chunk_indices: Optional[Tensor], chunk_offsets: Optional[Tensor],
                sizes: list[int]) -> tuple[Tensor, Tensor, list[Tensor]]:
            launch_checks({"q": q, "k": k, "v": v, "g": g, "initial_state": h0})  # the door's, skipped when traced
            q, k, v = (x.contiguous() for x in (q, k, v))
            g, h0 = (None if x is None else x.contiguous() for x in (g, h0))
            varlen = varlen_from(cu_seqlens, chunk_indices, chunk_offsets, sizes)
            o, ht, *residuals = forward(q, k, v, g, h0, scale, output_final_state, *self._options(options),
                                        varlen=varlen)
            return o, _or_empty(ht, q), residuals
        return fwd

    def _bwd_impl(self, backward):
        def bwd(q: Tensor, k: Tensor, v: Tensor, g: Optional[Tensor], h0: Optional[Tensor], ht: Optional[Tensor],
                residuals: list[Tensor], do: Tensor, dht: Optional[Tensor], scale: float, options: list[int],
                cu_seqlens: Optional[Tensor], chunk_indices: Optional[Tensor], chunk_offsets: Optional[Tensor],
                sizes: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
            q, k, v, do = (x.contiguous() for x in (q, k, v, do))
            g, h0, dht = (None if x is None else x.contiguous() for x in (g, h0, dht))
            varlen = varlen_from(cu_seqlens, chunk_indices, chunk_offsets, sizes)
            dq, dk, dv, dg, dh0 = backward(q, k, v, g, h0, ht, *residuals, do, dht, scale, *self._options(options),
                                           varlen=varlen)
            return dq, dk, dv, _or_empty(dg, q), _or_empty(dh0, q)
        return bwd

    def _fwd_fake(self, q, k, v, g, h0, scale, output_final_state, options, cu_seqlens, chunk_indices,
                  chunk_offsets, sizes):
        residuals = self.residuals(q, k, v, g, *self._options(options))
        return torch.empty_like(v, dtype=q.dtype), _states(q, v, output_final_state, cu_seqlens, sizes), list(residuals)

    def _backward(self, ctx, do, dht, _):
        q, k, v, g, h0, ht, cu_seqlens, chunk_indices, chunk_offsets, *residuals = ctx.saved_tensors
        final = ctx.output_final_state
        dq, dk, dv, dg, dh0 = self.bwd(q, k, v, g, h0, _or_none(ht, final), residuals, do, _or_none(dht, final),
                                       ctx.scale, ctx.options, cu_seqlens, chunk_indices, chunk_offsets, ctx.sizes)
        return dq, dk, dv, _or_none(dg, g is not None), _or_none(dh0, h0 is not None), *[None] * 7

    def apply(self, q, k, v, g, initial_state, scale, output_final_state, options, varlen=None):
        """``(o, final state or None)``: the call the family's door makes."""
        o, ht, _ = self.fwd(q, k, v, g, initial_state, scale, output_final_state, [int(x) for x in options],
                            *varlen_parts(varlen))
        return o, _or_none(ht, output_final_state)


def _save(ctx, inputs, output):
    q, k, v, g, h0, scale, output_final_state, options, cu_seqlens, chunk_indices, chunk_offsets, sizes = inputs
    ctx.save_for_backward(q, k, v, g, h0, output[1], cu_seqlens, chunk_indices, chunk_offsets, *output[2])
    ctx.scale, ctx.output_final_state, ctx.options, ctx.sizes = scale, output_final_state, options, sizes


def _states(q, v, output_final_state, cu_seqlens, sizes) -> Tensor:
    N = q.shape[0] if cu_seqlens is None else sizes[0]
    shape = (N, q.shape[2], q.shape[3], v.shape[3]) if output_final_state else (0,)
    return q.new_empty(shape, dtype=torch.float32)


def _bwd_fake(q, k, v, g, h0, ht, residuals, do, dht, scale, options, cu_seqlens, chunk_indices, chunk_offsets,
              sizes):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            _or_empty(None if g is None else torch.empty_like(g), q),
            _or_empty(None if h0 is None else torch.empty_like(h0), q))
