"""Pallas launchers on the GPU's Triton backend for the chunk math of :mod:`gla_ref.pallas.chunk_math`.

Kernels that carry a state run one program per ``(batch, head, value block)`` on the grid
``(B, H, NV)``: the program sees its head's whole sequence and loops over the chunks with
``lax.fori_loop``, the state ``Sᵀ [BV, K]`` being the loop carry (registers / shared memory, never
HBM unless the non-fused path asks for the per-chunk states). The output and gradient kernels
of the non-fused path run one program per chunk on ``(B, H, NV, N)``.

Triton needs every tensor size to be a power of two: ``K`` and ``V`` are padded to powers of two
(at least 16, the smallest ``tl.dot``), chunks are powers of two and sub-chunks are 16 rows; the
kernels of a scalar gate, fused and non-fused, take the whole chunk as one tile
(:attr:`gla_ref.pallas.launchers.common.Dims.c`), whose gate gradient is closer to float64 (bf16, ``g_gamma``,
T=2048 on the H200: 1.1e-3 against 8.7e-3).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from gla_ref import specs
from gla_ref.pallas import compat
from gla_ref.pallas.launchers import common as _launch
from gla_ref.pallas import chunk_math as cm
from gla_ref.pallas.launchers.common import Dims
from gla_ref.pallas.launchers.common import store as _store
from gla_ref.pallas.launchers.common import sub_blocks as _sub_blocks

BLOCK_V = specs.GPU_BLOCK_V
"""Value columns per program: keeps the ``[BV, K]`` float32 state within a program's registers."""
NUM_WARPS = 4


def _pow2(x: int) -> int:
    return max(16, 1 << (x - 1).bit_length())


def padded_dims(K: int, V: int) -> tuple[int, int]:
    """``(K_pad, V_pad)``: powers of two, at least 16."""
    return _pow2(K), _pow2(V)


def block_v(V_pad: int) -> int:
    return min(V_pad, BLOCK_V)



def dims_of(q, v, b, chunk_size):
    B, H, T, K = q.shape
    V = v.shape[-1]
    return Dims(B, H, T // chunk_size, chunk_size, K, V, block_v(V), b.shape[-1])


_SQ = compat.squeezed()


# ---------------------------------------------------------------- specs: whole sequence per program

def _seq_spec(d: Dims, width: int):
    """A head's whole sequence ``[T, width]`` of a ``[B, H, T, width]`` array."""
    return pl.BlockSpec((_SQ, _SQ, d.N * d.C, width), lambda b, h, iv: (b, h, 0, 0))


def _seq_value_spec(d: Dims):
    return pl.BlockSpec((_SQ, _SQ, d.N * d.C, d.BV), lambda b, h, iv: (b, h, 0, iv))


def _seq_state_spec(d: Dims):
    return pl.BlockSpec((_SQ, _SQ, d.BV, d.K), lambda b, h, iv: (b, h, iv, 0))


def _seq_states_spec(d: Dims):
    """All per-chunk states ``[N, BV, K]`` of a ``[B, H, N, V, K]`` array."""
    return pl.BlockSpec((_SQ, _SQ, d.N, d.BV, d.K), lambda b, h, iv: (b, h, 0, iv, 0))


def _seq_partial_spec(d: Dims):
    return pl.BlockSpec((_SQ, _SQ, _SQ, d.N * d.C, d.K), lambda b, h, iv: (b, h, iv, 0, 0))


# ---------------------------------------------------------------- specs: one chunk per program

def _chunk_spec(d: Dims, width: int):
    return pl.BlockSpec((_SQ, _SQ, d.C, width), lambda b, h, iv, n: (b, h, n, 0))


def _value_spec(d: Dims):
    return pl.BlockSpec((_SQ, _SQ, d.C, d.BV), lambda b, h, iv, n: (b, h, n, iv))


def _chunk_state_spec(d: Dims):
    return pl.BlockSpec((_SQ, _SQ, _SQ, d.BV, d.K), lambda b, h, iv, n: (b, h, n, iv, 0))


def _partial_spec(d: Dims, width=None):
    return pl.BlockSpec((_SQ, _SQ, _SQ, d.C, d.K if width is None else width), lambda b, h, iv, n: (b, h, iv, n, 0))


# ---------------------------------------------------------------- helpers

def _chunk_start(d: Dims, n):
    return pl.multiple_of(n * d.C, d.C)


def _call(kernel, grid, in_specs, out_specs, out_shape, *, interpret, name):
    return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                          out_shape=out_shape, interpret=interpret, name=name,
                          compiler_params=compat.triton_compiler_params(num_warps=NUM_WARPS))


