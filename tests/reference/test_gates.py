"""Tests of gla_ref.reference.gates (chapter 2) and its plots: each function against a direct computation."""

import math

import matplotlib
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gla_ref.reference import gates  # noqa: E402
from gla_ref.viz import plots  # noqa: E402

matplotlib.use("Agg")


def _rng(seed=0):
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------- low-rank gate

def _lowrank_inputs(d=12, r=4, K=6, seed=0):
    rng = _rng(seed)
    x = torch.tensor(rng.standard_normal((3, 5, d)))
    W1 = torch.tensor(rng.standard_normal((d, r)) / math.sqrt(d))
    W2 = torch.tensor(rng.standard_normal((r, K)) / math.sqrt(r))
    b = torch.tensor(rng.standard_normal(K))
    return x, W1, W2, b


@pytest.mark.parametrize("tau", [1.0, 4.0, 16.0])
def test_lowrank_log_gate_matches_sigmoid_power(tau):
    x, W1, W2, b = _lowrank_inputs()
    g = gates.lowrank_log_gate(x, W1, W2, b, tau=tau)
    z = np.einsum("btd,dr,rk->btk", x.numpy(), W1.numpy(), W2.numpy()) + b.numpy()
    alpha = (1.0 / (1.0 + np.exp(-z))) ** (1.0 / tau)  # the paper's α, directly
    assert g.shape == (3, 5, 6)
    np.testing.assert_allclose(g.numpy(), np.log(alpha), rtol=1e-12, atol=1e-14)
    assert (g <= 0).all()


def test_lowrank_log_gate_keeps_slow_gates_where_sigmoid_rounds_to_one():
    x = torch.full((1, 2), 30.0)
    W1, W2, b = torch.eye(2), torch.eye(2), torch.zeros(2)
    g = gates.lowrank_log_gate(x, W1, W2, b, tau=16.0)
    assert torch.sigmoid(torch.tensor(30.0)) == 1.0  # α itself is 1 in float32
    np.testing.assert_allclose(g.numpy(), -math.exp(-30.0) / 16.0, rtol=1e-6)


@pytest.mark.parametrize("bad, match", [
    (dict(W1=torch.zeros(5, 4)), "W1 must have shape"),
    (dict(W2=torch.zeros(3, 6)), "W2 must have shape"),
    (dict(b=torch.zeros(7)), "b must have shape"),
    (dict(tau=0.0), "tau must be a positive"),
    (dict(tau=-16.0), "tau must be a positive"),
])
def test_lowrank_log_gate_rejects_bad_shapes(bad, match):
    x, W1, W2, b = _lowrank_inputs()
    args = dict(x=x, W1=W1, W2=W2, b=b, tau=16.0) | bad
    with pytest.raises(ValueError, match=match):
        gates.lowrank_log_gate(**args)


def test_lowrank_log_gate_rejects_non_tensors():
    x, W1, W2, b = _lowrank_inputs()
    with pytest.raises(TypeError, match="x must be"):
        gates.lowrank_log_gate(x.numpy(), W1, W2, b)
    with pytest.raises(TypeError, match="W2 must be"):
        gates.lowrank_log_gate(x, W1, W2.long(), b)


# ----------------------------------------------------------------------------- constant decays

@pytest.mark.parametrize("H", [1, 2, 4, 8, 16, 32, 64])
def test_slopes_power_of_two_closed_form(H):
    expected = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    slopes = gates.build_slope_tensor(H)
    assert slopes.dtype == np.float64 and slopes.shape == (H,)
    np.testing.assert_array_equal(slopes, expected)


@pytest.mark.parametrize("H", [3, 5, 6, 7, 12, 20, 24, 40])
def test_slopes_interleaved_rule_for_other_head_counts(H):
    n = 1 << (H.bit_length() - 1)  # largest power of two below H
    first = 2.0 ** (-8.0 * np.arange(1, n + 1) / n)
    fill = 2.0 ** (-8.0 * np.arange(1, 2 * n + 1) / (2 * n))[0::2][: H - n]
    np.testing.assert_array_equal(gates.build_slope_tensor(H), np.concatenate([first, fill]))


