"""The backward's per-chunk kernel on Mosaic GPU: each chunk's ``dq, dk, dv`` and its gate gradient.

:func:`chunk_bwd` runs one program per chunk and value block on the grid ``(B, H, NV, N)``, from the state
entering the chunk (``h``) and the gradient of the state leaving it (``dso``):
:func:`chunk_math.chunk_dq`, :func:`chunk_math.chunk_dkv` and :func:`chunk_math.chunk_gate_grad` in full-chunk
form (:func:`chunk_grads`, which the fused backward calls too). A program owns ``dV``'s ``[C, BV]`` block and
this value block's float32 partials of ``dQ``, ``dK`` and ``dg`` (``[C, K]`` each; the launcher sums them over
the value blocks). The form of the scores follows :mod:`~gla_ref.pallas.launchers.mosaic_gpu.forms`: the
sub-chunk forms (:func:`_grad_kernel`) or the whole-chunk form (:func:`_whole_chunk_grad_kernel`), which took
the gradient kernel from 26.6 to 9.96 ms on the H200 (B=8, H=16, T=4096, K=V=128; at K=V=64 6.6 to 1.2 ms).

Gate gradient, chunk-local (§4.3): ``dg = U (Q ⊙ dQ − K ⊙ dK) + dγ``, the reverse sum inside the chunk as a
matmul by the upper triangle of ones ``U``, with ``dγ = e^{b_C} ⊙ Σ_v S ⊙ dS + κ`` the explicit gradient of
the chunk's decay ``b_C`` (``κ = Σ_rows K ⊙ (V dSᵀ) ⊙ e^{b_C − b}``, the keys' share).

Two bf16 parts. A wgmma reads a float32 operand as tf32 (10 bits), so ``U x`` is two bf16 wgmmas, of ``x``'s
bf16 part and of its bf16 remainder (:func:`~gla_ref.pallas.launchers.mosaic_gpu.common.two_parts`; 16 bits
kept). Where the wgmmas also form the diagonal tiles (the fast and the whole-chunk forms), the ``dq`` and ``dk``
operands ``K ⊙ e^{r_I − b}`` and ``Q ⊙ e^{b − r_I}`` (``r_I = b_0`` in the whole-chunk form) go in two bf16
parts each as well: a product ``q_i dA_ij k_j e^{b_i − b_j}`` of the diagonal tiles enters both ``q ⊙ dq`` and
``k ⊙ dk``, and the gate gradient, their difference summed over ``s ≥ t``, cancels it for ``i, j ≥ t`` (for
``i = j`` undecayed, the largest terms) only if both sides are formed alike. With one bf16 part each the two
sides were rounded apart (each operand by its own 2⁻⁹) and the gate gradient was 3.0e-2 off float64 at steep
gates (1.6 nats a token; the Triton-backend launcher's, float32 diagonal tiles: 1.6e-3); with the remainders,
1.6e-3, at a cost on the fused path at K=V=64 of 6.4 -> 9.0 ms (forward+backward).

Why the whole-chunk kernel loops: every elementwise step on a ``[C, BK]`` array is 32 instructions a thread,
so the kernel is long straight-line code, and with one warpgroup per SM nothing hides an instruction-cache
miss. With its key blocks unrolled in Python (478 KB of PTX, 604 bytes a thread spilled) Nsight Compute found
a warp waiting on instruction fetch for two thirds of its cycles; as ``lax.fori_loop`` loops (267 KB, 64 bytes
spilled) the kernel took 2.69 instead of 9.60 ms at B=8, H=16, T=4096, K=V=128
(benchmarks/results/mosaic_loops_nvidia_h200.json).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from gla_ref.pallas import compat
from gla_ref.pallas.launchers.common import Dims
from gla_ref.pallas.launchers.mosaic_gpu.common import (Ops, causal, check_supported, dims_of, gate_width,
                                                        interpret_params, per_key, tokens, transforms,
                                                        triangle_ones, two_parts)
from gla_ref.pallas.launchers.mosaic_gpu.forms import (ChunkTile, by_forms, key_blocks, whole_chunk_dims,
                                                       whole_chunk_inputs)


# ---------------------------------------------------------------- one chunk's gradients, sub-chunk forms

def chunk_grads(tile, bC, v_s, do_s, ref_row, x_s, y_s, a_s, scale, *, hb_s=None, dsb_s=None, dS=None):
    """One chunk's gradients in full-chunk form (:func:`chunk_math.chunk_dq`, :func:`chunk_math.chunk_dkv`),
    float32: ``dq`` given ``hb_s`` (the state entering the chunk, ``Sᵀ`` as a bf16 operand); ``dk, dv`` and
    the keys' share ``κ = Σ_rows k ⊙ dk_inter`` of the decay's gradient given ``dsb_s`` (the gradient of the
    state leaving it, bf16 ``dSᵀ``); given also ``dS`` (float32 registers), ``c = Σ_v dS ⊙ U`` with
    ``Uᵀ = Vᵀ (K ⊙ e^{b_C − b})`` (:func:`chunk_math.state_out_term`). Absent parts are None:
    ``(dq, dk, dv, κ, c)``.

    The inter-chunk terms are one wgmma each; the off-diagonal tiles use the masked operands of
    :meth:`ChunkTile.ref_operands` with ``dA = dO Vᵀ`` masked to the tiles ``(I, J < I)``; the diagonal tiles
    are float32, one key column (``dq``) or key row (``dk``) at a time (``exact``), or in the masked wgmmas
    (the fast form, their operands in two bf16 parts: module docstring)."""
    ops, mgpu, C, K, dtype = tile.ops, tile.ops.mgpu, tile.C, tile.K, tile.dtype
    dq = dk = dv = kappa = c = None
    if hb_s is not None:
        dq = scale * ops.matmul(do_s, hb_s, (C, K)) * jnp.exp(tile.b)
    if dsb_s is not None:
        dk, dv, kappa, c = _state_grad_terms(tile, bC, v_s, do_s, ref_row, x_s, y_s, a_s, scale, dsb_s, dS)
    dA = ops.matmul_nt(do_s, v_s, (C, C))
    if tile.scalar:  # the whole chunk at once: dq += scale (dA ⊙ D) K, dk += scale (dA ⊙ D)ᵀ Q
        a_s[...] = (dA * tile.decay()).astype(dtype)
        mgpu.commit_smem()
        if dq is not None:
            dq = dq + scale * ops.matmul(a_s, tile.k_s, (C, K))
        if dk is not None:
            dk = dk + scale * ops.matmul_tn(a_s, tile.q_s, (C, K))
        return dq, dk, dv, kappa, c
    if not tile.exact:  # the fast form: the operands' bf16 remainders in scoped tiles, dq's then dk's
        lo_type = mgpu.SMEM((C, K), dtype, transforms=transforms(dtype, K))
        dq, dk = pl.run_scoped(functools.partial(_sub_chunk_terms, tile, dA, ref_row, x_s, y_s, a_s, scale, dq, dk),
                               *[lo_type] * ((dq is not None) + (dk is not None)))
        return dq, dk, dv, kappa, c
    dq, dk = _sub_chunk_terms(tile, dA, ref_row, x_s, y_s, a_s, scale, dq, dk)
    dq, dk = _diagonal_terms(tile, dA, scale, dq, dk)
    return dq, dk, dv, kappa, c


def _state_grad_terms(tile, bC, v_s, do_s, ref_row, x_s, y_s, a_s, scale, dsb_s, dS):
    """``dk, dv, κ, c`` of :func:`chunk_grads` through the gradient of the state leaving the chunk (``dsb_s``,
    ``dS``), and the scores' share ``scale Aᵀ dO`` of ``dv`` (the scores end in ``a_s``, scaled)."""
    ops, mgpu, C, K, BV, dtype = tile.ops, tile.ops.mgpu, tile.C, tile.K, v_s.shape[-1], tile.dtype
    c = None
    decay = jnp.exp(tile.rows(bC) - tile.b)  # e^{b_C − b} ≤ 1
    x_s[...] = (tile.k * decay).astype(dtype)
    mgpu.commit_smem()
    dk = ops.matmul(v_s, dsb_s, (C, K)) * decay
    dv = ops.matmul_nt(x_s, dsb_s, (C, BV))
    kappa = jnp.sum(tile.k * dk, axis=0)
    if dS is not None:
        c = jnp.sum(dS * ops.matmul_tn(v_s, x_s, (BV, K)), axis=0)
    # scores A (for dv), float32
    A = tile.scores(ref_row, x_s, y_s)
    a_s[...] = (scale * A).astype(dtype)
    mgpu.commit_smem()
    dv = dv + ops.matmul_tn(a_s, do_s, (C, BV))
    return dk, dv, kappa, c


