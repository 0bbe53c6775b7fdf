"""The fused path on Mosaic GPU: the state kernel's loop with a per-chunk body, so that no state reaches HBM.

:func:`fused_fwd` (output and final state) and :func:`fused_bwd` (a forward loop for ``dq`` and the
gate-gradient rows ``a``, a reverse loop for ``dk, dv, dh0`` and the rows ``c, e``;
:func:`gla_ref.pallas.chunk._fused_gate_grad` sums them) are
:func:`~gla_ref.pallas.launchers.mosaic_gpu.states.state_kernel` with a body (:func:`fused_body`) that calls the per-chunk kernels' own math
(:func:`~gla_ref.pallas.launchers.mosaic_gpu.output.chunk_output`,
:func:`~gla_ref.pallas.launchers.mosaic_gpu.gradients.chunk_grads`) on the chunk's tiles the loop has fetched,
with the state in registers. The body's extra tiles are double-buffered with the loop's, which keeps the
fused path to ``K ≤ 64`` (``MAX_K_FUSED``), and it keeps the two sub-chunk forms of the scores (no
whole-chunk form; each program forms its scores' reference rows from ``b``'s registers).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from gla_ref.pallas import compat
from gla_ref.pallas.launchers.common import Dims
from gla_ref.pallas.launchers.mosaic_gpu.common import check_supported, gate_width, per_key, tokens, transforms
from gla_ref.pallas.launchers.mosaic_gpu.forms import ChunkTile, by_gates
from gla_ref.pallas.launchers.mosaic_gpu.gradients import chunk_grads
from gla_ref.pallas.launchers.mosaic_gpu.output import chunk_output
from gla_ref.pallas.launchers.mosaic_gpu.states import Loop, state_call


def fused_body(kind, dtype, scale, scalar, exact=True):
    """The per-chunk body of a fused kernel (``"fwd"``, ``"dq"`` or ``"dkv"``) for ``state_kernel``, and
    its SMEM scratch ``scratch(d)``."""
    chunk_body = {"fwd": _output_body, "dq": _dq_body, "dkv": _dkv_body}[kind]

    def body(env: Loop, S):
        C, K = env.b.shape
        q_s, k_s = (env.extra[0], env.x) if kind != "dkv" else (env.x, env.extra[0])
        tile = ChunkTile(env.ops, C, K, dtype, q_s, k_s, env.b, scalar, exact, hold=kind != "fwd")
        ref_row = tile.ref_rows()  # picked out of b (one-hot sums): no extra copies in the loop
        chunk_body(env, S, tile, ref_row, scale)

    return body, functools.partial(_fused_scratch, kind, dtype)


def _output_body(env: Loop, S, tile, ref_row, scale):
    """``"fwd"``: x = k, y = v, extra = (q,); ``S`` enters the chunk. The chunk's output leaves through SMEM."""
    mgpu = env.ops.mgpu
    (o_ref,), (hb_s, x_s, y_s, a_s, o_s) = env.outs, env.scratch
    o = chunk_output(tile, S, env.y, ref_row, hb_s, x_s, y_s, a_s, scale)
    mgpu.wait_smem_to_gmem(0)  # the previous chunk's o has left o_s
    o_s[...] = o.astype(tile.dtype)
    mgpu.commit_smem()
    mgpu.copy_smem_to_gmem(o_s, tokens(o_ref, env.ib, env.ih, env.rows, env.cols))


def _dq_body(env: Loop, S, tile, ref_row, scale):
    """``"dq"``: x = k, y = v, extra = (q, do); ``S`` enters the chunk. The chunk's ``dq`` and its row ``a``."""
    ops, dtype = env.ops, tile.dtype
    mgpu = ops.mgpu
    (dq_ref, a_ref), (hb_s, x_s, y_s, a_s, out_s, row_s) = env.outs, env.scratch
    do_s = env.extra[1]
    hb_s[...] = S.astype(dtype)
    mgpu.commit_smem()
    dq = chunk_grads(tile, None, env.y, do_s, ref_row, x_s, y_s, a_s, scale, hb_s=hb_s)[0]
    # a = Σ_v S ⊙ G, G = scale (Q ⊙ e^b)ᵀ dO held as Gᵀ [BV, K] (chunk_math.state_in_term)
    x_s[...] = (tile.q * jnp.exp(tile.b)).astype(dtype)
    mgpu.commit_smem()
    a = jnp.sum(S * (scale * ops.matmul_tn(do_s, x_s, S.shape)), axis=0)
    _send(env, ((dq_ref, out_s, dq), (a_ref, row_s, a)))


def _dkv_body(env: Loop, S, tile, ref_row, scale):
    """``"dkv"``: x = q, y = do, extra = (k, v); ``S`` is dS, the gradient of the state leaving the chunk. The
    chunk's ``dk``, ``dv`` and its rows ``c``, ``e = κ − c``."""
    ops = env.ops
    mgpu, W = ops.mgpu, ops.mgpu.Layout.WGMMA
    (dk_ref, dv_ref, c_ref, e_ref), (dsb_s, x_s, y_s, a_s, out_s, dv_s, c_s, e_s) = env.outs, env.scratch
    bC = ops.load(env.bc, W.reduce(0))
    dsb_s[...] = S.astype(tile.dtype)
    mgpu.commit_smem()
    _, dk, dv, kappa, c = chunk_grads(tile, bC, env.extra[1], env.y, ref_row, x_s, y_s, a_s, scale,
                                      dsb_s=dsb_s, dS=S)
    _send(env, ((dk_ref, out_s, dk), (dv_ref, dv_s, dv), (c_ref, c_s, c), (e_ref, e_s, kappa - c)))


