"""Pallas launchers on Mosaic GPU (Hopper, sm_90): the state recurrences as warpgroup kernels.

Status (read this first). Checked in the Mosaic GPU interpreter on a CPU and lowered for CUDA
(``jax.export`` with ``platforms=["cuda"]``); **not yet run on a GPU**, so it is not chosen
automatically: ``chunk_gla(..., launcher="mosaic_gpu")`` asks for it. Of the four kernels of the
non-fused path, the two that walk the sequence are Mosaic GPU kernels here:

* :func:`state_fwd` (the states entering each chunk, ``h``, and the final state), and
* :func:`state_bwd` (the gradient of the state leaving each chunk, ``dso``, and ``dh0``);

the two kernels that are parallel over chunks, :func:`chunk_fwd_o` and :func:`chunk_bwd`, still run
on the Triton backend (:mod:`gla_ref.pallas.gpu`, same layout, same chunk math). Their diagonal
16 × 16 tiles hold a per-channel decay inside a matmul, which the shared chunk math computes one
key column at a time from rows picked out of registers; Mosaic GPU reads a row of a swizzled SMEM
tile only at a static index, so that step needs its own formulation before it can move here.
The fused path (:func:`fused_fwd`, :func:`fused_bwd`) is not written for Mosaic GPU yet and raises.

What a program is. Mosaic GPU runs one *warpgroup* (4 warps, 128 threads) per program; arrays in
a kernel are distributed over the warpgroup's registers in a layout (``WGMMA``: the accumulator
layout of the tensor-core instruction), and every matmul is a ``wgmma``: operands in shared memory
(SMEM, swizzled so the tensor cores read them without bank conflicts), accumulator in registers.

Grid and ownership. The state kernel runs on the grid ``(B, H, NV)``, one program per batch,
head and block of ``BV = 64`` value columns (the M of a ``wgmma`` is 64 rows per warpgroup). The
program owns the transposed state ``Sᵀ [BV, K]`` in float32 registers for the whole sequence and
walks the chunks in order (backwards for :func:`state_bwd`). Per chunk of ``C`` tokens:

1. wait for the chunk's ``x [C, K]``, ``y [C, BV]``, ``b [C, K]`` and its last row ``b_C [K]`` in
   SMEM (one barrier per buffer);
2. write the state entering the chunk to HBM (registers → SMEM → TMA store, not waited for);
3. scale the keys (``x ⊙ e^{b_C − b}``; for the backward ``scale · x ⊙ e^{b}``, exponents ≤ 0)
   in registers and store them, as the input dtype, to SMEM;
4. ``Sᵀ ← e^{b_C} ⊙ Sᵀ + yᵀ x̃``: one ``wgmma`` of ``M = BV``, ``N = K``, contraction ``C``,
   ``yᵀ`` read through a transposed view of the SMEM tile (no copy).

Pipelining: the tiles of chunk ``n + 1`` are copied by TMA into the second half of a double
buffer while chunk ``n`` computes (step 1 of the next chunk waits on that copy), so the loop is
bound by the tensor cores and ``exp`` rather than by HBM latency.

HBM traffic per program: ``x``, ``b`` once (``C·K`` each per chunk, ``b`` in float32) and the value
block of ``y``, plus the states written out (``BV·K`` float32 per chunk): the same bytes as the
Triton-backend kernel, since both read each tile once.

Dtypes: bfloat16 only. A ``wgmma`` reads float32 operands as tf32 (10-bit mantissa, less than the
float32 path of the other launchers promises), and tf32 ``wgmma`` only takes K-major operands, so
the transposed ``yᵀ`` view above is not available to it; float32 inputs raise a TypeError that
names this launcher. Accumulation and states are float32.

Sizes: ``K`` and ``V`` are padded to powers of two of at least 64 (a 128-byte swizzled row of
bfloat16, and the ``wgmma`` M of a warpgroup); ``C · K_pad ≤ 8192`` (chunk 64 with K up to 128)
keeps the double-buffered tiles within a Hopper SMEM, and ``C ≥ 64`` (a register tile of a warpgroup
has a multiple of 64 rows): chunk 64 is the one size that fits every K up to 128; the scalar-gate family (``Kg = 1``) is not
supported here yet.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from gla_ref.pallas import _compat, gpu

BLOCK_V = 64
"""Value columns per program: the M of one warpgroup's ``wgmma``."""
MIN_DIM = 64
"""``K`` and ``V`` are padded to at least this: a 128-byte swizzled bfloat16 row."""
MIN_CHUNK = 64
"""Smallest chunk: a ``[C, K]`` register array in the ``WGMMA`` layout has a multiple of 64 rows."""
MAX_TILE = 64 * 128
"""Largest ``C · K_pad``: the double-buffered ``[C, K]`` tiles and the ``[BV, K]`` state fit in SMEM."""
NAME = "mosaic_gpu"


