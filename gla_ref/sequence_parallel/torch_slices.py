"""The pieces one rank runs on its own slice for :mod:`gla_ref.sequence_parallel.torch`.

Two implementations with the same methods, picked by dtype (:func:`slice_ops`):

* :class:`TritonSlice` (float32, float16, bfloat16; CUDA, or Triton's interpreter on a CPU): the
  kernels of :mod:`gla_ref.triton.chunk`, called one step at a time so that the chain of states can
  run between them. Over the slice, every step is a kernel; PyTorch only touches ``[B, H, K, V]``
  states and the ``[B, ⌈T_r/C⌉, H, K]`` chunk decays. The tensors kept for the backward are the
  single-device ``chunk_gla``'s: q, k, v, A (input dtype) and b (float32), plus the float32 state
  entering the slice.
* :class:`ReferenceSlice` (float64, any device): :func:`gla_ref.reference.torch.chunk_gla` under
  autograd, in the same order of steps, so that the chain's algebra is checked to float64
  rounding (the kernels take no float64).

The methods, in the order :class:`gla_ref.sequence_parallel.torch.SequenceParallelGLA` calls them
(a method that a rank does not need is not called; every one returns what the chain needs and
keeps the rest):

forward  ``prepare()``; ``zero_state()`` → (S_zero, log γ) (ranks in the middle of the chain);
         ``states(S_in, want_final)`` → final state or None; ``intra()``; ``output()`` → o;
         ``saved()`` → the tensors to save.
backward ``restore(saved, S_in, ...)``; ``state_grads(do, dht, need_dh0, keep)`` → dh0 (the gradient
         of the state entering the slice for the final-state cotangent ``dht``; ``keep`` keeps the
         per-chunk state gradients for ``finish``); ``recompute_states()`` (the states entering the
         chunks, which the reverse state pass does not read); ``intra_grads(do)``; ``finish(do)`` →
         (dq, dk, dv, dg).
"""

from __future__ import annotations

import torch

from gla_ref.reference import torch as torch_ref

__all__ = ["ReferenceSlice", "TritonSlice", "chunk_decays", "slice_ops"]


def slice_ops(q, k, v, g, scale, chunk_size):
    """The implementation for these inputs: :class:`ReferenceSlice` for float64, else :class:`TritonSlice`."""
    cls = ReferenceSlice if q.dtype == torch.float64 else TritonSlice
    return cls(q, k, v, g, scale, chunk_size)


def chunk_decays(b, chunk_size):
    """log γ of the whole slice ``[B, H, K]`` (float32): the sum of each chunk's total log-decay, read from
    the last row of every chunk of the chunk-local cumulative log-gate ``b [B, T, H, K]`` (the last
    token's row for a partial last chunk). ``⌈T/C⌉`` rows are read, not the slice."""
    log_gamma = b[:, chunk_size - 1::chunk_size].sum(1)  # a strided view: no copy, no index on the device
    if b.shape[1] % chunk_size:
        log_gamma = log_gamma + b[:, -1]
    return log_gamma


