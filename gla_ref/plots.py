"""Matplotlib helpers the chapters share (decay maps, attention-like maps, error and timing curves).

Each function draws on an Axes it is given (or a new one) and returns it; none calls ``plt.show``.
"""

from __future__ import annotations

# --- chapter 1: linear attention ---

def plot_attention_maps(maps, axes=None, *, cmap="RdBu_r"):
    """One heatmap per ``{title: [T, T] matrix}``, side by side, colour scale symmetric about 0
    (negative weights show up blue). Returns the axes."""
    import matplotlib.pyplot as plt
    import numpy as np

    if axes is None:
        _, axes = plt.subplots(1, len(maps), figsize=(2.6 * len(maps), 2.6), dpi=90, squeeze=False)
        axes = axes[0]
    for ax, (title, A) in zip(axes, maps.items()):
        A = np.asarray(A, dtype=np.float64)
        lim = float(np.abs(A).max()) or 1.0
        ax.imshow(A, cmap=cmap, vmin=-lim, vmax=lim)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
    return axes


def plot_flops_vs_length(Ts, chunk_sizes, d, ax=None):
    """Matmul FLOPs per head against T (log-log): parallel O(T²d), chunkwise O(TCd + Td²) for
    each C in ``chunk_sizes``, recurrent O(Td²) — from :mod:`gla_ref.bench`. Returns the axes."""
    import matplotlib.pyplot as plt

    from gla_ref import bench

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6), dpi=90)
    Ts = [int(T) for T in Ts]
    ax.loglog(Ts, [bench.flops_attention(T, d) for T in Ts], "k-", lw=2, label="parallel $4T^2d$")
    for C in chunk_sizes:
        ax.loglog(Ts, [bench.flops_chunkwise(T, C, d) for T in Ts], "--", label=f"chunkwise C={C}")
    ax.loglog(Ts, [bench.flops_linear_recurrent(T, d) for T in Ts], "k:", label="recurrent $4Td^2$")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("FLOPs per head")
    ax.set_title(f"FLOPs, head dim d={d}", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def plot_memory_vs_length(Ts, H, d, ax=None, *, cache_dtype_bytes=2, state_dtype_bytes=4):
    """Bytes per sequence and layer against T: the growing KV cache of softmax attention vs the
    constant ``[H, d, d]`` linear-attention state — from :mod:`gla_ref.bench`. Returns the axes."""
    import matplotlib.pyplot as plt

    from gla_ref import bench

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.6), dpi=90)
    Ts = [int(T) for T in Ts]
    mib = 2.0 ** 20
    ax.loglog(Ts, [bench.kv_cache_bytes(T, H, d, cache_dtype_bytes) / mib for T in Ts], "k-", lw=2,
              label=f"KV cache ({cache_dtype_bytes}-byte)")
    state = bench.state_bytes(H, d, d, state_dtype_bytes) / mib
    ax.loglog(Ts, [state] * len(Ts), "C1--", lw=2, label=f"linear-attention state ({state_dtype_bytes}-byte)")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("MiB per sequence and layer")
    ax.set_title(f"Decoding memory, H={H}, d={d}", fontsize=10)
    ax.legend(fontsize=8)
    return ax


# --- chapter 2: decay and gates ---


def decay_heatmap(D, ax=None, title=None, floor=1e-4):
    """Heatmap of a causal decay matrix ``D[i, j]`` (from ``gla_ref.gates.decay_matrix``) in log10.

    Entries above the diagonal are blank; values below ``floor`` share the darkest colour.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    from gla_ref.testing import to_numpy

    D = to_numpy(D)
    if D.ndim != 2 or D.shape[0] != D.shape[1]:
        raise ValueError(f"D must have shape [T, T], got {D.shape}")
    ax = ax if ax is not None else plt.subplots(figsize=(3.2, 3), dpi=90)[1]
    upper = np.triu(np.ones_like(D, dtype=bool), k=1)
    logD = np.ma.masked_array(np.log10(np.maximum(D, floor)), mask=upper)
    im = ax.imshow(logD, cmap="magma", vmin=np.log10(floor), vmax=0.0, interpolation="nearest")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="log10 decay")
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def _finish(ax, xlabel, ylabel, title=None, *, grid=None, legend_size=8):
    """Axis labels, a light grid (``which=grid``, if given), the legend and the title (if any)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if grid:
        ax.grid(True, which=grid, alpha=0.3)
    ax.legend(fontsize=legend_size)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def gate_histogram(samples, ax=None, bins=60, xlabel="gate α", title=None):
    """Overlaid density histograms of gate values; ``samples`` maps a label to an array."""
    import matplotlib.pyplot as plt

    from gla_ref.testing import to_numpy

    ax = ax if ax is not None else plt.subplots(figsize=(4, 3), dpi=90)[1]
    for label, x in samples.items():
        ax.hist(to_numpy(x).ravel(), bins=bins, range=(0.0, 1.0), density=True,
                histtype="step", linewidth=1.5, label=label)
    return _finish(ax, xlabel, "density", title)


