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


def show_source(*objects):
    """The source code of the given functions (or classes), one after the other, as an
    ``IPython.display.Code`` object: a notebook cell that ends with it shows the code highlighted,
    and its plain-text form is the source itself. Chapters use it to show the library's own lines."""
    import inspect

    from IPython.display import Code

    if not objects:
        raise ValueError("show_source needs at least one function or class")
    return Code("\n\n".join(inspect.getsource(obj).rstrip("\n") for obj in objects), language="python")


def plot_chunkwise_form(T, C, axes=None):
    """The chunkwise form as a picture, for T tokens in chunks of C (N = ⌈T/C⌉, at most 8 chunks).

    Left: every (query i, key j) pair, by the part of the chunkwise form that computes it — the
    causal triangle inside each C×C diagonal block (intra-chunk, ``(QKᵀ ⊙ M) V``), or, for a key in
    an earlier chunk, the state (inter-chunk); future pairs white (labels of
    :func:`chunk_block_labels` with c = C). Right: the chunks along T, each with its intra-chunk
    triangle above it, and below them the states S_[0] (initial) … S_[N] (final), S_[n] being the
    state at the end of chunk n: S_[n−1] feeds chunk n's queries and, with chunk n's keys and
    values added, becomes S_[n]. Returns the two axes.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import FancyArrowPatch, Patch, Polygon, Rectangle

    labels = chunk_block_labels(T, C, C)  # validates T and C: 0 future, 1 via the state, 3 intra
    N = -(-T // C)
    if N > 8:
        raise ValueError(f"T/C must be at most 8 chunks for a legible picture, got T={T}, C={C} ({N} chunks)")
    if axes is None:
        fig = plt.figure(figsize=(10, 3.6), dpi=90)
        axes = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2.3]})
    left, right = axes
    intra, inter = "tab:blue", "0.75"
    left.imshow(np.select([labels == 3, labels == 1], [2, 1], 0), interpolation="nearest",
                cmap=ListedColormap(["white", inter, intra]), vmin=0, vmax=2)
    for x in range(C, T, C):
        left.axhline(x - 0.5, color="k", lw=0.8)
        left.axvline(x - 0.5, color="k", lw=0.8)
    left.set_xlabel("key j")
    left.set_ylabel("query i")
    left.set_title(f"T={T}, C={C}: who computes pair (i, j)", fontsize=9)
    left.legend(handles=[Patch(facecolor=intra, label="intra-chunk $(QK^T \\odot M)V$"),
                         Patch(facecolor=inter, label="inter-chunk, via the state")],
                fontsize=7, loc="upper right")

    for n in range(1, N + 1):
        x0, x1 = (n - 1) * C, min(n * C, T)
        right.add_patch(Rectangle((x0, 0), x1 - x0, 1, facecolor="white", edgecolor="k", label="chunk"))
        right.text((x0 + x1) / 2, 0.5, f"$Q,K,V_{{[{n}]}}$", ha="center", va="center", fontsize=8)
        right.add_patch(Polygon([(x0 + 0.1 * C, 2.6), (x0 + 0.1 * C, 1.3), (x0 + 0.9 * C, 1.3)],
                                facecolor=intra, edgecolor="k", label="intra"))
        right.add_patch(FancyArrowPatch((x0 + 0.1 * C, -1.0), (x0 + 0.45 * C, -0.05), arrowstyle="-|>",
                                        mutation_scale=9, color="tab:red", label="read"))
        right.add_patch(FancyArrowPatch((x0 + 0.1 * C, -1.3), (x1 - 0.1 * C, -1.3), arrowstyle="-|>",
                                        mutation_scale=9, color="k", label="advance"))
    for n in range(N + 1):
        x = min(n * C, T)
        right.add_patch(Rectangle((x - 0.08 * C, -1.6), 0.16 * C, 0.6, facecolor="tab:orange",
                                  edgecolor="k", label="state"))
        right.text(x, -1.85, f"$S_{{[{n}]}}$", ha="center", va="top", fontsize=8)
    right.text(T / 2, 2.75, "intra-chunk triangles: all chunks in parallel", ha="center", fontsize=8)
    right.text(T / 2, -2.45, "state: $S_{[n]} = S_{[n-1]} + K_{[n]}^T V_{[n]}$ (black, in order);  "
               "queries read $S_{[n-1]}$ (red)", ha="center", fontsize=8)
    right.set_xlim(-0.15 * C, T + 0.15 * C)
    right.set_ylim(-2.7, 3.1)
    right.set_yticks([])
    for side in ("left", "right", "top"):
        right.spines[side].set_visible(False)
    right.set_xlabel("token position (chunks of C)")
    right.set_xticks([min(n * C, T) for n in range(N + 1)])
    return axes


# --- chapter 2: decay and gates ---


def decay_heatmap(D, ax=None, title=None, floor=1e-4):
    """Heatmap of a causal decay matrix ``D[i, j]`` (from ``gla_ref.reference.gates.decay_matrix``) in log10.

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


