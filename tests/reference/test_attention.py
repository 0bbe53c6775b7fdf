"""gla_ref.reference.attention against direct float64 NumPy loops (written here, independent of the library)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gla_ref.reference import attention as A  # noqa: E402
from gla_ref.testing import as_torch, assert_close, random_inputs  # noqa: E402


def _inputs(T=13, dtype=torch.float64, **kw):
    x = as_torch(random_inputs(B=2, T=T, H=3, K=5, V=4, gate="none", **kw), dtype=dtype)
    return x["q"], x["k"], x["v"]


def _np(*xs):
    return [x.detach().double().numpy() for x in xs]


# --- direct float64 computations, one query and one key at a time -------------------------

def _attend64(q, v, weights, causal, normalize=True):
    """``o_i = Σ_j w_ij v_j`` (divided by ``Σ_j w_ij`` if ``normalize``), ``weights(b, h, i, js)`` → w_i."""
    B, T, H, K = q.shape
    o = np.zeros(v.shape)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                js = range(i + 1) if causal else range(T)
                w = weights(b, h, i, js)
                num = sum(wj * v[b, j, h] for wj, j in zip(w, js))
                o[b, i, h] = num / w.sum() if normalize else num
    return o


def softmax64(q, k, v, scale, causal):
    return _attend64(q, v, lambda b, h, i, js: np.array(
        [np.exp(scale * q[b, i, h] @ k[b, j, h]) for j in js]), causal)


def kernel64(q, k, v, phi, causal, normalize=True, scale=1.0):
    return _attend64(q, v, lambda b, h, i, js: np.array(
        [phi(q[b, i, h]) @ phi(k[b, j, h]) for j in js]) * scale, causal, normalize)


def elu1_64(x):
    return np.where(x > 0, x + 1.0, np.exp(x))


# --- softmax attention ---------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_softmax_attention_matches_float64_loop(causal):
    q, k, v = _inputs()
    ref = softmax64(*_np(q, k, v), scale=5 ** -0.5, causal=causal)
    assert_close("o", ref, A.softmax_attention(q, k, v, causal=causal), 1e-13)


def test_softmax_attention_float32_and_custom_scale():
    q, k, v = _inputs(dtype=torch.float32)
    o = A.softmax_attention(q, k, v, scale=0.3)
    assert o.dtype == torch.float32
    assert_close("o", softmax64(*_np(q, k, v), scale=0.3, causal=True), o, 1e-6)


def test_softmax_weights_rows_sum_to_one_and_are_causal():
    q, k, _ = _inputs()
    P = A.softmax_attention_weights(q, k)
    torch.testing.assert_close(P.sum(-1), torch.ones_like(P.sum(-1)))
    assert (P.triu(1) == 0).all()


def test_softmax_recurrent_equals_parallel_and_fills_cache():
    q, k, v = _inputs(T=11)
    cache = A.KVCache()
    o_rec = A.softmax_attention_recurrent(q, k, v, cache=cache)
    assert_close("o", A.softmax_attention(q, k, v), o_rec, 1e-14)
    assert len(cache) == 11
    assert tuple(cache.keys.shape) == (2, 11, 3, 5) and tuple(cache.values.shape) == (2, 11, 3, 4)
    assert cache.nbytes == 2 * 11 * 3 * (5 + 4) * 8


def test_softmax_recurrent_continues_a_cache():
    q, k, v = _inputs(T=12)
    cache = A.KVCache()
    o1 = A.softmax_attention_recurrent(q[:, :5], k[:, :5], v[:, :5], cache=cache)
    o2 = A.softmax_attention_recurrent(q[:, 5:], k[:, 5:], v[:, 5:], cache=cache)
    assert_close("o", A.softmax_attention(q, k, v), torch.cat([o1, o2], 1), 1e-14)


def test_softmax_recurrent_half_precision_output_dtype():
    q, k, v = _inputs(dtype=torch.float16)
    o = A.softmax_attention_recurrent(q, k, v)
    assert o.dtype == torch.float16
    assert_close("o", softmax64(*_np(q, k, v), scale=5 ** -0.5, causal=True), o, 2e-3)


def test_kv_cache_rejects_mismatched_token_and_empty_step():
    cache = A.KVCache()
    cache.append(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="k_t/v_t"):
        cache.append(torch.zeros(1, 2, 5), torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="empty"):
        A.softmax_attention_step(torch.zeros(1, 2, 3), A.KVCache())


# --- normalised linear attention -------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_normalized_elu1_matches_float64_loop(causal):
    q, k, v = _inputs()
    ref = kernel64(*_np(q, k, v), phi=elu1_64, causal=causal)
    assert_close("o", ref, A.linear_attention_normalized(q, k, v, causal=causal), 1e-13)


def test_normalized_identity_and_callable_feature_maps():
    q, k, v = _inputs()
    ref = kernel64(*_np(q, k, v), phi=lambda x: x, causal=True)
    assert_close("o identity", ref, A.linear_attention_normalized(q, k, v, feature_map="identity"), 1e-11)
    ref_sq = kernel64(*_np(q, k, v), phi=lambda x: np.concatenate([x, x]) ** 2, causal=True)
    out_sq = A.linear_attention_normalized(q, k, v, feature_map=lambda x: torch.cat([x, x], -1) ** 2)
    assert_close("o callable (K'=2K)", ref_sq, out_sq, 1e-13)


def test_normalized_recurrent_equals_parallel_and_state():
    q, k, v = _inputs()
    o, (S, z) = A.linear_attention_normalized_recurrent(q, k, v, output_final_state=True)
    assert_close("o", A.linear_attention_normalized(q, k, v), o, 1e-13)
    fk = elu1_64(k.numpy())
    assert_close("S", np.einsum("bthk,bthv->bhkv", fk, v.numpy()), S, 1e-14)
    assert_close("z", fk.sum(1), z, 1e-14)
    assert A.linear_attention_normalized_recurrent(q, k, v)[1] is None


def test_normalized_weights_rows_sum_to_one_and_positive():
    q, k, _ = _inputs()
    W = A.linear_attention_weights(q, k)
    torch.testing.assert_close(W.sum(-1), torch.ones_like(W.sum(-1)))
    assert (W >= 0).all() and (W.triu(1) == 0).all()


# --- unnormalised linear attention: association orders ---------------------------------------

def test_qk_first_matches_float64_loop_both_masks():
    q, k, v = _inputs()
    for causal in (True, False):
        ref = kernel64(*_np(q, k, v), phi=lambda x: x, causal=causal, normalize=False, scale=5 ** -0.5)
        assert_close(f"o causal={causal}", ref, A.linear_attention_qk_first(q, k, v, causal=causal), 1e-13)


def test_kv_first_equals_unmasked_not_masked():
    q, k, v = _inputs()
    kv = A.linear_attention_kv_first(q, k, v)
    assert_close("o", A.linear_attention_qk_first(q, k, v, causal=False), kv, 1e-13)
    causal = A.linear_attention_qk_first(q, k, v, causal=True)
    assert torch.linalg.norm(causal - kv) / torch.linalg.norm(causal) > 0.1
    # the last query sees every key, so there the two orders agree
    assert_close("o_T", causal[:, -1], kv[:, -1], 1e-13)


def test_prefix_sum_equals_causal_and_materialises_states():
    q, k, v = _inputs()
    o, states = A.linear_attention_prefix_sum(q, k, v, scale=0.7, output_states=True)
    assert_close("o", A.linear_attention_qk_first(q, k, v, scale=0.7), o, 1e-13)
    assert tuple(states.shape) == (2, 13, 3, 5, 4)
    assert_close("S_T", np.einsum("bthk,bthv->bhkv", k.numpy(), v.numpy()), states[:, -1], 1e-14)


# --- bad input ---------------------------------------------------------------------------------

ALL = [
    lambda q, k, v: A.softmax_attention(q, k, v),
    lambda q, k, v: A.softmax_attention_recurrent(q, k, v),
    lambda q, k, v: A.linear_attention_normalized(q, k, v),
    lambda q, k, v: A.linear_attention_normalized_recurrent(q, k, v),
    lambda q, k, v: A.linear_attention_qk_first(q, k, v),
    lambda q, k, v: A.linear_attention_kv_first(q, k, v),
    lambda q, k, v: A.linear_attention_prefix_sum(q, k, v),
]


@pytest.mark.parametrize("f", ALL)
def test_bad_shapes_dtypes_values(f):
    q, k, v = _inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match="k must have shape"):
        f(q, k[:, :-1], v)
    with pytest.raises(ValueError, match="q must have shape"):
        f(q[0], k, v)
    with pytest.raises(TypeError, match="dtype"):
        f(q, k.double(), v)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        f(q.numpy(), k, v)
    with pytest.raises(ValueError, match="v contains NaN"):
        f(q, k, v.clone().fill_(float("nan")))


def test_bad_options():
    q, k, v = _inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match="scale must be positive"):
        A.softmax_attention(q, k, v, scale=-1.0)
    with pytest.raises(TypeError, match="scale must be a real number"):
        A.linear_attention_qk_first(q, k, v, scale="1")
    with pytest.raises(TypeError, match="causal must be a bool"):
        A.softmax_attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match="feature_map must be one of"):
        A.linear_attention_normalized(q, k, v, feature_map="relu")
    with pytest.raises(TypeError, match="feature_map must be a str or a callable"):
        A.linear_attention_normalized(q, k, v, feature_map=3)
    with pytest.raises(ValueError, match="feature_map must map"):
        A.linear_attention_normalized(q, k, v, feature_map=lambda x: x.sum(-1))
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        A.softmax_attention_recurrent(q, k, v, cache=[])
    with pytest.raises(ValueError, match="T must be a positive int"):
        A.causal_mask(0)