def _sub_chunk_terms(tile, dA, ref_row, x_s, y_s, a_s, scale, dq, dk, *lo):
    """``dq``, ``dk`` (those not None) plus the tiles of each sub-chunk's masked wgmma: ``dA`` restricted to
    (rows of I, its keys, causal) against the masked operands of :meth:`ChunkTile.ref_operands` (the causal mask
    matters only in the fast form's diagonal tile). ``lo``: the fast form's remainder tiles, dq's operand's
    then dk's (of those wanted), which put each operand in two bf16 parts (module docstring)."""
    ops, mgpu, C, K, dtype = tile.ops, tile.ops.mgpu, tile.C, tile.K, tile.dtype
    want_dq, want_dk = dq is not None, dk is not None
    lo_k, lo_q = (lo[0] if lo and want_dq else None), (lo[-1] if lo and want_dk else None)

    def operand(hi_s, lo_s, x):
        if lo_s is None:
            hi_s[...] = x.astype(dtype)
        else:
            hi_s[...], lo_s[...] = two_parts(x, dtype)

    for I in tile.sub_chunks():
        r = tile.rows(ref_row(I))
        mine, before = tile.masks(I)
        xq, xk = tile.ref_operands(I, r)
        tiles_I = (tile.srow >= 16 * I) & (tile.srow < 16 * I + 16) & (tile.scol < tile.key_end(I))
        tiles_I = tiles_I & (tile.srow >= tile.scol)
        a_s[...] = jnp.where(tiles_I, dA, 0.0).astype(dtype)  # A has been read: its buffer takes dA
        if want_dq:
            operand(x_s, lo_k, xk)
        if want_dk:
            operand(y_s, lo_q, xq)
        mgpu.commit_smem()
        if want_dq:
            dq = dq + scale * ops.matmul(a_s, x_s, (C, K), lo=lo_k) * jnp.exp(jnp.where(mine, tile.b - r, 0.0))
        if want_dk:
            dk = dk + scale * ops.matmul_tn(a_s, y_s, (C, K), lo=lo_q) * jnp.exp(
                jnp.where(before, r - tile.b, 0.0))
    return dq, dk