def _send(env: Loop, results):
    """Each ``(ref, buffer, value)`` of ``results`` to its place in HBM through its SMEM buffer, once the
    previous chunk's results have left the buffers."""
    mgpu = env.ops.mgpu
    mgpu.wait_smem_to_gmem(0)  # the previous chunk's results have left their buffers
    for ref, buf, value in results:
        buf[...] = value
    mgpu.commit_smem()
    for ref, buf, _ in results:
        if ref.ndim == 4:  # dv [B, T, H, V]
            dst = tokens(ref, env.ib, env.ih, env.rows, env.cols)
        elif ref.ndim == 5:  # partials [B, H, NV, T, K]
            dst = ref.at[env.ib, env.ih, env.iv, env.rows]
        else:  # one row per chunk [B, H, NV, N, 1, K]
            dst = ref.at[env.ib, env.ih, env.iv, env.n, 0]
        mgpu.copy_smem_to_gmem(buf, dst)


def _fused_scratch(kind, dtype, d: Dims):
    """The body's SMEM for sizes ``d``: four work tiles and its output buffers, in the order the body reads
    them from :attr:`Loop.scratch`."""
    mgpu = compat.mosaic_gpu()
    C, K, BV = d.C, d.K, d.BV
    f32 = jnp.float32

    def tile(shape, dt):
        return mgpu.SMEM(shape, dt, transforms=transforms(dt, shape[-1]))

    work = [tile((BV, K), dtype), tile((C, K), dtype), tile((C, K), dtype), tile((C, C), dtype)]
    if kind == "fwd":
        return work + [tile((C, BV), dtype)]
    if kind == "dq":
        return work + [tile((C, K), f32), mgpu.SMEM((K,), f32)]
    return work + [tile((C, K), f32), tile((C, BV), f32), mgpu.SMEM((K,), f32), mgpu.SMEM((K,), f32)]


def fused_fwd(q, k, v, b, h0, *, chunk_size, scale, want_final, interpret=False, exact=None):
    """Output and final state in one program per head and value block: the state kernel's loop, whose
    body also forms each chunk's output (``output.chunk_output``); no state is written to HBM. ``exact``
    as for ``output.chunk_fwd_o``."""
    check_supported(q.dtype, q.shape[-1], chunk_size, fused=True)
    b, scalar = per_key(b, q.shape[-1])

    def call(exact):
        body, scratch = fused_body("fwd", q.dtype, scale, scalar, exact)
        _, ht, (o,) = state_call(k, v, b, h0, chunk_size=chunk_size, reverse=False, scale=1.0, want_final=want_final,
                                 interpret=interpret, name="gla_fused_fwd_mgpu", write_states=False,
                                 extra=(("k", q),), body=body, body_scratch=scratch,
                                 body_outs=[jax.ShapeDtypeStruct(v.shape, q.dtype)])
        return o, ht

    return by_gates(b, scalar, call, exact)


def fused_bwd(q, k, v, b, do, h0, dht, *, chunk_size, scale, want_dh0, interpret=False, exact=None):
    """All gradients with the states in registers, the interface of :func:`gla_ref.pallas.launchers.gpu.fused_bwd`: the
    state kernel's loop forwards for ``dq`` and the rows ``a`` (re-building the state), and backwards for
    ``dk, dv, dh0`` and the rows ``c, e`` of the gate gradient (``[B, H, NV, N, 1, K]``;
    :func:`gla_ref.pallas.chunk._fused_gate_grad` sums them). ``exact`` as for ``output.chunk_fwd_o``."""
    check_supported(q.dtype, q.shape[-1], chunk_size, fused=True)
    b, scalar = per_key(b, q.shape[-1])

    def outs(*kinds):
        def types(d: Dims):
            shape = {"part": (d.B, d.H, d.NV, d.N * d.C, d.K), "dv": v.shape, "row": (d.B, d.H, d.NV, d.N, 1, d.K)}
            return [jax.ShapeDtypeStruct(shape[kind], jnp.float32) for kind in kinds]
        return types

    def call(exact):
        body, scratch = fused_body("dq", q.dtype, scale, scalar, exact)
        _, _, (dq, a) = state_call(k, v, b, h0, chunk_size=chunk_size, reverse=False, scale=1.0, want_final=False,
                                   interpret=interpret, name="gla_fused_bwd_dq_mgpu", write_states=False,
                                   extra=(("k", q), ("v", do)), body=body, body_scratch=scratch,
                                   body_outs=outs("part", "row"))
        body, scratch = fused_body("dkv", q.dtype, scale, scalar, exact)
        _, dh0, (dk, dv, c, e) = state_call(q, do, b, dht, chunk_size=chunk_size, reverse=True, scale=scale,
                                            want_final=want_dh0, interpret=interpret, name="gla_fused_bwd_dkv_mgpu",
                                            write_states=False, extra=(("k", k), ("v", v)), body=body,
                                            body_scratch=scratch, body_outs=outs("part", "dv", "row", "row"))
        return (dq, dk, dv, dh0) + tuple(gate_width(r, scalar) for r in (a, c, e))

    return by_gates(b, scalar, call, exact)
