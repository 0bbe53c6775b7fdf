"""Pallas launchers on Mosaic GPU (Hopper, sm_90): the chunk_gla kernels as warpgroup kernels.

Status (read this first). Run on an H200 (jax 0.11.2, 2026-11-25;
benchmarks/results/pallas_mosaic_gpu_nvidia_h200.json): bf16 within 3.3e-3 of float64 for o, the final state
and every gradient on every path, and faster than the Triton-backend launcher kernel by kernel at B=8, H=16,
T=4096 (at K=V=128 the output kernel 1.13 against 9.19 ms, the gradient kernel 9.96 against 25.8 ms;
chunk_gla's forward 2.29 against 11.0 ms, fwd+bwd 11.7 against 28.0 ms). The whole-chunk forms (below) took
the output kernel from 4.7 to about 1.1 ms and, with the gradient kernel's blocking over K
(:func:`_whole_chunk_grad_kernel`), the gradient kernel from 26.6 to 9.96 ms at K=V=128 (at K=V=64: 0.56 to
0.32 and 6.6 to 1.2 ms). The gradient kernels' matmul forms of the diagonal tiles take ``dq``'s and ``dk``'s
intra-chunk operands in two bf16 parts each (:func:`_split`), which took the gate gradient from 3.0e-2 to
1.6e-3 of float64 at steep gates (1.6 nats a token) and cost the fused path at K=V=64 6.4 -> 9.0 ms
(fwd+bwd). It is the default of ``chunk_gla``, ``fused_chunk_gla`` and ``chunk_simple_gla`` on a Hopper GPU
for the calls it takes (:func:`supported`; :func:`gla_ref.pallas.chunk.make_plan`) but scalar gates
(``chunk_simple_gla``, g_gamma or g: 1.2-1.7x slower than the Triton-backend launcher there), and it is still slower
than ``gla_ref.triton.chunk_gla`` timed in the same runs: at K=V=128 2.0-2.2x its forward and 2.7-2.9x its
forward+backward at T = 4K-16K (2026-11-25). Since the kernels read q, k, v, dO and write o, dv in the API's
``[B, T, H, D]`` (:data:`TOKEN_MAJOR`), the gates are summed by a kernel of their own
(:mod:`gla_ref.pallas.launchers.mosaic_gpu.gates`), the forward writes its states in the input dtype (:func:`state_fwd`) and
the whole-chunk output kernel takes 128 value columns a program (:func:`_output_dims`), the forward took 1.09x
Triton's at T=4096 and 1.00x at 16384, but the forward+backward 2.66x and 2.80x, nine tenths of the backward in
the gradient kernel (benchmarks/results/mosaic_forward_nvidia_h200.json). That kernel was waiting on instruction
fetch: its loops over key blocks, unrolled in Python, made it long straight-line code. As ``lax.fori_loop`` loops
(the whole-chunk gradient and output kernels) the gradient kernel took 2.69 instead of 9.60 ms, and ``chunk_gla``
is now faster than ``gla_ref.triton.chunk_gla`` in the same process: forward 0.88x, 0.96x and 0.92x,
forward+backward 0.97x, 0.96x and 0.96x at T=4096, 8192 and 16384 (B=8, H=16, K=V=128, bf16; H200, 2026-11-27,
benchmarks/results/mosaic_loops_nvidia_h200.json). The CPU
tests run it in the Mosaic GPU interpreter and lower it for CUDA. Every kernel of both paths is a Mosaic GPU
kernel, with the layout and the chunk math of the other launchers:

* :func:`state_fwd` (the states entering each chunk, ``h``, and the final state) and
  :func:`state_bwd` (the gradient of the state leaving each chunk, ``dso``, and ``dh0``): one
  sequential kernel, :func:`_state_kernel`, run forwards or backwards;
* :func:`chunk_fwd_o` (the output) and :func:`chunk_bwd` (``dq, dk, dv`` and the chunk-local gate
  gradient), one program per chunk: :func:`_output_kernel`, :func:`_grad_kernel`. Where every chunk's
  keys decay by at most :data:`SAFE_DECAY` from its first row (:func:`whole_chunk_gates`, the paper's
  gates), the output kernel takes its *whole-chunk form* (:func:`_whole_chunk_output_kernel`, as the
  Triton kernels' ``gla_ref.triton.chunk.intra``): the chunk's scores split at the first row ``b_0``,
  ``A = mask((Q ⊙ e^{b − b_0}) (K ⊙ e^{b_0 − b})ᵀ)``, one wgmma accumulation over the chunk with its
  operands formed ``64`` key columns at a time (SMEM blocks of ``[C, 64]``), so at ``K = 128`` no
  ``[C, K]`` float32 array is live; steeper chunks take the sub-chunk forms below. The gradient kernel has
  a whole-chunk form too, :func:`_whole_chunk_grad_kernel`, through the same split (``dq``, ``dk`` and the
  scores one masked wgmma each instead of ``C/16``) and blocked over ``K`` the same way.

* the fused path, :func:`fused_fwd` (output and final state; no state reaches HBM) and
  :func:`fused_bwd` (a forward loop for ``dq`` and the gate-gradient rows ``a``, a reverse loop for
  ``dk, dv, dh0`` and the rows ``c, e``; :func:`gla_ref.pallas.chunk._fused_gate_grad` sums them), is
  the same sequential kernel with a per-chunk body (:class:`_Loop`, :func:`_fused_body`) that calls
  the per-chunk kernels' own math (:func:`_chunk_output`, :func:`_chunk_grads`). Its extra tiles are
  double-buffered with the loop's, which keeps it to ``K ≤ 64`` (:data:`MAX_K_FUSED`).

Scalar gates (``Kg = 1``): ``b`` is broadcast to the ``K`` key columns the tiles have, and the chunk's
scores are ``(Q Kᵀ) ⊙ D`` with the ``[C, C]`` decay matrix ``D = e^{b_i − b_j}`` (:meth:`_Chunk.decay`):
one wgmma over the whole chunk, likewise ``dq``, ``dk`` through ``dA ⊙ D``; the gate-gradient terms of
the key columns are summed (:func:`_gate_width`).

Little here is tuned: no warp specialisation, one warpgroup per program, and a scalar gate's gradient
rows leave the kernels ``K`` wide. The per-chunk kernels form a chunk's scores (and its ``dq``, ``dk``)
with one wgmma each where :func:`whole_chunk_gates` allows it; otherwise, and in the fused kernels
always, they form GLA's diagonal ``16 × 16`` tiles inside the masked wgmmas where the gates allow it
(:func:`gentle_gates`; one key at a time in float32 otherwise, a form in which the output kernel took 7.5
times as long on the H200 at K=128 and 11 times at K=64), and sum the gate gradient inside a chunk with
two wgmmas. The three forms of a per-key gate are all compiled and chosen on the device by ``lax.cond``
(:func:`_by_forms`); the fused kernels keep the two sub-chunk forms.

Why the chunk math is not called directly: :mod:`gla_ref.pallas.chunk_math` builds a chunk from
16-row sub-chunk values and ``dot_general``; on Mosaic GPU every matmul is a ``wgmma`` on SMEM tiles
with at least 64 rows, and a register array has a fixed layout. So each kernel here writes the same
formulas over the whole chunk (:class:`_Chunk`; the sub-chunk forms): the off-diagonal 16 × 16 tiles come from
one masked ``wgmma`` per reference row ``r_I`` (the masks select exactly the tiles ``J < I`` that
:func:`chunk_math.intra_scores` builds one by one), and every exponent is ≤ 0, masked with ``where``
before ``exp``. The diagonal tiles have two forms (``exact`` of :class:`_Chunk`): float32 loops over
keys, whose results agree with the Triton-backend launcher's to float32 rounding, up to a last-bit flip
where a bf16 operand is rounded from a float32 sum taken in another order; or, where every 16-token
decay is at most :data:`SAFE_DECAY`, the same masked wgmma with the key operand also taking sub-chunk
I's own tokens (exponents up to SAFE_DECAY there), one bf16 rounding more (tests/test_pallas_mosaic_gpu.py).
In that form the gradient kernels' ``dq`` and ``dk`` operands (``K ⊙ e^{r_I − b}``, ``Q ⊙ e^{b − r_I}``; in the
whole-chunk form ``r_I = b_0``) go in two bf16 parts each (:func:`_split`), two wgmmas each instead of one: a
product ``q_i dA_ij k_j e^{b_i − b_j}`` of the diagonal tiles enters both ``q ⊙ dq`` and ``k ⊙ dk``, and the gate
gradient, their difference summed over ``s ≥ t``, cancels it for ``i, j ≥ t`` (for ``i = j`` undecayed, the
largest terms) only if both sides are formed alike. With one bf16 part each the two sides were rounded
apart (each operand by its own 2⁻⁹), and the gate gradient was 3.0e-2 off float64 at steep gates (the
Triton-backend launcher's, float32 diagonal tiles: 1.6e-3); with the remainders, 1.6e-3.

What a program is. Mosaic GPU runs one *warpgroup* (4 warps, 128 threads) per program; arrays in
a kernel are distributed over the warpgroup's registers in a layout (``WGMMA``: the accumulator
layout of the tensor-core instruction), and every matmul is a ``wgmma``: operands in shared memory
(SMEM, swizzled so the tensor cores read them without bank conflicts), accumulator in registers.

Grid and ownership. The per-chunk kernels run on ``(B, H, NV, N)``: a program loads its chunk's
tiles by TMA (q, k, v, dO straight from ``[B, T, H, D]``, :data:`TOKEN_MAJOR`), computes, and writes its outputs
back through SMEM. The state kernel runs on the grid
``(B, H, NV)``, one program per batch, head and block of ``BV = 64`` value columns (the M of a
``wgmma`` is 64 rows per warpgroup). The
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

HBM traffic of the state kernel per program: ``x``, ``b`` once (``C·K`` each per chunk, ``b`` in
float32) and the value block of ``y``, plus the states written out (``BV·K`` per chunk: float32, or in the
forward the input dtype); the per-chunk kernels read their chunk's tiles and its state(s) once. The same bytes
as the Triton-backend kernels, since both read each tile once, less the states' half in the forward.

Dtypes: bfloat16 only. A ``wgmma`` reads float32 operands as tf32 (10-bit mantissa, less than the
float32 path of the other launchers promises), and tf32 ``wgmma`` only takes K-major operands, so
the transposed ``yᵀ`` view above is not available to it; float32 inputs raise a TypeError that
names this launcher. Accumulation and states are float32, but for the states the forward writes for its output
kernel alone, in the input dtype (:func:`state_fwd`).

Sizes: ``K`` and ``V`` are padded to powers of two of at least 64 (a 128-byte swizzled row of
bfloat16, and the ``wgmma`` M of a warpgroup); chunks are 64 tokens (a register tile of a warpgroup
has a multiple of 64 rows) and ``K ≤ 128``, which keep every kernel's tiles within a Hopper block's
227 KiB of SMEM (the lowering checks it); the fused kernels take ``K ≤ 64`` (at most 197 KiB; 257 to 314 KiB at
``K = 128``).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from gla_ref.reference.gates import SAFE_DECAY
from gla_ref.pallas import compat
from gla_ref.pallas.launchers.common import Dims

BLOCK_V = 64
"""Value columns per program: the M of one warpgroup's ``wgmma``."""
MIN_DIM = 64
"""``K`` and ``V`` are padded to at least this: a 128-byte swizzled bfloat16 row."""
CHUNK = 64
"""The one chunk size: a register tile of a warpgroup has a multiple of 64 rows, and at 128 the
gradient kernel's ``[C, C]`` tiles no longer fit beside the others in 227 KiB of SMEM."""
MAX_K = 128
"""Largest padded ``K``: the gradient kernel's tiles fill about 221 KiB of SMEM at ``K = 128``."""
NAME = "mosaic_gpu"