def _diagonal_terms(tile, dA, scale, dq, dk):
    """The exact form's diagonal tiles, key ``j`` at a time in float32: ``dq_i += dA_ij k_j e^{b_i − b_j}``,
    ``dk_j += Σ_i dA_ij q_i e^{b_i − b_j}`` (for those of ``dq``, ``dk`` not None)."""
    C, K = tile.C, tile.K
    want_dq, want_dk = dq is not None, dk is not None

    def key(j, carry):
        dq, dk = carry
        same = tile.same_tile(j)
        b = tile.b
        e = jnp.exp(jnp.where(same, b - tile.rows(tile.pick(b, j)), 0.0))
        dA_j = lax.broadcast_in_dim(jnp.sum(jnp.where(tile.scol == j, dA, 0.0), axis=1), (C, K), [0])
        if want_dq:
            dq = dq + scale * jnp.where(same, dA_j * tile.rows(tile.pick(tile.k, j)) * e, 0.0)
        if want_dk:
            dk_j = jnp.sum(jnp.where(same, dA_j * tile.q * e, 0.0), axis=0)
            dk = dk + scale * jnp.where(tile.row == j, tile.rows(dk_j), 0.0)
        return dq, dk

    return lax.fori_loop(0, C, key, (dq, dk))


# ---------------------------------------------------------------- the per-chunk kernel, sub-chunk forms