def _pow2(x: int) -> int:
    return max(MIN_DIM, 1 << (x - 1).bit_length())


def padded_dims(K: int, V: int) -> tuple[int, int]:
    """``(K_pad, V_pad)``: powers of two, at least 64 (also what the Triton-backend kernels need)."""
    return _pow2(K), _pow2(V)


class Dims(NamedTuple):
    B: int
    H: int
    N: int
    C: int
    K: int
    V: int
    BV: int

    @property
    def NV(self):
        return self.V // self.BV


def check_supported(dtype, K_pad: int, scalar_gate: bool, chunk: int) -> None:
    """What this launcher cannot do yet raises here, before any kernel is traced."""
    if jnp.dtype(dtype) != jnp.bfloat16:
        raise TypeError(f"launcher='{NAME}' takes bfloat16 q, k, v, got {jnp.dtype(dtype).name}: its matmuls are "
                        "wgmma, which read float32 as tf32 and only K-major (the state update reads v transposed); "
                        "use launcher='gpu' for float32")
    if scalar_gate:
        raise ValueError(f"launcher='{NAME}' has no scalar-gate (g [B, T, H] or g_gamma) kernels yet; "
                         "use launcher='gpu'")
    if chunk < MIN_CHUNK:
        raise ValueError(f"launcher='{NAME}' needs chunk_size >= {MIN_CHUNK} (a [C, K] tile in registers is a "
                         f"multiple of a warpgroup's 64 rows), got chunk_size={chunk}")
    if chunk * K_pad > MAX_TILE:
        raise ValueError(f"launcher='{NAME}' needs chunk_size * K_pad <= {MAX_TILE} (SMEM), got chunk_size="
                         f"{chunk} and K_pad={K_pad}; use launcher='gpu' for K > {MAX_TILE // MIN_CHUNK}")


def check_call(q, g, chunk: int) -> None:
    """:func:`check_supported` for a public call's ``q [B, T, H, K]`` and gate ``g [B, T, H, Kg]``."""
    check_supported(q.dtype, _pow2(q.shape[-1]), g.shape[-1] != q.shape[-1], chunk)


