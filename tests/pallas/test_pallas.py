"""Pallas kernels (gla_ref.pallas): outputs, final states and every gradient against references.

Ground truth is jax_ref.recurrent_gla in float64 (the token-by-token recurrence, differentiated
by JAX); every result is also compared with jax_ref.chunk_gla in float32. On a CPU the launchers
run in Pallas' interpreter: the GPU (Triton-style) launcher with ``interpret=True``, the TPU
launcher under ``pltpu.InterpretParams`` with the race detector, NaN-filled scratch and a seeded
random order of the parallel grid points. On a GPU the same tests run the Triton launcher
natively; on a TPU, the Mosaic one. Shapes are tiny: interpreting is slow.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from gla_ref import device, jax_ref  # noqa: E402
from gla_ref.pallas import chunk_gla, chunk_simple_gla, fused_chunk_gla  # noqa: E402
from gla_ref.pallas import compat  # noqa: E402
from gla_ref.testing import as_jax, rel_rmse  # noqa: E402
from gla_ref.testing.pallas_cases import check_variant, compiled, make_inputs  # noqa: E402


# ---------------------------------------------------------------- the launcher of this device

@pytest.mark.parametrize("variant", ["chunk", "fused", "simple_chunk", "simple_fused",
                                     "gamma_chunk", "gamma_fused"])
def test_two_level_chunks_with_states(variant):
    """Chunks of 32 = two sub-chunks (off-diagonal tiles by matmul), initial and final state."""
    check_variant(variant, chunk_size=32, T=40)


@pytest.mark.parametrize("variant, chunk_size, shape, final", [
    ("chunk", 16, {"T": 1, "h0": False}, True),                         # a single token
    ("fused", 16, {"T": 1, "K": 8, "V": 40}, True),                     # one token, K < 16, V ≠ K
    ("chunk", 16, {"T": 23, "K": 40, "V": 80}, True),                   # GPU: two value blocks
    ("fused", 16, {"T": 23, "K": 40, "V": 80, "h0": False}, False),     # GPU: two value blocks, fused
    ("simple_chunk", 16, {"T": 17, "K": 24, "V": 12}, True),
    ("gamma_auto", 16, {"T": 37, "h0": False}, False),                  # auto -> fused path
    ("gamma_auto", 16, {"T": 9, "B": 2}, False),                        # auto -> chunk path (initial state)
    ("fused", 32, {"T": 33, "K": 16, "V": 16, "h0": False}, True),      # T one past a chunk boundary
    ("simple_fused", 16, {"T": 12, "scale": 0.3}, True),                # an explicit scale
])
def test_awkward_shapes(variant, chunk_size, shape, final):
    check_variant(variant, chunk_size=chunk_size, final=final, **shape)


@pytest.mark.parametrize("variant", ["chunk", "gamma_fused"])
def test_bfloat16_inputs(variant):
    """bf16 q, k, v: bf16 matmul operands, fp32 accumulation, fp32 states and gates."""
    check_variant(variant, dtype=jnp.bfloat16, T=33)


@pytest.mark.parametrize("variant, launcher", [("chunk", "gpu"), ("simple_chunk", "tpu"), ("fused", "tpu"),
                                               ("simple_fused", "gpu"), ("gamma_chunk", "gpu"),
                                               ("gamma_fused", "tpu")])
def test_bfloat16_accuracy_at_a_realistic_length(variant, launcher):
    """bf16 within 5e-3 relative RMSE of the float64 recurrence (on the same bf16 inputs) for o, the
    final state and every gradient, dg and g_gamma's included (FLA's bound; Triton's chunk_gla is
    ≈ 4e-3), at four chunks of 64 and slow gates (log σ(x)/16). The gate gradient is summed chunk by
    chunk (chunk_math.chunk_gate_grad; the fused path from per-chunk rows, chunk._fused_gate_grad):
    the sequence-wide reverse sum of q ⊙ dq − k ⊙ dk it replaced gave dg 8.4e-3 here against
    unrounded inputs (7.6e-3 for a scalar gate; 1.4e-2 on an H200 at longer T)."""
    interpret = True if launcher == "gpu" else compat.tpu_interpret_params()
    with _on_cpu():
        errors = check_variant(variant, chunk_size=64, dtype=jnp.bfloat16, launcher=launcher, interpret=interpret,
                               tol=5e-3, B=2, T=256, H=2, K=64, V=64, tau=16.0)
    assert errors["o"] > 1e-3 and errors["dg"] > 1e-4  # bf16 math: real rounding is measured, not a vacuous zero


# ---------------------------------------------------------------- the other launcher, interpreted

@contextlib.contextmanager
def _on_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.mark.parametrize("variant, chunk_size, cores, shape", [
    ("chunk", 32, 1, {"T": 40}),
    pytest.param("fused", 16, 2, {"T": 20, "B": 2}, marks=pytest.mark.slow),
    ("gamma_chunk", 16, 1, {"T": 20, "V": 136}),  # two value blocks of 128
])
def test_tpu_launcher_interpreted(variant, chunk_size, cores, shape):
    """The Mosaic launcher under the TPU interpreter: NaN-filled scratch, a random order of the
    "parallel" grid points (shared by two emulated cores in one case), the race detector on."""
    params = compat.tpu_interpret_params(detect_races=True, random_seed=7, num_cores=cores)
    assert params is not None, f"jax {jax.__version__} has no pltpu.InterpretParams"
    compat.reset_tpu_interpreter()
    with _on_cpu():
        check_variant(variant, chunk_size=chunk_size, launcher="tpu", interpret=params, **shape)
    assert compat.races_found() is not True, "the TPU interpreter detected a data race"


def test_gpu_launcher_interpreted():
    """The Triton-style launcher in Pallas' plain interpreter, wherever the tests run."""
    with _on_cpu():
        check_variant("chunk", launcher="gpu", interpret=True, T=20)


