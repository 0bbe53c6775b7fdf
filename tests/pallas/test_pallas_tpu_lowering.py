"""Every Pallas launcher configuration lowered for real hardware, on any machine.

``jax.export(..., platforms=["tpu"])`` runs the Mosaic lowering of each kernel, forward and
backward, so block shapes that break the (8, 128) rule, unsupported operations or dtypes fail
here on a CPU rather than on a TPU. The GPU launcher is lowered for CUDA the same way (Triton
IR: power-of-two tensor sizes, supported primitives). Nothing is compiled or run.
"""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from gla_ref.pallas import chunk_gla, chunk_simple_gla, fused_chunk_gla  # noqa: E402
from gla_ref.pallas import compat  # noqa: E402

f32, bf16 = jnp.float32, jnp.bfloat16

# public function and gate shape builder; each call asks for the non-interpreted launcher
CALLS = {
    "chunk_gla": (lambda q, k, v, g, **kw: chunk_gla(q, k, v, g, **kw), lambda B, T, H, K: (B, T, H, K)),
    "fused_chunk_gla": (lambda q, k, v, g, **kw: fused_chunk_gla(q, k, v, g, **kw), lambda B, T, H, K: (B, T, H, K)),
    "simple_g_chunk": (lambda q, k, v, g, **kw: chunk_simple_gla(q, k, v, g, mode="chunk", **kw),
                       lambda B, T, H, K: (B, T, H)),
    "simple_g_fused": (lambda q, k, v, g, **kw: chunk_simple_gla(q, k, v, g, mode="fused", **kw),
                       lambda B, T, H, K: (B, T, H)),
    "g_gamma_chunk": (lambda q, k, v, g, **kw: chunk_simple_gla(q, k, v, g_gamma=g, mode="chunk", **kw),
                      lambda B, T, H, K: (H,)),
    "g_gamma_fused": (lambda q, k, v, g, **kw: chunk_simple_gla(q, k, v, g_gamma=g, mode="fused", **kw),
                      lambda B, T, H, K: (H,)),
}

# (B, T, H, K, V, chunk_size, dtype): unaligned K/V, two value blocks, T = 1, the largest heads
SHAPES = [
    (2, 100, 2, 20, 200, 64, f32),
    (1, 1, 1, 256, 256, 128, bf16),
    (1, 77, 3, 96, 48, 16, bf16),
]


def _fwd_and_bwd(name, chunk_size, launcher, with_states):
    call, _ = CALLS[name]

    def f(q, k, v, g, h0):
        kw = {"chunk_size": chunk_size, "launcher": launcher, "interpret": False}
        if with_states:
            kw.update(initial_state=h0, output_final_state=True)
        out, pullback = jax.vjp(lambda *a: call(*a, **kw), q, k, v, g)
        return out, pullback(jax.tree.map(jnp.ones_like, out))

    return f


def _specs(name, B, T, H, K, V, dtype):
    g_shape = CALLS[name][1](B, T, H, K)
    sds = jax.ShapeDtypeStruct
    return (sds((B, T, H, K), dtype), sds((B, T, H, K), dtype), sds((B, T, H, V), dtype),
            sds(g_shape, f32), sds((B, H, K, V), f32))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}T{}H{}K{}V{}C{}-{}".format(*s[:6], jnp.dtype(s[6]).name))
