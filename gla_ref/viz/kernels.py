"""Kernel drawings of chapters 4 and 5: the grid, what one program owns, and what crosses HBM.

Every forward kernel of :mod:`gla_ref.triton` and :mod:`gla_ref.pallas` has a :class:`KernelSpec`
in :data:`KERNELS`: its grid as a formula of the sizes, its block sizes, and for every tensor it
touches the tiles one program reads or writes in HBM. :func:`draw_kernels` draws any list of
specs with one generic routine, :func:`traffic` and :func:`traffic_table` count the bytes.

The specs restate the launchers' arithmetic instead of importing it, so that drawing needs
neither torch, Triton nor JAX. ``tests/test_plots_kernels.py`` keeps them honest: it launches
every family with its kernels replaced by recorders and checks the recorded grids, block sizes and
output sizes (Triton) or block shapes (Pallas) against the specs, so a drawing cannot silently
go stale when a launcher changes.

Conventions of the drawings. One head's slab of each tensor is drawn, rows going down: token
tensors ``[T, D]`` with the chunks marked by dotted lines, the materialised states ``h`` as ``N``
states stacked (``h[:, :, i]`` is S_[i], the state entering the 0-based chunk i), Pallas states
transposed as the launchers hold them. Read tiles are blue, written tiles red; hatching marks the
padding a Pallas launcher adds in HBM. Bytes are those of the tiles a program touches, each tile
counted once (rows past T are masked, not loaded, in Triton; Pallas moves whole padded blocks).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

# --- constants restated from the launchers (tests/test_plots_kernels.py checks each one) ---

RECURRENT_STATE_BUDGET = 4096   # gla_ref.triton.fused_recurrent.STATE_BUDGET
FUSED_STATE_ELEMENTS = 8192     # gla_ref.triton.fused_chunk.forward.STATE_ELEMENTS
SUB_CHUNK = 16                  # gla_ref.triton.chunk.intra.SUB_CHUNK and gla_ref.pallas.chunk_math.SUB
WHOLE_CHUNK_KEYS = 64           # gla_ref.triton.chunk.intra.WHOLE_CHUNK_KEYS
HISTORICAL_CHUNK = 16           # gla_ref.teaching.historical.CHUNK
HISTORICAL_MAX_BLOCK = 64       # gla_ref.teaching.historical.MAX_BLOCK
STATE_FWD_BLOCKS = (32, 128)    # (BK, BV) of the first autotune config of chunk_state_fwd_kernel
OUTPUT_BLOCKS = (64, 64)        # (BK, BV) of the first autotune config of chunk_output_kernel
SIMPLE_OUTPUT_BV = 64           # BV of the first autotune config of simple_output_kernel
TPU_LANES = 128                 # gla_ref.pallas.launchers.tpu.LANES
TPU_BLOCK_V = 128               # gla_ref.pallas.launchers.tpu.BLOCK_V
GPU_BLOCK_V = 64                # gla_ref.pallas.launchers.gpu.BLOCK_V

COLORS = {"read": "tab:blue", "write": "tab:red"}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2(n: int, least: int = 16) -> int:
    """The power of two covering ``n``, at least ``least`` (``gla_ref.triton.common.host.block``)."""
    return max(least, 1 << (n - 1).bit_length())


@dataclass(frozen=True)
class Sizes:
    """The shape a drawing is made for. ``itemsize``: bytes of an element of q, k, v, o;
    ``gate_itemsize``: of g; ``initial_state`` / ``final_state``: whether h0 is given and the final
    state asked for (their tiles are drawn and counted only then)."""
    B: int
    T: int
    H: int
    K: int
    V: int
    C: int = 64
    itemsize: int = 2
    gate_itemsize: int = 4
    initial_state: bool = False
    final_state: bool = False

    def __post_init__(self):
        for name in ("B", "T", "H", "K", "V", "C", "itemsize", "gate_itemsize"):
            n = getattr(self, name)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")


@dataclass(frozen=True)
class Axis:
    """One grid axis: its label, its size as a function of ``(sizes, blocks)``, whether it only
    picks the (batch, head) slab, and whether its steps run in order (a TPU "arbitrary" axis)."""
    label: str
    size: Callable
    head: bool = False
    sequential: bool = False


@dataclass(frozen=True)
class Access:
    """A tensor one program reads or writes. ``shape(s, b)``: one head's slab as stored in HBM
    (rows, cols), padded where the launcher pads; ``tiles(s, b, p)``: the rectangles ``(r0, r1, c0,
    c1)`` program ``p`` (a tuple of grid indices) touches; ``dtype``: ``"act"`` (q's dtype), ``"gate"``
    or ``"f32"``; ``data(s, b)``: the part that holds data, when padding surrounds it; ``tokens``:
    whether rows are tokens (chunks are then marked); ``arg``: the kernel argument it is passed
    as; ``when``: ``"initial_state"`` or ``"final_state"`` for the optional state tensors;
    ``fold(s, b)``: rows per block of a tensor stacked from blocks (states, partial slabs), drawn
    side by side and named by ``fold_label`` (a format string of the block index ``i``)."""
    tensor: str
    mode: str
    shape: Callable
    tiles: Callable
    dtype: str = "act"
    data: Callable | None = None
    tokens: bool = True
    arg: str | None = None
    when: str | None = None
    fold: Callable | None = None
    fold_label: str = "{i}"


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: ``name`` (the Triton kernel, or the ``pallas_call`` name), ``source`` (its module
    and launcher), ``title``, the ``grid`` axes, ``blocks(s)`` (block sizes and derived sizes, a dict),
    ``owns`` (what one program owns, a format string over the sizes and blocks), the ``accesses``,
    ``loop`` (the sequential walk inside a program, or None), ``chunk(s, b)`` (the row band drawn on
    token tensors, or None) and ``unit`` ("program", or "grid step" on a TPU)."""
    name: str
    source: str
    title: str
    grid: tuple
    blocks: Callable
    owns: str
    accesses: tuple
    loop: str | None = None
    chunk: Callable | None = None
    unit: str = "program"


# --- building blocks of the specs ---------------------------------------------------------------

def _band(i, n, hi=None):
    """Rows (or columns) ``[i·n, (i+1)·n)``, cut at ``hi``."""
    end = (i + 1) * n
    return i * n, end if hi is None else min(end, hi)


def _tok(name, mode, cols, rows_of, cols_of, dtype="act", arg=None, data=None):
    """A token tensor ``[T, cols]``: program p touches rows ``rows_of(s, b, p)`` and columns ``cols_of``."""
    return Access(name, mode, lambda s, b: (s.T, cols(s, b)),
                  lambda s, b, p: [(*rows_of(s, b, p), *cols_of(s, b, p))], dtype, data=data, arg=arg)


def _all_rows(s, b, p):
    return 0, s.T


def _all(dim):
    return lambda s, b, p: (0, dim(s, b))


K_ = lambda s, b: s.K  # noqa: E731
V_ = lambda s, b: s.V  # noqa: E731


def _state(name, mode, rows_blk, cols_blk, when, arg):
    """An optional ``[K, V]`` float32 state (h0 or the final state): the program's block of it."""
    return Access(name, mode, lambda s, b: (s.K, s.V),
                  lambda s, b, p: [(*rows_blk(s, b, p), *cols_blk(s, b, p))], "f32", tokens=False,
                  when=when, arg=arg)


def _chunk_states(name, mode, rows_blk, cols_blk, chunks, arg):
    """The materialised states ``h`` of one head, ``N`` blocks ``[K, V]`` stacked: the program's
    ``rows_blk × cols_blk`` block of the states of the chunks ``chunks(s, b, p)``. The forward stores
    them in the input dtype (``states_in_fp32=False``, the default)."""
    def tiles(s, b, p):
        r0, r1 = rows_blk(s, b, p)
        return [(n * s.K + r0, n * s.K + min(r1, s.K), *cols_blk(s, b, p)) for n in chunks(s, b, p)]
    return Access(name, mode, lambda s, b: (cdiv(s.T, s.C) * s.K, s.V), tiles, "act", tokens=False, arg=arg,
                  fold=lambda s, b: s.K, fold_label="$S_{{[{i}]}}$")


# --- Triton (chapter 4) ---------------------------------------------------------------------------

def _recurrent_blocks(budget):
    def blocks(s):
        BK = pow2(s.K)
        return {"BK": BK, "BV": min(pow2(s.V), max(16, budget // BK)), "N": cdiv(s.T, s.C)}
    return blocks


def _state_on_chip(source, title, budget, owns, loop, chunked):
    vblk = lambda s, b, p: _band(p[0], b["BV"], s.V)  # noqa: E731
    return KernelSpec(
        name="_fwd_kernel", source=source, title=title,
        grid=(Axis("⌈V/BV⌉", lambda s, b: cdiv(s.V, b["BV"])), Axis("B·H", lambda s, b: s.B * s.H, head=True)),
        blocks=_recurrent_blocks(budget), owns=owns,
        accesses=(_tok("q", "read", K_, _all_rows, _all(K_), arg="q"),
                  _tok("k", "read", K_, _all_rows, _all(K_), arg="k"),
                  _tok("g", "read", K_, _all_rows, _all(K_), "gate", arg="g"),
                  _tok("v", "read", V_, _all_rows, vblk, arg="v"),
                  _state("h0", "read", _all(K_), vblk, "initial_state", "h0"),
                  _tok("o", "write", V_, _all_rows, vblk, arg="o"),
                  _state("final state", "write", _all(K_), vblk, "final_state", "ht")),
        loop=loop, chunk=(lambda s, b: s.C) if chunked else None)


def _chunk_grid(first, first_size):
    """A chunk-parallel grid ``(first, ⌈T/C⌉, B·H)``."""
    return (Axis(first, first_size), Axis("⌈T/C⌉", lambda s, b: cdiv(s.T, s.C)),
            Axis("B·H", lambda s, b: s.B * s.H, head=True))


def _chunk_rows(s, b, p):
    return _band(p[1], s.C, s.T)


def _cumsum(source, title, width, gate_dtype, gate_name, decayed=False):
    """Step 1: the gates' chunk-local cumsum; with ``decayed`` (GLA) also ``scale·Q ⊙ Λ`` and ``K ⊙ Γ``."""
    dblk = lambda s, b, p: _band(p[0], b["BD"], width(s, b))  # noqa: E731
    operands = ((_tok("q", "read", width, _chunk_rows, dblk, arg="q"),
                 _tok("k", "read", width, _chunk_rows, dblk, arg="k"),
                 _tok("Q ⊙ Λ", "write", width, _chunk_rows, dblk, arg="qt"),
                 _tok("K ⊙ Γ", "write", width, _chunk_rows, dblk, arg="kt")) if decayed else ())
    return KernelSpec(
        name="chunk_cumsum_kernel", source=source, title=title,
        grid=_chunk_grid("⌈D/BD⌉", lambda s, b: cdiv(width(s, b), b["BD"])),
        blocks=lambda s: {"BD": min(64, pow2(width(s, None), least=1)), "D": width(s, None)},
        owns="one chunk's {C}×{BD} tile of gates" + (" and of q, k" if decayed else ""),
        accesses=(_tok(gate_name, "read", width, _chunk_rows, dblk, gate_dtype, arg="g"),
                  _tok("gc", "write", width, _chunk_rows, dblk, "f32", arg="gc"), *operands),
        chunk=lambda s, b: s.C)


def _last_gate_rows(kblk):
    """gc's last real row of every chunk (log γ), the columns of the program's key block."""
    def tiles(s, b, p):
        return [(min(n * s.C + s.C, s.T) - 1, min(n * s.C + s.C, s.T), *kblk(s, b, p)) for n in range(b["N"])]
    return Access("gc (last rows)", "read", lambda s, b: (s.T, s.K), tiles, "f32", arg="gc")


def _state_fwd(source, title, gate_width):
    """Step 2; per-key gates (``gate_width`` None) read K ⊙ Γ from step 1 and only log γ of each chunk."""
    kblk = lambda s, b, p: _band(p[0], b["BK"], s.K)  # noqa: E731
    vblk = lambda s, b, p: _band(p[1], b["BV"], s.V)  # noqa: E731
    if gate_width == 1:
        keys = (_tok("k", "read", K_, _all_rows, kblk, arg="k"),
                _tok("gc", "read", lambda s, b: 1, _all_rows, lambda s, b, p: (0, 1), "f32", arg="gc"))
    else:
        keys = (_tok("K ⊙ Γ", "read", K_, _all_rows, kblk, arg="k"), _last_gate_rows(kblk))
    return KernelSpec(
        name="chunk_state_fwd_kernel", source=source, title=title,
        grid=(Axis("⌈K/BK⌉", lambda s, b: cdiv(s.K, b["BK"])), Axis("⌈V/BV⌉", lambda s, b: cdiv(s.V, b["BV"])),
              Axis("B·H", lambda s, b: s.B * s.H, head=True)),
        blocks=lambda s: {"BK": STATE_FWD_BLOCKS[0], "BV": STATE_FWD_BLOCKS[1], "N": cdiv(s.T, s.C)},
        owns="a {BK}×{BV} block of one head's state, every chunk in turn",
        accesses=(keys[0],
                  _tok("v", "read", V_, _all_rows, vblk, arg="v"),
                  keys[1],
                  _state("h0", "read", kblk, vblk, "initial_state", "h0"),
                  _chunk_states("h", "write", kblk, vblk,
                                lambda s, b, p: range(b["N"]), "h"),
                  _state("final state", "write", kblk, vblk, "final_state", "ht")),
        loop="chunks in order", chunk=lambda s, b: s.C)


def _intra_rows(s, b, p):
    """The chunk of program (n, bh): rows ``[nC, min(nC + C, T))``."""
    return _band(p[0], s.C, s.T)


TRITON = {
    "fused_recurrent_gla": _state_on_chip(
        "gla_ref.triton.fused_recurrent._forward", "fused_recurrent_gla: the recurrence",
        RECURRENT_STATE_BUDGET, "all K × {BV} columns of one head's state, in registers",
        "tokens one by one", chunked=False),
    "fused_chunk_gla": _state_on_chip(
        "gla_ref.triton.fused_chunk.forward.fused_chunk_forward", "fused_chunk_gla (Alg. 5)",
        FUSED_STATE_ELEMENTS, "all K × {BV} columns of one head's state on chip; per chunk a C×C matrix P",
        "chunks in order", chunked=True),
    "chunk_cumsum": _cumsum("gla_ref.triton.chunk.cumsum.chunk_gates_and_operands",
                            "chunk_gla step 1: cumulative gates, decayed q and k", K_, "gate", "g", decayed=True),
    "chunk_state_fwd": _state_fwd("gla_ref.triton.chunk.state.chunk_state_fwd", "chunk_gla step 2: chunk states", None),
    "chunk_intra": KernelSpec(
        name="chunk_intra_kernel", source="gla_ref.triton.chunk.intra.chunk_intra_attention",
        title="chunk_gla step 3: intra-chunk A (whole chunk or sub-chunks)",
        grid=(Axis("⌈T/C⌉", lambda s, b: cdiv(s.T, s.C)), Axis("B·H", lambda s, b: s.B * s.H, head=True)),
        blocks=lambda s: {"c": min(SUB_CHUNK, s.C), "BK": pow2(s.K), "BKI": min(pow2(s.K), WHOLE_CHUNK_KEYS)},
        owns="the {C}×{C} tile of A of one chunk",
        accesses=(_tok("q", "read", K_, _intra_rows, _all(K_), arg="q"),
                  _tok("k", "read", K_, _intra_rows, _all(K_), arg="k"),
                  _tok("gc", "read", K_, _intra_rows, _all(K_), "f32", arg="gc"),
                  _tok("A", "write", lambda s, b: s.C, _intra_rows, lambda s, b, p: (0, s.C), arg="A")),
        chunk=lambda s, b: s.C),
    "chunk_output": KernelSpec(
        name="chunk_output_kernel", source="gla_ref.triton.chunk.output.chunk_output",
        title="chunk_gla step 4: output",
        grid=_chunk_grid("⌈V/BV⌉", lambda s, b: cdiv(s.V, b["BV"])),
        blocks=lambda s: {"BK": OUTPUT_BLOCKS[0], "BV": OUTPUT_BLOCKS[1]},
        owns="one chunk's {C}×{BV} tile of o",
        accesses=(_tok("Q ⊙ Λ", "read", K_, _chunk_rows, _all(K_), arg="qt"),
                  _tok("A", "read", lambda s, b: s.C, _chunk_rows, lambda s, b, p: (0, s.C), arg="A"),
                  _chunk_states("h", "read", _all(K_),
                                lambda s, b, p: _band(p[0], b["BV"], s.V), lambda s, b, p: [p[1]], "h"),
                  _tok("v", "read", V_, _chunk_rows, lambda s, b, p: _band(p[0], b["BV"], s.V), arg="v"),
                  _tok("o", "write", V_, _chunk_rows, lambda s, b, p: _band(p[0], b["BV"], s.V), arg="o")),
        chunk=lambda s, b: s.C),
    "simple_cumsum": _cumsum("gla_ref.triton.chunk.cumsum.chunk_local_cumsum",
                             "chunk_simple_gla: cumulative scalar gates", lambda s, b: 1, "f32", "g"),
    "simple_state_fwd": _state_fwd("gla_ref.triton.chunk.state.chunk_state_fwd", "chunk_simple_gla: chunk states", 1),
    "simple_output": KernelSpec(
        name="simple_output_kernel", source="gla_ref.triton.chunk_simple.ChunkSimpleGLAFunction.forward",
        title="chunk_simple_gla: output, A rebuilt on chip",
        grid=_chunk_grid("⌈V/BV⌉", lambda s, b: cdiv(s.V, b["BV"])),
        blocks=lambda s: {"BK": min(64, pow2(s.K)), "BV": SIMPLE_OUTPUT_BV},
        owns="one chunk's {C}×{BV} tile of o; (QKᵀ)⊙D on chip",
        accesses=(_tok("q", "read", K_, _chunk_rows, _all(K_), arg="q"),
                  _tok("k", "read", K_, _chunk_rows, _all(K_), arg="k"),
                  _tok("gc", "read", lambda s, b: 1, _chunk_rows, lambda s, b, p: (0, 1), "f32", arg="gc"),
                  _chunk_states("h", "read", _all(K_),
                                lambda s, b, p: _band(p[0], b["BV"], s.V), lambda s, b, p: [p[1]], "h"),
                  _tok("v", "read", V_, _chunk_rows, lambda s, b, p: _band(p[0], b["BV"], s.V), arg="v"),
                  _tok("o", "write", V_, _chunk_rows, lambda s, b, p: _band(p[0], b["BV"], s.V), arg="o")),
        chunk=lambda s, b: s.C),
}


def _hist_blocks(s):
    return {"BK": min(HISTORICAL_MAX_BLOCK, pow2(s.K)), "BV": min(HISTORICAL_MAX_BLOCK, pow2(s.V)),
            "NK": cdiv(s.K, min(HISTORICAL_MAX_BLOCK, pow2(s.K))), "N16": cdiv(s.T, HISTORICAL_CHUNK),
            "C16": HISTORICAL_CHUNK}


def _hist_rows(s, b, p):
    return _band(p[1], HISTORICAL_CHUNK, s.T)


def _hist_kblk(s, b, p):
    return _band(p[0], b["BK"], s.K)


def _hist_grid():
    return (Axis("⌈K/BK⌉", lambda s, b: b["NK"]), Axis("⌈T/16⌉", lambda s, b: b["N16"]),
            Axis("B·H", lambda s, b: s.B * s.H, head=True))


def _hist_last_rows(s, b, p):
    """The last row of every chunk of 16 (the only rows of b the inter-chunk stage reads)."""
    return [(min(n * HISTORICAL_CHUNK + HISTORICAL_CHUNK, s.T) - 1, min(n * HISTORICAL_CHUNK + HISTORICAL_CHUNK, s.T),
             *_band(p[1], b["BK"], s.K)) for n in range(b["N16"])]


_chunk16 = lambda s, b: HISTORICAL_CHUNK  # noqa: E731

HISTORICAL = {
    "historical_decay_cumsum": KernelSpec(
        name="decay_cumsum_kernel", source="gla_ref.teaching.historical.decay_cumsum.launch_decay_cumsum",
        title="historical stage 1: log₂ cumulative gates", grid=_hist_grid(), blocks=_hist_blocks,
        owns="one chunk's 16×{BK} tile of gates",
        accesses=(_tok("g", "read", K_, _hist_rows, _hist_kblk, "gate", arg="g"),
                  _tok("b (log₂)", "write", K_, _hist_rows, _hist_kblk, "f32", arg="b")),
        chunk=_chunk16),
    "historical_prepare_qg_kg": KernelSpec(
        name="prepare_qg_kg_kernel", source="gla_ref.teaching.historical.prepare_qg_kg.launch_prepare_qg_kg",
        title="historical stage 2: decayed copies q_g, k_g", grid=_hist_grid(), blocks=_hist_blocks,
        owns="one chunk's 16×{BK} tiles of q_g and k_g",
        accesses=(_tok("q", "read", K_, _hist_rows, _hist_kblk, arg="q"),
                  _tok("k", "read", K_, _hist_rows, _hist_kblk, arg="k"),
                  _tok("b (log₂)", "read", K_, _hist_rows, _hist_kblk, "f32", arg="b"),
                  _tok("q_g", "write", K_, _hist_rows, _hist_kblk, arg="qg"),
                  _tok("k_g", "write", K_, _hist_rows, _hist_kblk, arg="kg")),
        chunk=_chunk16),
    "historical_inter_chunk": KernelSpec(
        name="fused_chunk_fwd_kernel", source="gla_ref.teaching.historical.fused_chunk.launch_fused_chunk",
        title="historical stage 3: inter-chunk, state on chip",
        grid=(Axis("⌈V/BV⌉", lambda s, b: cdiv(s.V, b["BV"])), Axis("⌈K/BK⌉", lambda s, b: b["NK"]),
              Axis("B·H", lambda s, b: s.B * s.H, head=True)),
        blocks=_hist_blocks, owns="a {BK}×{BV} block of one head's state; a float32 slab of O_inter per key block",
        accesses=(_tok("q_g", "read", K_, _all_rows, lambda s, b, p: _band(p[1], b["BK"], s.K), arg="qg"),
                  _tok("k_g", "read", K_, _all_rows, lambda s, b, p: _band(p[1], b["BK"], s.K), arg="kg"),
                  _tok("v", "read", V_, _all_rows, lambda s, b, p: _band(p[0], b["BV"], s.V), arg="v"),
                  Access("b (log₂)", "read", lambda s, b: (s.T, s.K), _hist_last_rows, "f32", arg="b"),
                  _state("h0", "read", lambda s, b, p: _band(p[1], b["BK"], s.K),
                         lambda s, b, p: _band(p[0], b["BV"], s.V), "initial_state", "h0"),
                  Access("O_inter", "write", lambda s, b: (b["NK"] * s.T, s.V),
                         lambda s, b, p: [(p[1] * s.T, (p[1] + 1) * s.T, *_band(p[0], b["BV"], s.V))], "f32",
                         tokens=False, arg="o", fold=lambda s, b: s.T, fold_label="$i_k$={i}"),
                  _state("final state", "write", lambda s, b, p: _band(p[1], b["BK"], s.K),
                         lambda s, b, p: _band(p[0], b["BV"], s.V), "final_state", "ht")),
        loop="chunks of 16 in order", chunk=_chunk16),
    "historical_intra_chunk": KernelSpec(
        name="inner_chunk_kernel", source="gla_ref.teaching.historical.inner_chunk.launch_inner_chunk",
        title="historical stage 4: intra-chunk A, float32 loop", grid=_hist_grid(), blocks=_hist_blocks,
        owns="one chunk's 16×16 partial of A over a {BK}-wide key block",
        accesses=(_tok("q", "read", K_, _hist_rows, _hist_kblk, arg="q"),
                  _tok("k", "read", K_, _hist_rows, _hist_kblk, arg="k"),
                  _tok("b (log₂)", "read", K_, _hist_rows, _hist_kblk, "f32", arg="b"),
                  Access("A partials", "write", lambda s, b: (b["NK"] * b["N16"] * 16, 16),
                         lambda s, b, p: [((p[0] * b["N16"] + p[1]) * 16, (p[0] * b["N16"] + p[1] + 1) * 16, 0, 16)],
                         "f32", tokens=False, arg="A", fold=lambda s, b: b["N16"] * 16, fold_label="$i_k$={i}")),
        chunk=_chunk16),
}


# --- Pallas (chapter 5) ---------------------------------------------------------------------------

def _pallas_blocks(backend, gate):
    def blocks(s):
        if backend == "tpu":
            Kp, Vp = cdiv(s.K, TPU_LANES) * TPU_LANES, cdiv(s.V, TPU_LANES) * TPU_LANES
            BV = min(Vp, TPU_BLOCK_V)
        else:
            Kp, Vp = pow2(s.K), pow2(s.V)
            BV = min(Vp, GPU_BLOCK_V)
        N = cdiv(s.T, s.C)
        return {"Kp": Kp, "Vp": Vp, "BV": BV, "NV": Vp // BV, "N": N, "Tp": N * s.C,
                "Kg": Kp if gate == "gla" else 1}
    return blocks


def _pallas_specs(backend, gate):
    """The forward kernels of one Pallas launcher (``"tpu"`` or ``"gpu"``) for a gate of width K
    (``"gla"``) or 1 (``"scalar"``): the state kernel, the output kernel and the fused kernel."""
    tpu = backend == "tpu"
    bh = (Axis("B", lambda s, b: s.B, head=True), Axis("H", lambda s, b: s.H, head=True),
          Axis("V/BV", lambda s, b: b["NV"]))
    grid_seq = bh + ((Axis("N", lambda s, b: b["N"], sequential=True),) if tpu else ())
    grid_par = bh + (Axis("N", lambda s, b: b["N"]),)
    per_step = lambda s, b, p: _band(p[3], s.C)  # noqa: E731  one chunk per grid step
    rows = per_step if tpu else (lambda s, b, p: (0, b["Tp"]))  # the GPU program sees the whole sequence
    vblk = lambda s, b, p: _band(p[2], b["BV"])  # noqa: E731

    def tok(name, mode, width, cols, dtype, data, row_of=rows):
        return Access(name, mode, lambda s, b: (b["Tp"], b[width]),
                      lambda s, b, p: [(*row_of(s, b, p), *cols(s, b, p))], dtype, data=data)

    data_k = lambda s, b: (s.T, s.K)  # noqa: E731
    data_v = lambda s, b: (s.T, s.V)  # noqa: E731
    data_g = lambda s, b: (s.T, s.K if gate == "gla" else 1)  # noqa: E731
    gname = "b"

    def states(mode, which):
        return Access("h", mode, lambda s, b: (b["N"] * b["Vp"], b["Kp"]),
                      lambda s, b, p: [(n * b["Vp"] + p[2] * b["BV"], n * b["Vp"] + (p[2] + 1) * b["BV"], 0, b["Kp"])
                                       for n in which(s, b, p)], "f32", data=None, tokens=False,
                      fold=lambda s, b: b["Vp"], fold_label="$S_{{[{i}]}}^T$")

    def state(name, mode, when):
        return Access(name, mode, lambda s, b: (b["Vp"], b["Kp"]),
                      lambda s, b, p: [(p[2] * b["BV"], (p[2] + 1) * b["BV"], 0, b["Kp"])], "f32",
                      data=lambda s, b: (s.V, s.K), tokens=False, when=when)

    k_all = lambda s, b, p: (0, b["Kp"])  # noqa: E731
    g_all = lambda s, b, p: (0, b["Kg"])  # noqa: E731
    mod = f"gla_ref.pallas.{backend}"
    where = "VMEM scratch" if tpu else "fori_loop carry"
    loop = "grid axis N, 'arbitrary'" if tpu else "chunks in a fori_loop"
    step = "grid step" if tpu else "program"
    owns_state = ("one (b, h, value block): its {BV}×{Kp} state Sᵀ in " + where
                  + (", one chunk per grid step" if tpu else ", the whole sequence as its block"))
    suffix = "" if gate == "gla" else " (scalar gate)"
    label = "TPU (Mosaic)" if tpu else "GPU (Triton)"
    h0 = state("h0", "read", "initial_state")
    ht = state("final state", "write", "final_state")
    return {
        f"{backend}.gla_state_fwd{'' if gate == 'gla' else '.scalar'}": KernelSpec(
            name="gla_state_fwd", source=f"{mod}.state_fwd", title=f"Pallas {label}: state kernel{suffix}",
            grid=grid_seq, blocks=_pallas_blocks(backend, gate), owns=owns_state,
            accesses=(tok("k", "read", "Kp", k_all, "act", data_k), tok("v", "read", "Vp", vblk, "act", data_v),
                      tok(gname, "read", "Kg", g_all, "f32", data_g), h0,
                      states("write", (lambda s, b, p: [p[3]]) if tpu else (lambda s, b, p: range(b["N"]))), ht),
            loop=loop, chunk=lambda s, b: s.C, unit=step),
        f"{backend}.gla_chunk_fwd_o{'' if gate == 'gla' else '.scalar'}": KernelSpec(
            name="gla_chunk_fwd_o", source=f"{mod}.chunk_fwd_o", title=f"Pallas {label}: output kernel{suffix}",
            grid=grid_par, blocks=_pallas_blocks(backend, gate),
            owns="one chunk's {C}×{BV} tile of o, from the state entering it",
            accesses=(tok("q", "read", "Kp", k_all, "act", data_k, per_step),
                      tok("k", "read", "Kp", k_all, "act", data_k, per_step),
                      tok("v", "read", "Vp", vblk, "act", data_v, per_step),
                      tok(gname, "read", "Kg", g_all, "f32", data_g, per_step),
                      states("read", lambda s, b, p: [p[3]]),
                      tok("o", "write", "Vp", vblk, "act", data_v, per_step)),
            chunk=lambda s, b: s.C, unit=step),
        f"{backend}.gla_fused_fwd{'' if gate == 'gla' else '.scalar'}": KernelSpec(
            name="gla_fused_fwd", source=f"{mod}.fused_fwd", title=f"Pallas {label}: fused kernel{suffix}",
            grid=grid_seq, blocks=_pallas_blocks(backend, gate), owns=owns_state,
            accesses=(tok("q", "read", "Kp", k_all, "act", data_k), tok("k", "read", "Kp", k_all, "act", data_k),
                      tok("v", "read", "Vp", vblk, "act", data_v), tok(gname, "read", "Kg", g_all, "f32", data_g), h0,
                      tok("o", "write", "Vp", vblk, "act", data_v), ht),
            loop=loop, chunk=lambda s, b: s.C, unit=step),
    }


PALLAS = {**_pallas_specs("tpu", "gla"), **_pallas_specs("gpu", "gla"),
          **_pallas_specs("tpu", "scalar"), **_pallas_specs("gpu", "scalar")}

KERNELS = {**TRITON, **HISTORICAL, **PALLAS}
"""Every drawn kernel by key."""

FAMILIES = {
    "fused_recurrent_gla": ("fused_recurrent_gla",),
    "fused_chunk_gla": ("fused_chunk_gla",),
    "chunk_gla": ("chunk_cumsum", "chunk_state_fwd", "chunk_intra", "chunk_output"),
    "chunk_simple_gla": ("simple_cumsum", "simple_state_fwd", "simple_output"),
    "historical": tuple(HISTORICAL),
    "pallas.chunk_gla": ("tpu.gla_state_fwd", "tpu.gla_chunk_fwd_o", "gpu.gla_state_fwd", "gpu.gla_chunk_fwd_o"),
    "pallas.fused_chunk_gla": ("tpu.gla_fused_fwd", "gpu.gla_fused_fwd"),
    "pallas.chunk_simple_gla": ("tpu.gla_fused_fwd.scalar", "gpu.gla_fused_fwd.scalar",
                                "tpu.gla_state_fwd.scalar", "gpu.gla_chunk_fwd_o.scalar"),
}
"""The forward kernels of each public function (in launch order), as drawn in chapters 4 and 5;
``pallas.chunk_simple_gla`` lists the fused kernels its default ``mode="auto"`` takes without
states, then the non-fused ones it takes with them."""


# --- evaluation -----------------------------------------------------------------------------------

def _spec(spec):
    if isinstance(spec, KernelSpec):
        return spec
    if spec not in KERNELS:
        raise ValueError(f"spec must be a KernelSpec or one of {sorted(KERNELS)}, got {spec!r}")
    return KERNELS[spec]


def block_sizes(spec, sizes, **overrides):
    """The block sizes (and derived sizes) of ``spec`` for ``sizes``; keyword overrides replace
    autotuned ones (e.g. ``BV=128`` for what a GPU autotuner picked)."""
    spec = _spec(spec)
    b = dict(spec.blocks(sizes))
    for key, val in overrides.items():
        if key not in b:
            raise ValueError(f"{spec.name} has no block size {key!r}; it has {sorted(b)}")
        b[key] = val
    return b


def grid(spec, sizes, **overrides):
    """The launch grid of ``spec`` for ``sizes``: a tuple of ints, as the launcher passes it."""
    spec = _spec(spec)
    b = block_sizes(spec, sizes, **overrides)
    return tuple(int(a.size(sizes, b)) for a in spec.grid)


def _active(spec, sizes):
    return [a for a in spec.accesses if a.when is None or getattr(sizes, a.when)]


def _itemsize(access, sizes):
    return {"act": sizes.itemsize, "gate": sizes.gate_itemsize, "f32": 4}[access.dtype]


def _clip(tile, shape):
    r0, r1, c0, c1 = tile
    return max(r0, 0), min(r1, shape[0]), max(c0, 0), min(c1, shape[1])


def _tile_bytes(access, sizes, b, p):
    shape = access.shape(sizes, b)
    area = 0
    for tile in access.tiles(sizes, b, p):
        r0, r1, c0, c1 = _clip(tile, shape)
        area += max(r1 - r0, 0) * max(c1 - c0, 0)
    return area * _itemsize(access, sizes)


def default_program(spec, sizes, **overrides):
    """The program drawn: index 1 along every grid axis that has two steps or more (so the tile is
    not at the origin), else 0."""
    return tuple(min(1, n - 1) for n in grid(spec, sizes, **overrides))


def traffic(spec, sizes, program=None, **overrides):
    """Bytes that one program (``program``, default :func:`default_program`) and all programs
    together read and write, per tensor: a list of dicts with ``tensor``, ``mode``, ``program``
    (bytes of that program) and ``total`` (summed over every program of the grid; repeated reads,
    e.g. of k by the query sub-chunks of one chunk, count every time)."""
    spec = _spec(spec)
    b = block_sizes(spec, sizes, **overrides)
    g = grid(spec, sizes, **overrides)
    p = default_program(spec, sizes, **overrides) if program is None else tuple(program)
    if len(p) != len(g) or any(not 0 <= i < n for i, n in zip(p, g)):
        raise ValueError(f"program must index the grid {g}, got {p}")
    heads = 1
    ranges = []
    for axis, n in zip(spec.grid, g):
        if axis.head:
            heads *= n
            ranges.append([0])
        else:
            ranges.append(range(n))
    rows = []
    for a in _active(spec, sizes):
        total = heads * sum(_tile_bytes(a, sizes, b, q) for q in itertools.product(*ranges))
        rows.append({"tensor": a.tensor, "mode": a.mode, "program": _tile_bytes(a, sizes, b, p), "total": total})
    return rows


def format_bytes(n):
    """``n`` bytes as B, KiB, MiB or GiB with three significant digits."""
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def traffic_table(specs, sizes, **overrides):
    """A text table of :func:`traffic` for each spec (a key of :data:`KERNELS`, a family of
    :data:`FAMILIES`, or a list of them), one line per tensor."""
    if isinstance(specs, str) and specs in FAMILIES:
        specs = FAMILIES[specs]
    elif isinstance(specs, (str, KernelSpec)):
        specs = [specs]
    lines = []
    for spec in map(_spec, specs):
        own = {k: v for k, v in overrides.items() if k in spec.blocks(sizes)}
        g = grid(spec, sizes, **own)
        n = 1
        for x in g:
            n *= x
        lines.append(f"{spec.name}: grid {g} = {n} {spec.unit}s")
        for row in traffic(spec, sizes, **own):
            lines.append(f"    {row['mode']:<5} {row['tensor']:<10} {format_bytes(row['program']):>10} per {spec.unit}"
                         f"   {format_bytes(row['total']):>10} over all")
    return "\n".join(lines)


# --- drawing --------------------------------------------------------------------------------------

def _layout(access, shape, sizes, b):
    """How a tensor is drawn: ``(blocks, block_rows, cols)``, blocks of a folded tensor side by side."""
    rows, cols = shape
    if access.fold is None:
        return 1, rows, cols
    per = access.fold(sizes, b)
    return cdiv(rows, per), per, cols


def _draw_one(ax, spec, sizes, program, overrides):
    from matplotlib.patches import Rectangle

    b = block_sizes(spec, sizes, **overrides)
    g = grid(spec, sizes, **overrides)
    p = default_program(spec, sizes, **overrides) if program is None else tuple(program)
    accesses = _active(spec, sizes)
    names = list(dict.fromkeys(a.tensor for a in accesses))
    first = {name: next(a for a in accesses if a.tensor == name) for name in names}
    shapes = {name: a.shape(sizes, b) for name, a in first.items()}
    layouts = {name: _layout(a, shapes[name], sizes, b) for name, a in first.items()}
    tallest = max(rows for _, rows, _ in layouts.values())
    room = 0.32 * tallest  # the narrowest slot: room for the labels
    gap = 0.1 * tallest
    chunk = spec.chunk(sizes, b) if spec.chunk else None
    x = 0.0
    for name in names:
        rows, cols = shapes[name]
        n_blocks, per, _ = layouts[name]
        fold_gap = max(0.04 * tallest, 0.16 * tallest - cols)  # room for the block labels
        drawn = n_blocks * cols + (n_blocks - 1) * fold_gap
        slot = max(drawn, room)
        x0 = x + (slot - drawn) / 2
        mine = [a for a in accesses if a.tensor == name]

        def place(r, c):  # element (r, c) of the stored slab -> drawing coordinates
            j = r // per if n_blocks > 1 else 0
            return x0 + j * (cols + fold_gap) + c, r - j * per

        for j in range(n_blocks):
            bx, _ = place(j * per, 0)
            h = min(per, rows - j * per)
            ax.add_patch(Rectangle((bx, 0), cols, h, fill=False, ec="0.3", lw=0.8, label="tensor"))
            if n_blocks > 1:
                ax.text(bx + cols / 2, h + 0.02 * tallest, first[name].fold_label.format(i=j), ha="center",
                        va="top", fontsize=6.5, color="0.35")
        data = first[name].data(sizes, b) if first[name].data else None
        if data is not None and (data[0] < rows or data[1] < cols):  # padding added by the launcher
            for px, py, pw, ph in ((data[1], 0, cols - data[1], rows), (0, data[0], data[1], rows - data[0])):
                if pw > 0 and ph > 0:
                    ax.add_patch(Rectangle((x0 + px, py), pw, ph, fill=False, hatch="////", ec="0.75", lw=0,
                                           label="padding"))
        if chunk and first[name].tokens:
            for r in range(chunk, rows, chunk):
                ax.plot([x0, x0 + cols], [r, r], color="0.55", lw=0.5, ls=":")
        below = []
        for a in mine:
            for tile in a.tiles(sizes, b, p):
                r0, r1, c0, c1 = _clip(tile, shapes[name])
                if r1 > r0 and c1 > c0:
                    tx, ty = place(r0, c0)
                    ax.add_patch(Rectangle((tx, ty), c1 - c0, r1 - r0, color=COLORS[a.mode], alpha=0.55, lw=0,
                                           label=a.mode))
            below.append(f"{a.mode} {format_bytes(_tile_bytes(a, sizes, b, p))}")
        ax.text(x + slot / 2, -0.03 * tallest, f"{name}\n{rows}×{cols}", ha="center", va="bottom", fontsize=6.5)
        bottom = min(per, rows) + (0.1 if n_blocks > 1 else 0.03) * tallest
        for i, line in enumerate(below):
            ax.text(x + slot / 2, bottom + 0.1 * i * tallest, line.replace(" ", "\n", 1), ha="center", va="top",
                    fontsize=6.5, color=COLORS[mine[i].mode])
        x += slot + gap
    if spec.loop:
        ax.annotate("", xy=(-0.45 * gap, tallest), xytext=(-0.45 * gap, 0),
                    arrowprops=dict(arrowstyle="-|>", color="k", lw=1.2))
        ax.text(-0.7 * gap, tallest / 2, f"loop: {spec.loop}", rotation=90, ha="right", va="center", fontsize=7)
    axes = ", ".join(f"{a.label}={n}" + (" in order" if a.sequential else "") for a, n in zip(spec.grid, g))
    n_prog = 1
    for n in g:
        n_prog *= n
    ax.set_title(f"{spec.title}\n{spec.name}: grid ({axes}) = {n_prog} {spec.unit}s", fontsize=8)
    reads = sum(_tile_bytes(a, sizes, b, p) for a in accesses if a.mode == "read")
    writes = sum(_tile_bytes(a, sizes, b, p) for a in accesses if a.mode == "write")
    fields = {**{f: getattr(sizes, f) for f in ("B", "T", "H", "K", "V", "C")}, **b}
    left = -1.6 * gap if spec.loop else -0.2 * gap
    ax.text(left, tallest * 1.36, f"{spec.unit} {p} owns {spec.owns.format(**fields)}\n"
            f"per {spec.unit}: reads {format_bytes(reads)}, writes {format_bytes(writes)}", fontsize=7, va="top")
    ax.set_xlim(left, x - gap + 0.02 * tallest)
    ax.set_ylim(tallest * 1.5, -0.3 * tallest)
    ax.set_aspect("equal")
    ax.axis("off")
    return ax


def draw_kernels(specs, sizes, *, program=None, ncols=None, **overrides):
    """Draw kernels, one panel each: every tensor a program touches (one head's slab), its tiles
    (blue read, red written) for one program of the grid, the grid with its axes in the title, the
    loop a program runs (an arrow), and the bytes per program under each tensor and in total.

    ``specs``: a family of :data:`FAMILIES`, a key of :data:`KERNELS`, a :class:`KernelSpec`, or a
    list of keys/specs. ``sizes``: a :class:`Sizes`. ``program``: the grid indices drawn (default
    :func:`default_program`; all panels must share a grid rank then). ``overrides``: block sizes
    (e.g. ``BV=64``) for the kernels that have them. Returns the Figure."""
    import matplotlib.pyplot as plt

    if not isinstance(sizes, Sizes):
        raise TypeError(f"sizes must be a gla_ref.viz.kernels.Sizes, got {type(sizes).__name__}")
    if isinstance(specs, str) and specs in FAMILIES:
        specs = FAMILIES[specs]
    elif isinstance(specs, (str, KernelSpec)):
        specs = [specs]
    specs = [_spec(s) for s in specs]
    if not specs:
        raise ValueError("specs must name at least one kernel")
    ncols = ncols or 1
    nrows = cdiv(len(specs), ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 3.3 * nrows), dpi=90, squeeze=False)
    for ax, spec in zip(axes.flat, specs):
        own = {k: v for k, v in overrides.items() if k in spec.blocks(sizes)}
        _draw_one(ax, spec, sizes, program, own)
    for ax in axes.flat[len(specs):]:
        fig.delaxes(ax)
    fig.tight_layout()
    return fig
