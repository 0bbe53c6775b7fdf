"""Figures of chapter 9 (sequence parallelism): the chain of states across devices, and the
orders in which an associative scan may combine the devices' affine maps.

Each ``draw_*`` function draws on the Axes it is given (or a new figure) and returns the axes;
none calls ``plt.show``. :func:`scan_schedule` is the plain data the drawing follows. Importing
this module loads no framework (matplotlib is imported when a function draws).
"""

from __future__ import annotations

SCAN_ORDERS = ("chain", "tree")
"""``chain``: device j hands its state to j+1, one hop after the other (what
:mod:`gla_ref.sequence_parallel` does). ``tree``: Hillis–Steele rounds, device d combines with
device d−2^r in round r (log₂ P rounds, more messages)."""


def _check_devices(devices):
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ValueError(f"devices must be an int >= 1, got {devices!r}")


def scan_schedule(devices, order="chain"):
    """The messages of an inclusive scan over ``devices`` devices, round by round.

    Returns ``(rounds, spans)``: ``rounds[r]`` is the list of ``(source, target)`` pairs of round
    r; ``spans[r][d] = (first, last)`` is the range of devices whose maps device d has composed
    after round r (``spans[0]``: before any message, each device its own). After the last round
    device d holds ``(0, d)``: the map from the sequence start to the end of its slice.
    """
    _check_devices(devices)
    if order not in SCAN_ORDERS:
        raise ValueError(f"order must be one of {SCAN_ORDERS}, got {order!r}")
    if order == "chain":
        rounds = [[(j, j + 1)] for j in range(devices - 1)]
    else:
        rounds, step = [], 1
        while step < devices:
            rounds.append([(d - step, d) for d in range(step, devices)])
            step *= 2
    spans = [[(d, d) for d in range(devices)]]
    for pairs in rounds:
        now = list(spans[-1])
        for source, target in pairs:  # target's maps follow source's: compose (first of source, last of target)
            now[target] = (spans[-1][source][0], spans[-1][target][1])
        spans.append(now)
    return rounds, spans