def _pow2(x: int) -> int:
    return max(MIN_DIM, 1 << (x - 1).bit_length())


def padded_dims(K: int, V: int) -> tuple[int, int]:
    """``(K_pad, V_pad)``: powers of two, at least 64."""
    return _pow2(K), _pow2(V)


def check_supported(dtype, K_pad: int, chunk: int, fused: bool = False) -> None:
    """What this launcher cannot do yet raises here, before any kernel is traced."""
    if jnp.dtype(dtype) != jnp.bfloat16:
        raise TypeError(f"launcher='{NAME}' takes bfloat16 q, k, v, got {jnp.dtype(dtype).name}: its matmuls are "
                        "wgmma, which read float32 as tf32 and only K-major (the state update reads v transposed); "
                        "use launcher='gpu' for float32")
    if chunk != CHUNK:
        raise ValueError(f"launcher='{NAME}' takes chunk_size={CHUNK} only (a register tile of a warpgroup has a "
                         f"multiple of 64 rows; larger chunks overflow SMEM), got chunk_size={chunk}")
    if K_pad > MAX_K:
        raise ValueError(f"launcher='{NAME}' takes K <= {MAX_K} (its tiles fill SMEM), got K padded to {K_pad}; "
                         "use launcher='gpu'")
    if fused and K_pad > MAX_K_FUSED:
        raise ValueError(f"launcher='{NAME}' runs the fused path for K <= {MAX_K_FUSED} (its double-buffered tiles "
                         f"fill SMEM), got K padded to {K_pad}; use chunk_gla with launcher='{NAME}', or "
                         "launcher='gpu'")


def supported(dtype, K: int, chunk: int, fused: bool = False) -> bool:
    """Whether :func:`check_supported` lets a call with head size ``K`` (unpadded) through: what
    :func:`gla_ref.pallas.chunk.make_plan` asks before choosing this launcher by itself."""
    try:
        check_supported(dtype, _pow2(K), chunk, fused)
    except (TypeError, ValueError):
        return False
    return True


def check_call(q, g, chunk: int, fused: bool = False) -> None:
    """:func:`check_supported` for a public call's ``q [B, T, H, K]`` and gate ``g [B, T, H, Kg]``."""
    check_supported(q.dtype, _pow2(q.shape[-1]), chunk, fused)


TOKEN_MAJOR = True
"""The layout this launcher's kernels read and write q, k, v, dO, o and dv in: the API's ``[B, T, H, D]``, as the
Triton kernels do. A program's TMA copy takes its ``[C, D]`` tile of one head straight from there, rows ``H·D``
elements apart (:func:`_tokens`), so :func:`gla_ref.pallas.chunk.run` transposes none of them. The gates ``b``, the
states and the float32 partials of ``dq``, ``dk`` and the gate gradient stay ``[B, H, …]``."""


def _tokens(ref, ib, ih, rows, cols=None):
    """Tokens ``rows`` of head ``ih`` (only the columns ``cols``, if given) of a ``[B, T, H, D]`` array in HBM: the
    ``[C, D]`` box a TMA copy reads or writes (:data:`TOKEN_MAJOR`)."""
    return ref.at[ib, rows, ih] if cols is None else ref.at[ib, rows, ih, cols]


def _dims(x, y, chunk):
    """The sizes of a call whose ``x`` (q or k) is ``[B, T, H, K]`` and ``y`` (v or dO) ``[B, T, H, V]``."""
    B, T, H, K = x.shape
    V = y.shape[-1]
    return Dims(B, H, T // chunk, chunk, K, V, min(BLOCK_V, V), K)  # GLA's per-key gate only


def _transforms(dtype, width):
    """Tiling + swizzle of an SMEM tile whose rows are ``width`` elements (wgmma and TMA read it)."""
    mgpu = compat.mosaic_gpu()
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = mgpu.find_swizzle(width * bits)
    return mgpu.TilingTransform((8, swizzle * 8 // bits)), mgpu.SwizzleTransform(swizzle)


def _whole_chunk_dims(d, interpret):
    """What both whole-chunk kernels start from: ``(ops, mgpu, WGMMA layout, C, K, BV, BK, nk)``, with the key
    block ``BK`` = :data:`WHOLE_CHUNK_KEYS` and ``nk = K / BK`` blocks."""
    ops = _Ops(interpret)
    return ops, ops.mgpu, ops.mgpu.Layout.WGMMA, d.C, d.K, d.BV, WHOLE_CHUNK_KEYS, d.K // WHOLE_CHUNK_KEYS


def _key_blocks(nk, rows, BK, dtype):
    """SMEM of a ``[rows, K]`` tile as ``nk`` swizzled key blocks ``[rows, BK]`` (``BK = 64``), each a wgmma operand."""
    return compat.mosaic_gpu().SMEM((nk, rows, BK), dtype, transforms=_transforms(dtype, BK))


def _whole_chunk_inputs(nk, C, BK, dtype):
    """The first SMEM of both whole-chunk kernels: the chunk's q, k and b as key blocks, and b_0, its first row."""
    f32 = jnp.float32
    return [_key_blocks(nk, C, BK, dtype), _key_blocks(nk, C, BK, dtype), _key_blocks(nk, C, BK, f32),
            compat.mosaic_gpu().SMEM((nk, BK), f32)]


def _interpret_params(interpret):
    """``True`` → the Mosaic GPU interpreter's parameters; ``False`` stays False; params pass through."""
    if interpret is True:
        params = compat.gpu_interpret_params()
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
    ``ref.transpose`` view; JAX 0.10's interpreter cannot read such a view, so it gets a
    transposed copy in SMEM (the same values; the compiled kernel never makes it).
    """

    def __init__(self, interpret):
        self.interpret = bool(interpret)
        self.mgpu = compat.mosaic_gpu()
        self.copy_transposed = self.interpret and not compat.gpu_interpreter_reads_transposed_refs()

    def load(self, ref, layout):
        return ref[...] if self.interpret else compat.mosaic_gpu_load(ref, layout)

    def cast(self, x, layout):
        return x if self.interpret else self.mgpu.layout_cast(x, layout)

    def matmul(self, a_ref, b_ref, shape, lo=None):
        """``a_ref @ b_ref`` (SMEM tiles) as one wgmma, float32 ``shape``; given ``lo``, ``a_ref @ (b_ref + lo)``
        as two wgmmas into one accumulator (``b_ref, lo``: a float32 operand's two bf16 parts, :func:`_split`)."""
        mgpu = self.mgpu

        def run(acc):
            for b in (b_ref,) if lo is None else (b_ref, lo):
                mgpu.wgmma(acc, a_ref, b)
            return acc[...]

        return pl.run_scoped(run, mgpu.ACC(shape, jnp.float32))

    def _matmul_transposed(self, x_refs, shape, operands, more=()):
        """wgmmas into one float32 accumulator ``shape`` with the SMEM tiles ``x_refs`` transposed,
        ``operands(xᵀs)`` giving their ``(a, b)`` pairs: each ``xᵀ`` is a transposed view of its tile, or,
        where the interpreter has no such view (``copy_transposed``), a transposed copy in SMEM. ``more``:
        further ``(a, b)`` pairs whose products the same accumulator adds."""
        mgpu = self.mgpu

        def run(acc, *copies):
            if copies:
                for x_ref, x_t in zip(x_refs, copies):
                    x_t[...] = x_ref[...].T
                mgpu.commit_smem()
            else:
                copies = [x_ref.transpose((1, 0)) for x_ref in x_refs]  # views, as plgpu.transpose_ref made
            for a, b in (*operands(copies), *more):
                mgpu.wgmma(acc, a, b)
            return acc[...]

        if self.copy_transposed:  # an accumulator cannot share one scoped allocation with SMEM
            types = [mgpu.SMEM(x_ref.shape[::-1], x_ref.dtype) for x_ref in x_refs]
            return pl.run_scoped(lambda *copies: pl.run_scoped(lambda acc: run(acc, *copies),
                                                               mgpu.ACC(shape, jnp.float32)), *types)
        return pl.run_scoped(run, mgpu.ACC(shape, jnp.float32))

    def matmul_nt(self, a_ref, b_ref, shape, more=()):
        """``a_ref @ b_refᵀ`` (SMEM tiles ``[M, K]`` and ``[N, K]``) as one wgmma, float32 ``[M, N]``, plus
        ``c @ d`` for each pair of ``more`` in the same accumulator."""
        return self._matmul_transposed([b_ref], shape, lambda b_t: [(a_ref, b_t[0])], more)

    def matmul_nt_blocks(self, pairs, shape, more=()):
        """``Σ a @ bᵀ`` over the ``(a, b)`` of ``pairs`` (SMEM tiles ``[M, 64]`` and ``[N, 64]``, the key blocks
        of a contraction over ``K``), plus ``c @ d`` for each pair of ``more``: wgmmas into one float32
        ``[M, N]`` accumulator."""
        return self._matmul_transposed([b for _, b in pairs], shape,
                                       lambda b_ts: [(a, b_t) for (a, _), b_t in zip(pairs, b_ts)], more)

    def matmul_tn(self, a_ref, b_ref, shape, lo=None):
        """``a_refᵀ @ b_ref`` (SMEM tiles ``[C, M]`` and ``[C, N]``) as one wgmma, float32 ``[M, N]``; ``lo`` as
        for :meth:`matmul`."""
        parts = (b_ref,) if lo is None else (b_ref, lo)
        return self._matmul_transposed([a_ref], shape, lambda a_t: [(a_t[0], b) for b in parts])


class _Loop(NamedTuple):
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


def _state_kernel(d: Dims, dtype, *, reverse, scale, has_init, want_final, interpret, write_states=True,
                  states_dtype=jnp.float32, extra=(), n_out=0, body=None, body_scratch=()):
    """The recurrence ``Sᵀ ← e^{b_C} ⊙ Sᵀ + yᵀ x̃`` over a head's chunks, writing the state entering
    each chunk (forward: ``x̃ = x ⊙ e^{b_C − b}``, chunks in order; ``reverse``: ``x̃ = scale · x ⊙ e^{b}``,
    chunks from last to first, the gradient recurrence of :func:`gla_ref.pallas.chunk_math.state_grad_update`).

    The fused kernels are this loop with a per-chunk ``body`` (see :class:`_Loop`): ``extra`` names the
    body's own input tiles (``"k"``: ``[C, K]`` rows, ``"v"``: ``[C, BV]`` of the program's value columns),
    double-buffered and fetched with the loop's own; ``n_out`` output refs follow the loop's; and
    ``write_states=False`` keeps the states in registers (only the final one may leave).

    The states written per chunk leave as ``states_dtype``: float32, or the input dtype for a consumer that
    rounds them to it anyway (the forward's output kernel, :func:`state_fwd`), through an SMEM buffer of their
    own (the float32 one keeps the initial and the final state)."""
    ops = _Ops(interpret)
    mgpu = ops.mgpu
    W = mgpu.Layout.WGMMA
    C, K, BV, N = d.C, d.K, d.BV, d.N
    n_extra = len(extra)
    n_own = 9 if write_states and states_dtype != jnp.float32 else 8  # the scratch of the loop itself

    def chunk_of(s):
        return N - 1 - s if reverse else s

    def kernel(*refs):
        x_ref, y_ref, b_ref = refs[:3]
        extra_refs, refs = refs[3:3 + n_extra], refs[3 + n_extra:]
        s0_ref = refs[0] if has_init else None
        refs = refs[1:] if has_init else refs
        states_ref = refs[0] if write_states else None
        refs = refs[1:] if write_states else refs
        final_ref = refs[0] if want_final else None
        refs = refs[1:] if want_final else refs
        outs, refs = refs[:n_out], refs[n_out:]
        x_s, y_s, b_s, bc_s, xd_s, st_s, ready, init_ready, *out_s = refs[:n_own]
        extra_s, own_scratch = refs[n_own:n_own + n_extra], refs[n_own + n_extra:]
        hs_s = out_s[0] if out_s else st_s  # the per-chunk states' way out
        ib, ih, iv = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("v")
        cols = pl.ds(iv * BV, BV)

        def fetch(s, slot):  # TMA copies of chunk s's tiles into one half of the double buffer
            n = chunk_of(s)
            rows = pl.ds(n * C, C)
            mgpu.copy_gmem_to_smem(_tokens(x_ref, ib, ih, rows), x_s.at[slot], ready.at[slot])
            mgpu.copy_gmem_to_smem(_tokens(y_ref, ib, ih, rows, cols), y_s.at[slot], ready.at[slot])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, rows], b_s.at[slot], ready.at[slot])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, n * C + C - 1], bc_s.at[slot], ready.at[slot])
            for kind, ref, dst in zip(extra, extra_refs, extra_s):
                src = _tokens(ref, ib, ih, rows, None if kind == "k" else cols)
                mgpu.copy_gmem_to_smem(src, dst.at[slot], ready.at[slot])

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
            if states_ref is not None:
                mgpu.wait_smem_to_gmem(0)  # the previous chunk's state has left hs_s
                hs_s[...] = S.astype(states_dtype)
                mgpu.commit_smem()
                mgpu.copy_smem_to_gmem(hs_s, states_ref.at[ib, ih, chunk_of(s), cols])
            if body is not None:
                n = chunk_of(s)
                body(_Loop(ops, ib, ih, iv, n, pl.ds(n * C, C), cols, x_s.at[slot], y_s.at[slot], b_s.at[slot],
                           bc_s.at[slot], tuple(e.at[slot] for e in extra_s), tuple(outs), tuple(own_scratch)), S)
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

    width = {"k": K, "v": BV}
    scratch = [
        mgpu.SMEM((2, C, K), dtype, transforms=_transforms(dtype, K)),
        mgpu.SMEM((2, C, BV), dtype, transforms=_transforms(dtype, BV)),
        mgpu.SMEM((2, C, K), jnp.float32, transforms=_transforms(jnp.float32, K)),
        mgpu.SMEM((2, K), jnp.float32),
        mgpu.SMEM((C, K), dtype, transforms=_transforms(dtype, K)),
        mgpu.SMEM((BV, K), jnp.float32, transforms=_transforms(jnp.float32, K)),
        mgpu.Barrier(num_arrivals=4 + n_extra, num_barriers=2),
        mgpu.Barrier(num_arrivals=1, num_barriers=1),
    ] + ([mgpu.SMEM((BV, K), states_dtype, transforms=_transforms(states_dtype, K))] if n_own > 8 else []) + [
        mgpu.SMEM((2, C, width[kind]), dtype, transforms=_transforms(dtype, width[kind])) for kind in extra]
    return kernel, scratch + list(body_scratch)