def _sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _state_call(kernel, d: Dims, in_specs, args, out_specs, out_shape, state_in, want_state_out, *,
                interpret, name):
    """Run a kernel looping over a head's chunks on the grid ``(B, H, NV)``; the initial state
    ``state_in`` and the final state are optional (see :func:`_launch.with_state`)."""
    call = functools.partial(_call, kernel, (d.B, d.H, d.NV), interpret=interpret, name=name)
    return _launch.with_state(call, in_specs, args, out_specs, out_shape, state_in, want_state_out,
                              _seq_state_spec(d), _sds((d.B, d.H, d.V, d.K)))


def _split(refs, *flags):
    """Split a kernel's refs: the leading ones, then one optional ref per flag (None if absent)."""
    refs, out = list(refs), []
    for flag in flags:
        out.append(refs.pop(0) if flag else None)
    return out, refs


def _initial(ref, d: Dims):
    return ref[...].astype(jnp.float32) if ref is not None else jnp.zeros((d.BV, d.K), jnp.float32)


# ---------------------------------------------------------------- non-fused forward

def state_fwd(k, v, b, h0, *, chunk_size, want_final, interpret=False):
    """States entering each chunk ``h [B, H, N, V, K]`` (float32, transposed) and the final state (or None)."""
    d = dims_of(k, v, b, chunk_size)
    n_sub = d.n_sub

    def kernel(k_ref, v_ref, b_ref, *refs):
        (h0_ref,), refs = _split(refs, h0 is not None)
        h_ref, ht_ref = refs[0], (refs[1] if want_final else None)

        def step(n, S):
            t = _chunk_start(d, n)
            h_ref[n] = S
            return cm.state_update(_sub_blocks(k_ref, n_sub, t, d.c), _sub_blocks(v_ref, n_sub, t, d.c),
                                   _sub_blocks(b_ref, n_sub, t, d.c), S)

        S = lax.fori_loop(0, d.N, step, _initial(h0_ref, d))
        if ht_ref is not None:
            ht_ref[...] = S

    return _state_call(kernel, d, [_seq_spec(d, d.K), _seq_value_spec(d), _seq_spec(d, d.Kg)],
                       [k, v, b], [_seq_states_spec(d)], [_sds((d.B, d.H, d.N, d.V, d.K))], h0,
                       want_final, interpret=interpret, name="gla_state_fwd")


def chunk_fwd_o(q, k, v, b, h, *, chunk_size, scale, interpret=False):
    """The output, one program per chunk, from the state ``h`` entering it."""
    d = dims_of(q, v, b, chunk_size)
    n_sub = d.n_sub

    kernel = _launch.chunk_output_kernel(n_sub, scale, sub_chunk_size=d.c)
    in_specs = [_chunk_spec(d, d.K), _chunk_spec(d, d.K), _value_spec(d), _chunk_spec(d, d.Kg),
                _chunk_state_spec(d)]
    return _call(kernel, (d.B, d.H, d.NV, d.N), in_specs, _value_spec(d), _sds(v.shape, q.dtype),
                 interpret=interpret, name="gla_chunk_fwd_o")(q, k, v, b, h)


# ---------------------------------------------------------------- fused forward