def _grad_kernel(d: Dims, dtype, *, scale, interpret, scalar=False, exact=True, whole=False):
    """The gradient kernel of one chunk and value block, and its SMEM: :func:`chunk_grads` and the chunk-local
    gate gradient (module docstring) in the form named (``whole``: :func:`_whole_chunk_grad_kernel`, else the
    sub-chunk form ``exact`` or not). The float32 states live in scoped SMEM buffers that later hold the float32
    results on their way out; the kernel fills about 221 KiB of SMEM at ``K = 128`` (the lowering checks the 227
    KiB a block has). Its sub-chunk forms hold ``q, k, b`` and ``dq, dk`` as whole ``[C, K]`` float32 arrays
    (:class:`ChunkTile` with ``hold``)."""
    if whole and not scalar:
        return _whole_chunk_grad_kernel(d, dtype, scale=scale, interpret=interpret)
    ops = Ops(interpret)
    mgpu = ops.mgpu
    W = mgpu.Layout.WGMMA
    C, K, BV = d.C, d.K, d.BV
    n_sub = C // 16
    f32 = jnp.float32

    def kernel(q_ref, k_ref, v_ref, b_ref, do_ref, h_ref, dso_ref, dq_ref, dk_ref, dv_ref, dg_ref,
               q_s, k_s, v_s, do_s, b_s, r_s, bc_s, hb_s, dsb_s, x_s, y_s, a_s, ready, state_ready):
        ib, ih, iv, n = (lax.axis_index(a) for a in ("b", "h", "v", "n"))
        rows, cols = pl.ds(n * C, C), pl.ds(iv * BV, BV)
        for src, dst in ((tokens(q_ref, ib, ih, rows), q_s), (tokens(k_ref, ib, ih, rows), k_s),
                         (tokens(v_ref, ib, ih, rows, cols), v_s), (tokens(do_ref, ib, ih, rows, cols), do_s),
                         (b_ref.at[ib, ih, rows], b_s), (b_ref.at[ib, ih, n * C + C - 1], bc_s)):
            mgpu.copy_gmem_to_smem(src, dst, ready.at[0])
        for I in range(n_sub):
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, n * C + 16 * I], r_s.at[I], ready.at[0])
        SdS = _state_operands(ops, h_ref.at[ib, ih, n, cols], dso_ref.at[ib, ih, n, cols], hb_s, dsb_s, state_ready)
        mgpu.barrier_wait(ready.at[0])
        bC = ops.load(bc_s, W.reduce(0))
        tile = ChunkTile(ops, C, K, dtype, q_s, k_s, b_s, scalar, exact, hold=True)
        dq, dk, dv, kappa, _ = chunk_grads(tile, bC, v_s, do_s, tile.ref_rows(r_s), x_s, y_s, a_s, scale,
                                           hb_s=hb_s, dsb_s=dsb_s)
        dgamma = jnp.exp(bC) * SdS + kappa  # the explicit gradient of the chunk's decay b_C

        # gate gradient: Σ_{s ≥ t in the chunk} (q ⊙ dq − k ⊙ dk)_s + dγ, as U x with U the upper triangle of
        # ones: two wgmmas, of x's bf16 part and of its bf16 remainder (U exact in bf16; what the two parts
        # miss of x is under 2⁻¹⁶ of it, and the products are summed in float32). x goes to SMEM first, dq
        # and dk leave, then dg is formed: fewer [C, K] arrays held at once.
        a_s[...] = triangle_ones(ops, C, dtype)
        x_s[...], y_s[...] = two_parts(tile.q * dq - tile.k * dk, dtype)
        mgpu.commit_smem()

        def write(out_s, dv_s):
            def out(ref, value):
                mgpu.wait_smem_to_gmem(0)
                out_s[...] = value
                mgpu.commit_smem()
                mgpu.copy_smem_to_gmem(out_s, ref.at[ib, ih, iv, rows])

            out(dq_ref, dq)
            out(dk_ref, dk)
            out(dg_ref, ops.matmul(a_s, x_s, (C, K), lo=y_s) + tile.rows(dgamma))
            dv_s[...] = dv
            mgpu.commit_smem()
            mgpu.copy_smem_to_gmem(dv_s, tokens(dv_ref, ib, ih, rows, cols))
            mgpu.wait_smem_to_gmem(0)

        pl.run_scoped(write, mgpu.SMEM((C, K), f32, transforms=transforms(f32, K)),
                      mgpu.SMEM((C, BV), f32, transforms=transforms(f32, BV)))

    return kernel, _grad_scratch(d, dtype)


def _state_operands(ops, h, dso, hb_s, dsb_s, ready):
    """The chunk's float32 states ``Sᵀ`` (``h``, the one entering it) and ``dSᵀ`` (``dso``, the gradient of the
    one leaving it) by TMA into scoped SMEM: both leave as bf16 operands in ``hb_s``, ``dsb_s``, and as the
    returned ``Σ_v S ⊙ dS`` ``[K]``."""
    mgpu, W, f32 = ops.mgpu, ops.mgpu.Layout.WGMMA, jnp.float32

    def states(h_s, dso_s):
        mgpu.copy_gmem_to_smem(h, h_s, ready.at[0])
        mgpu.copy_gmem_to_smem(dso, dso_s, ready.at[0])
        mgpu.barrier_wait(ready.at[0])
        St, dSt = ops.load(h_s, W), ops.load(dso_s, W)
        hb_s[...] = St.astype(hb_s.dtype)
        dsb_s[...] = dSt.astype(dsb_s.dtype)
        return jnp.sum(St * dSt, axis=0)

    BV, K = hb_s.shape
    state_type = mgpu.SMEM((BV, K), f32, transforms=transforms(f32, K))
    return pl.run_scoped(states, state_type, state_type)


def _grad_scratch(d: Dims, dtype):
    """The SMEM of :func:`_grad_kernel`'s sub-chunk forms, in the order of its kernel's arguments."""
    mgpu, sw, f32 = compat.mosaic_gpu(), transforms, jnp.float32
    C, K, BV = d.C, d.K, d.BV
    return [
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),       # q
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),       # k
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),     # v
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),     # do
        mgpu.SMEM((C, K), f32, transforms=sw(f32, K)),           # b
        mgpu.SMEM((C // 16, K), f32),                            # reference rows r_I
        mgpu.SMEM((K,), f32),                                    # b_C
        mgpu.SMEM((BV, K), dtype, transforms=sw(dtype, K)),      # S (bf16 operand)
        mgpu.SMEM((BV, K), dtype, transforms=sw(dtype, K)),      # dS (bf16 operand)
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),       # work operand x
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),       # work operand y
        mgpu.SMEM((C, C), dtype, transforms=sw(dtype, C)),       # scores A, then dA of the tiles (I, J < I)
        mgpu.Barrier(num_arrivals=6 + C // 16, num_barriers=1),
        mgpu.Barrier(num_arrivals=2, num_barriers=1),
    ]