def _state_call(x, y, b, s0, *, chunk, reverse, scale, want_final, interpret, name, write_states=True,
                states_dtype=jnp.float32, extra=(), body=None, body_outs=(), body_scratch=()):
    """Run :func:`_state_kernel` on the grid ``(B, H, NV)``; returns the per-chunk states (or None; as
    ``states_dtype``), the final state (or None; float32) and the body's outputs (``extra``: ``(kind, array)``
    pairs)."""
    check_supported(x.dtype, x.shape[-1], chunk)
    b, _ = _per_key(b, x.shape[-1])
    d = _dims(x, y, chunk)
    mgpu = compat.mosaic_gpu()
    body_outs = list(body_outs(d) if callable(body_outs) else body_outs)
    kernel, scratch = _state_kernel(d, x.dtype, reverse=reverse, scale=scale, has_init=s0 is not None,
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
                       interpret=_interpret_params(interpret), kernel_name=name)
    args = [x, y, b] + [a for _, a in extra] + ([s0] if s0 is not None else [])
    outs = list(call(*args))
    states = outs.pop(0) if write_states else None
    final = outs.pop(0) if want_final else None
    return states, final, tuple(outs)


def _split(x, dtype):
    """A float32 ``x`` as two operands of the input dtype, ``hi = x`` rounded and ``lo = x − hi`` rounded: the
    wgmmas of both into one accumulator multiply by ``x`` to about 2⁻¹⁶ of it, ``hi`` alone to 2⁻⁹ (bf16)."""
    hi = x.astype(dtype)
    return hi, (x - hi.astype(jnp.float32)).astype(dtype)


def _score_iotas(ops, C):
    """``(srow, scol)``: the query and the key of every element of a ``[C, C]`` score tile, in the WGMMA layout."""
    W = ops.mgpu.Layout.WGMMA
    return tuple(ops.cast(lax.broadcasted_iota(jnp.int32, (C, C), a), W) for a in (0, 1))


def _causal(ops, x):
    """A ``[C, C]`` score tile ``x`` with 0 above the diagonal (keys after their query)."""
    srow, scol = _score_iotas(ops, x.shape[0])
    return jnp.where(srow >= scol, x, 0.0)


def _triangle_ones(ops, C, dtype, upper=True):
    """``U [C, C]``, ones on and above the diagonal: ``U x`` sums ``x`` over the rows ``s ≥ t`` of a chunk; or, not
    ``upper``, ``L``, ones on and below it, which sums over ``s ≤ t``."""
    srow, scol = _score_iotas(ops, C)
    inside = scol >= srow if upper else scol <= srow
    return jnp.where(inside, ops.cast(jnp.ones((C, C), jnp.float32), ops.mgpu.Layout.WGMMA), 0.0).astype(dtype)