def channel_decay(g):
    """How much of a write made at the first token is left in each key channel's state row:
    ``exp(Σ_{s=1}^{t} g_s)`` for t = 0 … T−1 (1 at t = 0; the first token's own gate acts before
    its write). ``g``: ``[T, K]`` log-gates of one head → float64 NumPy ``[T, K]``."""
    import numpy as np

    from gla_ref.testing import to_numpy

    g = to_numpy(g)
    if g.ndim != 2:
        raise ValueError(f"g must have shape [T, K] (one head's log-gates), got {g.shape}")
    return np.exp(np.concatenate([np.zeros((1, g.shape[1])), np.cumsum(g[1:], axis=0)]))


def plot_channel_decay(g, channels, axes=None):
    """GLA's per-channel decay for one head. Left: the gates ``α = exp(g)`` as a heatmap over
    token t (x) and key channel k (y). Right: :func:`channel_decay` of the listed ``channels``
    against t (log scale), with the 1/e level dotted. ``g``: ``[T, K]`` log-gates. Returns the axes."""
    import matplotlib.pyplot as plt
    import numpy as np

    from gla_ref.testing import to_numpy

    alpha = np.exp(to_numpy(g))
    left_over = channel_decay(g)
    channels = [int(k) for k in channels]
    if not channels or any(not 0 <= k < alpha.shape[1] for k in channels):
        raise ValueError(f"channels must be a non-empty list of key channels in [0, {alpha.shape[1]}), "
                         f"got {channels}")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.2), dpi=90, gridspec_kw={"width_ratios": [1.2, 1]})
    left, right = axes
    im = left.imshow(alpha.T, aspect="auto", cmap="viridis", interpolation="nearest", vmax=1.0)
    left.figure.colorbar(im, ax=left, fraction=0.046, pad=0.04, label="gate α")
    left.set_xlabel("token t")
    left.set_ylabel("key channel k")
    left.set_title("gates of one head: one per token and key channel", fontsize=9)
    for k in channels:
        right.semilogy(np.arange(alpha.shape[0]), left_over[:, k], label=f"channel {k}")
    right.axhline(np.exp(-1.0), color="k", ls=":", lw=0.8, label="1/e")
    right.set_ylim(max(left_over[:, channels].min(), 1e-12) / 2, 1.5)
    _finish(right, "token t", "left of the write at t = 0", "state rows decay at their own rates",
            grid="both", legend_size=7)
    return axes

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


def plot_ratio_curves(curves, ax=None, *, target=None, ylabel="ours / reference", title=None, legend=True):
    """Time or memory ratios against T, one line per ``{label: (Ts, ratios)}`` (e.g. one per head shape),
    on a base-2 length axis with a grey line at parity (1) and, if ``target`` is given, a dashed line at
    that ratio labelled as the target. ``legend=False`` leaves the legend to the caller. Returns the axes."""
    import matplotlib.pyplot as plt

    if not curves:
        raise ValueError("curves must hold at least one {label: (Ts, ratios)} entry")
    for label, (Ts, ratios) in curves.items():
        if len(Ts) != len(ratios) or not Ts:
            raise ValueError(f"curves[{label!r}]: Ts and ratios must have one nonzero length, "
                             f"got {len(Ts)} and {len(ratios)}")
        if any(T <= 0 for T in Ts) or any(r <= 0 for r in ratios):
            raise ValueError(f"curves[{label!r}]: Ts and ratios must be positive")
    ax = ax if ax is not None else plt.subplots(figsize=(5, 3.4), dpi=90)[1]
    for label, (Ts, ratios) in curves.items():
        ax.plot(Ts, ratios, marker="o", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="0.4", lw=0.8)
    if target is not None:
        ax.axhline(target, color="tab:red", lw=1, ls="--", label=f"target {target:g}")
    Ts_all = sorted({T for Ts, _ in curves.values() for T in Ts})
    ax.set_xticks(Ts_all, [f"{T // 1024}K" if T % 1024 == 0 else str(T) for T in Ts_all])
    ax.minorticks_off()
    _finish(ax, "sequence length T", ylabel, title, grid="major", legend_size=7)
    if not legend:
        ax.get_legend().remove()
    return ax