@pytest.mark.parametrize("name", list(CALLS))
def test_mosaic_lowering(name, shape):
    B, T, H, K, V, C, dtype = shape
    args = _specs(name, B, T, H, K, V, dtype)
    for with_states in (False, True):
        exported = jax.export.export(jax.jit(_fwd_and_bwd(name, C, "tpu", with_states)),
                                     platforms=["tpu"])(*args)
        text = exported.mlir_module()
        assert text.count("tpu_custom_call") >= 2, "expected Mosaic kernels forward and backward"


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[2]], ids=["B2T100V200", "T77K96-bf16"])
@pytest.mark.parametrize("name", list(CALLS))
def test_triton_lowering(name, shape):
    B, T, H, K, V, C, dtype = shape
    args = _specs(name, B, T, H, K, V, dtype)
    for with_states in (False, True):
        with compat.abstract_gpu("NVIDIA H100"):
            lowered = jax.jit(_fwd_and_bwd(name, C, "gpu", with_states)).trace(*args).lower(
                lowering_platforms=("cuda",))
        assert "__gpu$xla.gpu.triton" in lowered.as_text(), "expected Triton kernels"


@pytest.mark.parametrize("K, V, C, scalar", [(64, 64, 64, True), (128, 128, 64, True), (100, 200, 128, True),
                                             (256, 512, 64, False), (20, 24, 16, False)])
def test_tpu_blocks_fill_the_mxu_where_dims_allow(K, V, C, scalar):
    """The Mosaic launcher's launch parameters: whole (padded) K and 128 value columns a block, so
    every state matmul is ≥ 128 wide; a scalar/constant gate's intra-chunk scores are one whole-chunk
    tile of C rows, GLA's are 16-row tiles (its per-key decay needs them)."""
    from gla_ref.pallas.launchers import tpu

    p = tpu.launch_params(K, V, C, scalar)
    assert p["BK"] >= 128 and p["BK"] >= K and p["BK"] % 128 == 0
    assert p["BV"] == 128  # V < 128 stays one block (padded), larger V is split into blocks of 128
    assert (p["tile_rows"], p["n_tiles"]) == ((C, 1) if scalar else (16, C // 16))


def _jaxprs_in_params(params):
    try:
        from jax.extend.core import jaxprs_in_params
    except ImportError:  # older JAX
        jaxprs_in_params = jax.core.jaxprs_in_params
    return jaxprs_in_params(params)


def _kernel_dot_shapes(name, C, launcher="tpu"):
    """Result shapes of every matmul inside the kernels of ``name`` (forward and backward) on ``launcher``,
    read from the kernels' own jaxprs (the lowered Mosaic bodies are serialised)."""
    args = _specs(name, 1, 2 * C, 1, 128, 128, bf16)
    shapes = set()

    def walk(jaxpr, inside):
        for eqn in jaxpr.eqns:
            if inside and eqn.primitive.name == "dot_general":
                shapes.add(tuple(eqn.outvars[0].aval.shape))
            for sub in _jaxprs_in_params(eqn.params):
                walk(sub, inside or eqn.primitive.name == "pallas_call")

    walk(jax.make_jaxpr(_fwd_and_bwd(name, C, launcher, False))(*args).jaxpr, False)
    return shapes


@pytest.mark.parametrize("name", ["g_gamma_chunk", "g_gamma_fused", "simple_g_fused"])
def test_scalar_gate_scores_are_whole_chunk_matmuls_on_the_gpu_launcher(name):
    """The Pallas Triton-backend launcher, fused kernels included, builds a scalar gate's scores from one
    whole-chunk tile too (its 16-row tiles gave g_gamma's dg 8.7e-3 against float64 in bf16 on the H200)."""
    C = 64
    shapes = _kernel_dot_shapes(name, C, launcher="gpu")
    assert (C, C) in shapes and (16, 16) not in shapes, shapes


def test_scalar_gate_scores_are_whole_chunk_matmuls_on_tpu():
    """chunk_simple_gla's kernels build the scores as C × K @ K × C matmuls (a [C, C] result);
    chunk_gla's only from 16-row tiles ([16, 16] and narrower)."""
    C = 64
    simple, gla = _kernel_dot_shapes("g_gamma_chunk", C), _kernel_dot_shapes("chunk_gla", C)
    assert (C, C) in simple and (16, 16) not in simple
    assert (16, 16) in gla and all(s[0] <= 16 or s[0] == 128 for s in gla), gla