class _Chunk:
    """Register-level helpers of the per-chunk kernels: one chunk ``[C, K]`` in the ``WGMMA`` layout.

    ``scalar``: the gate is one number per token (``b``'s columns are equal, :func:`_per_key`), so the
    chunk's decay is the ``[C, C]`` matrix ``D`` of :meth:`decay` and its scores ``(Q Kᵀ) ⊙ D`` are one wgmma
    of the SMEM tiles ``q_s, k_s`` (bf16) for the whole chunk: no sub-chunks, no loop over keys.

    ``exact``: how the diagonal ``16 × 16`` tiles of a per-key gate are formed. True: one key at a time in
    float32 (every exponent ≤ 0, any valid gate). False (the fast form, :func:`gentle_gates`): inside the
    masked wgmma of their sub-chunk I, whose key operand then also takes I's own tokens, scaled by
    ``e^{r_I − b_j} ≥ 1``, at most ``e^{SAFE_DECAY}`` (the causal mask drops ``j > i`` afterwards)."""

    def __init__(self, ops, C, K, dtype, q_s, k_s, b_s, scalar=False, exact=True, hold=False):
        self.ops, self.C, self.K, self.dtype = ops, C, K, dtype
        self.q_s, self.k_s, self.b_s, self.scalar, self.exact = q_s, k_s, b_s, scalar, exact
        self.held = None
        if hold:
            self.held = {name: getattr(self, name) for name in ("q", "k", "b")}
        W = ops.mgpu.Layout.WGMMA
        self.row = ops.cast(lax.broadcasted_iota(jnp.int32, (C, K), 0), W)  # token of each element
        self.col = ops.cast(lax.broadcasted_iota(jnp.int32, (C, K), 1), W)  # key column of each element
        self.srow = ops.cast(lax.broadcasted_iota(jnp.int32, (C, C), 0), W)  # query of a score
        self.scol = ops.cast(lax.broadcasted_iota(jnp.int32, (C, C), 1), W)  # key of a score

    # q, k, b as float32 [C, K] arrays. Three are 192 registers a thread at K = 128 (a warpgroup thread has
    # 255), so by default each use reads them from their SMEM tiles again; ``hold`` loads them once and
    # keeps them. Measured on the H200 (B=8, H=16, T=4096, K=V=128): the output kernel 5.8 ms held,
    # 4.8 ms re-read; the gradient kernel 27.5 ms held, 31.0 ms re-read (so the gradients hold them).
    def _load(self, name):
        if self.held is not None:
            return self.held[name]
        x = self.ops.load(getattr(self, name + "_s"), self.ops.mgpu.Layout.WGMMA)
        return x if name == "b" else x.astype(jnp.float32)

    q = property(lambda self: self._load("q"))
    k = property(lambda self: self._load("k"))
    b = property(lambda self: self._load("b"))

    def rows(self, x):
        """A ``[K]`` row broadcast to every token, ``[C, K]``."""
        return lax.broadcast_in_dim(x, (self.C, self.K), [1])

    def pick(self, x, j):
        """Row ``j`` of ``x [C, K]`` as ``[K]``, by a one-hot sum (exact)."""
        return jnp.sum(jnp.where(self.row == j, x, 0.0), axis=0)

    def sub_chunks(self):
        """The sub-chunks I whose masked wgmma runs: those with keys before them (I ≥ 1), and in the
        fast form also the first, whose only tile is its diagonal one."""
        return range(1 if self.exact else 0, self.C // 16)

    def key_end(self, I):
        """The first key outside sub-chunk I's wgmma: ``16 I`` (tiles J < I), or in the fast form
        ``16 I + 16`` (its diagonal tile too)."""
        return 16 * I + (0 if self.exact else 16)

    def masks(self, I):
        """Tokens of sub-chunk I (the queries of its wgmma), and the keys of its wgmma (:meth:`key_end`)."""
        return (self.row >= 16 * I) & (self.row < 16 * I + 16), self.row < self.key_end(I)

    def same_tile(self, j):
        """Tokens ``i ≥ j`` in key ``j``'s sub-chunk (the rows of its diagonal tile)."""
        return (self.row >= j) & (self.row < (j // 16) * 16 + 16)

    def ref_operands(self, I, r):
        """``Q_I ⊙ e^{b − r_I}`` (rows of sub-chunk I, else 0) and ``K ⊙ e^{r_I − b}`` (the keys of
        :meth:`masks`, else 0), float32: the operands of the tiles ``A_IJ``; exponents ≤ 0, except
        ``r_I − b_j`` for I's own keys in the fast form (at most SAFE_DECAY)."""
        mine, before = self.masks(I)
        return (jnp.where(mine, self.q * jnp.exp(jnp.where(mine, self.b - r, 0.0)), 0.0),
                jnp.where(before, self.k * jnp.exp(jnp.where(before, r - self.b, 0.0)), 0.0))

    def ref_rows(self, r_s=None):
        """``I ↦ r_I [K]``, the first row of sub-chunk I: loaded from ``r_s`` (row I, copied by TMA), or
        picked out of ``b``'s registers (exact) where no such copy was made."""
        if r_s is None:
            return lambda I: self.pick(self.b, 16 * I)
        return lambda I: self.ops.load(r_s.at[I], self.ops.mgpu.Layout.WGMMA.reduce(0))

    def decay(self):
        """Scalar gates: ``D[i, j] = e^{b_i − b_j}`` for ``i ≥ j``, else 0 (float32 ``[C, C]``; exponents ≤ 0),
        from ``b [C, K]`` (equal columns): its first column gives ``b_i`` down the rows, and the diagonal of
        that column broadcast gives ``b_j`` along them (one-hot sums, exact; no transpose of a register array)."""
        C = self.C
        b_i = jnp.sum(jnp.where(self.col == 0, self.b, 0.0), axis=1)
        square = lax.broadcast_in_dim(b_i, (C, C), [0])
        b_j = jnp.sum(jnp.where(self.srow == self.scol, square, 0.0), axis=0)
        causal = self.srow >= self.scol
        return jnp.where(causal, jnp.exp(jnp.where(causal, square - lax.broadcast_in_dim(b_j, (C, C), [1]), 0.0)), 0.0)

    def scores(self, ref_row, x_s, y_s):
        """The chunk's causal scores without the scale, float32 ``[C, C]``: one masked wgmma per reference row
        (``ref_row``, :meth:`ref_rows`) for the tiles of :meth:`masks`, then the diagonal tiles one key column
        at a time (``exact``) or the causal mask (the fast form, whose wgmmas made them); for a scalar gate
        ``(Q Kᵀ) ⊙ D``, one wgmma."""
        ops, mgpu, C = self.ops, self.ops.mgpu, self.C
        if self.scalar:
            return ops.matmul_nt(self.q_s, self.k_s, (C, C)) * self.decay()
        A = ops.cast(jnp.zeros((C, C), jnp.float32), mgpu.Layout.WGMMA)
        for I in self.sub_chunks():
            xq, xk = self.ref_operands(I, self.rows(ref_row(I)))
            x_s[...] = xq.astype(self.dtype)
            y_s[...] = xk.astype(self.dtype)
            mgpu.commit_smem()
            A = A + ops.matmul_nt(x_s, y_s, (C, C))
        if not self.exact:
            return jnp.where(self.srow >= self.scol, A, 0.0)

        def column(j, A):
            same = self.same_tile(j)
            b = self.b
            e = jnp.exp(jnp.where(same, b - self.rows(self.pick(b, j)), 0.0))
            a = jnp.sum(jnp.where(same, self.q * self.rows(self.pick(self.k, j)) * e, 0.0), axis=1)
            return A + jnp.where(self.scol == j, lax.broadcast_in_dim(a, (C, C), [0]), 0.0)  # a is 0 off j's tile

        return lax.fori_loop(0, C, column, A)


def _chunk_output(tile, S, v_s, ref_row, hb_s, x_s, y_s, a_s, scale):
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
    """One chunk's output ``O = scale ((Q ⊙ e^{b}) S + A V)`` (one program per chunk and value block, grid
    ``(B, H, NV, N)``; HBM: the chunk's ``q, k`` and ``b`` rows, its value block of ``v`` and of the state
    ``S`` entering it read once, ``O``'s block written once). ``A`` is the chunk's causal scores, in one of
    three forms (the launcher picks one per call on the device, :func:`chunk_fwd_o`):

    * ``whole`` (:func:`whole_chunk_gates`: every key of every chunk decays by at most :data:`SAFE_DECAY`
      from the chunk's first row ``b_0``): ``A = mask((Q ⊙ e^{b − b_0}) (K ⊙ e^{b_0 − b})ᵀ)``, one wgmma
      accumulation over the whole chunk (:func:`_whole_chunk_output_kernel`), operands formed
      ``BK = 64`` key columns at a time;
    * the fast sub-chunk form (``exact=False``, :func:`gentle_gates`): the tiles of each 16-row sub-chunk
      I (``I = 0 … C/16 − 1``) by one masked wgmma of ``Q_I ⊙ e^{b − r_I}`` (rows of sub-chunk I only) and
      ``K ⊙ e^{r_I − b}`` (keys up to I's last), ``r_I`` the sub-chunk's first row; the causal mask after;
    * the exact form (``exact=True``, any valid gate): the off-diagonal 16-row tiles by the masked
      wgmmas above, restricted to the keys before row ``16 I`` (each product fills exactly the tiles
      ``A_IJ, J < I``, as :func:`chunk_math.intra_scores` builds them one by one); the diagonal tiles
      ``Σ_d q_id k_jd e^{b_id − b_jd}`` one key column at a time in float32, the key's row picked out
      of the registers by a one-hot sum (as the shared chunk math does; every exponent ≤ 0, masked with
      ``where`` before ``exp``).

    The sub-chunk forms hold whole ``[C, K]`` float32 arrays (at ``K = 128`` three of them are 192
    registers a thread, :meth:`_Chunk._load`) and re-form full operands for each of the ``C/16`` wgmmas;
    the whole-chunk form forms each operand once, ``[C, 64]`` at a time. Scalar gates: ``(Q Kᵀ) ⊙ D``.
    The states come as ``states_dtype`` (float32, or the input dtype: :func:`state_fwd`)."""
    if whole and not scalar:
        return _whole_chunk_output_kernel(d, dtype, scale=scale, interpret=interpret, states_dtype=states_dtype)
    ops = _Ops(interpret)
    mgpu = ops.mgpu
    W = mgpu.Layout.WGMMA
    C, K, BV = d.C, d.K, d.BV
    n_sub = C // 16
    f32 = jnp.float32

    def kernel(q_ref, k_ref, v_ref, b_ref, h_ref, o_ref, q_s, k_s, v_s, b_s, r_s, h_s, x_s, y_s, hb_s, a_s, o_s,
               ready):
        ib, ih, iv, n = (lax.axis_index(a) for a in ("b", "h", "v", "n"))
        rows, cols = pl.ds(n * C, C), pl.ds(iv * BV, BV)
        mgpu.copy_gmem_to_smem(_tokens(q_ref, ib, ih, rows), q_s, ready.at[0])
        mgpu.copy_gmem_to_smem(_tokens(k_ref, ib, ih, rows), k_s, ready.at[0])
        mgpu.copy_gmem_to_smem(_tokens(v_ref, ib, ih, rows, cols), v_s, ready.at[0])
        mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, rows], b_s, ready.at[0])
        mgpu.copy_gmem_to_smem(h_ref.at[ib, ih, n, cols], h_s, ready.at[0])
        for I in range(n_sub):
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, n * C + 16 * I], r_s.at[I], ready.at[0])
        mgpu.barrier_wait(ready.at[0])

        tile = _Chunk(ops, C, K, dtype, q_s, k_s, b_s, scalar, exact)
        o = _chunk_output(tile, ops.load(h_s, W), v_s, tile.ref_rows(r_s), hb_s, x_s, y_s, a_s, scale)
        o_s[...] = o.astype(o_s.dtype)
        mgpu.commit_smem()
        mgpu.copy_smem_to_gmem(o_s, _tokens(o_ref, ib, ih, rows, cols))
        mgpu.wait_smem_to_gmem(0)

    sw = _transforms
    scratch = [
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),
        mgpu.SMEM((C, K), f32, transforms=sw(f32, K)),
        mgpu.SMEM((n_sub, K), f32),
        mgpu.SMEM((BV, K), states_dtype, transforms=sw(states_dtype, K)),
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),
        mgpu.SMEM((BV, K), dtype, transforms=sw(dtype, K)),
        mgpu.SMEM((C, C), dtype, transforms=sw(dtype, C)),
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),
        mgpu.Barrier(num_arrivals=5 + n_sub, num_barriers=1),
    ]
    return kernel, scratch


WHOLE_CHUNK_KEYS = 64
"""``BK``: key columns per step of the whole-chunk form (as :data:`gla_ref.triton.chunk.intra.WHOLE_CHUNK_KEYS`):
its ``q, k, b`` and state tiles are held as ``K / BK`` SMEM blocks of ``[C, BK]`` (a 128-byte swizzled
bfloat16 row), so that only ``[C, BK]`` float32 arrays are live in registers and every wgmma of the
contraction over ``K`` reads whole blocks (no SMEM slicing inside a swizzled tile)."""


WIDE_BLOCK_V = 128
"""Value columns per program of the whole-chunk output kernel where ``V`` has them and the states come in the
input dtype (:func:`_output_dims`)."""


def _output_dims(d, dtype, states_dtype):
    """The whole-chunk output kernel's sizes: value blocks of :data:`WIDE_BLOCK_V` columns where ``V`` has them and
    the states come as ``dtype`` (184 KiB of SMEM at ``K = 128`` in bf16; float32 states would take it to 248 KiB,
    over a block's 227), so that each chunk's ``q, k, b`` are read, and its operands formed, once per 128 value
    columns instead of once per 64; else ``d`` as it is."""
    wide = states_dtype == dtype and d.V % WIDE_BLOCK_V == 0
    return d._replace(BV=WIDE_BLOCK_V) if wide else d