def fused_fwd(q, k, v, b, h0, *, chunk_size, scale, want_final, interpret=False):
    """Output and final state in one program per head and value block; the state is a loop carry."""
    d = dims_of(q, v, b, chunk_size)
    n_sub = d.n_sub  # whole-chunk tiles for a scalar gate, 16 rows for GLA (as the non-fused kernels)

    def kernel(q_ref, k_ref, v_ref, b_ref, *refs):
        (h0_ref,), refs = _split(refs, h0 is not None)
        o_ref, ht_ref = refs[0], (refs[1] if want_final else None)

        def step(n, S):
            t = _chunk_start(d, n)
            qs, ks, vs, bs = (_sub_blocks(r, n_sub, t, d.c) for r in (q_ref, k_ref, v_ref, b_ref))
            A = cm.intra_scores(qs, ks, bs, scale)
            _store(o_ref, cm.chunk_output(qs, vs, bs, S, A, scale), t, d.c)
            return cm.state_update(ks, vs, bs, S)

        S = lax.fori_loop(0, d.N, step, _initial(h0_ref, d))
        if ht_ref is not None:
            ht_ref[...] = S

    in_specs = [_seq_spec(d, d.K), _seq_spec(d, d.K), _seq_value_spec(d), _seq_spec(d, d.Kg)]
    return _state_call(kernel, d, in_specs, [q, k, v, b], [_seq_value_spec(d)],
                       [_sds(v.shape, q.dtype)], h0, want_final, interpret=interpret,
                       name="gla_fused_fwd")


# ---------------------------------------------------------------- non-fused backward

def state_bwd(q, b, do, dht, *, chunk_size, scale, want_dh0, interpret=False):
    """Gradients w.r.t. the state leaving each chunk ``[B, H, N, V, K]`` and w.r.t. h0 (or None):
    a loop over the chunks from last to first."""
    d = dims_of(q, do, b, chunk_size)
    n_sub = d.n_sub

    def kernel(q_ref, b_ref, do_ref, *refs):
        (dht_ref,), refs = _split(refs, dht is not None)
        dso_ref, dh0_ref = refs[0], (refs[1] if want_dh0 else None)

        def step(s, dS):
            n = d.N - 1 - s
            t = _chunk_start(d, n)
            dso_ref[n] = dS
            return cm.state_grad_update(_sub_blocks(q_ref, n_sub, t, d.c), _sub_blocks(b_ref, n_sub, t, d.c),
                                        _sub_blocks(do_ref, n_sub, t, d.c), dS, scale)

        dS = lax.fori_loop(0, d.N, step, _initial(dht_ref, d))
        if dh0_ref is not None:
            dh0_ref[...] = dS

    return _state_call(kernel, d, [_seq_spec(d, d.K), _seq_spec(d, d.Kg), _seq_value_spec(d)],
                       [q, b, do], [_seq_states_spec(d)], [_sds((d.B, d.H, d.N, d.V, d.K))], dht,
                       want_dh0, interpret=interpret, name="gla_state_bwd")


def chunk_bwd(q, k, v, b, do, h, dso, *, chunk_size, scale, interpret=False):
    """``dq, dk`` (float32 partials per value block ``[B, H, NV, T, K]``), ``dv`` (float32) and the
    gate gradient's partials ``[B, H, NV, T, Kg]``, one program per chunk."""
    d = dims_of(q, v, b, chunk_size)
    n_sub = d.n_sub

    kernel = _launch.chunk_grad_kernel(n_sub, scale, sub_chunk_size=d.c)
    in_specs = [_chunk_spec(d, d.K), _chunk_spec(d, d.K), _value_spec(d), _chunk_spec(d, d.Kg),
                _value_spec(d), _chunk_state_spec(d), _chunk_state_spec(d)]
    part = _sds((d.B, d.H, d.NV, d.N * d.C, d.K))
    return _call(kernel, (d.B, d.H, d.NV, d.N), in_specs,
                 [_partial_spec(d), _partial_spec(d), _value_spec(d), _partial_spec(d, d.Kg)],
                 [part, part, _sds(v.shape), _sds((d.B, d.H, d.NV, d.N * d.C, d.Kg))], interpret=interpret,
                 name="gla_chunk_bwd")(q, k, v, b, do, h, dso)


