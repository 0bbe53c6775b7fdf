"""Every bad input to the references raises ValueError/TypeError with a message naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from gla_ref import jax_ref, torch_ref  # noqa: E402

B, T, H, K, V = 1, 5, 2, 4, 3
FORMS = {  # framework: the forms taking (q, k, v, g, scale=..., initial_state=...)
    "torch": [torch_ref.recurrent_gla, torch_ref.parallel_gla, torch_ref.chunk_gla,
              torch_ref.chunk_gla_two_level, torch_ref.chunk_gla_direct],
    "jax": [jax_ref.recurrent_gla, jax_ref.parallel_gla, jax_ref.chunk_gla, jax_ref.chunk_gla_two_level],
}
CASES = [  # (case, change to the good float32 inputs, error type, message pattern)
    ("q-rank3", dict(q=np.zeros((T, H, K))), ValueError, r"^q must have shape \[B, T, H, D\]"),
    ("q-T0", dict(q=np.zeros((B, 0, H, K)), k=np.zeros((B, 0, H, K)), v=np.zeros((B, 0, H, V)), g=None),
     ValueError, r"^q must have T >= 1"),
    ("k-shape", dict(k=np.zeros((B, T, H, K + 1))), ValueError, r"^k must have shape \[B, T, H, K\]"),
    ("v-shape", dict(v=np.zeros((B, T + 1, H, V))), ValueError, r"^v must have shape \[B, T, H, V\]"),
    ("g-rank2", dict(g=np.zeros((B, T))), ValueError, r"^g must have shape"),
    ("g-K", dict(g=np.zeros((B, T, H, K + 1))), ValueError, r"^g must have shape"),
    ("g-H", dict(g=np.zeros(H + 1)), ValueError, r"^g must have shape"),
    ("h0-shape", dict(initial_state=np.zeros((B, H, V, K))), ValueError, r"^initial_state must have shape"),
    ("h0-fp16", dict(initial_state=np.zeros((B, H, K, V), np.float16)), TypeError, r"^initial_state must have a floating dtype"),
    ("q-int", dict(q=np.zeros((B, T, H, K), np.int32)), TypeError, r"^q must have a floating dtype"),
    ("v-int", dict(v=np.zeros((B, T, H, V), np.int32)), TypeError, r"^v must have a floating dtype"),
    ("g-int", dict(g=np.zeros((B, T, H, K), np.int32)), TypeError, r"^g must have a floating dtype"),
    ("k-fp16", dict(k=np.zeros((B, T, H, K), np.float16)), TypeError, r"^q, k, v must share one dtype"),
    ("g-positive", dict(g=np.full((B, T, H), 0.1)), ValueError,
     r"^g must hold log forget gates <= 0 .*got 0.1 > 0 at g\[b=0, t=0, h=0\]: g looks like gate probabilities"),
    ("g-nan", {"g": "poison"}, ValueError, r"^g must hold log forget gates <= 0 .*got NaN at g\[b=0, t=0, h=0, k=3\]$"),
    ("g-inf", {"g": "poison"}, ValueError,  # -inf: a hard reset
     r"^g must hold log forget gates <= 0 .*got -inf at g\[b=0, t=0, h=0, k=3\]: a hard reset .*cu_seqlens"),
    ("scale-nan", dict(scale=float("nan")), ValueError, r"^scale must be finite"),
    ("scale-str", dict(scale="0.5"), TypeError, r"^scale must be a real number or None"),
] + [  # NaN or inf in each input but the gate (above)
    (f"{name}-{bad}", {name: "poison"}, ValueError, rf"^{name} contains NaN or inf")
    for name in ("q", "k", "v", "initial_state") for bad in ("nan", "inf")
]


def good_inputs():
    rng = np.random.default_rng(0)
    return {"q": rng.standard_normal((B, T, H, K)).astype(np.float32),
            "k": rng.standard_normal((B, T, H, K)).astype(np.float32),
            "v": rng.standard_normal((B, T, H, V)).astype(np.float32),
            "g": -rng.random((B, T, H, K)).astype(np.float32),
            "initial_state": rng.standard_normal((B, H, K, V)).astype(np.float32)}


def to_framework(fw, x):
    """NumPy arrays to tensors of the same dtype (None and non-arrays pass through)."""
    if not isinstance(x, np.ndarray):
        return x
    return torch.from_numpy(x) if fw == "torch" else jnp.asarray(x)


def bad_inputs(case_change, case_name):
    x = {**good_inputs(), "scale": None}
    for name, value in case_change.items():
        if isinstance(value, str) and value == "poison":
            value = x[name].copy()
            value.flat[3] = np.nan if case_name.endswith("nan") else -np.inf if name == "g" else np.inf
        x[name] = value
    return x


def call(f, fw, x):
    x = {n: to_framework(fw, a) for n, a in x.items()}
    if f is torch_ref.parallel_gla_naive:
        x.pop("initial_state")
    return f(**x)


@pytest.mark.parametrize("case,change,error,match", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("fw", FORMS)
def test_bad_inputs_name_the_argument(fw, case, change, error, match):
    x = bad_inputs(change, case)
    for f in FORMS[fw]:
        with pytest.raises(error, match=match):
            call(f, fw, x)


NAIVE_CASES = [c for c in CASES if "initial_state" not in c[1]]  # parallel_gla_naive takes no state


@pytest.mark.parametrize("case,change,error,match", NAIVE_CASES, ids=[c[0] for c in NAIVE_CASES])
def test_parallel_naive_bad_inputs(case, change, error, match):
    x = bad_inputs(change, case)
    with pytest.raises(error, match=match):
        call(torch_ref.parallel_gla_naive, "torch", x)


CHUNK_FORMS = {"torch": [torch_ref.chunk_gla, torch_ref.chunk_gla_two_level, torch_ref.chunk_gla_direct],
               "jax": [jax_ref.chunk_gla, jax_ref.chunk_gla_two_level]}


@pytest.mark.parametrize("chunk_size", [0, -16, 16.0, True, "16", None])
@pytest.mark.parametrize("fw", FORMS)
def test_bad_chunk_size(fw, chunk_size):
    x = {n: to_framework(fw, a) for n, a in good_inputs().items()}
    for f in CHUNK_FORMS[fw]:
        with pytest.raises(ValueError, match=r"^chunk_size must be a positive int"):
            f(**x, chunk_size=chunk_size)


@pytest.mark.parametrize("sub_chunk_size,match", [
    (0, r"^sub_chunk_size must be a positive int"), (-4, r"^sub_chunk_size must be a positive int"),
    (4.0, r"^sub_chunk_size must be a positive int"), (None, r"^sub_chunk_size must be a positive int"),
    (3, r"^sub_chunk_size=3 must divide chunk_size=16"), (32, r"^sub_chunk_size=32 must divide chunk_size=16")])
@pytest.mark.parametrize("fw", FORMS)
def test_bad_sub_chunk_size(fw, sub_chunk_size, match):
    x = {n: to_framework(fw, a) for n, a in good_inputs().items()}
    ref = torch_ref if fw == "torch" else jax_ref
    with pytest.raises(ValueError, match=match):
        ref.chunk_gla_two_level(**x, chunk_size=16, sub_chunk_size=sub_chunk_size)


@pytest.mark.parametrize("matmul_dtype", ["int32", "bool", "not a dtype"])
@pytest.mark.parametrize("fw", FORMS)
def test_bad_matmul_dtype(fw, matmul_dtype):
    x = {n: to_framework(fw, a) for n, a in good_inputs().items()}
    forms = CHUNK_FORMS[fw][1:]  # the forms that take matmul_dtype
    dtype = getattr(torch if fw == "torch" else jnp, matmul_dtype, matmul_dtype)
    for f in forms:
        with pytest.raises(TypeError, match=r"^matmul_dtype must be None or a floating"):
            f(**x, matmul_dtype=dtype)


@pytest.mark.parametrize("fw", FORMS)
def test_expand_gate_rejects_bad_rank(fw):
    ref = torch_ref if fw == "torch" else jax_ref
    with pytest.raises(ValueError, match=r"^g must have shape"):
        ref.expand_gate(to_framework(fw, np.zeros((B, T), np.float32)), B, T, H, K)


@pytest.mark.parametrize("fw", FORMS)
def test_good_inputs_pass(fw):
    """The baseline the bad cases start from is accepted by every form (so each case tests one fault)."""
    x = {n: to_framework(fw, a) for n, a in good_inputs().items()}
    for f in FORMS[fw]:
        o, S = f(**x, output_final_state=True)
        assert o.shape == (B, T, H, V) and S.shape == (B, H, K, V)