def whole_chunk_gates(b, chunk=CHUNK):
    """True (a traced boolean, no sync) when in every chunk of ``chunk`` tokens of the chunk-local gates
    ``b [B, H, T, K]`` every key column decays by at most :data:`SAFE_DECAY` from the chunk's first row to its
    last (``b`` falls along a chunk, so the last row decides for all of them): the per-chunk kernels'
    whole-chunk forms (:func:`_whole_chunk_output_kernel`, ``whole`` of :func:`_grad_kernel`) then hold every
    exponent. NaN gates are not (a comparison with NaN is False)."""
    return _spans_decay_safely(b, chunk)


def _spans_decay_safely(b, span):
    """Whether every run of ``span`` tokens of ``b [B, H, T, K]`` (T a multiple of ``span``) decays by at most
    :data:`SAFE_DECAY` from its first row to its last, in every key column (False where either is NaN)."""
    B, H, T, K = b.shape
    runs = b.reshape(B, H, T // span, span, K)
    return jnp.all(runs[:, :, :, 0] - runs[:, :, :, span - 1] <= SAFE_DECAY)


def _whole_chunk_output_kernel(d: Dims, dtype, *, scale, interpret, states_dtype=jnp.float32):
    """The whole-chunk form of :func:`_output_kernel` (per-key gates whose chunks decay by at most
    :data:`SAFE_DECAY`, :func:`whole_chunk_gates`): every score of the chunk splits at its first row ``b_0``,

        ``A = mask((Q ⊙ e^{b − b_0}) (K ⊙ e^{b_0 − b})ᵀ)``,   ``O = scale ((Q ⊙ e^{b}) S + A V)``,

    the query-side exponents ≤ 0, the key-side ones in ``[0, SAFE_DECAY]`` (at most e^64, which float32 and
    bfloat16 hold), each product still ``q_i k_j e^{b_i − b_j}``; the causal mask drops ``j > i`` (finite
    there, since ``b_i − b_j ≤ SAFE_DECAY`` too).

    Grid ``(B, H, NV, N)``, one program per chunk and block of ``BV`` value columns (64, or 128:
    :func:`_output_dims`); it owns ``O``'s ``[C, BV]`` block. Its ``q, k`` (input dtype), ``b`` (float32) and
    state ``Sᵀ [BV, K]`` (float32 or the input dtype) come by TMA as ``K / BK`` blocks of ``BK = 64`` key columns
    (:data:`WHOLE_CHUNK_KEYS`), ``b_0`` as one ``[BK]`` row per block. Per block ``c``, in registers (``[C, BK]``
    float32 at a time, 96 registers a thread for ``q, k, b``): ``Q_c ⊙ e^{b_c − b_0}``, ``K_c ⊙ e^{b_0 − b_c}``
    and ``Q_c ⊙ e^{b_c}`` (and a float32 ``Sᵀ_c``), stored as the input dtype to SMEM work blocks. Then one
    accumulator of ``K / BK`` wgmmas gives ``A`` (``[C, C]``, contraction over the key blocks), the causal mask in
    registers, ``A`` to SMEM as the input dtype, and one more accumulator ``Σ_c (Q_c ⊙ e^{b_c}) S_c + A V``
    (``K / BK + 1`` wgmmas). HBM: as the sub-chunk forms (each tile read once), without their ``C/16`` reference rows.
    States that come in the input dtype (``states_dtype``, :func:`state_fwd`) are the wgmma operand as TMA leaves
    them: no float32 blocks, no copy."""
    ops, mgpu, W, C, K, BV, BK, nk = _whole_chunk_dims(d, interpret)
    f32 = jnp.float32
    cast = states_dtype != dtype  # float32 states: rounded to the operand dtype in the kernel

    def kernel(q_ref, k_ref, v_ref, b_ref, h_ref, o_ref, q_s, k_s, b_s, b0_s, h_s, v_s, xq_s, xk_s, xs_s, *rest):
        hb_s, a_s, o_s, ready = rest if cast else (h_s, *rest)
        ib, ih, iv, n = (lax.axis_index(a) for a in ("b", "h", "v", "n"))
        rows, cols = pl.ds(n * C, C), pl.ds(iv * BV, BV)
        for c in range(nk):  # key block c: columns c BK … c BK + BK − 1
            keys = pl.ds(c * BK, BK)
            mgpu.copy_gmem_to_smem(_tokens(q_ref, ib, ih, rows, keys), q_s.at[c], ready.at[0])
            mgpu.copy_gmem_to_smem(_tokens(k_ref, ib, ih, rows, keys), k_s.at[c], ready.at[0])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, rows, keys], b_s.at[c], ready.at[0])
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, n * C, keys], b0_s.at[c], ready.at[0])
            mgpu.copy_gmem_to_smem(h_ref.at[ib, ih, n, cols, keys], h_s.at[c], ready.at[0])
        mgpu.copy_gmem_to_smem(_tokens(v_ref, ib, ih, rows, cols), v_s, ready.at[0])
        mgpu.barrier_wait(ready.at[0])

        def operands(c, carry):  # key block c's operands (a loop, not unrolled: see _whole_chunk_grad_kernel)
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
        a_s[...] = _causal(ops, A).astype(dtype)
        mgpu.commit_smem()
        o = scale * ops.matmul_nt_blocks([(xs_s.at[c], hb_s.at[c]) for c in range(nk)], (C, BV),
                                         more=((a_s, v_s),))
        o_s[...] = o.astype(o_s.dtype)
        mgpu.commit_smem()
        mgpu.copy_smem_to_gmem(o_s, _tokens(o_ref, ib, ih, rows, cols))
        mgpu.wait_smem_to_gmem(0)

    sw = _transforms

    def blocks(rows, dt):
        return _key_blocks(nk, rows, BK, dt)

    scratch = [
        *_whole_chunk_inputs(nk, C, BK, dtype),                  # q, k, b, b_0
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
    return kernel, scratch


def _chunk_grads(tile, bC, v_s, do_s, ref_row, x_s, y_s, a_s, scale, *, hb_s=None, dsb_s=None, dS=None):
    """One chunk's gradients in full-chunk form (:func:`chunk_math.chunk_dq`, :func:`chunk_math.chunk_dkv`),
    float32: ``dq`` given ``hb_s`` (the state entering the chunk, ``Sᵀ`` as a bf16 operand); ``dk, dv`` and
    the keys' share ``κ = Σ_rows k ⊙ dk_inter`` of the decay's gradient given ``dsb_s`` (the gradient of the
    state leaving it, bf16 ``dSᵀ``); given also ``dS`` (float32 registers), ``c = Σ_v dS ⊙ U`` with
    ``Uᵀ = Vᵀ (K ⊙ e^{b_C − b})`` (:func:`chunk_math.state_out_term`). Absent parts are None:
    ``(dq, dk, dv, κ, c)``.

    The inter-chunk terms are one wgmma each; the off-diagonal tiles use the masked operands of
    :meth:`_Chunk.ref_operands` with ``dA = dO Vᵀ`` masked to the tiles ``(I, J < I)``; the diagonal tiles
    are float32, one key column (``dq``) or key row (``dk``) at a time (``exact``), or in the masked wgmmas
    (the fast form, their operands in two bf16 parts: see the loop's comment)."""
    ops, mgpu, C, K, BV, dtype = tile.ops, tile.ops.mgpu, tile.C, tile.K, v_s.shape[-1], tile.dtype
    want_dq, want_dk = hb_s is not None, dsb_s is not None
    dq = dk = dv = kappa = c = None
    if want_dq:
        dq = scale * ops.matmul(do_s, hb_s, (C, K)) * jnp.exp(tile.b)
    if want_dk:
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
    dA = ops.matmul_nt(do_s, v_s, (C, C))
    if tile.scalar:  # the whole chunk at once: dq += scale (dA ⊙ D) K, dk += scale (dA ⊙ D)ᵀ Q
        a_s[...] = (dA * tile.decay()).astype(dtype)
        mgpu.commit_smem()
        if want_dq:
            dq = dq + scale * ops.matmul(a_s, tile.k_s, (C, K))
        if want_dk:
            dk = dk + scale * ops.matmul_tn(a_s, tile.q_s, (C, K))
        return dq, dk, dv, kappa, c

    # the tiles of each sub-chunk's wgmma: dA restricted to (rows of I, its keys, causal) against the masked
    # operands (the causal mask matters only in the fast form's diagonal tile). The fast form's operands go in
    # two bf16 parts each (:func:`_split`, their remainders in scoped tiles): its wgmmas also make the diagonal
    # tiles, whose products q_i dA_ij k_j e^{b_i − b_j} enter q ⊙ dq and k ⊙ dk alike and cancel in the gate
    # gradient (i = j undecayed) only if both are formed to float32 accuracy, as the exact form's are.
    def operand(hi_s, lo_s, x):
        if lo_s is None:
            hi_s[...] = x.astype(dtype)
        else:
            hi_s[...], lo_s[...] = _split(x, dtype)

    def sub_chunks(*lo):  # lo: the fast form's remainder tiles, dq's operand's then dk's (of those wanted)
        lo_k, lo_q = (lo[0] if lo and want_dq else None), (lo[-1] if lo and want_dk else None)
        dq_, dk_ = dq, dk
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
                dq_ = dq_ + scale * ops.matmul(a_s, x_s, (C, K), lo=lo_k) * jnp.exp(jnp.where(mine, tile.b - r, 0.0))
            if want_dk:
                dk_ = dk_ + scale * ops.matmul_tn(a_s, y_s, (C, K), lo=lo_q) * jnp.exp(
                    jnp.where(before, r - tile.b, 0.0))
        return dq_, dk_

    if not tile.exact:
        lo_type = mgpu.SMEM((C, K), dtype, transforms=_transforms(dtype, K))
        dq, dk = pl.run_scoped(sub_chunks, *[lo_type] * (want_dq + want_dk))
        return dq, dk, dv, kappa, c
    dq, dk = sub_chunks()

    # diagonal tiles, key j at a time: dq_i += dA_ij k_j e^{b_i − b_j}, dk_j += Σ_i dA_ij q_i e^{b_i − b_j}
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

    dq, dk = lax.fori_loop(0, C, key, (dq, dk))
    return dq, dk, dv, kappa, c


def _grad_kernel(d: Dims, dtype, *, scale, interpret, scalar=False, exact=True, whole=False):
    """One chunk's ``dq, dk, dv`` and chunk-local gate gradient from the state entering it (``h``) and the
    gradient of the state leaving it (``dso``): :func:`chunk_math.chunk_dq`, :func:`chunk_math.chunk_dkv`
    and :func:`chunk_math.chunk_gate_grad` in full-chunk form (:func:`_chunk_grads`), one program per chunk and
    value block (grid ``(B, H, NV, N)``). The reverse sum of the gate gradient inside the chunk is ``U x``, ``U``
    the upper triangle of ones, as two bf16 wgmmas: ``x``'s bf16 part and its bf16 remainder (:func:`_split`;
    a float32 operand would be read as tf32, 10 bits; the split keeps 16). The float32 states live in scoped
    SMEM buffers that later hold the float32 results on their way out. The kernel fills about 221 KiB of SMEM
    at ``K = 128`` (the lowering checks the 227 KiB a block has). Its sub-chunk forms hold ``q, k, b`` and
    ``dq, dk`` as whole ``[C, K]`` float32 arrays (:meth:`_Chunk._load`).

    ``whole`` (per-key gates, :func:`whole_chunk_gates`): :func:`_whole_chunk_grad_kernel`, ``dq``, ``dk`` and
    the scores split at the chunk's first row, one masked wgmma each where the sub-chunk forms take ``C/16``,
    blocked over ``K``."""
    if whole and not scalar:
        return _whole_chunk_grad_kernel(d, dtype, scale=scale, interpret=interpret)
    ops = _Ops(interpret)
    mgpu = ops.mgpu
    W = mgpu.Layout.WGMMA
    C, K, BV = d.C, d.K, d.BV
    n_sub = C // 16
    f32 = jnp.float32

    def kernel(q_ref, k_ref, v_ref, b_ref, do_ref, h_ref, dso_ref, dq_ref, dk_ref, dv_ref, dg_ref,
               q_s, k_s, v_s, do_s, b_s, r_s, bc_s, hb_s, dsb_s, x_s, y_s, a_s, ready, state_ready):
        ib, ih, iv, n = (lax.axis_index(a) for a in ("b", "h", "v", "n"))
        rows, cols = pl.ds(n * C, C), pl.ds(iv * BV, BV)
        for src, dst in ((_tokens(q_ref, ib, ih, rows), q_s), (_tokens(k_ref, ib, ih, rows), k_s),
                         (_tokens(v_ref, ib, ih, rows, cols), v_s), (_tokens(do_ref, ib, ih, rows, cols), do_s),
                         (b_ref.at[ib, ih, rows], b_s), (b_ref.at[ib, ih, n * C + C - 1], bc_s)):
            mgpu.copy_gmem_to_smem(src, dst, ready.at[0])
        for I in range(n_sub):
            mgpu.copy_gmem_to_smem(b_ref.at[ib, ih, n * C + 16 * I], r_s.at[I], ready.at[0])

        def states(h_s, dso_s):  # S and dS in float32; both leave as bf16 operands, and as Σ_v S ⊙ dS
            mgpu.copy_gmem_to_smem(h_ref.at[ib, ih, n, cols], h_s, state_ready.at[0])
            mgpu.copy_gmem_to_smem(dso_ref.at[ib, ih, n, cols], dso_s, state_ready.at[0])
            mgpu.barrier_wait(state_ready.at[0])
            St, dSt = ops.load(h_s, W), ops.load(dso_s, W)
            hb_s[...] = St.astype(dtype)
            dsb_s[...] = dSt.astype(dtype)
            return jnp.sum(St * dSt, axis=0)

        state_type = mgpu.SMEM((BV, K), f32, transforms=_transforms(f32, K))
        SdS = pl.run_scoped(states, state_type, state_type)
        mgpu.barrier_wait(ready.at[0])
        bC = ops.load(bc_s, W.reduce(0))
        tile = _Chunk(ops, C, K, dtype, q_s, k_s, b_s, scalar, exact, hold=True)
        dq, dk, dv, kappa, _ = _chunk_grads(tile, bC, v_s, do_s, tile.ref_rows(r_s), x_s, y_s, a_s, scale,
                                            hb_s=hb_s, dsb_s=dsb_s)
        dgamma = jnp.exp(bC) * SdS + kappa  # the explicit gradient of the chunk's decay b_C

        # gate gradient: Σ_{s ≥ t in the chunk} (q ⊙ dq − k ⊙ dk)_s + dγ, as U x with U the upper triangle of
        # ones: two wgmmas, of x's bf16 part and of its bf16 remainder (U exact in bf16; what the two parts
        # miss of x is under 2⁻¹⁶ of it, and the products are summed in float32). x goes to SMEM first, dq
        # and dk leave, then dg is formed: fewer [C, K] arrays held at once.
        a_s[...] = _triangle_ones(ops, C, dtype)
        x_s[...], y_s[...] = _split(tile.q * dq - tile.k * dk, dtype)
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
            mgpu.copy_smem_to_gmem(dv_s, _tokens(dv_ref, ib, ih, rows, cols))
            mgpu.wait_smem_to_gmem(0)

        pl.run_scoped(write, mgpu.SMEM((C, K), f32, transforms=_transforms(f32, K)),
                      mgpu.SMEM((C, BV), f32, transforms=_transforms(f32, BV)))

    sw = _transforms
    scratch = [
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),       # q
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),       # k
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),     # v
        mgpu.SMEM((C, BV), dtype, transforms=sw(dtype, BV)),     # do
        mgpu.SMEM((C, K), f32, transforms=sw(f32, K)),           # b
        mgpu.SMEM((n_sub, K), f32),                              # reference rows r_I
        mgpu.SMEM((K,), f32),                                    # b_C
        mgpu.SMEM((BV, K), dtype, transforms=sw(dtype, K)),      # S (bf16 operand)
        mgpu.SMEM((BV, K), dtype, transforms=sw(dtype, K)),      # dS (bf16 operand)
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),       # work operand x
        mgpu.SMEM((C, K), dtype, transforms=sw(dtype, K)),       # work operand y
        mgpu.SMEM((C, C), dtype, transforms=sw(dtype, C)),       # scores A, then dA of the tiles (I, J < I)
        mgpu.Barrier(num_arrivals=6 + n_sub, num_barriers=1),
        mgpu.Barrier(num_arrivals=2, num_barriers=1),
    ]
    return kernel, scratch