# ---------------------------------------------------------------- the per-chunk kernel, whole-chunk form

def _whole_chunk_grad_kernel(d: Dims, dtype, *, scale, interpret):
    """The whole-chunk form of :func:`_grad_kernel` (per-key gates whose chunks decay by at most ``SAFE_DECAY``,
    ``forms.whole_chunk_gates``), blocked over ``K`` as the whole-chunk output kernel. Every score and score
    gradient of the chunk splits at its first row ``b_0`` (query side ``Q̃ = Q ⊙ e^{b − b_0}``, exponents ≤ 0;
    key side ``K̃ = K ⊙ e^{b_0 − b}``, in ``[0, SAFE_DECAY]``):

        ``A = mask(Q̃ K̃ᵀ)``,  ``dA = mask(dO Vᵀ)``,  ``dV = (K ⊙ e^{b_C − b}) dS + scale Aᵀ dO``,
        ``dQ = scale ((dO Sᵀ) ⊙ e^{b} + (dA K̃) ⊙ e^{b − b_0})``,
        ``dK = (V dSᵀ) ⊙ e^{b_C − b} + scale (dAᵀ Q̃) ⊙ e^{b_0 − b}``,
        ``dg = U (Q ⊙ dQ − K ⊙ dK) + dγ``,  ``dγ = e^{b_C} ⊙ Σ_v S ⊙ dS + Σ_rows K ⊙ (V dSᵀ) ⊙ e^{b_C − b}``,

    with the roundings of the sub-chunk forms' :func:`chunk_grads` (bf16 operands, float32 accumulation; ``K̃``
    and ``Q̃`` in two bf16 parts each for ``dQ`` and ``dK``, whose products then cancel in ``dg`` as the exact
    form's do).

    Its ``q, k`` (input dtype) and ``b`` (float32) come by TMA as ``K / BK`` blocks of ``BK = 64`` key columns
    (``forms.WHOLE_CHUNK_KEYS``), ``b_0`` and ``b_C`` as one ``[BK]`` row per block, and the float32 states
    ``Sᵀ``, ``dSᵀ`` one ``[BV, BK]`` block at a time. Two passes over the key blocks (:func:`_first_pass`,
    :func:`_second_pass`), each a ``lax.fori_loop`` (not unrolled in Python: module docstring), each array in
    registers ``[C, BK]`` float32 (32 registers a thread), none ``[C, K]``. So ``2 + 10 K / BK`` wgmmas of
    ``64 × 64 × 64`` (22 at ``K = 128``: the tensor-core work of the unblocked form with the same split), and
    about six ``[C, BK]`` float32 arrays live at most (``b``, ``x = q ⊙ dQ_c``, ``dK_c``, an accumulator, an
    exponential, a reloaded ``q`` or ``k``: some 200 of a thread's 255 registers, at any ``K``; the unblocked
    form held ``q, k, b, dQ, dK`` as ``[C, K]`` arrays, 320 registers at ``K = 128``). ``e^{b − b_0}`` and
    ``e^{b_0 − b}`` are formed in both passes rather than held: registers are the scarce resource. SMEM, 212 KiB
    at ``K = 128``: 153.5 KiB for the whole kernel, then 48 KiB scoped to the first pass (a state block pair,
    ``K ⊙ e^{b_C − b}``) or 56 KiB to the second (remainders, ``U``, output buffers). HBM: each input tile and
    state read once, each result written once, as in the sub-chunk forms."""
    ops, mgpu, W, C, K, BV, BK, nk = whole_chunk_dims(d, interpret)
    f32 = jnp.float32
    assert BV == BK, "dV leaves through the [C, BK] output buffers"

    def kernel(q_ref, k_ref, v_ref, b_ref, do_ref, h_ref, dso_ref, dq_ref, dk_ref, dv_ref, dg_ref, *smem):
        smem = _WholeChunkSmem(*smem)
        ib, ih, iv, n = (lax.axis_index(a) for a in ("b", "h", "v", "n"))
        rows, cols = pl.ds(n * C, C), pl.ds(iv * BV, BV)
        p = _Program(ops, dtype, C, BV, BK, nk, (ib, ih, iv, n, rows, cols), smem)
        q_s, k_s, b_s, b0_s, bc_s, v_s, do_s, ready = (smem.q_s, smem.k_s, smem.b_s, smem.b0_s, smem.bc_s,
                                                       smem.v_s, smem.do_s, smem.ready)
        for c in range(nk):  # key block c: columns c BK … c BK + BK − 1
            keys = pl.ds(c * BK, BK)
            for src, dst in ((tokens(q_ref, ib, ih, rows, keys), q_s.at[c]),
                             (tokens(k_ref, ib, ih, rows, keys), k_s.at[c]),
                             (b_ref.at[ib, ih, rows, keys], b_s.at[c]), (b_ref.at[ib, ih, n * C, keys], b0_s.at[c]),
                             (b_ref.at[ib, ih, n * C + C - 1, keys], bc_s.at[c])):
                mgpu.copy_gmem_to_smem(src, dst, ready.at[0])
        mgpu.copy_gmem_to_smem(tokens(v_ref, ib, ih, rows, cols), v_s, ready.at[0])
        mgpu.copy_gmem_to_smem(tokens(do_ref, ib, ih, rows, cols), do_s, ready.at[0])

        def tile(rows_, dt):
            return mgpu.SMEM((rows_, BK), dt, transforms=transforms(dt, BK))

        dv = pl.run_scoped(functools.partial(_first_pass, p, h_ref, dso_ref, scale), tile(BV, f32), tile(BV, f32),
                           mgpu.SMEM((nk, C, BK), dtype, transforms=transforms(dtype, BK)))
        smem.a_s[...] = causal(ops, ops.matmul_nt(do_s, v_s, (C, C))).astype(dtype)  # A has been read
        mgpu.commit_smem()
        pl.run_scoped(functools.partial(_second_pass, p, (dq_ref, dk_ref, dv_ref, dg_ref), scale, dv),
                      tile(C, dtype), tile(C, dtype), mgpu.SMEM((C, C), dtype, transforms=transforms(dtype, C)),
                      mgpu.SMEM((2, C, BK), f32, transforms=transforms(f32, BK)))

    return kernel, _whole_chunk_grad_scratch(nk, C, BV, BK, dtype)


