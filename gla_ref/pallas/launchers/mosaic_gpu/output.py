"""Step 3 of the forward on Mosaic GPU: each chunk's output from the state entering it, one program per chunk.

:func:`chunk_fwd_o` runs one program per chunk and value block on the grid ``(B, H, NV, N)``: it loads its
chunk's tiles by TMA (q, k, v straight from ``[B, T, H, D]``, ``common.TOKEN_MAJOR``) and its state, computes ``O = scale ((Q ⊙ e^{b}) S + A V)`` and writes ``O``'s block back through SMEM (HBM:
the chunk's ``q, k`` and ``b`` rows, its value block of ``v`` and of the state ``S`` read once, ``O``'s block
written once). ``A`` is the chunk's causal scores, in one of the three forms of
:mod:`~gla_ref.pallas.launchers.mosaic_gpu.forms`, chosen per call on the device:

* the whole-chunk form (:func:`_whole_chunk_output_kernel`), ``A = mask((Q ⊙ e^{b − b_0}) (K ⊙ e^{b_0 − b})ᵀ)``,
  one wgmma accumulation over the whole chunk, operands formed ``BK = 64`` key columns at a time;
* the fast sub-chunk form (``exact=False``): the tiles of each 16-row sub-chunk I (``I = 0 … C/16 − 1``) by one
  masked wgmma of ``Q_I ⊙ e^{b − r_I}`` (rows of sub-chunk I only) and ``K ⊙ e^{r_I − b}`` (keys up to I's
  last), ``r_I`` the sub-chunk's first row; the causal mask after;
* the exact form (``exact=True``, any valid gate): the off-diagonal 16-row tiles by the masked wgmmas above,
  restricted to the keys before row ``16 I``; the diagonal tiles ``Σ_d q_id k_jd e^{b_id − b_jd}`` one key
  column at a time in float32, the key's row picked out of the registers by a one-hot sum (as the shared
  chunk math does; every exponent ≤ 0, masked with ``where`` before ``exp``).

The sub-chunk forms hold whole ``[C, K]`` float32 arrays (at ``K = 128`` three of them are 192 registers a
thread, :class:`~gla_ref.pallas.launchers.mosaic_gpu.forms.ChunkTile`) and re-form full operands for each of the
``C/16`` wgmmas; the whole-chunk form forms each operand once, ``[C, 64]`` at a time, which took the output
kernel from 4.7 to about 1.1 ms on the H200 (B=8, H=16, T=4096, K=V=128). Scalar gates: ``(Q Kᵀ) ⊙ D``. The
states come in the input dtype from the forward (:func:`~gla_ref.pallas.launchers.mosaic_gpu.states.state_fwd`),
which lets the whole-chunk form take 128 value columns a program (:func:`output_dims`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from gla_ref.pallas import compat
from gla_ref.pallas.launchers.common import Dims
from gla_ref.pallas.launchers.mosaic_gpu.common import (Ops, causal, check_supported, dims_of, interpret_params,
                                                        per_key, tokens, transforms)
from gla_ref.pallas.launchers.mosaic_gpu.forms import (WHOLE_CHUNK_KEYS, ChunkTile, by_forms, key_blocks,
                                                       whole_chunk_dims, whole_chunk_inputs)

def chunk_output(tile, S, v_s, ref_row, hb_s, x_s, y_s, a_s, scale):
    """``O = scale ((Q ⊙ e^{b}) S + A V)`` of one chunk, float32 ``[C, BV]``, from the chunk's tiles (``tile``)
    and the float32 state ``Sᵀ [BV, K]`` entering it (written to ``hb_s`` as a bf16 operand; a transposed view
    of it is the ``[K, BV]`` operand); ``x_s, y_s, a_s`` are work tiles. The scores come first, so that
    both products then accumulate in one wgmma accumulator."""
    ops, C, BV = tile.ops, tile.C, v_s.shape[-1]
    hb_s[...] = S.astype(tile.dtype)
    A = tile.scores(ref_row, x_s, y_s)
    a_s[...] = A.astype(tile.dtype)
    x_s[...] = (tile.q * jnp.exp(tile.b)).astype(tile.dtype)
    ops.mgpu.commit_smem()
    return scale * ops.matmul_nt(x_s, hb_s, (C, BV), more=((a_s, v_s),))


def _output_kernel(d: Dims, dtype, *, scale, interpret, scalar=False, exact=True, whole=False,
                   states_dtype=jnp.float32):
    """The output kernel of one chunk and value block, and its SMEM: ``O = scale ((Q ⊙ e^{b}) S + A V)`` with the
    scores ``A`` in the form named (``whole``, else the sub-chunk form ``exact`` or not; module docstring),
    the states coming as ``states_dtype`` (float32, or the input dtype)."""
    if whole and not scalar:
        return _whole_chunk_output_kernel(d, dtype, scale=scale, interpret=interpret, states_dtype=states_dtype)
    ops = Ops(interpret)
    mgpu = ops.mgpu
    W = mgpu.Layout.WGMMA
    C, K, BV = d.C, d.K, d.BV
    n_sub = C // 16

    def kernel(q_ref, k_ref, v_ref, b_ref, h_ref, o_ref, q_s, k_s, v_s, b_s, r_s, h_s, x_s, y_s, hb_s, a_s, o_s,
               ready):
        ib, ih, iv, n = (lax.axis_index(a) for a in ("b", "h", "v", "n"))
        rows, cols = pl.ds(n * C, C), pl.ds(iv * BV, BV)
        mgpu.copy_gmem_to_smem(tokens(q_ref, ib, ih, rows), q_s, ready.at[0])
        mgpu.copy_gmem_to_smem(tokens(k_ref, ib, ih, rows), k_s, ready.at[0])
        mgpu.copy_gmem_to_smem(tokens(v_ref, ib, ih, rows, cols), v_s, ready.at[0])
        mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, rows], b_s, ready.at[0])
        mgpu.copy_gmem_to_smem(h_ref.at[ib, ih, n, cols], h_s, ready.at[0])
        for I in range(n_sub):
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, n * C + 16 * I], r_s.at[I], ready.at[0])
        mgpu.barrier_wait(ready.at[0])

        tile = ChunkTile(ops, C, K, dtype, q_s, k_s, b_s, scalar, exact)
        o = chunk_output(tile, ops.load(h_s, W), v_s, tile.ref_rows(r_s), hb_s, x_s, y_s, a_s, scale)
        o_s[...] = o.astype(o_s.dtype)
        mgpu.commit_smem()
        mgpu.copy_smem_to_gmem(o_s, tokens(o_ref, ib, ih, rows, cols))
        mgpu.wait_smem_to_gmem(0)

    return kernel, _output_scratch(d, dtype, states_dtype)


def _output_scratch(d: Dims, dtype, states_dtype):
    """The SMEM of :func:`_output_kernel`'s sub-chunk forms, in the order of its kernel's arguments."""
    mgpu, sw, f32 = compat.mosaic_gpu(), transforms, jnp.float32
    C, K, BV = d.C, d.K, d.BV
    return [
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),                # q
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),                # k
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),              # v
        mgpu.SMEM((C, K), f32, transforms=sw(f32, K)),                    # b
        mgpu.SMEM((C // 16, K), f32),                                     # reference rows r_I
        mgpu.SMEM((BV, K), states_dtype, transforms=sw(states_dtype, K)),  # Sᵀ
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),                # work operand x
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),                # work operand y
        mgpu.SMEM((BV, K), dtype, transforms=sw(dtype, K)),               # Sᵀ (bf16 operand)
        mgpu.SMEM((C, C), dtype, transforms=sw(dtype, C)),                # A
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),              # O
        mgpu.Barrier(num_arrivals=5 + C // 16, num_barriers=1),
    ]


WIDE_BLOCK_V = 128
"""Value columns per program of the whole-chunk output kernel where ``V`` has them and the states come in the
input dtype (:func:`output_dims`)."""


def output_dims(d, dtype, states_dtype):
    """The whole-chunk output kernel's sizes: value blocks of :data:`WIDE_BLOCK_V` columns where ``V`` has them and
    the states come as ``dtype`` (184 KiB of SMEM at ``K = 128`` in bf16; float32 states would take it to 248 KiB,
    over a block's 227), so that each chunk's ``q, k, b`` are read, and its operands formed, once per 128 value
    columns instead of once per 64; else ``d`` as it is."""
    wide = states_dtype == dtype and d.V % WIDE_BLOCK_V == 0
    return d._replace(BV=WIDE_BLOCK_V) if wide else d


def _whole_chunk_output_kernel(d: Dims, dtype, *, scale, interpret, states_dtype=jnp.float32):
    """The whole-chunk form of :func:`_output_kernel` (per-key gates whose chunks decay by at most
    ``SAFE_DECAY``, :func:`~gla_ref.pallas.launchers.mosaic_gpu.forms.whole_chunk_gates`): every score of the
    chunk splits at its first row ``b_0``,

        ``A = mask((Q ⊙ e^{b − b_0}) (K ⊙ e^{b_0 − b})ᵀ)``,   ``O = scale ((Q ⊙ e^{b}) S + A V)``,

    the query-side exponents ≤ 0, the key-side ones in ``[0, SAFE_DECAY]`` (at most e^64, which float32 and
    bfloat16 hold), each product still ``q_i k_j e^{b_i − b_j}``; the causal mask drops ``j > i`` (finite
    there, since ``b_i − b_j ≤ SAFE_DECAY`` too).

    Grid ``(B, H, NV, N)``, one program per chunk and block of ``BV`` value columns (64, or 128:
    :func:`output_dims`); it owns ``O``'s ``[C, BV]`` block. Its ``q, k`` (input dtype), ``b`` (float32) and
    state ``Sᵀ [BV, K]`` (float32 or the input dtype) come by TMA as ``K / BK`` blocks of ``BK = 64`` key columns
    (``forms.WHOLE_CHUNK_KEYS``), ``b_0`` as one ``[BK]`` row per block. Per block ``c``, in registers (``[C, BK]``
    float32 at a time, 96 registers a thread for ``q, k, b``): ``Q_c ⊙ e^{b_c − b_0}``, ``K_c ⊙ e^{b_0 − b_c}``
    and ``Q_c ⊙ e^{b_c}`` (and a float32 ``Sᵀ_c``), stored as the input dtype to SMEM work blocks. Then one
    accumulator of ``K / BK`` wgmmas gives ``A`` (``[C, C]``, contraction over the key blocks), the causal mask in
    registers, ``A`` to SMEM as the input dtype, and one more accumulator ``Σ_c (Q_c ⊙ e^{b_c}) S_c + A V``
    (``K / BK + 1`` wgmmas). HBM: as the sub-chunk forms (each tile read once), without their ``C/16`` reference rows.
    States that come in the input dtype (``states_dtype``, the forward's) are the wgmma operand as TMA leaves
    them: no float32 blocks, no copy."""
    ops, mgpu, W, C, K, BV, BK, nk = whole_chunk_dims(d, interpret)
    f32 = jnp.float32
    cast = states_dtype != dtype  # float32 states: rounded to the operand dtype in the kernel

    def kernel(q_ref, k_ref, v_ref, b_ref, h_ref, o_ref, q_s, k_s, b_s, b0_s, h_s, v_s, xq_s, xk_s, xs_s, *rest):
        hb_s, a_s, o_s, ready = rest if cast else (h_s, *rest)
        ib, ih, iv, n = (lax.axis_index(a) for a in ("b", "h", "v", "n"))
        rows, cols = pl.ds(n * C, C), pl.ds(iv * BV, BV)
        for c in range(nk):  # key block c: columns c BK … c BK + BK − 1
            keys = pl.ds(c * BK, BK)
            mgpu.copy_gmem_to_smem(tokens(q_ref, ib, ih, rows, keys), q_s.at[c], ready.at[0])
            mgpu.copy_gmem_to_smem(tokens(k_ref, ib, ih, rows, keys), k_s.at[c], ready.at[0])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, rows, keys], b_s.at[c], ready.at[0])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, n * C, keys], b0_s.at[c], ready.at[0])
            mgpu.copy_gmem_to_smem(h_ref.at[ib, ih, n, cols, keys], h_s.at[c], ready.at[0])
        mgpu.copy_gmem_to_smem(tokens(v_ref, ib, ih, rows, cols), v_s, ready.at[0])
        mgpu.barrier_wait(ready.at[0])

        def operands(c, carry):  # key block c's operands (a loop, not unrolled: see the gradients module)
            b = ops.load(b_s.at[c], W)
            b0 = lax.broadcast_in_dim(ops.load(b0_s.at[c], W.reduce(0)), (C, BK), [1])
            q = ops.load(q_s.at[c], W).astype(f32)
            xq_s.at[c][...] = (q * jnp.exp(b - b0)).astype(dtype)   # exponents ≤ 0
            xs_s.at[c][...] = (q * jnp.exp(b)).astype(dtype)        # ≤ 0: b is chunk-local
            k = ops.load(k_s.at[c], W).astype(f32)
            xk_s.at[c][...] = (k * jnp.exp(b0 - b)).astype(dtype)   # in [0, SAFE_DECAY]
            if cast:
                hb_s.at[c][...] = ops.load(h_s.at[c], W).astype(dtype)
            return carry

        lax.fori_loop(0, nk, operands, 0)
        mgpu.commit_smem()
        A = ops.matmul_nt_blocks([(xq_s.at[c], xk_s.at[c]) for c in range(nk)], (C, C))
        a_s[...] = causal(ops, A).astype(dtype)
        mgpu.commit_smem()
        o = scale * ops.matmul_nt_blocks([(xs_s.at[c], hb_s.at[c]) for c in range(nk)], (C, BV),
                                         more=((a_s, v_s),))
        o_s[...] = o.astype(o_s.dtype)
        mgpu.commit_smem()
        mgpu.copy_smem_to_gmem(o_s, tokens(o_ref, ib, ih, rows, cols))
        mgpu.wait_smem_to_gmem(0)

    return kernel, _whole_chunk_output_scratch(d, dtype, states_dtype, cast)


def _whole_chunk_output_scratch(d: Dims, dtype, states_dtype, cast):
    """The SMEM of :func:`_whole_chunk_output_kernel`, in the order of its kernel's arguments (``cast``: float32
    states, which get bf16 operand blocks of their own)."""
    mgpu, sw = compat.mosaic_gpu(), transforms
    C, BV, BK, nk = d.C, d.BV, WHOLE_CHUNK_KEYS, d.K // WHOLE_CHUNK_KEYS

    def blocks(rows, dt):
        return key_blocks(nk, rows, BK, dt)

    return [
        *whole_chunk_inputs(nk, C, BK, dtype),                   # q, k, b, b_0
        blocks(BV, states_dtype),                                # Sᵀ
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),     # v
        blocks(C, dtype),                                        # Q ⊙ e^{b − b_0}
        blocks(C, dtype),                                        # K ⊙ e^{b_0 − b}
        blocks(C, dtype),                                        # Q ⊙ e^{b}
        *([blocks(BV, dtype)] if cast else []),                  # Sᵀ (bf16 operand)
        mgpu.SMEM((C, C), dtype, transforms=sw(dtype, C)),       # A
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),     # O
        mgpu.Barrier(num_arrivals=5 * nk + 1, num_barriers=1),
    ]


def chunk_fwd_o(q, k, v, b, h, *, chunk_size, scale, interpret=False, exact=None, whole_chunk=None):
    """The output, one program per chunk and value block on the grid ``(B, H, NV, N)``, from the state
    ``h`` entering the chunk (:func:`_output_kernel`; float32 or the input dtype; the whole-chunk form's value
    blocks by :func:`output_dims`). The form of a per-key gate's scores (``forms.by_forms``): the whole-chunk
    form where ``whole_chunk_gates``, else the fast sub-chunk form where ``gentle_gates``, else the exact one;
    ``whole_chunk=True`` or ``exact`` True or False force one."""
    check_supported(q.dtype, q.shape[-1], chunk_size)
    b, scalar = per_key(b, q.shape[-1])
    d = dims_of(q, v, chunk_size)
    mgpu = compat.mosaic_gpu()

    def call(exact, whole):
        dk = output_dims(d, q.dtype, h.dtype) if whole and not scalar else d
        kernel, scratch = _output_kernel(dk, q.dtype, scale=scale, interpret=interpret, scalar=scalar, exact=exact,
                                         whole=whole, states_dtype=h.dtype)
        run = mgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(v.shape, q.dtype), scratch_types=scratch,
                          grid=(dk.B, dk.H, dk.NV, dk.N), grid_names=("b", "h", "v", "n"),
                          compiler_params=mgpu.CompilerParams(), interpret=interpret_params(interpret),
                          kernel_name="gla_chunk_fwd_o_mgpu")
        return run(q, k, v, b, h)

    return by_forms(b, scalar, chunk_size, call, exact, whole_chunk)