def _whole_chunk_grad_kernel(d: Dims, dtype, *, scale, interpret):
    """The whole-chunk form of :func:`_grad_kernel` (per-key gates whose chunks decay by at most
    :data:`SAFE_DECAY`, :func:`whole_chunk_gates`), blocked over ``K`` as :func:`_whole_chunk_output_kernel`.
    Every score and score gradient of the chunk splits at its first row ``b_0`` (query side
    ``Q̃ = Q ⊙ e^{b − b_0}``, exponents ≤ 0; key side ``K̃ = K ⊙ e^{b_0 − b}``, in ``[0, SAFE_DECAY]``):

        ``A = mask(Q̃ K̃ᵀ)``,  ``dA = mask(dO Vᵀ)``,  ``dV = (K ⊙ e^{b_C − b}) dS + scale Aᵀ dO``,
        ``dQ = scale ((dO Sᵀ) ⊙ e^{b} + (dA K̃) ⊙ e^{b − b_0})``,
        ``dK = (V dSᵀ) ⊙ e^{b_C − b} + scale (dAᵀ Q̃) ⊙ e^{b_0 − b}``,
        ``dg = U (Q ⊙ dQ − K ⊙ dK) + dγ``,  ``dγ = e^{b_C} ⊙ Σ_v S ⊙ dS + Σ_rows K ⊙ (V dSᵀ) ⊙ e^{b_C − b}``,

    with the roundings of the sub-chunk forms' :func:`_chunk_grads` (bf16 operands, float32 accumulation; ``K̃``
    and ``Q̃`` in two bf16 parts each for ``dQ`` and ``dK``, whose products then cancel in ``dg`` as the exact
    form's do).

    Grid ``(B, H, NV, N)``, one program per chunk and block of ``BV`` value columns; it owns ``dV``'s ``[C, BV]``
    block and this value block's partials of ``dQ``, ``dK``, ``dg`` (``[C, K]`` each; the launcher sums them over
    the value blocks). Its ``q, k`` (input dtype) and ``b`` (float32) come by TMA as ``K / BK`` blocks of
    ``BK = 64`` key columns (:data:`WHOLE_CHUNK_KEYS`), ``b_0`` and ``b_C`` as one ``[BK]`` row per block, and
    the float32 states ``Sᵀ``, ``dSᵀ`` one ``[BV, BK]`` block at a time. Two passes over the key blocks, each a
    ``lax.fori_loop`` (not unrolled in Python), each array in registers ``[C, BK]`` float32 (32 registers a
    thread), none ``[C, K]``:

    1. per block ``c``: ``Sᵀ_c``, ``dSᵀ_c`` to bf16 SMEM operands and ``Σ_v S_c ⊙ dS_c`` to a row of SMEM
       (for the second pass); ``Q̃_c``, ``K̃_c`` and
       ``K_c ⊙ e^{b_C − b_c}`` to bf16 SMEM blocks. Then ``A`` (``K / BK`` wgmmas into one accumulator) and
       ``dV`` (``K / BK + 1``);
    2. ``dA`` (one wgmma) to SMEM; ``dV`` leaves; then per block ``c``: ``Q̃_c``'s and ``K̃_c``'s bf16
       remainders, ``dQ_c`` (three wgmmas), ``dK_c`` (three) and ``dg_c`` (two), each stored to HBM as soon
       as it is finished, through two float32 SMEM buffers in turn.

    So ``2 + 10 K / BK`` wgmmas of ``64 × 64 × 64`` (22 at ``K = 128``: the tensor-core work of the unblocked
    form with the same split), and about six ``[C, BK]`` float32 arrays live at most (``b``, ``x = q ⊙ dQ_c``,
    ``dK_c``, an accumulator, an exponential, a reloaded ``q`` or ``k``: some 200 of a thread's 255 registers,
    at any ``K``; the unblocked form held ``q, k, b, dQ, dK`` as ``[C, K]`` arrays, 320 registers at
    ``K = 128``). ``e^{b − b_0}`` and ``e^{b_0 − b}`` are formed in both passes rather than held: registers are
    the scarce resource. SMEM, 212 KiB at ``K = 128``: 153.5 KiB for the whole kernel, then 48 KiB scoped to
    the first pass (a state block pair, ``K ⊙ e^{b_C − b}``) or 56 KiB to the second (remainders, ``U``, output
    buffers). HBM: each input tile and state read once, each result written once, as in the sub-chunk forms.

    Why loops: every elementwise step on a ``[C, BK]`` array is 32 instructions a thread, so the kernel is long
    straight-line code, and with one warpgroup per SM nothing hides an instruction-cache miss. With the blocks
    unrolled (478 KB of PTX, 604 bytes a thread spilled) Nsight Compute found a warp waiting on instruction fetch
    for two thirds of its cycles; as loops (267 KB, 64 bytes spilled) the kernel took 2.69 instead of 9.60 ms at
    B=8, H=16, T=4096, K=V=128 (benchmarks/results/mosaic_loops_nvidia_h200.json)"""
    ops, mgpu, W, C, K, BV, BK, nk = _whole_chunk_dims(d, interpret)
    f32 = jnp.float32
    assert BV == BK, "dV leaves through the [C, BK] output buffers"

    def kernel(q_ref, k_ref, v_ref, b_ref, do_ref, h_ref, dso_ref, dq_ref, dk_ref, dv_ref, dg_ref,
               q_s, k_s, b_s, b0_s, bc_s, sds_s, v_s, do_s, hb_s, dsb_s, xq_s, xk_s, a_s, ready, state_ready):
        ib, ih, iv, n = (lax.axis_index(a) for a in ("b", "h", "v", "n"))
        rows, cols = pl.ds(n * C, C), pl.ds(iv * BV, BV)
        for c in range(nk):  # key block c: columns c BK … c BK + BK − 1
            keys = pl.ds(c * BK, BK)
            for src, dst in ((_tokens(q_ref, ib, ih, rows, keys), q_s.at[c]),
                             (_tokens(k_ref, ib, ih, rows, keys), k_s.at[c]),
                             (b_ref.at[ib, ih, rows, keys], b_s.at[c]), (b_ref.at[ib, ih, n * C, keys], b0_s.at[c]),
                             (b_ref.at[ib, ih, n * C + C - 1, keys], bc_s.at[c])):
                mgpu.copy_gmem_to_smem(src, dst, ready.at[0])
        mgpu.copy_gmem_to_smem(_tokens(v_ref, ib, ih, rows, cols), v_s, ready.at[0])
        mgpu.copy_gmem_to_smem(_tokens(do_ref, ib, ih, rows, cols), do_s, ready.at[0])
        def row(r_s, c):  # b_0 or b_C of key block c, [BK]
            return ops.load(r_s.at[c], W.reduce(0))

        def wide(x):  # a [BK] row broadcast to every token, [C, BK]
            return lax.broadcast_in_dim(x, (C, BK), [1])

        def load(x_s, c):  # key block c of q or k as float32 [C, BK]
            return ops.load(x_s.at[c], W).astype(f32)

        def first_pass(s_s, ds_s, xs_s):
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
            a_s[...] = (scale * _causal(ops, A)).astype(dtype)
            mgpu.commit_smem()
            dv = ops.matmul_nt_blocks([(xs_s.at[c], dsb_s.at[c]) for c in range(nk)], (C, BV))
            return dv + ops.matmul_tn(a_s, do_s, (C, BV))

        def second_pass(dv, xl_s, yl_s, u_s, out_s):
            def send(i, ref, value):  # result i of this pass to HBM through the two output buffers in turn
                buf = out_s.at[i % 2]
                mgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this buffer's previous store has read it
                buf[...] = value
                mgpu.commit_smem()
                mgpu.copy_smem_to_gmem(buf, ref)

            def block(c, carry):  # key block c: dQ_c, dK_c, dg_c
                keys = pl.ds(c * BK, BK)
                b, b0, bC = ops.load(b_s.at[c], W), row(b0_s, c), row(bc_s, c)
                yl_s[...] = _split(load(q_s, c) * jnp.exp(b - wide(b0)), dtype)[1]  # the remainders of Q̃_c, K̃_c
                xl_s[...] = _split(load(k_s, c) * jnp.exp(wide(b0) - b), dtype)[1]
                mgpu.commit_smem()
                dq = scale * ops.matmul(do_s, hb_s.at[c], (C, BK)) * jnp.exp(b)
                dq = dq + scale * ops.matmul(a_s, xk_s.at[c], (C, BK), lo=xl_s) * jnp.exp(b - wide(b0))
                send(1 + 3 * c, dq_ref.at[ib, ih, iv, rows, keys], dq)
                x = load(q_s, c) * dq  # x = q ⊙ dq − k ⊙ dk takes dq's registers
                dk = ops.matmul(v_s, dsb_s.at[c], (C, BK)) * jnp.exp(wide(bC) - b)
                kappa = jnp.sum(load(k_s, c) * dk, axis=0)
                dk = dk + scale * ops.matmul_tn(a_s, xq_s.at[c], (C, BK), lo=yl_s) * jnp.exp(wide(b0) - b)
                send(2 + 3 * c, dk_ref.at[ib, ih, iv, rows, keys], dk)
                xl_s[...], yl_s[...] = _split(x - load(k_s, c) * dk, dtype)  # the remainders' wgmmas are done
                mgpu.commit_smem()
                dgamma = jnp.exp(bC) * row(sds_s, c) + kappa  # the explicit gradient of the chunk's decay b_C
                dg = ops.matmul(u_s, xl_s, (C, BK), lo=yl_s) + wide(dgamma)
                send(3 + 3 * c, dg_ref.at[ib, ih, iv, rows, keys], dg)
                return carry

            u_s[...] = _triangle_ones(ops, C, dtype)
            send(0, _tokens(dv_ref, ib, ih, rows, cols), dv)
            lax.fori_loop(0, nk, block, 0)
            mgpu.wait_smem_to_gmem(0)

        def tile(rows_, dt):
            return mgpu.SMEM((rows_, BK), dt, transforms=_transforms(dt, BK))

        dv = pl.run_scoped(first_pass, tile(BV, f32), tile(BV, f32),
                           mgpu.SMEM((nk, C, BK), dtype, transforms=_transforms(dtype, BK)))
        a_s[...] = _causal(ops, ops.matmul_nt(do_s, v_s, (C, C))).astype(dtype)  # A has been read
        mgpu.commit_smem()
        pl.run_scoped(functools.partial(second_pass, dv), tile(C, dtype), tile(C, dtype),
                      mgpu.SMEM((C, C), dtype, transforms=_transforms(dtype, C)),
                      mgpu.SMEM((2, C, BK), f32, transforms=_transforms(f32, BK)))

    sw = _transforms

    def blocks(rows, dt):
        return _key_blocks(nk, rows, BK, dt)

    scratch = [
        *_whole_chunk_inputs(nk, C, BK, dtype),                  # q, k, b, b_0 (the chunk's first row)
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
    return kernel, scratch


# ---------------------------------------------------------------- the launcher interface

def _per_key(b, K):
    """``(b, scalar)``: a scalar gate's ``b [B, H, T, 1]`` broadcast to the ``K`` key columns the kernels read
    (their tiles and TMA copies are ``[C, K]``; a 4-byte ``[C, 1]`` column is below TMA's 16-byte rows), or
    GLA's ``b`` as it is."""
    if b.shape[-1] == 1:
        return jnp.broadcast_to(b, b.shape[:-1] + (K,)), True
    return b, False


def gentle_gates(b):
    """True (a traced boolean, no sync) when every 16-token sub-chunk of the chunk-local gates ``b [B, H, T, K]``
    decays by at most :data:`SAFE_DECAY`: the kernels then form the diagonal tiles in their wgmmas (the fast
    form); otherwise, and for NaN gates, one key at a time in float32 (``exact``), correct for any gate."""
    return _spans_decay_safely(b, 16)


def _by_gates(b, scalar, call, exact=None):
    """``call(exact)``: the form a caller named (``exact`` True or False), or for ``None`` and a per-key gate's
    ``b`` the fast form where :func:`gentle_gates`, the exact one elsewhere, chosen on the device by
    ``lax.cond`` (both compiled); scalar gates have one form."""
    if scalar:
        return call(True)
    if exact is not None:
        return call(exact)
    return lax.cond(gentle_gates(b), lambda: call(False), lambda: call(True))


def _by_forms(b, scalar, chunk, call, exact=None, whole_chunk=None):
    """``call(exact, whole)`` for the per-chunk kernels of the non-fused path: the whole-chunk form where
    :func:`whole_chunk_gates`, else the sub-chunk forms by :func:`_by_gates`, chosen on the device by
    ``lax.cond`` (all compiled, no sync). Forced: ``whole_chunk=True`` (the whole-chunk form, whatever the
    gates: only for gates that satisfy :func:`whole_chunk_gates`), or ``exact`` True or False (that sub-chunk
    form); ``whole_chunk=False`` with ``exact=None``: the sub-chunk forms by :func:`gentle_gates`. Scalar
    gates have one form."""
    if scalar or whole_chunk is False or (whole_chunk is None and exact is not None):
        return _by_gates(b, scalar, lambda exact: call(exact, False), exact)
    if whole_chunk:
        return call(False, True)
    return lax.cond(whole_chunk_gates(b, chunk), lambda: call(False, True),
                    lambda: _by_gates(b, scalar, lambda exact: call(exact, False)))


def _gate_width(x, scalar):
    """A scalar gate's gradient terms from the kernels' per-key-column ones: their sum over the key columns
    (every column carries the same gate, so its gradient is the sum of theirs)."""
    return x.sum(-1, keepdims=True) if scalar else x


def state_fwd(k, v, b, h0, *, chunk, want_final, interpret=False, states_dtype=jnp.float32):
    """States entering each chunk ``h [B, H, N, V, K]`` (transposed, as ``states_dtype``) and the final state
    (float32, or None), from ``k [B, T, H, K]``, ``v [B, T, H, V]`` (:data:`TOKEN_MAJOR`) and the gates
    ``b [B, H, T, K]``. The forward asks for the states in the input dtype: :func:`chunk_fwd_o` rounds them to it
    as a wgmma operand anyway, so ``o`` is the same to the bit and the states take half the bytes to write and to
    read (as FLA keeps them); the backward recomputes them in float32, where ``Σ_v S ⊙ dS`` uses them unrounded."""
    return _state_call(k, v, b, h0, chunk=chunk, reverse=False, scale=1.0, want_final=want_final,
                       interpret=interpret, name="gla_state_fwd_mgpu", states_dtype=states_dtype)[:2]


def state_bwd(q, b, do, dht, *, chunk, scale, want_dh0, interpret=False):
    """Gradients w.r.t. the state leaving each chunk ``[B, H, N, V, K]`` and w.r.t. h0 (or None)."""
    return _state_call(q, do, b, dht, chunk=chunk, reverse=True, scale=scale, want_final=want_dh0,
                       interpret=interpret, name="gla_state_bwd_mgpu")[:2]


def chunk_fwd_o(q, k, v, b, h, *, chunk, scale, interpret=False, exact=None, whole_chunk=None):
    """The output, one program per chunk and value block on the grid ``(B, H, NV, N)``, from the state
    ``h`` entering the chunk (:func:`_output_kernel`; float32 or the input dtype; the whole-chunk form's value
    blocks by :func:`_output_dims`). The form of a per-key gate's scores (:func:`_by_forms`):
    the whole-chunk form where :func:`whole_chunk_gates`, else the fast sub-chunk form where
    :func:`gentle_gates`, else the exact one; ``whole_chunk=True`` or ``exact`` True or False force one."""
    check_supported(q.dtype, q.shape[-1], chunk)
    b, scalar = _per_key(b, q.shape[-1])
    d = _dims(q, v, chunk)
    mgpu = compat.mosaic_gpu()

    def call(exact, whole):
        dk = _output_dims(d, q.dtype, h.dtype) if whole and not scalar else d
        kernel, scratch = _output_kernel(dk, q.dtype, scale=scale, interpret=interpret, scalar=scalar, exact=exact,
                                         whole=whole, states_dtype=h.dtype)
        run = mgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(v.shape, q.dtype), scratch_types=scratch,
                          grid=(dk.B, dk.H, dk.NV, dk.N), grid_names=("b", "h", "v", "n"),
                          compiler_params=mgpu.CompilerParams(), interpret=_interpret_params(interpret),
                          kernel_name="gla_chunk_fwd_o_mgpu")
        return run(q, k, v, b, h)

    return _by_forms(b, scalar, chunk, call, exact, whole_chunk)