def draw_state_chain(devices=4, ax=None):
    """The sequence split over ``devices`` devices and the three steps of the sequence-parallel
    chunk form: each device's affine map from zero (parallel), the states handed along (a chain),
    each device finishing its outputs (parallel). Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    _check_devices(devices)
    ax = ax if ax is not None else plt.subplots(figsize=(1.9 * devices + 1.6, 3.4), dpi=90)[1]
    colors = plt.get_cmap("tab10")
    w, gap = 1.3, 0.5  # box width and the room for the arrows between boxes
    x0 = [d * (w + gap) for d in range(devices)]
    rows = {"tokens": 3.0, "local": 1.9, "finish": 0.5}
    for d, x in enumerate(x0):
        c = colors(d % 10)
        ax.add_patch(FancyBboxPatch((x, rows["tokens"]), w, 0.45, boxstyle="square,pad=0", fc=c, alpha=0.35, ec=c))
        ax.text(x + w / 2, rows["tokens"] + 0.22, f"device {d}\ntokens of slice {d}", ha="center", va="center",
                fontsize=7)
        ax.add_patch(FancyBboxPatch((x, rows["local"]), w, 0.6, boxstyle="round,pad=0.03", fc="white", ec=c, lw=1.5))
        ax.text(x + w / 2, rows["local"] + 0.3,
                rf"$\mathbf{{S}} \mapsto \mathrm{{Diag}}(\boldsymbol{{\gamma}}_{{\langle {d}\rangle}})\,\mathbf{{S}}$"
                "\n" rf"$+\ \mathbf{{U}}_{{\langle {d}\rangle}}$", ha="center", va="center", fontsize=7.5)
        ax.add_patch(FancyBboxPatch((x, rows["finish"]), w, 0.6, boxstyle="round,pad=0.03", fc=c, alpha=0.2, ec=c))
        entering = r"\mathbf{S}_0" if d == 0 else rf"\mathbf{{S}}_{{\langle {d - 1}\rangle}}"
        ax.text(x + w / 2, rows["finish"] + 0.3, r"$\mathbf{O}^{0} + (\mathbf{Q}\odot\boldsymbol{\Lambda})\,$"
                rf"${entering}$", ha="center", va="center", fontsize=7.5)
        ax.annotate("", xy=(x + w / 2, rows["local"] + 0.62), xytext=(x + w / 2, rows["tokens"] - 0.02),
                    arrowprops=dict(arrowstyle="->", color="0.5"))
        ax.annotate("", xy=(x + 0.35 * w, rows["finish"] + 0.62), xytext=(x + 0.35 * w, rows["local"] - 0.04),
                    arrowprops=dict(arrowstyle="->", color="0.5", ls=":"))
    arrow = dict(arrowstyle="-|>", color="k", lw=1.4)
    y = rows["local"] + 0.3
    ax.annotate("", xy=(x0[0] - 0.04, y), xytext=(x0[0] - gap, y), arrowprops=arrow)
    ax.text(x0[0] - gap / 2 - 0.1, y + 0.14, r"$\mathbf{S}_0$", ha="center", fontsize=8)
    for d in range(devices):
        end = x0[d] + w + 0.04
        ax.annotate("", xy=(end + gap - 0.08, y), xytext=(end, y), arrowprops=arrow)
        ax.text(end + gap / 2 - 0.04, y + 0.14, rf"$\mathbf{{S}}_{{\langle {d}\rangle}}$", ha="center", fontsize=8)
        if d + 1 < devices:  # the state entering slice d+1 also goes down to its finish step
            ax.annotate("", xy=(x0[d + 1] + 0.8 * w, rows["finish"] + 0.62), xytext=(end + gap / 2, y - 0.05),
                        arrowprops=dict(arrowstyle="->", color="k", lw=0.8, connectionstyle="arc3,rad=0.2"))
    ax.annotate("", xy=(x0[0] + 0.8 * w, rows["finish"] + 0.62), xytext=(x0[0] - gap / 2, y - 0.05),
                arrowprops=dict(arrowstyle="->", color="k", lw=0.8, connectionstyle="arc3,rad=0.2"))
    right = x0[-1] + w + gap + 0.1
    for label, yy in (("1. local, from zero\n(in parallel)", rows["local"] + 0.3),
                      ("2. states handed on\n(P−1 hops in turn)", rows["local"] - 0.25),
                      ("3. finish the outputs\n(in parallel)", rows["finish"] + 0.3)):
        ax.text(right, yy, label, fontsize=7.5, va="center")
    ax.set_xlim(x0[0] - gap - 0.1, right + 1.7)
    ax.set_ylim(0.3, rows["tokens"] + 0.6)
    ax.axis("off")
    return ax


def draw_scan_orders(devices=8, axes=None):
    """Two panels, one per order of :data:`SCAN_ORDERS`: devices across, rounds going down, an
    arrow per message (a state, or a composed map, sent to another device), and under each
    device the span of maps it holds at the end. Both end with device d holding maps 0..d, since
    composition is associative. Returns the two axes."""
    import matplotlib.pyplot as plt

    _check_devices(devices)
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=90)
    for ax, order in zip(axes, SCAN_ORDERS):
        rounds, spans = scan_schedule(devices, order)
        depth = len(rounds)
        for r in range(depth + 1):
            ax.scatter(range(devices), [-r] * devices, s=22, color="k", zorder=3)
        for d in range(devices):
            ax.plot([d, d], [0, -depth], color="0.8", lw=1, zorder=1)
            first, last = spans[-1][d]
            ax.text(d, -depth - 0.45, f"{first}..{last}", ha="center", va="top", fontsize=7)
        for r, pairs in enumerate(rounds):
            for source, target in pairs:
                ax.annotate("", xy=(target, -r - 1), xytext=(source, -r),
                            arrowprops=dict(arrowstyle="-|>", color="tab:blue", lw=1.1, shrinkA=3, shrinkB=3))
        messages = sum(len(p) for p in rounds)
        most = max([sum(s == d for p in rounds for s, _ in p) for d in range(devices)] or [0])
        name = "chain (this library)" if order == "chain" else "tree (Hillis–Steele)"
        ax.set_title(f"{name}: {depth} rounds, {messages} messages,\nat most {most} sent by one device",
                     fontsize=9)
        ax.set_xticks(range(devices))
        ax.set_xlabel("device")
        ax.set_yticks([-r for r in range(depth + 1)])
        ax.set_yticklabels([str(r) for r in range(depth + 1)], fontsize=7)
        ax.set_ylabel("round")
        ax.set_ylim(-depth - 1.1, 0.4)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    return axes