# ---------------------------------------------------------------- fused backward

def fused_bwd(q, k, v, b, do, h0, dht, *, chunk_size, scale, want_dh0, interpret=False):
    """All gradients with the states as loop carries: one kernel loops forwards for ``dq``
    (re-building the state), a second loops backwards for ``dk, dv, dh0``. Each also writes one row
    per chunk for the gate gradient, ``a``, ``c`` and ``e`` ``[B, H, NV, N, 1, Kg]`` (see the TPU launcher)."""
    d = dims_of(q, v, b, chunk_size)
    n_sub = d.n_sub  # as fused_fwd
    part = _sds((d.B, d.H, d.NV, d.N * d.C, d.K))
    rows = _sds((d.B, d.H, d.NV, d.N, 1, d.Kg))
    row_spec = pl.BlockSpec((_SQ, _SQ, _SQ, d.N, 1, d.Kg), lambda b, h, iv: (b, h, iv, 0, 0, 0))
    seq_in = [_seq_spec(d, d.K), _seq_spec(d, d.K), _seq_value_spec(d), _seq_spec(d, d.Kg),
              _seq_value_spec(d)]

    def dq_kernel(q_ref, k_ref, v_ref, b_ref, do_ref, *refs):
        (h0_ref,), (dq_ref, a_ref) = _split(refs, h0 is not None)

        def step(n, S):
            t = _chunk_start(d, n)
            qs, ks, vs, bs, dos = (_sub_blocks(r, n_sub, t, d.c) for r in (q_ref, k_ref, v_ref, b_ref, do_ref))
            _store(dq_ref, cm.chunk_dq(qs, ks, vs, bs, dos, S, scale), t, d.c)
            a_ref[n] = cm.state_in_term(qs, bs, dos, S, scale)
            return cm.state_update(ks, vs, bs, S)

        lax.fori_loop(0, d.N, step, _initial(h0_ref, d))

    dq, a, _ = _state_call(dq_kernel, d, seq_in, [q, k, v, b, do], [_seq_partial_spec(d), row_spec],
                           [part, rows], h0, False, interpret=interpret, name="gla_fused_bwd_dq")

    def dkv_kernel(q_ref, k_ref, v_ref, b_ref, do_ref, *refs):
        (dht_ref,), refs = _split(refs, dht is not None)
        dk_ref, dv_ref, c_ref, e_ref = refs[:4]
        dh0_ref = refs[4] if want_dh0 else None

        def step(s, dS):
            n = d.N - 1 - s
            t = _chunk_start(d, n)
            qs, ks, vs, bs, dos = (_sub_blocks(r, n_sub, t, d.c) for r in (q_ref, k_ref, v_ref, b_ref, do_ref))
            dk, dv, kappa = cm.chunk_dkv(qs, ks, vs, bs, dos, dS, cm.intra_scores(qs, ks, bs, scale), scale,
                                         key_term=True)
            _store(dk_ref, dk, t, d.c)
            _store(dv_ref, dv, t, d.c)
            c = cm.state_out_term(ks, vs, bs, dS)
            c_ref[n] = c
            e_ref[n] = kappa - c
            return cm.state_grad_update(qs, bs, dos, dS, scale)

        dS = lax.fori_loop(0, d.N, step, _initial(dht_ref, d))
        if dh0_ref is not None:
            dh0_ref[...] = dS

    dk, dv, c, e, dh0 = _state_call(dkv_kernel, d, seq_in, [q, k, v, b, do],
                                    [_seq_partial_spec(d), _seq_value_spec(d), row_spec, row_spec],
                                    [part, _sds(v.shape), rows, rows], dht, want_dh0, interpret=interpret,
                                 name="gla_fused_bwd_dkv")
    return dq, dk, dv, dh0, a, c, e
