"""Kernel drawings of chapters 4 and 5: the grid, what one program owns, and what crosses HBM.

Every forward kernel of :mod:`gla_ref.triton` and :mod:`gla_ref.pallas` has a :class:`KernelSpec`
in :data:`KERNELS` (defined in :mod:`gla_ref.viz.kernel_specs`): its grid as a formula of the sizes, its block sizes, and for every tensor it
touches the tiles one program reads or writes in HBM. :func:`draw_kernels` draws any list of
specs with one generic routine, :func:`traffic` and :func:`traffic_table` count the bytes.

Block sizes and budgets come from :mod:`gla_ref.specs`, the framework-free module the kernels take
their own launch constants from (the first autotune config's blocks included), so drawing needs
neither torch, Triton nor JAX and holds no copy of a kernel's number. What stays here is each
kernel's own description: its grid and block sizes as formulas of the sizes and those constants,
and the tiles it touches. The test of the drawings (``tests/book/test_plots_kernels.py``) launches
every family with its kernels replaced by recorders and checks the recorded grids, block sizes and
output sizes (Triton) or block shapes (Pallas) against these specs, so a drawing cannot silently go
stale when a launcher's arithmetic changes.

Conventions of the drawings. One head's slab of each tensor is drawn, rows going down: token
tensors ``[T, D]`` with the chunks marked by dotted lines, the materialised states ``h`` as ``N``
states stacked (``h[:, :, i]`` is S_[i], the state entering the 0-based chunk i), Pallas states
transposed as the launchers hold them. Read tiles are blue, written tiles red; hatching marks the
padding a Pallas launcher adds in HBM. Bytes are those of the tiles a program touches, each tile
counted once (rows past T are masked, not loaded, in Triton; Pallas moves whole padded blocks).
"""

from __future__ import annotations

import itertools

from gla_ref.viz.kernel_specs import (  # noqa: F401 (the specs are used through this module too)
    COLORS,
    FAMILIES,
    HISTORICAL,
    KERNELS,
    PALLAS,
    TRITON,
    Access,
    Axis,
    KernelSpec,
    Sizes,
    cdiv,
    pow2,
)

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