def test_slopes_known_values():
    # H = 6: slopes of 4 heads, then the 1st and 3rd of the 8-head sequence
    np.testing.assert_array_equal(gates.build_slope_tensor(6),
                                  [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


@pytest.mark.parametrize("H", [0, -2, 2.0, True, "4"])
def test_slopes_reject_bad_head_counts(H):
    with pytest.raises(ValueError, match="H must be a positive int"):
        gates.build_slope_tensor(H)


def test_slopes_to_g_gamma_numpy_and_torch():
    slopes = gates.build_slope_tensor(8)
    g = gates.slopes_to_g_gamma(slopes)
    assert isinstance(g, np.ndarray) and (g < 0).all()
    np.testing.assert_array_equal(g, -slopes)
    gt = gates.slopes_to_g_gamma(torch.tensor(slopes), scale=0.5)
    assert isinstance(gt, torch.Tensor)
    np.testing.assert_array_equal(gt.numpy(), -0.5 * slopes)
    np.testing.assert_array_equal(gates.slopes_to_g_gamma([0.5, 0.25]), [-0.5, -0.25])


@pytest.mark.parametrize("slopes, scale, match", [
    ([0.5, 0.0], 1.0, "positive"),
    ([[0.5, 0.25]], 1.0, r"shape \[H\]"),
    ([0.5], 0.0, "scale must be"),
])
def test_slopes_to_g_gamma_rejects_bad_input(slopes, scale, match):
    with pytest.raises(ValueError, match=match):
        gates.slopes_to_g_gamma(slopes, scale=scale)


def test_retnet_log_gammas():
    np.testing.assert_allclose(np.exp(gates.retnet_log_gammas(4)),
                               [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128, 1 - 1 / 256], rtol=1e-15)
    with pytest.raises(ValueError, match="H must be"):
        gates.retnet_log_gammas(0)


# ----------------------------------------------------------------------------- decay matrix

def _products(alpha):
    """D[i, j] = α_{j+1} ⋯ α_i by explicit loops (float64)."""
    T = alpha.shape[0]
    D = np.zeros((T, T) + alpha.shape[1:])
    for i in range(T):
        for j in range(i + 1):
            D[i, j] = np.prod(alpha[j + 1: i + 1], axis=0)
    return D


def test_decay_matrix_constant_is_gamma_power():
    T, gamma = 9, 0.8
    D = gates.decay_matrix(math.log(gamma), T).numpy()
    i, j = np.indices((T, T))
    np.testing.assert_allclose(D, np.where(i >= j, gamma ** (i - j), 0.0), rtol=1e-13)


def test_decay_matrix_data_dependent_and_per_channel():
    rng = _rng(1)
    alpha = rng.uniform(0.3, 1.0, size=(11, 4))
    D = gates.decay_matrix(torch.tensor(np.log(alpha)), 11).numpy()
    assert D.shape == (11, 11, 4)
    np.testing.assert_allclose(D, _products(alpha), rtol=1e-12, atol=1e-300)
    D1 = gates.decay_matrix(np.log(alpha[:, 0]), 11).numpy()
    np.testing.assert_allclose(D1, _products(alpha[:, 0]), rtol=1e-12)


def test_decay_matrix_has_no_overflow_above_the_diagonal():
    D = gates.decay_matrix(torch.full((50,), -30.0, dtype=torch.float32), 50)
    assert torch.isfinite(D).all()
    assert (torch.triu(D, 1) == 0).all() and (torch.diagonal(D) == 1).all()


@pytest.mark.parametrize("g, T, exc, match", [
    (torch.full((5,), 0.1), 5, ValueError, "log-gates"),
    (torch.full((5,), float("nan")), 5, ValueError, "log-gates"),
    (torch.zeros(4), 5, ValueError, "g must be a scalar"),
    (torch.zeros(5, 2, 2), 5, ValueError, "g must be a scalar"),
    (-0.1, 0, ValueError, "T must be"),
    (torch.zeros(5, dtype=torch.int64), 5, TypeError, "floating"),
    ("x", 5, TypeError, "g must be"),
])
def test_decay_matrix_rejects_bad_input(g, T, exc, match):
    with pytest.raises(exc, match=match):
        gates.decay_matrix(g, T)


# ----------------------------------------------------------------------------- cumulative gate

def test_cumulative_gate_float64_is_exact_product():
    rng = _rng(2)
    g = np.log(rng.uniform(0.5, 1.0, size=(30, 3)))
    b = gates.cumulative_gate(torch.tensor(g), torch.float64)
    np.testing.assert_allclose(b.numpy(), np.exp(np.cumsum(g, axis=0)), rtol=1e-13)


def test_cumulative_gate_rounds_every_step_like_a_loop():
    rng = _rng(3)
    alpha = rng.uniform(0.6, 0.99, size=200)
    b = gates.cumulative_gate(torch.tensor(np.log(alpha)), torch.float16).numpy()
    run, ref = np.float16(1.0), []
    for a in np.exp(np.log(alpha)).astype(np.float16):  # α rounded to fp16, product rounded per step
        run = np.float16(run * a)
        ref.append(run)
    np.testing.assert_array_equal(b, np.array(ref))
    assert b[-1] > 0  # stalled on a subnormal instead of reaching 0


def test_cumulative_gate_dim_and_bf16_rounding_of_slow_gates():
    g = torch.full((2, 40, 3), math.log(0.999))
    b = gates.cumulative_gate(g, torch.bfloat16, dim=1)
    assert b.shape == (2, 40, 3) and b.dtype == torch.bfloat16
    assert (b == 1).all()  # 0.999 rounds to 1.0 in bfloat16: the gate forgets nothing
    b32 = gates.cumulative_gate(g, torch.float32, dim=1)
    np.testing.assert_allclose(b32[0, :, 0].numpy(), 0.999 ** np.arange(1, 41), rtol=1e-5)


def test_cumulative_gate_rejects_bad_dtype():
    with pytest.raises(TypeError, match="dtype must be"):
        gates.cumulative_gate(torch.zeros(3), torch.int32)


@pytest.mark.parametrize("dtype, zero_at", [(torch.float16, 25), (torch.bfloat16, 134),
                                            (torch.float32, 150)])
def test_underflow_steps_for_halving_gate(dtype, zero_at):
    # α = 1/2: b_t = 2^-t exactly until it passes the smallest subnormal, then 2^-(t) rounds to 0
    lost, zero = gates.underflow_steps(torch.tensor([math.log(0.5)]), dtype, 200)
    assert zero[0] == zero_at and lost[0] == zero_at


def test_underflow_steps_not_within_T_and_stalling():
    lost, zero = gates.underflow_steps([math.log(0.5), math.log(0.9)], torch.float16, 20)
    assert list(lost) == [-1, -1] and list(zero) == [-1, -1]
    lost, zero = gates.underflow_steps([math.log(0.9)], torch.float16, 400)
    assert zero[0] == -1  # stalls on a subnormal instead of reaching 0
    exact_subnormal = math.log(2.0**-14) / math.log(0.9)  # exact α^t leaves the normal range
    assert exact_subnormal < lost[0] < 400


def test_underflow_steps_rejects_bad_input():
    with pytest.raises(ValueError, match="log_alpha must have shape"):
        gates.underflow_steps(torch.zeros(2, 2) - 0.1, torch.float32, 10)
    with pytest.raises(ValueError, match="T must be"):
        gates.underflow_steps([-0.1], torch.float32, 0)
    with pytest.raises(ValueError, match="rel_tol must be"):
        gates.underflow_steps([-0.1], torch.float32, 10, rel_tol=0.0)
    with pytest.raises(ValueError, match="log-gates"):
        gates.underflow_steps([0.1], torch.float32, 10)


# ----------------------------------------------------------------------------- log2 cumsum

def test_log2_cumsum_with_exp2_equals_exp_of_cumsum():
    rng = _rng(4)
    g = torch.tensor(np.log(rng.uniform(0.2, 1.0, size=(2, 33, 5))))
    l2 = gates.log2_cumsum(g, dim=1)
    np.testing.assert_allclose(l2.numpy(), np.cumsum(g.numpy(), axis=1) / math.log(2), rtol=1e-13)
    np.testing.assert_allclose(torch.exp2(l2).numpy(), np.exp(np.cumsum(g.numpy(), axis=1)),
                               rtol=1e-12)


def test_log2_cumsum_restarts_every_chunk():
    rng = _rng(5)
    g = np.log(rng.uniform(0.2, 1.0, size=(37, 3)))
    local = gates.log2_cumsum(torch.tensor(g), chunk_size=16).numpy()
    full = np.cumsum(g, axis=0) / math.log(2)
    for t in range(37):
        start = (t // 16) * 16
        before = full[start - 1] if start > 0 else 0.0
        np.testing.assert_allclose(local[t], full[t] - before, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(g=torch.ones(4)), ValueError, "log-gates"),
    (dict(g=-torch.ones(4), chunk_size=0), ValueError, "chunk_size"),
    (dict(g=-torch.ones(4), chunk_size=2.0), ValueError, "chunk_size"),
])
def test_log2_cumsum_rejects_bad_input(kw, exc, match):
    with pytest.raises(exc, match=match):
        gates.log2_cumsum(**kw)


# ----------------------------------------------------------------------------- memory horizon

def test_memory_horizon_definition():
    g = np.log(np.array([0.5, 0.9, 0.99, 1.0]))
    n = gates.memory_horizon(g)
    np.testing.assert_allclose(n[:3], -1.0 / g[:3], rtol=1e-14)
    assert n[3] == np.inf
    half = gates.memory_horizon(g[:3], fraction=0.5)
    np.testing.assert_allclose(np.exp(g[:3]) ** half, 0.5, rtol=1e-12)  # α^n = fraction
    assert gates.memory_horizon(-0.25) == 4.0
    nt = gates.memory_horizon(torch.tensor(g))
    assert isinstance(nt, torch.Tensor)
    np.testing.assert_allclose(nt.numpy(), n, rtol=1e-14)


@pytest.mark.parametrize("g, fraction, match", [
    (0.1, math.exp(-1), "log-gates"),
    (float("nan"), math.exp(-1), "log-gates"),
    (-0.1, 1.0, "fraction"),
    (-0.1, 0.0, "fraction"),
])
def test_memory_horizon_rejects_bad_input(g, fraction, match):
    with pytest.raises(ValueError, match=match):
        gates.memory_horizon(g, fraction=fraction)


# ----------------------------------------------------------------------------- plots (chapter 2)

def test_decay_heatmap_draws_log10_lower_triangle():
    D = gates.decay_matrix(math.log(0.7), 6)
    ax = plots.decay_heatmap(D, title="γ = 0.7")
    img = ax.images[0].get_array()
    i, j = np.indices((6, 6))
    assert img.mask[i < j].all() and not img.mask[i >= j].any()
    np.testing.assert_allclose(img[i >= j], np.log10(0.7 ** (i - j)[i >= j]), rtol=1e-12)
    with pytest.raises(ValueError, match=r"D must have shape \[T, T\]"):
        plots.decay_heatmap(np.zeros((3, 4)))
    matplotlib.pyplot.close("all")


def test_gate_histogram_and_steps_plot():
    rng = _rng(6)
    ax = plots.gate_histogram({"a": rng.uniform(size=100), "b": rng.uniform(size=50)})
    assert len(ax.patches) == 2 and [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    ax = plots.steps_vs_gate(np.log([0.5, 0.9, 0.99]), {"fp16": np.array([25, 149, -1])})
    x, y = ax.lines[0].get_data()
    np.testing.assert_allclose(x, -np.log([0.5, 0.9]))
    np.testing.assert_array_equal(y, [25, 149])
    matplotlib.pyplot.close("all")
