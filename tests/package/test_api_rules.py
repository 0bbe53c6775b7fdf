"""One API across the forms: the shared option rules of gla_ref._validate (scale, bool flags,
chunk sizes, empty sizes) hold in the references and in every Triton and Pallas wrapper, and an
explicit scale reaches every gradient of the fused Triton kernels."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import gla_ref.pallas.chunk as pallas_chunk  # noqa: E402
import gla_ref.pallas.simple as pallas_simple  # noqa: E402
import gla_ref.triton.chunk as triton_chunk  # noqa: E402
import gla_ref.triton.chunk_simple as triton_simple  # noqa: E402
import gla_ref.triton.fused_chunk as triton_fused_chunk  # noqa: E402
import gla_ref.triton.fused_recurrent as triton_fused_recurrent  # noqa: E402
import gla_ref.teaching.historical as triton_historical  # noqa: E402
from gla_ref import device, jax_ref, pallas, torch_ref  # noqa: E402
from gla_ref import triton as gtriton  # noqa: E402
from gla_ref._validate import check_chunk_sizes, check_flag, check_scale  # noqa: E402
from gla_ref.testing import as_jax, as_torch, random_inputs, recurrence64, recurrence64_grads, rel_rmse  # noqa: E402

B, T, H, K, V = 1, 20, 1, 16, 16
X = random_inputs(B=B, T=T, H=H, K=K, V=V, gate="gla", initial_state=True)
SCALAR_G = random_inputs(B=B, T=T, H=H, K=K, V=V, gate="scalar")["g"]


def torch_forms():
    return [torch_ref.recurrent_gla, torch_ref.parallel_gla, torch_ref.chunk_gla,
            torch_ref.chunk_gla_two_level, torch_ref.chunk_gla_direct]


def jax_forms():
    return [jax_ref.recurrent_gla, jax_ref.parallel_gla, jax_ref.chunk_gla, jax_ref.chunk_gla_two_level]


def on_device(x, **kw):
    """NumPy inputs as torch tensors where the Triton kernels run (CUDA with a GPU, else the CPU)."""
    return as_torch(x, device=device.torch_device(), **kw)


def kernel(f, convert, scalar_gate=False):
    """``call(x, **options)``: kernel f on NumPy inputs x, converted (a scalar gate for simple GLA)."""
    def call(x, **options):
        y = convert({**x, "g": SCALAR_G} if scalar_gate else x)
        return f(y["q"], y["k"], y["v"], y["g"], initial_state=y["initial_state"], **options)

    return call


KERNELS = {  # every kernel wrapper, on tiny float32 shapes
    "triton.chunk_gla": kernel(gtriton.chunk_gla, on_device),
    "triton.chunk_simple_gla": kernel(gtriton.chunk_simple_gla, on_device, scalar_gate=True),
    "triton.fused_chunk_gla": kernel(gtriton.fused_chunk_gla, on_device),
    "triton.fused_recurrent_gla": kernel(gtriton.fused_recurrent_gla, on_device),
    "teaching.fused_chunk_gla_historical": kernel(triton_historical.fused_chunk_gla_historical, on_device),
    "pallas.chunk_gla": kernel(pallas.chunk_gla, as_jax),
    "pallas.fused_chunk_gla": kernel(pallas.fused_chunk_gla, as_jax),
    "pallas.chunk_simple_gla": kernel(pallas.chunk_simple_gla, as_jax, scalar_gate=True),
}
CHUNKED = [name for name in KERNELS if "recurrent" not in name and "historical" not in name]


@pytest.fixture
def no_launch(monkeypatch):
    """Any kernel launch fails the test: the errors must come from the checks made before it."""
    def launched(*args, **kwargs):
        raise AssertionError("a kernel was launched")

    for owner, name in [(triton_chunk.ChunkGLAFunction, "apply"),
                        (triton_simple.ChunkSimpleGLAFunction, "apply"),
                        (triton_fused_chunk.FusedChunkGLA, "apply"),
                        (triton_fused_recurrent.FusedRecurrentGLA, "apply"),
                        (triton_historical, "launch_decay_cumsum"),
                        (pallas_chunk, "run"), (pallas_simple, "run")]:
        monkeypatch.setattr(owner, name, launched)


# ----------------------------------------------------------------------------- scale

@pytest.mark.parametrize("scale", [0.5, 1, np.float32(0.5), np.float64(-0.25), np.int64(1), np.float16(2)])
def test_check_scale_takes_python_and_numpy_reals(scale):
    value = check_scale(scale, K)
    assert type(value) is float and value == float(scale)
    assert check_scale(None, K) == K ** -0.5


@pytest.mark.parametrize("scale,error", [
    (True, TypeError), (np.bool_(False), TypeError), ("0.5", TypeError), (1j, TypeError),
    (np.complex64(1), TypeError), (torch.tensor(0.5), TypeError), (jnp.float32(0.5), TypeError),
    (float("nan"), ValueError), (np.float32(np.inf), ValueError), (-float("inf"), ValueError)])
def test_check_scale_rejects(scale, error):
    with pytest.raises(error, match="^scale must be"):
        check_scale(scale, K)


@pytest.mark.parametrize("fw", ["torch", "jax"])
def test_references_take_numpy_scales(fw):
    """np.float32(0.37) is the scale used, in every form (jax: the chunk form, one compilation)."""
    scale = np.float32(0.37)
    o64, S64 = recurrence64(**X, scale=float(scale))
    forms = torch_forms() if fw == "torch" else [jax_ref.chunk_gla]
    convert = as_torch if fw == "torch" else as_jax
    for f in forms:
        o, S = f(**convert(X), scale=scale, output_final_state=True)
        assert rel_rmse(o64, o) < 2e-5 and rel_rmse(S64, S) < 2e-5, f.__name__
    o1, _ = forms[0](**convert(X), scale=np.int64(1))
    assert rel_rmse(recurrence64(**X, scale=1.0)[0], o1) < 2e-5


@pytest.mark.parametrize("name", ["triton.fused_recurrent_gla", "triton.fused_chunk_gla"])
def test_explicit_scale_reaches_every_gradient(name):
    """A non-default scale (0.37, not K**-0.5 = 0.25) reaches the forward and every gradient."""
    scale = np.float32(0.37)
    xt = on_device(X, requires_grad=True)
    f = gtriton.fused_recurrent_gla if "recurrent" in name else gtriton.fused_chunk_gla
    o, S = f(xt["q"], xt["k"], xt["v"], xt["g"], scale=scale, initial_state=xt["initial_state"],
             output_final_state=True)
    rng = np.random.default_rng(1)
    do, dS = rng.standard_normal(o.shape), rng.standard_normal(S.shape)
    ((o * torch.tensor(do, dtype=o.dtype, device=o.device)).sum()
     + (S * torch.tensor(dS, dtype=S.dtype, device=S.device)).sum()).backward()
    o64, S64 = recurrence64(**X, scale=float(scale))
    assert rel_rmse(o64, o) < 1e-5 and rel_rmse(S64, S) < 1e-5
    for arg, d64 in recurrence64_grads(**X, scale=float(scale), do=do, dS=dS).items():
        assert rel_rmse(d64, xt[arg].grad) < 1e-4, arg


@pytest.mark.parametrize("name", KERNELS)
def test_kernels_share_the_scale_rule(name, no_launch):
    for scale, error in [("0.5", TypeError), (True, TypeError), (float("nan"), ValueError)]:
        with pytest.raises(error, match="^scale must be"):
            KERNELS[name](X, scale=scale)


# ----------------------------------------------------------------------------- bool flags

BAD_FLAGS = [1, 0, None, "yes", np.int64(1), torch.tensor(True)]


def test_check_flag():
    assert check_flag("f", True) is True and check_flag("f", np.bool_(False)) is False
    for value in BAD_FLAGS:
        with pytest.raises(TypeError, match="^f must be a bool"):
            check_flag("f", value)


@pytest.mark.parametrize("fw", ["torch", "jax"])
def test_references_take_strict_bool_output_final_state(fw):
    forms, convert = (torch_forms(), as_torch) if fw == "torch" else (jax_forms(), as_jax)
    x = convert(X)
    for f in forms:
        for value in BAD_FLAGS:
            with pytest.raises(TypeError, match="^output_final_state must be a bool"):
                f(**x, output_final_state=value)
    _, S = forms[0](**x, output_final_state=np.bool_(True))
    assert S.shape == (B, H, K, V)


@pytest.mark.parametrize("name", KERNELS)
def test_kernels_take_strict_bool_output_final_state(name, no_launch):
    for value in BAD_FLAGS:
        with pytest.raises(TypeError, match="^output_final_state must be a bool"):
            KERNELS[name](X, output_final_state=value)


def test_fused_recurrent_reverse_is_a_strict_bool(no_launch):
    with pytest.raises(TypeError, match="^reverse must be a bool"):
        KERNELS["triton.fused_recurrent_gla"](X, reverse=1)


# ----------------------------------------------------------------------------- chunk sizes

BAD_CHUNKS = [True, np.bool_(True), 16.0, np.float64(16), "16", None, 0, -16]


def test_check_chunk_sizes():
    check_chunk_sizes(np.int64(16), np.int32(4))
    check_chunk_sizes(16, np.uint8(8))
    for value in BAD_CHUNKS:
        with pytest.raises(ValueError, match="^chunk_size must be a positive int"):
            check_chunk_sizes(value)
        if value is not None:  # no sub-chunk size: one-level chunking
            with pytest.raises(ValueError, match="^sub_chunk_size must be a positive int"):
                check_chunk_sizes(16, value)


@pytest.mark.parametrize("fw", ["torch", "jax"])
def test_references_take_numpy_chunk_sizes(fw):
    R, convert = (torch_ref, as_torch) if fw == "torch" else (jax_ref, as_jax)
    x = convert(X)
    o64, _ = recurrence64(**X)
    assert rel_rmse(o64, R.chunk_gla(**x, chunk_size=np.int64(8))[0]) < 2e-5
    o, _ = R.chunk_gla_two_level(**x, chunk_size=np.int64(8), sub_chunk_size=np.int32(4))
    assert rel_rmse(o64, o) < 2e-5


@pytest.mark.parametrize("name", CHUNKED)
def test_kernels_share_the_chunk_size_rule(name, no_launch):
    for value in BAD_CHUNKS:
        with pytest.raises(ValueError, match="^chunk_size must be"):
            KERNELS[name](X, chunk_size=value)


@pytest.mark.parametrize("name", ["triton.fused_recurrent_gla", "triton.chunk_gla", "triton.fused_chunk_gla",
                                  "pallas.chunk_gla"])
def test_kernels_take_numpy_options(name):
    """NumPy scalars for scale, chunk_size and output_final_state, as a NumPy pipeline makes them."""
    options = dict(scale=np.float32(0.37), output_final_state=np.bool_(True))
    if name != "triton.fused_recurrent_gla":
        options["chunk_size"] = np.int64(16)
    o, S = KERNELS[name](X, **options)
    o64, S64 = recurrence64(**X, scale=float(np.float32(0.37)))
    assert rel_rmse(o64, o) < 1e-5 and rel_rmse(S64, S) < 1e-5


# ----------------------------------------------------------------------------- empty sizes

EMPTY = {"B0": dict(B=0), "H0": dict(H=0), "K0": dict(K=0), "V0": dict(V=0)}


def empty_inputs(change):
    return random_inputs(**{**dict(B=B, T=T, H=H, K=K, V=V), **change}, gate="gla", initial_state=True)


@pytest.mark.parametrize("case", EMPTY)
def test_empty_sizes_are_a_value_error_in_references(case):
    x = empty_inputs(EMPTY[case])
    for forms, convert in [(torch_forms(), as_torch), (jax_forms(), as_jax)]:
        for f in forms:
            with pytest.raises(ValueError, match=r"^q and v must have B, H, K, V >= 1"):
                f(**convert(x))


@pytest.mark.parametrize("case", EMPTY)
@pytest.mark.parametrize("name", KERNELS)
def test_empty_sizes_are_a_value_error_in_kernels(name, case, no_launch):
    with pytest.raises(ValueError, match=r"^q and v must have B, H, K, V >= 1"):
        KERNELS[name](empty_inputs(EMPTY[case]))