def steps_vs_gate(log_alpha, steps, ax=None, ylabel="steps", title=None):
    """Log-log plot of a step count against the decay rate ``−log α``, one line per label.

    ``steps`` maps a label (e.g. a dtype) to an array like ``log_alpha``; entries ``< 0`` (never
    happened) are left out.
    """
    import matplotlib.pyplot as plt

    from gla_ref.testing import to_numpy

    rate = -to_numpy(log_alpha)
    ax = ax if ax is not None else plt.subplots(figsize=(4.5, 3), dpi=90)[1]
    for label, n in steps.items():
        n = to_numpy(n)
        keep = n >= 0
        ax.loglog(rate[keep], n[keep], marker="o", markersize=3, label=label)
    return _finish(ax, "decay rate −log α", ylabel, title, grid="both")

# --- chapter 3: parallel and chunkwise forms ---

CHUNK_MAP_KINDS = ("future (masked)", "inter-chunk (via the state S)",
                   "inter-sub-chunk (half-precision matmul)", "intra-sub-chunk (full precision, log space)")
"""Labels 0–3 of :func:`chunk_block_labels`, in the colours of the paper's Figure 3."""


def chunk_block_labels(T, C, c):
    """Label each (query i, key j) pair by how the two-level chunkwise form computes it.

    Returns an int ``[T, T]`` array: 0 future (j > i, masked), 1 inter-chunk (j in an earlier chunk,
    reached through the chunk state), 2 inter-sub-chunk (same chunk, earlier sub-chunk: a matmul),
    3 intra-sub-chunk (same sub-chunk, j ≤ i: Eq. 4 in log space). See :data:`CHUNK_MAP_KINDS`.
    """
    import numpy as np

    for name, n in (("T", T), ("C", C), ("c", c)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if C % c:
        raise ValueError(f"c={c} must divide C={C}")
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    labels = np.where(i // C != j // C, 1, np.where(i // c != j // c, 2, 3))
    return np.where(j > i, 0, labels).astype(np.int8)


def plot_chunk_map(T, C, c, ax=None):
    """The attention-style map of the paper's Figure 3 for sizes T, C, c: grey inter-chunk,
    orange inter-sub-chunk (half-precision matmul), pink intra-sub-chunk (full precision),
    white future. Chunk borders are solid lines, sub-chunk borders dotted. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    labels = chunk_block_labels(T, C, c)
    colors = ["white", "0.7", "tab:orange", "hotpink"]
    ax = ax if ax is not None else plt.subplots(figsize=(4.2, 4.2), dpi=90)[1]
    ax.imshow(labels, cmap=ListedColormap(colors), vmin=0, vmax=3, interpolation="nearest")
    for x in range(c, T, c):  # sub-chunk borders dotted, chunk borders solid
        style = dict(color="k", lw=0.8) if x % C == 0 else dict(color="k", lw=0.4, ls=":")
        ax.axhline(x - 0.5, **style)
        ax.axvline(x - 0.5, **style)
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_title(f"T={T}, chunk C={C}, sub-chunk c={c}", fontsize=9)
    ax.legend(handles=[Patch(facecolor=col, edgecolor="k", label=kind)
                       for col, kind in zip(colors[1:], CHUNK_MAP_KINDS[1:])],
              fontsize=7, loc="upper right")
    return ax


def plot_error_curves(x, errors, ax=None, *, xlabel="chunk size C", ylabel="relative RMSE",
                      title=None, styles=None):
    """Log-log error curves ``{label: [error per x]}``; a non-finite error (inf/NaN output) is drawn
    as an ``x`` marker on the top edge, so failures show instead of vanishing. ``styles`` maps a
    label to matplotlib keyword arguments. Returns the axes."""
    import matplotlib.pyplot as plt
    import numpy as np

    ax = ax if ax is not None else plt.subplots(figsize=(5, 3.4), dpi=90)[1]
    x = np.asarray(x, dtype=np.float64)
    finite_max = max([e for errs in errors.values() for e in errs if np.isfinite(e)] or [1.0])
    top = 10 * finite_max
    for label, errs in errors.items():
        errs = np.asarray(errs, dtype=np.float64)
        ok = np.isfinite(errs)
        line, = ax.loglog(x[ok], errs[ok], marker="o", markersize=4, label=label,
                          **(styles or {}).get(label, {}))
        if (~ok).any():
            ax.loglog(x[~ok], np.full((~ok).sum(), top), "x", color=line.get_color(), markersize=9, mew=2)
    if any(not np.all(np.isfinite(e)) for e in errors.values()):
        ax.axhline(top, color="0.6", lw=0.6, ls="--")
        ax.text(x[0], top, " inf / NaN", va="bottom", fontsize=8, color="0.4")
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.minorticks_off()
    return _finish(ax, xlabel, ylabel, title, grid="major", legend_size=7)


# --- chapters 4+: kernels and benchmarks ---


# --- chapter 7: benchmarks ---

def plot_benchmark_curves(result, names, metric="fwd_bwd", ax=None, *, scale=1.0, ylabel="time (ms)",
                          mark=None, title=None, legend=True):
    """Log-log curves of one metric against T, one per candidate name (from :func:`gla_ref.bench.series`);
    ``scale`` multiplies the values (e.g. ``2**-30`` for bytes → GiB). A candidate with rows that hold
    an error instead (out of memory, say) gets the error and the first such T in its label.
    ``mark = (T, label)`` draws a labelled vertical line there, e.g. at a crossover. ``legend=False``
    leaves the legend to the caller (one for a whole figure, say). Returns the axes."""
    import matplotlib.pyplot as plt

    from gla_ref import bench

    ax = ax if ax is not None else plt.subplots(figsize=(5, 3.4), dpi=90)[1]
    for name in names:
        Ts, vals = bench.series(result, name, metric)
        failed = sorted((r["T"], r["error"]) for r in result["rows"] if r.get("name") == name and "error" in r)
        label = name + (f" ({failed[0][1]} from T={failed[0][0]})" if failed else "")
        ax.loglog(Ts, [x * scale for x in vals], marker="o", markersize=3, label=label)
    if mark is not None:
        ax.axvline(mark[0], color="0.4", lw=0.8, ls="--")
        ax.text(mark[0], ax.get_ylim()[0], f"{mark[1]} ", rotation=90, ha="right", va="bottom", fontsize=7,
                color="0.3")
    _finish(ax, "sequence length T", ylabel, title, grid="both", legend_size=7)
    if not legend:
        ax.get_legend().remove()
    return ax


def plot_chunk_sweep(sweep, impl, ax=None, *, title=None):
    """Stacked bars of the median time of each part against the chunk size C, for one implementation
    (``"torch"``, ``"triton"`` or ``"fused"``) of a chunk-size sweep (``benchmarks/bench_chunk_size.py``);
    the whole-forward row (``"total"``) is drawn as a black dash when there are parts beside it.
    Chunk sizes the implementation does not accept are marked ``n/a``. Returns the axes."""
    import matplotlib.pyplot as plt

    rows = [r for r in sweep["rows"] if r["impl"] == impl]
    Cs = sorted({r["C"] for r in sweep["rows"]} | {u["C"] for u in sweep.get("unsupported", [])})
    parts = list(dict.fromkeys(r["part"] for r in rows if r["part"] != "total")) or ["total"]
    ms = {(r["C"], r["part"]): r["median_ms"] for r in rows}
    ax = ax if ax is not None else plt.subplots(figsize=(4.5, 3.2), dpi=90)[1]
    x = range(len(Cs))
    bottom = [0.0] * len(Cs)
    for part in parts:
        h = [ms.get((C, part), 0.0) for C in Cs]
        ax.bar(x, h, 0.6, bottom=bottom, label=part)
        bottom = [b + hh for b, hh in zip(bottom, h)]
    if parts != ["total"]:
        for i, C in enumerate(Cs):
            if (C, "total") in ms:
                ax.plot([i - 0.35, i + 0.35], [ms[C, "total"]] * 2, "k-", lw=1.5,
                        label="whole forward" if i == 0 else None)
    for i, C in enumerate(Cs):
        if not any(r["C"] == C for r in rows):
            ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8, color="0.4")
    ax.set_xticks(list(x), [str(C) for C in Cs])
    return _finish(ax, "chunk size C", "median time (ms)", title, legend_size=7)


def plot_roofline(points, peaks, ax=None, *, title=None):
    """A roofline, log-log: attainable TFLOP/s against arithmetic intensity (FLOPs per HBM byte) for
    each ``{label: peaks}`` (``bf16_TFLOPs``, ``fp32_TFLOPs``, ``hbm_GBps``; the tensor-core roof
    solid, the fp32 roof dotted, one colour per peaks dict), and one marker per kernel of
    ``points`` = ``{label: (intensity, achieved TFLOP/s)}``. Returns the axes."""
    import matplotlib.pyplot as plt
    import numpy as np

    ax = ax if ax is not None else plt.subplots(figsize=(5.5, 3.6), dpi=90)[1]
    xs = [i for i, _ in points.values()]
    x = np.geomspace(min(xs + [1.0]) / 2, max(xs + [1e4]) * 2, 200)
    for color, (label, pk) in zip(("k", "0.55"), peaks.items()):
        bw = pk["hbm_GBps"] / 1e3  # TB/s: TFLOP/s = intensity (FLOP/byte) × TB/s
        ax.loglog(x, np.minimum(pk["bf16_TFLOPs"], x * bw), color=color, lw=1.5, label=f"{label}: bf16 roof")
        ax.loglog(x, np.minimum(pk["fp32_TFLOPs"], x * bw), color=color, lw=1, ls=":", label=f"{label}: fp32 roof")
    for label, (intensity, tflops) in points.items():
        ax.loglog([intensity], [tflops], "o", markersize=6, label=label)
    return _finish(ax, "arithmetic intensity (FLOP per HBM byte)", "TFLOP/s", title, grid="both", legend_size=6)