def chunk_bwd(q, k, v, b, do, h, dso, *, chunk, scale, interpret=False, exact=None, whole_chunk=None):
    """``dq, dk`` (float32 partials per value block ``[B, H, NV, T, K]``), ``dv`` (float32 ``[B, T, H, V]``) and
    the gate gradient's partials ``[B, H, NV, T, K]``, one program per chunk and value block (:func:`_grad_kernel`);
    the forms and ``exact``, ``whole_chunk`` as for :func:`chunk_fwd_o`."""
    check_supported(q.dtype, q.shape[-1], chunk)
    b, scalar = _per_key(b, q.shape[-1])
    d = _dims(q, v, chunk)
    mgpu = compat.mosaic_gpu()
    part = jax.ShapeDtypeStruct((d.B, d.H, d.NV, d.N * d.C, d.K), jnp.float32)

    def call(exact, whole):
        kernel, scratch = _grad_kernel(d, q.dtype, scale=scale, interpret=interpret, scalar=scalar, exact=exact,
                                       whole=whole)
        run = mgpu.kernel(kernel, out_type=[part, part, jax.ShapeDtypeStruct(v.shape, jnp.float32), part],
                          scratch_types=scratch, grid=(d.B, d.H, d.NV, d.N), grid_names=("b", "h", "v", "n"),
                          compiler_params=mgpu.CompilerParams(), interpret=_interpret_params(interpret),
                          kernel_name="gla_chunk_bwd_mgpu")
        return tuple(run(q, k, v, b, do, h, dso))

    dq, dk, dv, dg = _by_forms(b, scalar, chunk, call, exact, whole_chunk)
    return dq, dk, dv, _gate_width(dg, scalar)


