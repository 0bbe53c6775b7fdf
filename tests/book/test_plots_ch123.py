"""The teaching helpers of chapters 1–3 in gla_ref.viz.plots: the displayed source is the library's,
the chunkwise picture has one chunk, triangle and state per place it claims, and the per-channel
decay curves are what the recurrence keeps of a write."""

from __future__ import annotations

import inspect

import matplotlib
import numpy as np
import pytest

torch = pytest.importorskip("torch")

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Polygon, Rectangle

from gla_ref import torch_ref
from gla_ref.viz import plots


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_show_source_is_the_library_source_in_order():
    code = plots.show_source(torch_ref._state_output, torch_ref._advance_state)
    expected = (inspect.getsource(torch_ref._state_output).rstrip("\n") + "\n\n"
                + inspect.getsource(torch_ref._advance_state).rstrip("\n"))
    assert code.data == expected
    assert code.data.startswith("def _state_output(")
    with pytest.raises(ValueError, match="at least one"):
        plots.show_source()


def _patches(ax, kind, label):
    return [p for p in ax.patches if isinstance(p, kind) and p.get_label() == label]


@pytest.mark.parametrize("T, C", [(64, 16), (50, 16), (8, 8)])
def test_chunkwise_picture_has_one_chunk_triangle_and_state_per_place(T, C):
    left, right = plots.plot_chunkwise_form(T, C)
    N = -(-T // C)
    image = left.get_images()[0].get_array()
    labels = plots.chunk_block_labels(T, C, C)
    assert np.array_equal(image == 2, labels == 3) and np.array_equal(image == 1, labels == 1)
    chunks = _patches(right, Rectangle, "chunk")
    assert [(p.get_x(), p.get_x() + p.get_width()) for p in chunks] == [
        ((n - 1) * C, min(n * C, T)) for n in range(1, N + 1)]
    assert len(_patches(right, Polygon, "intra")) == N
    assert len(_patches(right, Rectangle, "state")) == N + 1
    assert len(_patches(right, FancyArrowPatch, "read")) == len(_patches(right, FancyArrowPatch, "advance")) == N
    texts = [t.get_text() for t in right.texts]
    assert [f"$S_{{[{n}]}}$" for n in range(N + 1)] == [t for t in texts if t.startswith("$S_")]


def test_chunkwise_picture_rejects_bad_sizes():
    with pytest.raises(ValueError, match="C must be a positive int"):
        plots.plot_chunkwise_form(64, 0)
    with pytest.raises(ValueError, match="at most 8 chunks"):
        plots.plot_chunkwise_form(90, 10)


def test_channel_decay_is_what_the_recurrence_keeps_of_the_first_write():
    T, K = 40, 5
    gen = torch.Generator().manual_seed(0)
    g = torch.nn.functional.logsigmoid(torch.randn(T, K, generator=gen, dtype=torch.float64)) / 4
    # batch row k reads key channel k: q_t = e_k, one write k_0 = 1, v_0 = 1 at the first token
    q = torch.eye(K, dtype=torch.float64)[:, None, None, :].expand(K, T, 1, K)
    k = torch.zeros(K, T, 1, K, dtype=torch.float64)
    k[:, 0] = 1.0
    v = torch.zeros(K, T, 1, 1, dtype=torch.float64)
    v[:, 0] = 1.0
    o, _ = torch_ref.recurrent_gla(q, k, v, g[None, :, None, :].expand(K, T, 1, K), scale=1.0)
    np.testing.assert_allclose(plots.channel_decay(g), o[:, :, 0, 0].T.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match=r"\[T, K\]"):
        plots.channel_decay(g[0])


def test_channel_decay_plot_draws_the_gates_and_the_chosen_channels():
    g = -torch.rand(30, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64) / 5
    left, right = plots.plot_channel_decay(g, [0, 4])
    np.testing.assert_allclose(left.get_images()[0].get_array(), np.exp(g.numpy()).T)
    curves = [line for line in right.get_lines() if line.get_label().startswith("channel")]
    assert [line.get_label() for line in curves] == ["channel 0", "channel 4"]
    np.testing.assert_allclose(curves[1].get_ydata(), plots.channel_decay(g)[:, 4])
    with pytest.raises(ValueError, match="channels"):
        plots.plot_channel_decay(g, [6])