class _WholeChunkSmem(NamedTuple):
    """The SMEM of :func:`_whole_chunk_grad_kernel` (:func:`_whole_chunk_grad_scratch`), key blocks indexed by
    ``c``."""
    q_s: Any      # q, k and b of the chunk
    k_s: Any
    b_s: Any
    b0_s: Any     # b_0, its first row, and b_C, its last
    bc_s: Any
    sds_s: Any    # Σ_v S ⊙ dS
    v_s: Any
    do_s: Any
    hb_s: Any     # Sᵀ and dSᵀ, bf16 operands
    dsb_s: Any
    xq_s: Any     # Q̃ and K̃, bf16 parts
    xk_s: Any
    a_s: Any      # scale A, then dA
    ready: Any
    state_ready: Any


class _Program(NamedTuple):
    """What both passes of :func:`_whole_chunk_grad_kernel` share: its ops and sizes, its place (the indices
    ``(ib, ih, iv, n)``, its tokens ``rows`` and value columns ``cols``) and its SMEM."""
    ops: Any
    dtype: Any
    C: int
    BV: int       # = BK
    BK: int
    nk: int
    at: tuple
    smem: _WholeChunkSmem

    def row(self, r_s, c):  # b_0 or b_C of key block c, [BK]
        return self.ops.load(r_s.at[c], self.ops.mgpu.Layout.WGMMA.reduce(0))

    def wide(self, x):  # a [BK] row broadcast to every token, [C, BK]
        return lax.broadcast_in_dim(x, (self.C, self.BK), [1])

    def load(self, x_s, c):  # key block c of q or k as float32 [C, BK]
        return self.ops.load(x_s.at[c], self.ops.mgpu.Layout.WGMMA).astype(jnp.float32)