# ---------------------------------------------------------------- structure: fused means fused

def _kernel_names(fn, *args):
    text = str(jax.make_jaxpr(fn)(*args))
    return {name for name in ("gla_state_fwd", "gla_chunk_fwd_o", "gla_fused_fwd", "gla_state_bwd",
                              "gla_chunk_bwd", "gla_fused_bwd_dq", "gla_fused_bwd_dkv") if name in text}


def test_fused_paths_write_no_states():
    x, _ = make_inputs("chunk", T=40, h0=False)
    j = as_jax(x)

    def loss(fn):
        return lambda q, k, v, g: fn(q, k, v, g, chunk_size=16)[0].sum()

    fused = _kernel_names(jax.grad(loss(fused_chunk_gla), argnums=(0, 1, 2, 3)), j["q"], j["k"], j["v"], j["g"])
    assert fused == {"gla_fused_fwd", "gla_fused_bwd_dq", "gla_fused_bwd_dkv"}
    chunk = _kernel_names(jax.grad(loss(chunk_gla), argnums=(0, 1, 2, 3)), j["q"], j["k"], j["v"], j["g"])
    assert chunk == {"gla_state_fwd", "gla_chunk_fwd_o", "gla_state_bwd", "gla_chunk_bwd"}


def test_simple_auto_mode_picks_the_rfc_path():
    x, _ = make_inputs("gamma_auto", T=20)
    j = as_jax(x)
    g_gamma = j["g"]
    run = lambda h0, final: _kernel_names(
        lambda q, k, v: chunk_simple_gla(q, k, v, g_gamma=g_gamma, initial_state=h0,
                                         output_final_state=final, chunk_size=16), j["q"], j["k"], j["v"])
    assert run(None, False) == {"gla_fused_fwd"}
    assert run(j["initial_state"], False) == {"gla_state_fwd", "gla_chunk_fwd_o"}
    assert run(None, True) == {"gla_state_fwd", "gla_chunk_fwd_o"}


def test_g_gamma_gradient_is_the_sum_over_positions():
    """g_gamma's gradient equals the scalar-gate gradient summed over batch and time."""
    x, _ = make_inputs("gamma_chunk", B=2, T=20, h0=False)
    j = as_jax(x)
    B, T, H = 2, 20, 2
    def grads(gg):
        loss_gamma = lambda gg: chunk_simple_gla(j["q"], j["k"], j["v"], g_gamma=gg, chunk_size=16)[0].sum()
        loss_scalar = lambda g: chunk_simple_gla(j["q"], j["k"], j["v"], g, chunk_size=16)[0].sum()
        return jax.grad(loss_gamma)(gg), jax.grad(loss_scalar)(jnp.broadcast_to(gg, (B, T, H)))

    d_gamma, d_scalar = compiled(grads, j["g"])(j["g"])
    assert np.abs(np.asarray(d_gamma)).min() > 0
    assert rel_rmse(np.asarray(d_scalar).sum((0, 1)), d_gamma) < 1e-5


