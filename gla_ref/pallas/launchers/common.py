"""Launcher plumbing shared by the TPU and GPU launchers: sub-chunk loads and stores, the
per-chunk kernel bodies (identical on both backends) and calls of kernels that carry a state."""

from __future__ import annotations

from typing import NamedTuple

from jax.experimental import pallas as pl

from gla_ref.pallas import chunk_math as cm


class Dims(NamedTuple):
    """The sizes a launcher's kernels see, in kernel layout (``K``, ``V`` padded by the launcher)."""
    B: int
    H: int
    N: int  # chunks
    C: int  # chunk size
    K: int
    V: int
    BV: int  # value columns per program
    Kg: int  # gate width: K (GLA) or 1 (scalar gate)

    @property
    def NV(self):
        """Value blocks per head."""
        return self.V // self.BV

    @property
    def c(self):
        """The sub-chunk length ``c``, the rows of one intra-chunk tile: the whole chunk for a scalar gate (its
        decay is a ``[C, C]`` matrix, so the scores are one ``C × K @ K × C`` matmul; measured on the H200 in
        bf16, the gate gradient for ``g_gamma`` at T=2048 came out ten times closer to float64 than with 16-row
        tiles and reference rows, 1.1e-3 against 8.7e-3), 16 for GLA (the per-key decay needs the two-level
        split of :mod:`chunk_math`). Both launchers use it in every kernel."""
        return self.C if self.Kg == 1 else cm.SUB

    @property
    def n_sub(self):
        """Intra-chunk tiles per chunk."""
        return self.C // self.c


def sub_blocks(ref, n_sub, start=0, sub_chunk_size=cm.SUB):
    """The ``n_sub`` sub-chunks ``[c, D]`` (``c = sub_chunk_size``) of the chunk starting at row ``start`` of
    ``ref`` (``c`` = the chunk itself gives one whole-chunk tile)."""
    return [ref[pl.ds(start + i * sub_chunk_size, sub_chunk_size), :] for i in range(n_sub)]


def store(ref, blocks, start=0, sub_chunk_size=cm.SUB):
    """Write sub-chunks of ``sub_chunk_size`` rows back from row ``start`` of ``ref``, in its dtype."""
    for i, x in enumerate(blocks):
        ref[pl.ds(start + i * sub_chunk_size, sub_chunk_size), :] = x.astype(ref.dtype)


def chunk_output_kernel(n_sub, scale, sub_chunk_size=cm.SUB):
    """Body of the non-fused output kernel: one chunk's output from the state ``h`` entering it."""
    c = sub_chunk_size

    def kernel(q_ref, k_ref, v_ref, b_ref, h_ref, o_ref):
        qs, ks, bs = (sub_blocks(r, n_sub, 0, c) for r in (q_ref, k_ref, b_ref))
        A = cm.intra_scores(qs, ks, bs, scale)
        store(o_ref, cm.chunk_output(qs, sub_blocks(v_ref, n_sub, 0, c), bs, h_ref[...], A, scale), 0, c)

    return kernel


def chunk_grad_kernel(n_sub, scale, sub_chunk_size=cm.SUB):
    """Body of the non-fused gradient kernel: one chunk's ``dq, dk, dv`` and its gate gradient
    ``dg`` (chunk-local, :func:`chunk_math.chunk_gate_grad`) from the state entering it (``h``) and
    the gradient of the state leaving it (``dso``); ``dq, dk, dg`` are this value block's partials."""
    c = sub_chunk_size

    def kernel(q_ref, k_ref, v_ref, b_ref, do_ref, h_ref, dso_ref, dq_ref, dk_ref, dv_ref, dg_ref):
        qs, ks, vs, bs, dos = (sub_blocks(r, n_sub, 0, c) for r in (q_ref, k_ref, v_ref, b_ref, do_ref))
        St = h_ref[...]
        dq = cm.chunk_dq(qs, ks, vs, bs, dos, St, scale)
        dk, dv, dgamma = cm.chunk_dkv(qs, ks, vs, bs, dos, dso_ref[...],
                                      cm.intra_scores(qs, ks, bs, scale), scale, St=St)
        store(dq_ref, dq, 0, c)
        store(dk_ref, dk, 0, c)
        store(dv_ref, dv, 0, c)
        store(dg_ref, cm.chunk_gate_grad(qs, ks, dq, dk, bs, dgamma), 0, c)

    return kernel


def with_state(call, in_specs, args, out_specs, out_shape, state_in, want_state_out, state_spec,
               state_shape):
    """Run ``call(in_specs, out_specs, out_shape)(*args)`` for a kernel carrying a state.

    The initial state ``state_in`` (if not None) becomes the last input; if ``want_state_out``,
    the final state becomes the last output. Returns the outputs of ``out_specs`` followed by
    the final state (or None).
    """
    if state_in is not None:
        in_specs, args = [*in_specs, state_spec], [*args, state_in]
    extra_spec, extra_shape = ([state_spec], [state_shape]) if want_state_out else ([], [])
    outs = call(in_specs, [*out_specs, *extra_spec], [*out_shape, *extra_shape])(*args)
    n = len(out_specs)
    return (*outs[:n], outs[n] if want_state_out else None)
