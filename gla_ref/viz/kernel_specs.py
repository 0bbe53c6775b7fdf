"""What each kernel of :mod:`gla_ref.triton` and :mod:`gla_ref.pallas` launches, as data the drawings read.

Every forward kernel has a :class:`KernelSpec` in :data:`KERNELS`: its grid as a formula of the sizes,
its block sizes, and for every tensor it touches the tiles one program reads or writes in HBM.
Launch constants (block sizes, budgets, sub-chunk sizes) come from :mod:`gla_ref.specs`, the module
the kernels take them from, so a drawing cannot restate a stale number; the grids here are the
drawing's own description of each launcher, which ``tests/book/test_plots_kernels.py`` checks against
recorded launches. :mod:`gla_ref.viz.kernels` draws and counts these specs. Needs no framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gla_ref import specs

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
        blocks=lambda s: {"BD": min(specs.CUMSUM_BLOCK_D, pow2(width(s, None), least=1)), "D": width(s, None)},
        owns="one chunk's {C}×{BD} tile of gates" + (" and of q, k" if decayed else ""),
        accesses=(_tok(gate_name, "read", width, _chunk_rows, dblk, gate_dtype, arg="g"),
                  _tok("gc", "write", width, _chunk_rows, dblk, "f32", arg="b"), *operands),
        chunk=lambda s, b: s.C)


def _last_gate_rows(kblk):
    """gc's last real row of every chunk (log γ), the columns of the program's key block."""
    def tiles(s, b, p):
        return [(min(n * s.C + s.C, s.T) - 1, min(n * s.C + s.C, s.T), *kblk(s, b, p)) for n in range(b["N"])]
    return Access("gc (last rows)", "read", lambda s, b: (s.T, s.K), tiles, "f32", arg="b")


def _state_fwd(source, title, gate_width):
    """Step 2; per-key gates (``gate_width`` None) read K ⊙ Γ from step 1 and only log γ of each chunk."""
    kblk = lambda s, b, p: _band(p[0], b["BK"], s.K)  # noqa: E731
    vblk = lambda s, b, p: _band(p[1], b["BV"], s.V)  # noqa: E731
    if gate_width == 1:
        keys = (_tok("k", "read", K_, _all_rows, kblk, arg="k"),
                _tok("gc", "read", lambda s, b: 1, _all_rows, lambda s, b, p: (0, 1), "f32", arg="b"))
    else:
        keys = (_tok("K ⊙ Γ", "read", K_, _all_rows, kblk, arg="k"), _last_gate_rows(kblk))
    return KernelSpec(
        name="chunk_state_fwd_kernel", source=source, title=title,
        grid=(Axis("⌈K/BK⌉", lambda s, b: cdiv(s.K, b["BK"])), Axis("⌈V/BV⌉", lambda s, b: cdiv(s.V, b["BV"])),
              Axis("B·H", lambda s, b: s.B * s.H, head=True)),
        blocks=lambda s: {"BK": specs.STATE_FWD_BLOCKS[0], "BV": specs.STATE_FWD_BLOCKS[1], "N": cdiv(s.T, s.C)},
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
        specs.RECURRENT_STATE_BUDGET, "all K × {BV} columns of one head's state, in registers",
        "tokens one by one", chunked=False),
    "fused_chunk_gla": _state_on_chip(
        "gla_ref.triton.fused_chunk.forward.fused_chunk_forward", "fused_chunk_gla (Alg. 5)",
        specs.FUSED_STATE_ELEMENTS, "all K × {BV} columns of one head's state on chip; per chunk a C×C matrix P",
        "chunks in order", chunked=True),
    "chunk_cumsum": _cumsum("gla_ref.triton.chunk.cumsum.chunk_gates_and_operands",
                            "chunk_gla step 1: cumulative gates, decayed q and k", K_, "gate", "g", decayed=True),
    "chunk_state_fwd": _state_fwd("gla_ref.triton.chunk.state.chunk_state_fwd", "chunk_gla step 2: chunk states", None),
    "chunk_intra": KernelSpec(
        name="chunk_intra_kernel", source="gla_ref.triton.chunk.intra.chunk_intra_attention",
        title="chunk_gla step 3: intra-chunk A (whole chunk or sub-chunks)",
        grid=(Axis("⌈T/C⌉", lambda s, b: cdiv(s.T, s.C)), Axis("B·H", lambda s, b: s.B * s.H, head=True)),
        blocks=lambda s: {"c": min(specs.SUB_CHUNK, s.C), "BK": pow2(s.K),
                           "BKI": min(pow2(s.K), specs.WHOLE_CHUNK_KEYS)},
        owns="the {C}×{C} tile of A of one chunk",
        accesses=(_tok("q", "read", K_, _intra_rows, _all(K_), arg="q"),
                  _tok("k", "read", K_, _intra_rows, _all(K_), arg="k"),
                  _tok("gc", "read", K_, _intra_rows, _all(K_), "f32", arg="b"),
                  _tok("A", "write", lambda s, b: s.C, _intra_rows, lambda s, b, p: (0, s.C), arg="A")),
        chunk=lambda s, b: s.C),
    "chunk_output": KernelSpec(
        name="chunk_output_kernel", source="gla_ref.triton.chunk.output.chunk_output",
        title="chunk_gla step 4: output",
        grid=_chunk_grid("⌈V/BV⌉", lambda s, b: cdiv(s.V, b["BV"])),
        blocks=lambda s: {"BK": specs.OUTPUT_BLOCKS[0], "BV": specs.OUTPUT_BLOCKS[1]},
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
        name="simple_output_kernel", source="gla_ref.triton.chunk_simple.simple_forward",
        title="chunk_simple_gla: output, A rebuilt on chip",
        grid=_chunk_grid("⌈V/BV⌉", lambda s, b: cdiv(s.V, b["BV"])),
        blocks=lambda s: {"BK": min(specs.SIMPLE_OUTPUT_BLOCK_K, pow2(s.K)), "BV": specs.BLOCK_CONFIGS_FIRST},
        owns="one chunk's {C}×{BV} tile of o; (QKᵀ)⊙D on chip",
        accesses=(_tok("q", "read", K_, _chunk_rows, _all(K_), arg="q"),
                  _tok("k", "read", K_, _chunk_rows, _all(K_), arg="k"),
                  _tok("gc", "read", lambda s, b: 1, _chunk_rows, lambda s, b, p: (0, 1), "f32", arg="b"),
                  _chunk_states("h", "read", _all(K_),
                                lambda s, b, p: _band(p[0], b["BV"], s.V), lambda s, b, p: [p[1]], "h"),
                  _tok("v", "read", V_, _chunk_rows, lambda s, b, p: _band(p[0], b["BV"], s.V), arg="v"),
                  _tok("o", "write", V_, _chunk_rows, lambda s, b, p: _band(p[0], b["BV"], s.V), arg="o")),
        chunk=lambda s, b: s.C),
}


def _hist_blocks(s):
    BK = min(specs.HISTORICAL_MAX_BLOCK, pow2(s.K))
    return {"BK": BK, "BV": min(specs.HISTORICAL_MAX_BLOCK, pow2(s.V)), "NK": cdiv(s.K, BK),
            "N16": cdiv(s.T, specs.HISTORICAL_CHUNK), "C16": specs.HISTORICAL_CHUNK}


def _hist_rows(s, b, p):
    return _band(p[1], specs.HISTORICAL_CHUNK, s.T)


def _hist_kblk(s, b, p):
    return _band(p[0], b["BK"], s.K)


def _hist_grid():
    return (Axis("⌈K/BK⌉", lambda s, b: b["NK"]), Axis(f"⌈T/{specs.HISTORICAL_CHUNK}⌉", lambda s, b: b["N16"]),
            Axis("B·H", lambda s, b: s.B * s.H, head=True))


def _hist_last_rows(s, b, p):
    """The last row of every chunk (16 tokens): the only rows of b the inter-chunk stage reads."""
    c = specs.HISTORICAL_CHUNK
    return [(min(n * c + c, s.T) - 1, min(n * c + c, s.T), *_band(p[1], b["BK"], s.K)) for n in range(b["N16"])]


_chunk16 = lambda s, b: specs.HISTORICAL_CHUNK  # noqa: E731

HISTORICAL = {
    "historical_decay_cumsum": KernelSpec(
        name="decay_cumsum_kernel", source="gla_ref.teaching.historical.decay_cumsum.launch_decay_cumsum",
        title="historical stage 1: log₂ cumulative gates", grid=_hist_grid(), blocks=_hist_blocks,
        owns="one chunk's {C16}×{BK} tile of gates",
        accesses=(_tok("g", "read", K_, _hist_rows, _hist_kblk, "gate", arg="g"),
                  _tok("b (log₂)", "write", K_, _hist_rows, _hist_kblk, "f32", arg="b")),
        chunk=_chunk16),
    "historical_prepare_qg_kg": KernelSpec(
        name="prepare_qg_kg_kernel", source="gla_ref.teaching.historical.prepare_qg_kg.launch_prepare_qg_kg",
        title="historical stage 2: decayed copies q_g, k_g", grid=_hist_grid(), blocks=_hist_blocks,
        owns="one chunk's {C16}×{BK} tiles of q_g and k_g",
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
        loop=f"chunks of {specs.HISTORICAL_CHUNK} in order", chunk=_chunk16),
    "historical_intra_chunk": KernelSpec(
        name="inner_chunk_kernel", source="gla_ref.teaching.historical.inner_chunk.launch_inner_chunk",
        title="historical stage 4: intra-chunk A, float32 loop", grid=_hist_grid(), blocks=_hist_blocks,
        owns="one chunk's {C16}×{C16} partial of A over a {BK}-wide key block",
        accesses=(_tok("q", "read", K_, _hist_rows, _hist_kblk, arg="q"),
                  _tok("k", "read", K_, _hist_rows, _hist_kblk, arg="k"),
                  _tok("b (log₂)", "read", K_, _hist_rows, _hist_kblk, "f32", arg="b"),
                  Access("A partials", "write", lambda s, b: (b["NK"] * b["N16"] * b["C16"], b["C16"]),
                         lambda s, b, p: [((p[0] * b["N16"] + p[1]) * b["C16"], (p[0] * b["N16"] + p[1] + 1) * b["C16"],
                                           0, b["C16"])],
                         "f32", tokens=False, arg="A", fold=lambda s, b: b["N16"] * b["C16"], fold_label="$i_k$={i}")),
        chunk=_chunk16),
}


# --- Pallas (chapter 5) ---------------------------------------------------------------------------

def _pallas_blocks(backend, gate):
    def blocks(s):
        if backend == "tpu":
            Kp, Vp = cdiv(s.K, specs.TPU_LANES) * specs.TPU_LANES, cdiv(s.V, specs.TPU_LANES) * specs.TPU_LANES
            BV = min(Vp, specs.TPU_BLOCK_V)
        else:
            Kp, Vp = pow2(s.K), pow2(s.V)
            BV = min(Vp, specs.GPU_BLOCK_V)
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
