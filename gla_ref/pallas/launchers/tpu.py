"""Mosaic (TPU) launchers for the chunk math of :mod:`gla_ref.pallas.chunk_math`.

Every kernel runs on the grid ``(B, H, NV, N)``: batch, head and value block are "parallel",
the chunk axis comes last. Kernels that carry a state (``state_fwd``, ``state_bwd``, the fused
ones) mark it "arbitrary" and keep the state in a VMEM scratch buffer across its steps; the
output and gradient kernels of the non-fused path are parallel over chunks too.

Arrays arrive in kernel layout (see :mod:`gla_ref.pallas.chunk`): ``[B, H, T, D]`` with ``T`` a
multiple of the chunk and ``K``, ``V`` padded to multiples of 128, so every block satisfies
Mosaic's (8, 128) rule: a block is one chunk ``[C, K]`` (``C`` a multiple of 16) or one state
``[BV, K]`` (states are held transposed, see chunk_math); a scalar gate block ``[C, 1]`` spans its array's whole last axis.

MXU-shaped tiles: blocks span the whole padded K and 128 value columns, so every state matmul is
at least 128 wide. With a scalar or constant gate (``chunk_simple_gla``) the intra-chunk scores
are built from one whole-chunk tile, ``(Q Kᵀ) ⊙ D`` with the ``[C, C]`` decay ``D_ij = e^{b_i − b_j}``
(exponents ≤ 0 under the causal mask, applied by ``where``), instead of ``(C/16)²/2`` tiles of 16
rows, which would fill 16/128 of a 128 × 128 MXU (16/256 on v6e). GLA's per-key decay keeps the
16-row two-level tiles. :func:`launch_params` reports the choice.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from gla_ref import specs
from gla_ref.pallas import compat
from gla_ref.pallas.launchers import common as _launch
from gla_ref.pallas import chunk_math as cm
from gla_ref.pallas.launchers.common import store as _store
from gla_ref.pallas.launchers.common import sub_blocks as _sub_blocks

LANES = specs.TPU_LANES
"""K and V are padded to a multiple of this (the TPU vector lane count)."""
BLOCK_V = specs.TPU_BLOCK_V
"""Value columns per program: V / BLOCK_V programs share a head (more parallel work)."""


def padded_dims(K: int, V: int) -> tuple[int, int]:
    """``(K_pad, V_pad)``: multiples of 128."""
    return -(-K // LANES) * LANES, -(-V // LANES) * LANES


def block_v(V_pad: int) -> int:
    return min(V_pad, BLOCK_V)


class Dims(_launch.Dims):
    """The shared sizes, with the TPU launcher's grid."""
    __slots__ = ()

    @property
    def grid(self):
        return (self.B, self.H, self.V // self.BV, self.N)


def launch_params(K: int, V: int, chunk_size: int, scalar_gate: bool) -> dict:
    """The block sizes this launcher picks for heads ``K × V`` (before padding), a chunk size and a
    gate kind: ``{"BK", "BV", "tile_rows", "n_tiles"}``. A block spans the whole padded K (≥ 128) and
    ``min(V_pad, 128)`` value columns; ``tile_rows`` is the row count of the intra-chunk matmuls."""
    K_pad, V_pad = padded_dims(K, V)
    d = Dims(1, 1, 1, chunk_size, K_pad, V_pad, block_v(V_pad), 1 if scalar_gate else K_pad)
    return {"BK": d.K, "BV": d.BV, "tile_rows": d.c, "n_tiles": d.n_sub}


def dims_of(q, v, b, chunk_size):
    B, H, T, K = q.shape
    V = v.shape[-1]
    return Dims(B, H, T // chunk_size, chunk_size, K, V, block_v(V), b.shape[-1])


# ---------------------------------------------------------------- block specs

_SQ = compat.squeezed()


def _chunk_spec(d: Dims, width: int, *, reverse=False):
    """One chunk ``[C, width]`` of a ``[B, H, T, width]`` array (chunks visited backwards if ``reverse``)."""
    return pl.BlockSpec((_SQ, _SQ, d.C, width),
                        lambda b, h, iv, n: (b, h, d.N - 1 - n if reverse else n, 0))


def _value_spec(d: Dims, *, reverse=False):
    """One chunk ``[C, BV]`` of this program's value block of a ``[B, H, T, V]`` array."""
    return pl.BlockSpec((_SQ, _SQ, d.C, d.BV),
                        lambda b, h, iv, n: (b, h, d.N - 1 - n if reverse else n, iv))


def _state_spec(d: Dims):
    """The ``[BV, K]`` block of a transposed state array ``[B, H, V, K]`` (same block at every chunk)."""
    return pl.BlockSpec((_SQ, _SQ, d.BV, d.K), lambda b, h, iv, n: (b, h, iv, 0))


def _chunk_state_spec(d: Dims, *, reverse=False):
    """The ``[BV, K]`` state of one chunk in a ``[B, H, N, V, K]`` array."""
    return pl.BlockSpec((_SQ, _SQ, _SQ, d.BV, d.K),
                        lambda b, h, iv, n: (b, h, d.N - 1 - n if reverse else n, iv, 0))


def _partial_spec(d: Dims, width=None, *, reverse=False):
    """One chunk of a per-value-block partial gradient ``[B, H, NV, T, width]`` (width K by default)."""
    return pl.BlockSpec((_SQ, _SQ, _SQ, d.C, d.K if width is None else width),
                        lambda b, h, iv, n: (b, h, iv, d.N - 1 - n if reverse else n, 0))


def _row_spec(d: Dims, *, reverse=False):
    """One chunk's ``[1, Kg]`` row of a per-value-block ``[B, H, NV, N, 1, Kg]`` array."""
    return pl.BlockSpec((_SQ, _SQ, _SQ, _SQ, 1, d.Kg),
                        lambda b, h, iv, n: (b, h, iv, d.N - 1 - n if reverse else n, 0, 0))


def _call(kernel, d: Dims, in_specs, out_specs, out_shape, *, sequential, scratch=(), interpret, name):
    params = compat.tpu_compiler_params("parallel", "parallel", "parallel",
                                         "arbitrary" if sequential else "parallel")
    return pl.pallas_call(kernel, grid=d.grid, in_specs=in_specs, out_specs=out_specs,
                          out_shape=out_shape, scratch_shapes=list(scratch), compiler_params=params,
                          interpret=interpret, name=name)


def _sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _state_call(kernel, d: Dims, in_specs, args, out_specs, out_shape, state_in, want_state_out, *,
                interpret, name):
    """Run a sequential kernel whose state ``[BV, K]`` lives in VMEM scratch; the initial state
    ``state_in`` and the final state are optional (see :func:`_launch.with_state`)."""
    call = functools.partial(_call, kernel, d, sequential=True,
                             scratch=[compat.vmem((d.BV, d.K), jnp.float32)], interpret=interpret,
                             name=name)
    return _launch.with_state(call, in_specs, args, out_specs, out_shape, state_in, want_state_out,
                              _state_spec(d), _sds((d.B, d.H, d.V, d.K)))


# ---------------------------------------------------------------- non-fused forward

def state_fwd(k, v, b, h0, *, chunk_size, want_final, interpret=False):
    """States entering each chunk ``h [B, H, N, V, K]`` (float32, transposed) and the final state (or None)."""
    d = dims_of(k, v, b, chunk_size)
    n_sub, last = d.n_sub, d.N - 1

    def kernel(*refs):
        k_ref, v_ref, b_ref = refs[:3]
        h0_ref = refs[3] if h0 is not None else None
        h_ref, *rest = refs[3 + (h0 is not None):]
        ht_ref, S = (rest[0], rest[1]) if want_final else (None, rest[0])
        n = pl.program_id(3)

        @pl.when(n == 0)
        def _():
            S[...] = h0_ref[...] if h0_ref is not None else jnp.zeros(S.shape, S.dtype)

        h_ref[...] = S[...]
        S[...] = cm.state_update(_sub_blocks(k_ref, n_sub, 0, d.c), _sub_blocks(v_ref, n_sub, 0, d.c),
                                 _sub_blocks(b_ref, n_sub, 0, d.c), S[...])
        if ht_ref is not None:
            @pl.when(n == last)
            def _():
                ht_ref[...] = S[...]

    return _state_call(kernel, d, [_chunk_spec(d, d.K), _value_spec(d), _chunk_spec(d, d.Kg)],
                       [k, v, b], [_chunk_state_spec(d)], [_sds((d.B, d.H, d.N, d.V, d.K))], h0,
                       want_final, interpret=interpret, name="gla_state_fwd")


def chunk_fwd_o(q, k, v, b, h, *, chunk_size, scale, interpret=False):
    """The output, every chunk in parallel from the state ``h`` entering it."""
    d = dims_of(q, v, b, chunk_size)
    n_sub = d.n_sub

    kernel = _launch.chunk_output_kernel(n_sub, scale, sub_chunk_size=d.c)
    in_specs = [_chunk_spec(d, d.K), _chunk_spec(d, d.K), _value_spec(d),
                _chunk_spec(d, d.Kg), _chunk_state_spec(d)]
    return _call(kernel, d, in_specs, _value_spec(d), _sds(v.shape, q.dtype),
                 sequential=False, interpret=interpret, name="gla_chunk_fwd_o")(q, k, v, b, h)


# ---------------------------------------------------------------- fused forward

def fused_fwd(q, k, v, b, h0, *, chunk_size, scale, want_final, interpret=False):
    """Output and final state in one pass; the state lives in VMEM and never reaches HBM."""
    d = dims_of(q, v, b, chunk_size)
    n_sub, last = d.n_sub, d.N - 1

    def kernel(*refs):
        q_ref, k_ref, v_ref, b_ref = refs[:4]
        h0_ref = refs[4] if h0 is not None else None
        o_ref, *rest = refs[4 + (h0 is not None):]
        ht_ref, S = (rest[0], rest[1]) if want_final else (None, rest[0])
        n = pl.program_id(3)

        @pl.when(n == 0)
        def _():
            S[...] = h0_ref[...] if h0_ref is not None else jnp.zeros(S.shape, S.dtype)

        qs, ks, vs, bs = (_sub_blocks(r, n_sub, 0, d.c) for r in (q_ref, k_ref, v_ref, b_ref))
        A = cm.intra_scores(qs, ks, bs, scale)
        _store(o_ref, cm.chunk_output(qs, vs, bs, S[...], A, scale), 0, d.c)
        S[...] = cm.state_update(ks, vs, bs, S[...])
        if ht_ref is not None:
            @pl.when(n == last)
            def _():
                ht_ref[...] = S[...]

    in_specs = [_chunk_spec(d, d.K), _chunk_spec(d, d.K), _value_spec(d), _chunk_spec(d, d.Kg)]
    return _state_call(kernel, d, in_specs, [q, k, v, b], [_value_spec(d)], [_sds(v.shape, q.dtype)],
                       h0, want_final, interpret=interpret, name="gla_fused_fwd")


# ---------------------------------------------------------------- non-fused backward

def state_bwd(q, b, do, dht, *, chunk_size, scale, want_dh0, interpret=False):
    """Gradients w.r.t. the state leaving each chunk ``[B, H, N, V, K]`` and w.r.t. h0 (or None),
    chunks visited from last to first."""
    d = dims_of(q, do, b, chunk_size)
    n_sub, last = d.n_sub, d.N - 1

    def kernel(*refs):
        q_ref, b_ref, do_ref = refs[:3]
        dht_ref = refs[3] if dht is not None else None
        dso_ref, *rest = refs[3 + (dht is not None):]
        dh0_ref, dS = (rest[0], rest[1]) if want_dh0 else (None, rest[0])
        step = pl.program_id(3)

        @pl.when(step == 0)
        def _():
            dS[...] = dht_ref[...] if dht_ref is not None else jnp.zeros(dS.shape, dS.dtype)

        dso_ref[...] = dS[...]
        dS[...] = cm.state_grad_update(_sub_blocks(q_ref, n_sub, 0, d.c), _sub_blocks(b_ref, n_sub, 0, d.c),
                                       _sub_blocks(do_ref, n_sub, 0, d.c), dS[...], scale)
        if dh0_ref is not None:
            @pl.when(step == last)
            def _():
                dh0_ref[...] = dS[...]

    in_specs = [_chunk_spec(d, d.K, reverse=True), _chunk_spec(d, d.Kg, reverse=True),
                _value_spec(d, reverse=True)]
    return _state_call(kernel, d, in_specs, [q, b, do], [_chunk_state_spec(d, reverse=True)],
                       [_sds((d.B, d.H, d.N, d.V, d.K))], dht, want_dh0, interpret=interpret,
                       name="gla_state_bwd")


def chunk_bwd(q, k, v, b, do, h, dso, *, chunk_size, scale, interpret=False):
    """``dq, dk`` (float32 partials per value block ``[B, H, NV, T, K]``), ``dv`` (float32) and the
    gate gradient's partials ``[B, H, NV, T, Kg]``, every chunk in parallel from the state entering
    it and the gradient of the state leaving it."""
    d = dims_of(q, v, b, chunk_size)
    n_sub = d.n_sub

    kernel = _launch.chunk_grad_kernel(n_sub, scale, sub_chunk_size=d.c)
    vspec = _value_spec(d)
    in_specs = [_chunk_spec(d, d.K), _chunk_spec(d, d.K), vspec, _chunk_spec(d, d.Kg), vspec,
                _chunk_state_spec(d), _chunk_state_spec(d)]
    part = _sds((d.B, d.H, d.V // d.BV, d.N * d.C, d.K))
    dg_part = _sds((d.B, d.H, d.V // d.BV, d.N * d.C, d.Kg))
    return _call(kernel, d, in_specs, [_partial_spec(d), _partial_spec(d), vspec, _partial_spec(d, d.Kg)],
                 [part, part, _sds(v.shape), dg_part], sequential=False, interpret=interpret,
                 name="gla_chunk_bwd")(q, k, v, b, do, h, dso)


# ---------------------------------------------------------------- fused backward

def fused_bwd(q, k, v, b, do, h0, dht, *, chunk_size, scale, want_dh0, interpret=False):
    """All gradients with states kept on chip: one kernel runs the chunks forwards for ``dq``
    (re-building the state), a second runs them backwards for ``dk, dv, dh0``. Each also writes one
    row per chunk for the gate gradient, ``a`` (:func:`chunk_math.state_in_term`), ``c``
    (:func:`chunk_math.state_out_term`) and ``e = κ − c``, ``[B, H, NV, N, 1, Kg]`` float32."""
    d = dims_of(q, v, b, chunk_size)
    n_sub, last = d.n_sub, d.N - 1
    vspec, vspec_rev = _value_spec(d), _value_spec(d, reverse=True)
    part = _sds((d.B, d.H, d.V // d.BV, d.N * d.C, d.K))
    rows = _sds((d.B, d.H, d.V // d.BV, d.N, 1, d.Kg))

    def dq_kernel(*refs):
        q_ref, k_ref, v_ref, b_ref, do_ref = refs[:5]
        h0_ref = refs[5] if h0 is not None else None
        dq_ref, a_ref, S = refs[5 + (h0 is not None):]

        @pl.when(pl.program_id(3) == 0)
        def _():
            S[...] = h0_ref[...] if h0_ref is not None else jnp.zeros(S.shape, S.dtype)

        qs, ks, vs, bs, dos = (_sub_blocks(r, n_sub, 0, d.c) for r in (q_ref, k_ref, v_ref, b_ref, do_ref))
        _store(dq_ref, cm.chunk_dq(qs, ks, vs, bs, dos, S[...], scale), 0, d.c)
        a_ref[...] = cm.state_in_term(qs, bs, dos, S[...], scale)
        S[...] = cm.state_update(ks, vs, bs, S[...])

    in_specs = [_chunk_spec(d, d.K), _chunk_spec(d, d.K), vspec, _chunk_spec(d, d.Kg), vspec]
    dq, a, _ = _state_call(dq_kernel, d, in_specs, [q, k, v, b, do], [_partial_spec(d), _row_spec(d)],
                           [part, rows], h0, False, interpret=interpret, name="gla_fused_bwd_dq")

    def dkv_kernel(*refs):
        q_ref, k_ref, v_ref, b_ref, do_ref = refs[:5]
        dht_ref = refs[5] if dht is not None else None
        dk_ref, dv_ref, c_ref, e_ref, *rest = refs[5 + (dht is not None):]
        dh0_ref, dS = (rest[0], rest[1]) if want_dh0 else (None, rest[0])
        step = pl.program_id(3)

        @pl.when(step == 0)
        def _():
            dS[...] = dht_ref[...] if dht_ref is not None else jnp.zeros(dS.shape, dS.dtype)

        qs, ks, vs, bs, dos = (_sub_blocks(r, n_sub, 0, d.c) for r in (q_ref, k_ref, v_ref, b_ref, do_ref))
        dk, dv, kappa = cm.chunk_dkv(qs, ks, vs, bs, dos, dS[...], cm.intra_scores(qs, ks, bs, scale), scale,
                                     key_term=True)
        _store(dk_ref, dk, 0, d.c)
        _store(dv_ref, dv, 0, d.c)
        c = cm.state_out_term(ks, vs, bs, dS[...])
        c_ref[...] = c
        e_ref[...] = kappa - c
        dS[...] = cm.state_grad_update(qs, bs, dos, dS[...], scale)
        if dh0_ref is not None:
            @pl.when(step == last)
            def _():
                dh0_ref[...] = dS[...]

    in_specs = [_chunk_spec(d, d.K, reverse=True), _chunk_spec(d, d.K, reverse=True), vspec_rev,
                _chunk_spec(d, d.Kg, reverse=True), vspec_rev]
    dk, dv, c, e, dh0 = _state_call(dkv_kernel, d, in_specs, [q, k, v, b, do],
                                    [_partial_spec(d, reverse=True), vspec_rev, _row_spec(d, reverse=True),
                                     _row_spec(d, reverse=True)], [part, _sds(v.shape), rows, rows], dht,
                              want_dh0, interpret=interpret, name="gla_fused_bwd_dkv")
    return dq, dk, dv, dh0, a, c, e