MAX_K_FUSED = 64
"""Largest padded ``K`` of the fused kernels: they double-buffer four input tiles (``b`` in float32) beside
the per-chunk work tiles, at most about 197 KiB of SMEM at ``K = 64`` and over 227 KiB at ``K = 128``."""


def _fused_body(kind, dtype, scale, scalar, exact=True):
    """The per-chunk body of a fused kernel (``"fwd"``, ``"dq"`` or ``"dkv"``) for :func:`_state_kernel`, and
    its SMEM scratch ``scratch(d)``."""
    f32 = jnp.float32

    def body(env: _Loop, S):
        ops = env.ops
        mgpu, W = ops.mgpu, ops.mgpu.Layout.WGMMA
        C, K = env.b.shape
        q_s, k_s = (env.extra[0], env.x) if kind != "dkv" else (env.x, env.extra[0])
        tile = _Chunk(ops, C, K, dtype, q_s, k_s, env.b, scalar, exact, hold=kind != "fwd")
        ref_row = tile.ref_rows()  # picked out of b (one-hot sums): no extra copies in the loop
        if kind == "fwd":  # x = k, y = v, extra = (q,); S enters the chunk
            (o_ref,), (hb_s, x_s, y_s, a_s, o_s) = env.outs, env.scratch
            o = _chunk_output(tile, S, env.y, ref_row, hb_s, x_s, y_s, a_s, scale)
            mgpu.wait_smem_to_gmem(0)  # the previous chunk's o has left o_s
            o_s[...] = o.astype(dtype)
            mgpu.commit_smem()
            mgpu.copy_smem_to_gmem(o_s, _tokens(o_ref, env.ib, env.ih, env.rows, env.cols))
            return
        if kind == "dq":  # x = k, y = v, extra = (q, do); S enters the chunk
            (dq_ref, a_ref), (hb_s, x_s, y_s, a_s, out_s, row_s) = env.outs, env.scratch
            do_s = env.extra[1]
            hb_s[...] = S.astype(dtype)
            mgpu.commit_smem()
            dq = _chunk_grads(tile, None, env.y, do_s, ref_row, x_s, y_s, a_s, scale, hb_s=hb_s)[0]
            # a = Σ_v S ⊙ G, G = scale (Q ⊙ e^b)ᵀ dO held as Gᵀ [BV, K] (chunk_math.state_in_term)
            x_s[...] = (tile.q * jnp.exp(tile.b)).astype(dtype)
            mgpu.commit_smem()
            a = jnp.sum(S * (scale * ops.matmul_tn(do_s, x_s, S.shape)), axis=0)
            results = ((dq_ref, out_s, dq), (a_ref, row_s, a))
        else:  # "dkv": x = q, y = do, extra = (k, v); S is dS, the gradient of the state leaving the chunk
            (dk_ref, dv_ref, c_ref, e_ref), (dsb_s, x_s, y_s, a_s, out_s, dv_s, c_s, e_s) = env.outs, env.scratch
            bC = ops.load(env.bc, W.reduce(0))
            dsb_s[...] = S.astype(dtype)
            mgpu.commit_smem()
            _, dk, dv, kappa, c = _chunk_grads(tile, bC, env.extra[1], env.y, ref_row, x_s, y_s, a_s, scale,
                                               dsb_s=dsb_s, dS=S)
            results = ((dk_ref, out_s, dk), (dv_ref, dv_s, dv), (c_ref, c_s, c), (e_ref, e_s, kappa - c))
        mgpu.wait_smem_to_gmem(0)  # the previous chunk's results have left their buffers
        for ref, buf, value in results:
            buf[...] = value
        mgpu.commit_smem()
        for ref, buf, _ in results:
            if ref.ndim == 4:  # dv [B, T, H, V]
                dst = _tokens(ref, env.ib, env.ih, env.rows, env.cols)
            elif ref.ndim == 5:  # partials [B, H, NV, T, K]
                dst = ref.at[env.ib, env.ih, env.iv, env.rows]
            else:  # one row per chunk [B, H, NV, N, 1, K]
                dst = ref.at[env.ib, env.ih, env.iv, env.n, 0]
            mgpu.copy_smem_to_gmem(buf, dst)

    def scratch(d: Dims):
        mgpu = compat.mosaic_gpu()
        C, K, BV = d.C, d.K, d.BV

        def tile(shape, dt):
            return mgpu.SMEM(shape, dt, transforms=_transforms(dt, shape[-1]))

        work = [tile((BV, K), dtype), tile((C, K), dtype), tile((C, K), dtype), tile((C, C), dtype)]
        if kind == "fwd":
            return work + [tile((C, BV), dtype)]
        if kind == "dq":
            return work + [tile((C, K), f32), mgpu.SMEM((K,), f32)]
        return work + [tile((C, K), f32), tile((C, BV), f32), mgpu.SMEM((K,), f32), mgpu.SMEM((K,), f32)]

    return body, scratch


def fused_fwd(q, k, v, b, h0, *, chunk, scale, want_final, interpret=False, exact=None):
    """Output and final state in one program per head and value block: the state kernel's loop, whose
    body also forms each chunk's output (:func:`_chunk_output`); no state is written to HBM. ``exact``
    as for :func:`chunk_fwd_o`."""
    check_supported(q.dtype, q.shape[-1], chunk, fused=True)
    b, scalar = _per_key(b, q.shape[-1])

    def call(exact):
        body, scratch = _fused_body("fwd", q.dtype, scale, scalar, exact)
        _, ht, (o,) = _state_call(k, v, b, h0, chunk=chunk, reverse=False, scale=1.0, want_final=want_final,
                                  interpret=interpret, name="gla_fused_fwd_mgpu", write_states=False,
                                  extra=(("k", q),), body=body, body_scratch=scratch,
                                  body_outs=[jax.ShapeDtypeStruct(v.shape, q.dtype)])
        return o, ht

    return _by_gates(b, scalar, call, exact)


def fused_bwd(q, k, v, b, do, h0, dht, *, chunk, scale, want_dh0, interpret=False, exact=None):
    """All gradients with the states in registers, the interface of :func:`gla_ref.pallas.launchers.gpu.fused_bwd`: the
    state kernel's loop forwards for ``dq`` and the rows ``a`` (re-building the state), and backwards for
    ``dk, dv, dh0`` and the rows ``c, e`` of the gate gradient (``[B, H, NV, N, 1, K]``;
    :func:`gla_ref.pallas.chunk._fused_gate_grad` sums them). ``exact`` as for :func:`chunk_fwd_o`."""
    check_supported(q.dtype, q.shape[-1], chunk, fused=True)
    b, scalar = _per_key(b, q.shape[-1])

    def outs(*kinds):
        def types(d: Dims):
            shape = {"part": (d.B, d.H, d.NV, d.N * d.C, d.K), "dv": v.shape, "row": (d.B, d.H, d.NV, d.N, 1, d.K)}
            return [jax.ShapeDtypeStruct(shape[kind], jnp.float32) for kind in kinds]
        return types

    def call(exact):
        body, scratch = _fused_body("dq", q.dtype, scale, scalar, exact)
        _, _, (dq, a) = _state_call(k, v, b, h0, chunk=chunk, reverse=False, scale=1.0, want_final=False,
                                    interpret=interpret, name="gla_fused_bwd_dq_mgpu", write_states=False,
                                    extra=(("k", q), ("v", do)), body=body, body_scratch=scratch,
                                    body_outs=outs("part", "row"))
        body, scratch = _fused_body("dkv", q.dtype, scale, scalar, exact)
        _, dh0, (dk, dv, c, e) = _state_call(q, do, b, dht, chunk=chunk, reverse=True, scale=scale,
                                             want_final=want_dh0, interpret=interpret, name="gla_fused_bwd_dkv_mgpu",
                                             write_states=False, extra=(("k", k), ("v", v)), body=body,
                                             body_scratch=scratch, body_outs=outs("part", "dv", "row", "row"))
        return (dq, dk, dv, dh0) + tuple(_gate_width(r, scalar) for r in (a, c, e))

    return _by_gates(b, scalar, call, exact)