class TritonSlice:
    """One slice through the Triton chunk kernels (see the module docstring)."""

    def __init__(self, q, k, v, g, scale, chunk_size):
        self.q, self.k, self.v, self.g = (x.contiguous() for x in (q, k, v, g))
        self.scale, self.C, self.g_dtype = scale, chunk_size, g.dtype

    # --- forward

    def prepare(self):
        from gla_ref.triton.chunk.cumsum import chunk_gates_and_operands

        self.b, self.qt, self.kt = chunk_gates_and_operands(self.q, self.k, self.g, self.scale, self.C)
        del self.g  # read once, as the single-device forward does

    def zero_state(self):
        """The slice's own state from a zero state, and its total log-decay ``[B, H, K]``."""
        from gla_ref.triton.chunk.state import chunk_state_fwd

        _, S_zero = chunk_state_fwd(self.kt, self.v, self.b, None, True, self.C, None, decayed=True)
        return S_zero, chunk_decays(self.b, self.C)

    def states(self, S_in, want_final):
        from gla_ref.triton.chunk.state import chunk_state_fwd

        self.h, final = chunk_state_fwd(self.kt, self.v, self.b, S_in, want_final, self.C, None, decayed=True)
        del self.kt
        return final

    def intra(self):
        from gla_ref.triton.chunk.intra import chunk_intra_attention

        self.A = chunk_intra_attention(self.q, self.k, self.b, self.scale, self.C)

    def output(self):
        from gla_ref.triton.chunk.output import chunk_output

        o = chunk_output(self.qt, self.v, self.h, self.A, self.C)
        del self.qt, self.h
        return o

    def saved(self):
        return self.q, self.k, self.v, self.b, self.A

    # --- backward

    @classmethod
    def restore(cls, saved, S_in, scale, chunk_size, g_dtype):
        """The slice again from ``saved()`` for the backward."""
        self = cls.__new__(cls)
        self.q, self.k, self.v, self.b, self.A = saved
        self.S_in, self.scale, self.C, self.g_dtype = S_in, scale, chunk_size, g_dtype
        return self

    def recompute_states(self):
        """The states S_[i] entering the chunks again, in float32 (dq, dk read them), from the saved S_in."""
        from gla_ref.triton.chunk.state import chunk_state_fwd

        self.h, _ = chunk_state_fwd(self.k, self.v, self.b, self.S_in, False, self.C, None, states_in_fp32=True)

    def state_grads(self, do, dht, need_dh0, keep=True):
        from gla_ref.triton.chunk.state import chunk_state_bwd

        dh, dh0 = chunk_state_bwd(self.q, self.b, do, dht, self.scale, need_dh0, self.C)
        if keep:
            self.dh = dh
        return dh0

    def intra_grads(self, do):
        from gla_ref.triton.chunk.backward import chunk_bwd_dA
        from gla_ref.triton.chunk.backward_intra import chunk_bwd_dqk_intra

        dA = chunk_bwd_dA(self.v, do, self.scale, self.C)
        self.dq_intra, self.dk_intra = chunk_bwd_dqk_intra(self.q, self.k, self.b, dA, self.C)

    def finish(self, do):
        from gla_ref.triton.chunk.backward import chunk_bwd_dqkg_inter, chunk_bwd_dv

        dv = chunk_bwd_dv(self.k, self.b, self.A, self.dh, do, self.C)
        dq, dk, dg = chunk_bwd_dqkg_inter(self.q, self.k, self.v, self.b, self.h, self.dh, do, self.dq_intra,
                                          self.dk_intra, self.scale, self.C, self.g_dtype)
        return dq, dk, dv, dg


class ReferenceSlice:
    """One slice through :func:`gla_ref.reference.torch.chunk_gla` (float64; see the module docstring)."""

    def __init__(self, q, k, v, g, scale, chunk_size):
        self.q, self.k, self.v, self.g = q, k, v, g
        self.scale, self.C = scale, chunk_size

    def _run(self, S_in):
        return torch_ref.chunk_gla(self.q, self.k, self.v, self.g, scale=self.scale, initial_state=S_in,
                                   output_final_state=True, chunk_size=self.C)

    def prepare(self):
        pass

    def zero_state(self):
        return self._run(None)[1], self.g.sum(1)

    def states(self, S_in, want_final):
        self.o, final = self._run(S_in)
        return final if want_final else None

    def intra(self):
        pass

    def output(self):
        return self.o

    def saved(self):
        return self.q, self.k, self.v, self.g

    @classmethod
    def restore(cls, saved, S_in, scale, chunk_size, g_dtype):
        self = cls(*(x.detach().requires_grad_() for x in saved), scale, chunk_size)
        B, _, H, K = self.q.shape
        zero = torch.zeros(B, H, K, self.v.shape[-1], dtype=self.q.dtype, device=self.q.device)
        self.S_in = (zero if S_in is None else S_in.detach()).requires_grad_()
        with torch.enable_grad():
            self.o, self.final = self._run(self.S_in)
        return self

    def recompute_states(self):
        pass

    def state_grads(self, do, dht, need_dh0, keep=True):
        dht = torch.zeros_like(self.final) if dht is None else dht
        if keep:
            self.dht = dht
        if not need_dh0:
            return None
        return torch.autograd.grad((self.o, self.final), self.S_in, (do, dht), retain_graph=True)[0]

    def intra_grads(self, do):
        pass

    def finish(self, do):
        inputs = (self.q, self.k, self.v, self.g)
        return torch.autograd.grad((self.o, self.final), inputs, (do, self.dht))