@pytest.mark.parametrize("mode", ["chunk", "fused"])
def test_simple_gate_rule_matches_triton(mode):
    """As in gla_ref.triton.chunk_simple_gla: g and g_gamma add, neither is plain linear attention; the
    gradients of both are true ones, and an invalid g cannot hide inside a valid sum."""
    x, _ = make_inputs("simple_chunk", B=2, T=20, h0=False)
    j = as_jax(x)
    B, T, H = 2, 20, 2
    g, gamma = j["g"], jnp.array([-0.3, -0.05], jnp.float32)
    run = lambda g, gamma: chunk_simple_gla(j["q"], j["k"], j["v"], g, g_gamma=gamma, chunk_size=16, mode=mode)[0]
    total = g + gamma[None, None, :]
    want = jax_ref.chunk_gla(j["q"], j["k"], j["v"], total, chunk_size=16)[0]
    assert rel_rmse(want, run(g, gamma)) < 1e-5
    assert rel_rmse(jax_ref.chunk_gla(j["q"], j["k"], j["v"], None)[0], run(None, None)) < 1e-5
    d_g, d_gamma = jax.grad(lambda a, b: run(a, b).sum(), argnums=(0, 1))(g, gamma)
    d_total = jax.grad(lambda t: jax_ref.chunk_gla(j["q"], j["k"], j["v"], t, chunk_size=16)[0].sum())(total)
    assert rel_rmse(d_total, d_g) < 1e-5
    assert rel_rmse(np.asarray(d_total).sum((0, 1)), d_gamma) < 1e-5
    hidden = g.at[1, 5, 0].set(0.2)  # 0.2 + (-0.3) < 0: valid as a sum, invalid as a gate
    o = np.asarray(run(hidden, gamma))
    assert np.isnan(o[1, 5:, 0]).all() and np.isfinite(o[0]).all()


# ---------------------------------------------------------------- bad input, rejected before tracing

def _args(B=1, T=8, H=2, K=20, V=24, dtype=jnp.float32):
    q = jnp.zeros((B, T, H, K), dtype)
    return q, q, jnp.zeros((B, T, H, V), dtype), jnp.full((B, T, H, K), -0.1, jnp.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda q, k, v, g: chunk_gla(q, k, v, g[..., 0]), ValueError, "g must have shape"),
    (lambda q, k, v, g: fused_chunk_gla(q, k[:, :4], v, g), ValueError, "k must have shape"),
    (lambda q, k, v, g: chunk_gla(q, k, v[:, :, :1], g), ValueError, "v must have shape"),
    (lambda q, k, v, g: chunk_gla(q.astype(jnp.float16), k.astype(jnp.float16), v.astype(jnp.float16), g),
     TypeError, "float32 or bfloat16 .* has no float16"),
    (lambda q, k, v, g: chunk_gla(q, k, v, g, chunk_size=24), ValueError, "power of two"),
    (lambda q, k, v, g: chunk_gla(q, k, v, g, chunk_size=8), ValueError, "power of two"),
    (lambda q, k, v, g: chunk_gla(q, k, v, g, chunk_size=0), ValueError, "chunk_size"),
    (lambda q, k, v, g: chunk_gla(q, k, v, g, scale="x"), TypeError, "scale"),
    (lambda q, k, v, g: chunk_gla(q, k, v, g, output_final_state=1), TypeError, "output_final_state"),
    (lambda q, k, v, g: chunk_gla(q, k, v, g, initial_state=jnp.zeros((1, 2, 24, 20))), ValueError,
     "initial_state must have shape"),
    (lambda q, k, v, g: chunk_gla(q, k, v, g, launcher="cuda"), ValueError, "launcher"),
    (lambda q, k, v, g: chunk_simple_gla(q, k, v, g_gamma=g[0, 0, 0]), ValueError, "g_gamma must have shape"),
    (lambda q, k, v, g: chunk_simple_gla(q, k, v, g), ValueError, "g must have shape"),
    (lambda q, k, v, g: chunk_simple_gla(q, k, v, g[..., 0], mode="fast"), ValueError, "mode"),
])
def test_bad_input_is_rejected(call, error, match):
    with pytest.raises(error, match=match):
        call(*_args())


def test_head_dims_above_256_are_rejected():
    with pytest.raises(ValueError, match="at most 256"):
        chunk_gla(*_args(K=264))


def test_debug_mode_checks_values():
    q, k, v, g = _args()
    with device.debug(True):
        with pytest.raises(ValueError, match="log forget gates"):
            chunk_gla(q, k, v, -g)
        with pytest.raises(ValueError, match="NaN"):
            fused_chunk_gla(q.at[0, 0, 0, 0].set(jnp.nan), k, v, g)
        with pytest.raises(ValueError, match="g_gamma"):
            chunk_simple_gla(q, k, v, g_gamma=jnp.ones((2,)))