def _first_pass(p: _Program, h_ref, dso_ref, scale, s_s, ds_s, xs_s):
    """The first pass over the key blocks: per block ``c``, ``Sᵀ_c``, ``dSᵀ_c`` (TMA, into ``s_s``, ``ds_s``) to
    bf16 SMEM operands and ``Σ_v S_c ⊙ dS_c`` to a row of SMEM (for the second pass); ``Q̃_c``, ``K̃_c`` and
    ``K_c ⊙ e^{b_C − b_c}`` (``xs_s``) to bf16 SMEM blocks. Then ``scale A`` to SMEM (``K / BK`` wgmmas into one
    accumulator) and the returned ``dV`` (``K / BK + 1``)."""
    ops, mgpu, W, dtype = p.ops, p.ops.mgpu, p.ops.mgpu.Layout.WGMMA, p.dtype
    C, BV, BK, nk = p.C, p.BV, p.BK, p.nk
    ib, ih, _, n, _, cols = p.at
    b_s, b0_s, bc_s, sds_s, do_s, hb_s, dsb_s, xq_s, xk_s, a_s = (
        p.smem.b_s, p.smem.b0_s, p.smem.bc_s, p.smem.sds_s, p.smem.do_s, p.smem.hb_s, p.smem.dsb_s, p.smem.xq_s,
        p.smem.xk_s, p.smem.a_s)
    q_s, k_s, ready, state_ready = p.smem.q_s, p.smem.k_s, p.smem.ready, p.smem.state_ready
    row, wide, load = p.row, p.wide, p.load

    def fetch(c):
        keys = pl.ds(c * BK, BK)
        mgpu.copy_gmem_to_smem(h_ref.at[ib, ih, n, cols, keys], s_s, state_ready.at[c])
        mgpu.copy_gmem_to_smem(dso_ref.at[ib, ih, n, cols, keys], ds_s, state_ready.at[c])

    def block(c, carry):  # key block c
        mgpu.barrier_wait(state_ready.at[c])
        St, dSt = ops.load(s_s, W), ops.load(ds_s, W)
        hb_s.at[c][...] = St.astype(dtype)
        dsb_s.at[c][...] = dSt.astype(dtype)
        sds_s.at[c][...] = jnp.sum(St * dSt, axis=0)
        b, b0 = ops.load(b_s.at[c], W), wide(row(b0_s, c))
        xq_s.at[c][...] = (load(q_s, c) * jnp.exp(b - b0)).astype(dtype)                # exponents ≤ 0
        xk_s.at[c][...] = (load(k_s, c) * jnp.exp(b0 - b)).astype(dtype)                # in [0, SAFE_DECAY]
        xs_s.at[c][...] = (load(k_s, c) * jnp.exp(wide(row(bc_s, c)) - b)).astype(dtype)  # ≤ 0
        mgpu.commit_smem()  # a warpgroup barrier: every thread has read s_s and ds_s

        @pl.when(c + 1 < nk)
        def _():
            fetch(c + 1)

        return carry

    fetch(0)
    mgpu.barrier_wait(ready.at[0])
    lax.fori_loop(0, nk, block, 0)
    A = ops.matmul_nt_blocks([(xq_s.at[c], xk_s.at[c]) for c in range(nk)], (C, C))
    a_s[...] = (scale * causal(ops, A)).astype(dtype)
    mgpu.commit_smem()
    dv = ops.matmul_nt_blocks([(xs_s.at[c], dsb_s.at[c]) for c in range(nk)], (C, BV))
    return dv + ops.matmul_tn(a_s, do_s, (C, BV))


def _second_pass(p: _Program, out_refs, scale, dv, xl_s, yl_s, u_s, out_s):
    """The second pass, once ``dA`` is in SMEM: ``dV`` leaves; then per key block ``c``: ``Q̃_c``'s and ``K̃_c``'s
    bf16 remainders (``yl_s``, ``xl_s``), ``dQ_c`` (three wgmmas), ``dK_c`` (three) and ``dg_c`` (two, ``U`` in
    ``u_s``), each stored to HBM as soon as it is finished, through the two float32 buffers of ``out_s`` in
    turn."""
    ops, mgpu, W, C, BK, nk, dtype = p.ops, p.ops.mgpu, p.ops.mgpu.Layout.WGMMA, p.C, p.BK, p.nk, p.dtype
    ib, ih, iv, _, rows, cols = p.at
    dq_ref, dk_ref, dv_ref, dg_ref = out_refs
    b_s, b0_s, bc_s, sds_s, v_s, do_s, hb_s, dsb_s, xq_s, xk_s, a_s = (
        p.smem.b_s, p.smem.b0_s, p.smem.bc_s, p.smem.sds_s, p.smem.v_s, p.smem.do_s, p.smem.hb_s, p.smem.dsb_s,
        p.smem.xq_s, p.smem.xk_s, p.smem.a_s)
    q_s, k_s = p.smem.q_s, p.smem.k_s
    row, wide, load = p.row, p.wide, p.load

    def send(i, ref, value):  # result i of this pass to HBM through the two output buffers in turn
        buf = out_s.at[i % 2]
        mgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this buffer's previous store has read it
        buf[...] = value
        mgpu.commit_smem()
        mgpu.copy_smem_to_gmem(buf, ref)

    def block(c, carry):  # key block c: dQ_c, dK_c, dg_c
        keys = pl.ds(c * BK, BK)
        b, b0, bC = ops.load(b_s.at[c], W), row(b0_s, c), row(bc_s, c)
        yl_s[...] = two_parts(load(q_s, c) * jnp.exp(b - wide(b0)), dtype)[1]  # the remainders of Q̃_c, K̃_c
        xl_s[...] = two_parts(load(k_s, c) * jnp.exp(wide(b0) - b), dtype)[1]
        mgpu.commit_smem()
        dq = scale * ops.matmul(do_s, hb_s.at[c], (C, BK)) * jnp.exp(b)
        dq = dq + scale * ops.matmul(a_s, xk_s.at[c], (C, BK), lo=xl_s) * jnp.exp(b - wide(b0))
        send(1 + 3 * c, dq_ref.at[ib, ih, iv, rows, keys], dq)
        x = load(q_s, c) * dq  # x = q ⊙ dq − k ⊙ dk takes dq's registers
        dk = ops.matmul(v_s, dsb_s.at[c], (C, BK)) * jnp.exp(wide(bC) - b)
        kappa = jnp.sum(load(k_s, c) * dk, axis=0)
        dk = dk + scale * ops.matmul_tn(a_s, xq_s.at[c], (C, BK), lo=yl_s) * jnp.exp(wide(b0) - b)
        send(2 + 3 * c, dk_ref.at[ib, ih, iv, rows, keys], dk)
        xl_s[...], yl_s[...] = two_parts(x - load(k_s, c) * dk, dtype)  # the remainders' wgmmas are done
        mgpu.commit_smem()
        dgamma = jnp.exp(bC) * row(sds_s, c) + kappa  # the explicit gradient of the chunk's decay b_C
        dg = ops.matmul(u_s, xl_s, (C, BK), lo=yl_s) + wide(dgamma)
        send(3 + 3 * c, dg_ref.at[ib, ih, iv, rows, keys], dg)
        return carry

    u_s[...] = triangle_ones(ops, C, dtype)
    send(0, tokens(dv_ref, ib, ih, rows, cols), dv)
    lax.fori_loop(0, nk, block, 0)
    mgpu.wait_smem_to_gmem(0)


