"""gla_ref.viz.plots.plot_ratio_curves (chapter 7's ratios against FLA): one line per curve with its data,
parity and target lines where asked, length ticks in K, and a clear error for malformed curves."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gla_ref.viz import plots


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_plot_ratio_curves_draws_each_curve_parity_and_target():
    curves = {"64x64": ([1024, 2048, 4096], [0.5, 1.0, 1.1]), "128x128": ([1024, 4096], [0.9, 0.95])}
    ax = plots.plot_ratio_curves(curves, plt.subplots()[1], target=0.85)
    data = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines]
    assert data[0] == ([1024, 2048, 4096], [0.5, 1.0, 1.1]) and data[1] == ([1024, 4096], [0.9, 0.95])
    assert list(ax.lines[2].get_ydata()) == [1.0, 1.0]  # parity
    assert list(ax.lines[3].get_ydata()) == [0.85, 0.85] and ax.lines[3].get_linestyle() == "--"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["64x64", "128x128", "target 0.85"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1K", "2K", "4K"]
    assert ax.get_xscale() == "log"


def test_plot_ratio_curves_without_target_or_legend():
    ax = plots.plot_ratio_curves({"a": ([100, 200], [1.2, 1.3])}, plt.subplots()[1], legend=False)
    assert len(ax.lines) == 2 and ax.get_legend() is None  # the curve and parity, nothing else
    assert [t.get_text() for t in ax.get_xticklabels()] == ["100", "200"]


@pytest.mark.parametrize("curves, match", [({}, "at least one"),
                                           ({"a": ([1, 2], [1.0])}, r"curves\['a'\].*one nonzero length"),
                                           ({"a": ([], [])}, "one nonzero length"),
                                           ({"a": ([0, 2], [1.0, 1.0])}, "positive"),
                                           ({"a": ([1, 2], [1.0, -1.0])}, "positive")])
def test_plot_ratio_curves_rejects_malformed_curves(curves, match):
    with pytest.raises(ValueError, match=match):
        plots.plot_ratio_curves(curves, plt.subplots()[1])