def _dims(x, y, chunk):
    B, H, T, K = x.shape
    V = y.shape[-1]
    return Dims(B, H, T // chunk, chunk, K, V, min(BLOCK_V, V))


def _transforms(dtype, width):
    """Tiling + swizzle of an SMEM tile whose rows are ``width`` elements (wgmma and TMA read it)."""
    mgpu = _compat.mosaic_gpu()
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = mgpu.find_swizzle(width * bits)
    return mgpu.TilingTransform((8, swizzle * 8 // bits)), mgpu.SwizzleTransform(swizzle)


def _interpret_params(interpret):
    """``True`` → the Mosaic GPU interpreter's parameters; ``False`` stays False; params pass through."""
    if interpret is True:
        params = _compat.gpu_interpret_params()
        if params is None:
            raise ValueError(f"interpret=True with launcher='{NAME}' needs a JAX with the Mosaic GPU interpreter "
                             f"(jax {jax.__version__} has none)")
        return params
    return interpret


class _Ops:
    """The few operations whose form differs between compiled Mosaic GPU and its interpreter.

    Compiled, a register array gets an explicit layout (``plgpu.load(..., layout=)``,
    ``layout_cast``); the interpreter keeps arrays in their logical form and has no ``load``
    primitive, so there a plain ``ref[...]`` is the same read. A transposed operand is a
    ``transpose_ref`` view; JAX 0.10's interpreter cannot read such a view, so it gets a
    transposed copy in SMEM (the same values; the compiled kernel never makes it).
    """

    def __init__(self, interpret):
        self.interpret = bool(interpret)
        self.mgpu = _compat.mosaic_gpu()
        self.copy_transposed = self.interpret and not _compat.gpu_interpreter_reads_transposed_refs()

    def load(self, ref, layout):
        return ref[...] if self.interpret else self.mgpu.load(ref, (), layout=layout)

    def cast(self, x, layout):
        return x if self.interpret else self.mgpu.layout_cast(x, layout)

    def matmul_tn(self, a_ref, b_ref, shape):
        """``a_refᵀ @ b_ref`` (SMEM tiles ``[C, M]`` and ``[C, N]``) as one wgmma, float32 ``[M, N]``."""
        mgpu = self.mgpu

        def run(acc, a_t=None):
            if a_t is None:
                a_t = mgpu.transpose_ref(a_ref, (1, 0))
            else:
                a_t[...] = a_ref[...].T
                mgpu.commit_smem()
            mgpu.wgmma(acc, a_t, b_ref)
            return acc[...]

        if self.copy_transposed:  # an accumulator cannot share one scoped allocation with SMEM
            a_t_type = mgpu.SMEM(shape[:1] + a_ref.shape[:1], a_ref.dtype)
            return pl.run_scoped(lambda a_t: pl.run_scoped(lambda acc: run(acc, a_t), mgpu.ACC(shape, jnp.float32)),
                                 a_t_type)
        return pl.run_scoped(run, mgpu.ACC(shape, jnp.float32))


def _state_kernel(d: Dims, dtype, *, reverse, scale, has_init, want_final, interpret):
    """The recurrence ``Sᵀ ← e^{b_C} ⊙ Sᵀ + yᵀ x̃`` over a head's chunks, writing the state entering
    each chunk (forward: ``x̃ = x ⊙ e^{b_C − b}``, chunks in order; ``reverse``: ``x̃ = scale · x ⊙ e^{b}``,
    chunks from last to first, the gradient recurrence of :func:`gla_ref.pallas.chunk_math.state_grad_update`)."""
    ops = _Ops(interpret)
    mgpu = ops.mgpu
    W = mgpu.Layout.WGMMA
    C, K, BV, N = d.C, d.K, d.BV, d.N

    def chunk_of(s):
        return N - 1 - s if reverse else s

    def kernel(*refs):
        x_ref, y_ref, b_ref = refs[:3]
        refs = refs[3:]
        s0_ref = refs[0] if has_init else None
        refs = refs[1:] if has_init else refs
        states_ref = refs[0]
        final_ref = refs[1] if want_final else None
        x_s, y_s, b_s, bc_s, xd_s, st_s, ready, init_ready = refs[1 + want_final:]
        ib, ih, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
        cols = pl.ds(iv * BV, BV)

        def fetch(s, slot):  # TMA copies of chunk s's tiles into one half of the double buffer
            n = chunk_of(s)
            rows = pl.ds(n * C, C)
            mgpu.copy_gmem_to_smem(x_ref.at[ib, ih, rows], x_s.at[slot], ready.at[slot])
            mgpu.copy_gmem_to_smem(y_ref.at[ib, ih, rows, cols], y_s.at[slot], ready.at[slot])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, rows], b_s.at[slot], ready.at[slot])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, n * C + C - 1], bc_s.at[slot], ready.at[slot])

        fetch(0, 0)
        if s0_ref is not None:
            mgpu.copy_gmem_to_smem(s0_ref.at[ib, ih, cols], st_s, init_ready.at[0])
            mgpu.barrier_wait(init_ready.at[0])
            S = ops.load(st_s, W)
        else:
            S = ops.cast(jnp.zeros((BV, K), jnp.float32), W)

        def step(s, S):
            slot = lax.rem(s, 2)

            @pl.when(s + 1 < N)
            def _():
                fetch(s + 1, 1 - slot)

            mgpu.barrier_wait(ready.at[slot])
            mgpu.wait_smem_to_gmem(0)  # the previous chunk's state has left st_s
            st_s[...] = S
            mgpu.commit_smem()
            mgpu.copy_smem_to_gmem(st_s, states_ref.at[ib, ih, chunk_of(s), cols])
            b = ops.load(b_s.at[slot], W)
            bC = ops.load(bc_s.at[slot], W.reduce(0))
            x = ops.load(x_s.at[slot], W).astype(jnp.float32)
            if reverse:
                xd = scale * x * jnp.exp(b)
            else:
                xd = x * jnp.exp(lax.broadcast_in_dim(bC, (C, K), [1]) - b)
            xd_s[...] = xd.astype(dtype)
            mgpu.commit_smem()
            update = ops.matmul_tn(y_s.at[slot], xd_s, (BV, K))
            return S * lax.broadcast_in_dim(jnp.exp(bC), (BV, K), [1]) + update

        S = lax.fori_loop(0, N, step, S)
        if final_ref is not None:
            mgpu.wait_smem_to_gmem(0)
            st_s[...] = S
            mgpu.commit_smem()
            mgpu.copy_smem_to_gmem(st_s, final_ref.at[ib, ih, cols])
        mgpu.wait_smem_to_gmem(0)

    scratch = [
        mgpu.SMEM((2, C, K), dtype, transforms=_transforms(dtype, K)),
        mgpu.SMEM((2, C, BV), dtype, transforms=_transforms(dtype, BV)),
        mgpu.SMEM((2, C, K), jnp.float32, transforms=_transforms(jnp.float32, K)),
        mgpu.SMEM((2, K), jnp.float32),
        mgpu.SMEM((C, K), dtype, transforms=_transforms(dtype, K)),
        mgpu.SMEM((BV, K), jnp.float32, transforms=_transforms(jnp.float32, K)),
        mgpu.Barrier(num_arrivals=4, num_barriers=2),
        mgpu.Barrier(num_arrivals=1, num_barriers=1),
    ]
    return kernel, scratch