def _whole_chunk_grad_scratch(nk, C, BV, BK, dtype):
    """The SMEM of :func:`_whole_chunk_grad_kernel`, in the order of :class:`_WholeChunkSmem`."""
    mgpu, sw, f32 = compat.mosaic_gpu(), transforms, jnp.float32

    def blocks(rows, dt):
        return key_blocks(nk, rows, BK, dt)

    return [
        *whole_chunk_inputs(nk, C, BK, dtype),                   # q, k, b, b_0 (the chunk's first row)
        mgpu.SMEM((nk, BK), f32),                                # b_C, its last
        mgpu.SMEM((nk, BK), f32),                                # Σ_v S ⊙ dS
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),     # v
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),     # do
        blocks(BV, dtype),                                       # Sᵀ (bf16 operand)
        blocks(BV, dtype),                                       # dSᵀ (bf16 operand)
        blocks(C, dtype),                                        # Q̃ = Q ⊙ e^{b − b_0}, bf16 part
        blocks(C, dtype),                                        # K̃ = K ⊙ e^{b_0 − b}, bf16 part
        mgpu.SMEM((C, C), dtype, transforms=sw(dtype, C)),       # scale A, then dA
        mgpu.Barrier(num_arrivals=5 * nk + 2, num_barriers=1),
        mgpu.Barrier(num_arrivals=2, num_barriers=nk),
    ]


# ---------------------------------------------------------------- the launcher interface

def chunk_bwd(q, k, v, b, do, h, dso, *, chunk_size, scale, interpret=False, exact=None, whole_chunk=None):
    """``dq, dk`` (float32 partials per value block ``[B, H, NV, T, K]``), ``dv`` (float32 ``[B, T, H, V]``) and
    the gate gradient's partials ``[B, H, NV, T, K]``, one program per chunk and value block (:func:`_grad_kernel`);
    the forms and ``exact``, ``whole_chunk`` as for :func:`~gla_ref.pallas.launchers.mosaic_gpu.output.chunk_fwd_o`."""
    check_supported(q.dtype, q.shape[-1], chunk_size)
    b, scalar = per_key(b, q.shape[-1])
    d = dims_of(q, v, chunk_size)
    mgpu = compat.mosaic_gpu()
    part = jax.ShapeDtypeStruct((d.B, d.H, d.NV, d.N * d.C, d.K), jnp.float32)

    def call(exact, whole):
        kernel, scratch = _grad_kernel(d, q.dtype, scale=scale, interpret=interpret, scalar=scalar, exact=exact,
                                       whole=whole)
        run = mgpu.kernel(kernel, out_type=[part, part, jax.ShapeDtypeStruct(v.shape, jnp.float32), part],
                          scratch_types=scratch, grid=(d.B, d.H, d.NV, d.N), grid_names=("b", "h", "v", "n"),
                          compiler_params=mgpu.CompilerParams(), interpret=interpret_params(interpret),
                          kernel_name="gla_chunk_bwd_mgpu")
        return tuple(run(q, k, v, b, do, h, dso))

    dq, dk, dv, dg = by_forms(b, scalar, chunk_size, call, exact, whole_chunk)
    return dq, dk, dv, gate_width(dg, scalar)
