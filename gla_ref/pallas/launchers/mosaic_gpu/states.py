"""Step 2 of the forward on Mosaic GPU, and its backward: the chunk-state recurrence in one sequential kernel.

:func:`state_fwd` writes the state entering each chunk, ``h``, and the final state; :func:`state_bwd` the
gradient of the state leaving each chunk, ``dso``, and ``dh0``. Both are :func:`state_kernel`, run forwards
or backwards; the fused path (:mod:`gla_ref.pallas.launchers.mosaic_gpu.fused`) is the same loop with a
per-chunk body (:class:`Loop`).

Grid and ownership: ``(B, H, NV)``, one program per batch, head and block of ``BV = 64`` value columns (the
M of a ``wgmma`` is 64 rows per warpgroup). The program owns the transposed state ``Sᵀ [BV, K]`` in float32
registers for the whole sequence and walks the chunks in order (backwards for :func:`state_bwd`). Per chunk
of ``C`` tokens:

1. wait for the chunk's ``x [C, K]``, ``y [C, BV]``, ``b [C, K]`` and its last row ``b_C [K]`` in SMEM
   (one barrier per buffer);
2. write the state entering the chunk to HBM (registers → SMEM → TMA store, not waited for);
3. scale the keys (``x ⊙ e^{b_C − b}``; for the backward ``scale · x ⊙ e^{b}``, exponents ≤ 0) in
   registers and store them, as the input dtype, to SMEM;
4. ``Sᵀ ← e^{b_C} ⊙ Sᵀ + yᵀ x̃``: one ``wgmma`` of ``M = BV``, ``N = K``, contraction ``C``, ``yᵀ`` read
   through a transposed view of the SMEM tile (no copy).

Pipelining: the tiles of chunk ``n + 1`` are copied by TMA into the second half of a double buffer while
chunk ``n`` computes (step 1 of the next chunk waits on that copy), so the loop is bound by the tensor cores
and ``exp`` rather than by HBM latency.

HBM traffic per program: ``x``, ``b`` once (``C·K`` each per chunk, ``b`` in float32) and the value block of
``y``, plus the states written out (``BV·K`` per chunk: float32, or in the forward the input dtype): the
bytes of the Triton-backend kernels, less the states' half in the forward.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from gla_ref.pallas import compat
from gla_ref.pallas.launchers.common import Dims
from gla_ref.pallas.launchers.mosaic_gpu.common import (Ops, check_supported, dims_of, interpret_params, per_key,
                                                        tokens, transforms)

class Loop(NamedTuple):
    """What the state kernel's loop hands a fused path's per-chunk ``body(env, S)``, called once the chunk's
    tiles are in SMEM and before the state moves past the chunk (``S``: the state entering it, or for a
    reverse loop the gradient of the state leaving it)."""
    ops: Any
    ib: Any
    ih: Any
    iv: Any
    n: Any              # the chunk
    rows: Any           # its tokens, pl.ds
    cols: Any           # the program's value columns, pl.ds
    x: Any              # SMEM tiles of this chunk: the loop's x [C, K], y [C, BV], b [C, K] float32, b_C [K]
    y: Any
    b: Any
    bc: Any
    extra: tuple        # the body's own input tiles, [C, K] or [C, BV]
    outs: tuple         # the body's output refs (HBM)
    scratch: tuple      # the body's SMEM scratch


def state_kernel(d: Dims, dtype, *, reverse, scale, has_init, want_final, interpret, write_states=True,
                 states_dtype=jnp.float32, extra=(), n_out=0, body=None, body_scratch=()):
    """The recurrence ``Sᵀ ← e^{b_C} ⊙ Sᵀ + yᵀ x̃`` over a head's chunks, writing the state entering
    each chunk (forward: ``x̃ = x ⊙ e^{b_C − b}``, chunks in order; ``reverse``: ``x̃ = scale · x ⊙ e^{b}``,
    chunks from last to first, the gradient recurrence of :func:`gla_ref.pallas.chunk_math.state_grad_update`).

    The fused kernels are this loop with a per-chunk ``body`` (see :class:`Loop`): ``extra`` names the
    body's own input tiles (``"k"``: ``[C, K]`` rows, ``"v"``: ``[C, BV]`` of the program's value columns),
    double-buffered and fetched with the loop's own; ``n_out`` output refs follow the loop's; and
    ``write_states=False`` keeps the states in registers (only the final one may leave).

    The states written per chunk leave as ``states_dtype``: float32, or the input dtype for a consumer that
    rounds them to it anyway (the forward's output kernel, :func:`state_fwd`), through an SMEM buffer of their
    own (the float32 one keeps the initial and the final state)."""
    ops = Ops(interpret)
    mgpu = ops.mgpu
    C, BV, N = d.C, d.BV, d.N
    n_extra = len(extra)
    n_own = 9 if write_states and states_dtype != jnp.float32 else 8  # the scratch of the loop itself

    def chunk_of(s):
        return N - 1 - s if reverse else s

    def kernel(*refs):
        x_ref, y_ref, b_ref = refs[:3]
        extra_refs, refs = refs[3:3 + n_extra], refs[3 + n_extra:]
        s0_ref, refs = _optional(refs, has_init)
        states_ref, refs = _optional(refs, write_states)
        final_ref, refs = _optional(refs, want_final)
        outs, refs = refs[:n_out], refs[n_out:]
        x_s, y_s, b_s, bc_s, xd_s, st_s, ready, init_ready, *out_s = refs[:n_own]
        extra_s, own_scratch = refs[n_own:n_own + n_extra], refs[n_own + n_extra:]
        hs_s = out_s[0] if out_s else st_s  # the per-chunk states' way out
        ib, ih, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
        cols = pl.ds(iv * BV, BV)

        def fetch(s, slot):  # TMA copies of chunk s's tiles into one half of the double buffer
            n = chunk_of(s)
            rows = pl.ds(n * C, C)
            mgpu.copy_gmem_to_smem(tokens(x_ref, ib, ih, rows), x_s.at[slot], ready.at[slot])
            mgpu.copy_gmem_to_smem(tokens(y_ref, ib, ih, rows, cols), y_s.at[slot], ready.at[slot])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, rows], b_s.at[slot], ready.at[slot])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, n * C + C - 1], bc_s.at[slot], ready.at[slot])
            for kind, ref, dst in zip(extra, extra_refs, extra_s):
                src = tokens(ref, ib, ih, rows, None if kind == "k" else cols)
                mgpu.copy_gmem_to_smem(src, dst.at[slot], ready.at[slot])

        fetch(0, 0)
        S = _initial_state(ops, None if s0_ref is None else s0_ref.at[ib, ih, cols], st_s, init_ready)

        def step(s, S):
            slot = lax.rem(s, 2)

            @pl.when(s + 1 < N)
            def _():
                fetch(s + 1, 1 - slot)

            mgpu.barrier_wait(ready.at[slot])
            if states_ref is not None:
                mgpu.wait_smem_to_gmem(0)  # the previous chunk's state has left hs_s
                hs_s[...] = S.astype(states_dtype)
                mgpu.commit_smem()
                mgpu.copy_smem_to_gmem(hs_s, states_ref.at[ib, ih, chunk_of(s), cols])
            if body is not None:
                n = chunk_of(s)
                body(Loop(ops, ib, ih, iv, n, pl.ds(n * C, C), cols, x_s.at[slot], y_s.at[slot], b_s.at[slot],
                          bc_s.at[slot], tuple(e.at[slot] for e in extra_s), tuple(outs), tuple(own_scratch)), S)
            return advance(ops, S, x_s.at[slot], y_s.at[slot], b_s.at[slot], bc_s.at[slot], xd_s, reverse=reverse,
                           scale=scale)

        S = lax.fori_loop(0, N, step, S)
        if final_ref is not None:
            mgpu.wait_smem_to_gmem(0)
            st_s[...] = S
            mgpu.commit_smem()
            mgpu.copy_smem_to_gmem(st_s, final_ref.at[ib, ih, cols])
        mgpu.wait_smem_to_gmem(0)

    own_states = states_dtype if n_own > 8 else None  # a buffer of their own
    return kernel, _state_scratch(d, dtype, extra, own_states) + list(body_scratch)


def _optional(refs, present):
    """``(refs[0], refs[1:])`` where an optional ref is ``present``, else ``(None, refs)``."""
    return (refs[0], refs[1:]) if present else (None, refs)


def _initial_state(ops, s0, st_s, ready):
    """The state the loop starts from, float32 ``Sᵀ [BV, K]`` in registers: the block ``s0`` of the initial
    state in HBM, by TMA through the SMEM tile ``st_s``, or zeros where there is none."""
    mgpu, W = ops.mgpu, ops.mgpu.Layout.WGMMA
    if s0 is not None:
        mgpu.copy_gmem_to_smem(s0, st_s, ready.at[0])
        mgpu.barrier_wait(ready.at[0])
        return ops.load(st_s, W)
    return ops.cast(jnp.zeros(st_s.shape, jnp.float32), W)


def advance(ops, S, x_s, y_s, b_s, bc_s, xd_s, *, reverse, scale):
    """One chunk's step of the recurrence, ``Sᵀ ← e^{b_C} ⊙ Sᵀ + yᵀ x̃`` (:func:`chunk_math.state_update`, or
    :func:`chunk_math.state_grad_update` ``reverse``), from the chunk's tiles in SMEM: ``x̃`` (``x ⊙ e^{b_C − b}``,
    or ``scale · x ⊙ e^{b}``; exponents ≤ 0) is formed in registers and stored to ``xd_s`` as the input dtype, and
    ``yᵀ x̃`` is one wgmma, ``yᵀ`` a transposed view of its tile."""
    mgpu, W = ops.mgpu, ops.mgpu.Layout.WGMMA
    (C, K), BV = x_s.shape, y_s.shape[-1]
    b = ops.load(b_s, W)
    bC = ops.load(bc_s, W.reduce(0))
    x = ops.load(x_s, W).astype(jnp.float32)
    if reverse:
        xd = scale * x * jnp.exp(b)
    else:
        xd = x * jnp.exp(lax.broadcast_in_dim(bC, (C, K), [1]) - b)
    xd_s[...] = xd.astype(xd_s.dtype)
    mgpu.commit_smem()
    update = ops.matmul_tn(y_s, xd_s, (BV, K))
    return S * lax.broadcast_in_dim(jnp.exp(bC), (BV, K), [1]) + update


def _state_scratch(d: Dims, dtype, extra, states_dtype=None):
    """The state kernel's own SMEM: double buffers of ``x``, ``y``, ``b`` and ``b_C``, the scaled ``x̃``, the
    float32 state's way in and out, the barriers; a buffer of its own for states written as ``states_dtype``
    (where given), and double buffers of the ``extra`` input tiles of a fused body."""
    mgpu = compat.mosaic_gpu()
    C, K, BV = d.C, d.K, d.BV
    width = {"k": K, "v": BV}
    scratch = [
        mgpu.SMEM((2, C, K), dtype, transforms=transforms(dtype, K)),
        mgpu.SMEM((2, C, BV), dtype, transforms=transforms(dtype, BV)),
        mgpu.SMEM((2, C, K), jnp.float32, transforms=transforms(jnp.float32, K)),
        mgpu.SMEM((2, K), jnp.float32),
        mgpu.SMEM((C, K), dtype, transforms=transforms(dtype, K)),
        mgpu.SMEM((BV, K), jnp.float32, transforms=transforms(jnp.float32, K)),
        mgpu.Barrier(num_arrivals=4 + len(extra), num_barriers=2),
        mgpu.Barrier(num_arrivals=1, num_barriers=1),
    ]
    if states_dtype is not None:
        scratch.append(mgpu.SMEM((BV, K), states_dtype, transforms=transforms(states_dtype, K)))
    return scratch + [mgpu.SMEM((2, C, width[kind]), dtype, transforms=transforms(dtype, width[kind])) for kind in extra]


def state_call(x, y, b, s0, *, chunk_size, reverse, scale, want_final, interpret, name, write_states=True,
               states_dtype=jnp.float32, extra=(), body=None, body_outs=(), body_scratch=()):
    """Run :func:`state_kernel` on the grid ``(B, H, NV)``; returns the per-chunk states (or None; as
    ``states_dtype``), the final state (or None; float32) and the body's outputs (``extra``: ``(kind, array)``
    pairs)."""
    check_supported(x.dtype, x.shape[-1], chunk_size)
    b, _ = per_key(b, x.shape[-1])
    d = dims_of(x, y, chunk_size)
    mgpu = compat.mosaic_gpu()
    body_outs = list(body_outs(d) if callable(body_outs) else body_outs)
    kernel, scratch = state_kernel(d, x.dtype, reverse=reverse, scale=scale, has_init=s0 is not None,
                                   want_final=want_final, interpret=interpret, write_states=write_states,
                                   states_dtype=states_dtype, extra=tuple(kind for kind, _ in extra),
                                   n_out=len(body_outs), body=body,
                                   body_scratch=body_scratch(d) if callable(body_scratch) else body_scratch)
    out = [jax.ShapeDtypeStruct((d.B, d.H, d.N, d.V, d.K), states_dtype)] if write_states else []
    if want_final:
        out.append(jax.ShapeDtypeStruct((d.B, d.H, d.V, d.K), jnp.float32))
    out += body_outs
    call = mgpu.kernel(kernel, out_type=out, scratch_types=scratch, grid=(d.B, d.H, d.NV),
                       grid_names=("b", "h", "v"), compiler_params=mgpu.CompilerParams(),
                       interpret=interpret_params(interpret), kernel_name=name)
    args = [x, y, b] + [a for _, a in extra] + ([s0] if s0 is not None else [])
    outs = list(call(*args))
    states = outs.pop(0) if write_states else None
    final = outs.pop(0) if want_final else None
    return states, final, tuple(outs)


def state_fwd(k, v, b, h0, *, chunk_size, want_final, interpret=False, states_dtype=jnp.float32):
    """States entering each chunk ``h [B, H, N, V, K]`` (transposed, as ``states_dtype``) and the final state
    (float32, or None), from ``k [B, T, H, K]``, ``v [B, T, H, V]`` (``common.TOKEN_MAJOR``) and the gates
    ``b [B, H, T, K]``. The forward asks for the states in the input dtype: ``output.chunk_fwd_o`` rounds them to it
    as a wgmma operand anyway, so ``o`` is the same to the bit and the states take half the bytes to write and to
    read (as FLA keeps them); the backward recomputes them in float32, where ``Σ_v S ⊙ dS`` uses them unrounded."""
    return state_call(k, v, b, h0, chunk_size=chunk_size, reverse=False, scale=1.0, want_final=want_final,
                      interpret=interpret, name="gla_state_fwd_mgpu", states_dtype=states_dtype)[:2]


def state_bwd(q, b, do, dht, *, chunk_size, scale, want_dh0, interpret=False):
    """Gradients w.r.t. the state leaving each chunk ``[B, H, N, V, K]`` and w.r.t. h0 (or None)."""
    return state_call(q, do, b, dht, chunk_size=chunk_size, reverse=True, scale=scale, want_final=want_dh0,
                      interpret=interpret, name="gla_state_bwd_mgpu")[:2]