def _state_call(x, y, b, s0, *, chunk, reverse, scale, want_final, interpret, name):
    check_supported(x.dtype, x.shape[-1], b.shape[-1] != x.shape[-1], chunk)
    d = _dims(x, y, chunk)
    mgpu = _compat.mosaic_gpu()
    kernel, scratch = _state_kernel(d, x.dtype, reverse=reverse, scale=scale, has_init=s0 is not None,
                                    want_final=want_final, interpret=interpret)
    out = [jax.ShapeDtypeStruct((d.B, d.H, d.N, d.V, d.K), jnp.float32)]
    if want_final:
        out.append(jax.ShapeDtypeStruct((d.B, d.H, d.V, d.K), jnp.float32))
    call = mgpu.kernel(kernel, out_type=out, scratch_types=scratch, grid=(d.B, d.H, d.NV),
                       grid_names=("b", "h", "v"), compiler_params=mgpu.CompilerParams(),
                       interpret=_interpret_params(interpret), kernel_name=name)
    args = [x, y, b] + ([s0] if s0 is not None else [])
    outs = call(*args)
    return outs[0], (outs[1] if want_final else None)


# ---------------------------------------------------------------- the launcher interface

def state_fwd(k, v, b, h0, *, chunk, want_final, interpret=False):
    """States entering each chunk ``h [B, H, N, V, K]`` (float32, transposed) and the final state (or None)."""
    return _state_call(k, v, b, h0, chunk=chunk, reverse=False, scale=1.0, want_final=want_final,
                       interpret=interpret, name="gla_state_fwd_mgpu")


def state_bwd(q, b, do, dht, *, chunk, scale, want_dh0, interpret=False):
    """Gradients w.r.t. the state leaving each chunk ``[B, H, N, V, K]`` and w.r.t. h0 (or None)."""
    return _state_call(q, do, b, dht, chunk=chunk, reverse=True, scale=scale, want_final=want_dh0,
                       interpret=interpret, name="gla_state_bwd_mgpu")


def _triton_interpret(interpret):
    return bool(interpret)


def chunk_fwd_o(q, k, v, b, h, *, chunk, scale, interpret=False):
    """The output, one program per chunk: the Triton-backend kernel for now (see the module docstring)."""
    return gpu.chunk_fwd_o(q, k, v, b, h, chunk=chunk, scale=scale, interpret=_triton_interpret(interpret))


def chunk_bwd(q, k, v, b, do, h, dso, *, chunk, scale, interpret=False):
    """``dq, dk, dv`` and the chunk-local gate gradient: the Triton-backend kernel for now."""
    return gpu.chunk_bwd(q, k, v, b, do, h, dso, chunk=chunk, scale=scale, interpret=_triton_interpret(interpret))


def _no_fused(*args, **kwargs):
    raise ValueError(f"launcher='{NAME}' has no fused kernels yet: use chunk_gla with launcher='{NAME}', "
                     "or fused_chunk_gla with launcher='gpu'")


fused_fwd = functools.wraps(gpu.fused_fwd)(_no_fused)
fused_bwd = functools.wraps(gpu.fused_bwd)(_no_fused)
