"""Every Pallas launcher configuration lowered for real hardware, on any machine.

``jax.export(..., platforms=["tpu"])`` runs the Mosaic lowering of each kernel, forward and
backward, so block shapes that break the (8, 128) rule, unsupported operations or dtypes fail
here on a CPU rather than on a TPU. The GPU launcher is lowered for CUDA the same way (Triton
IR: power-of-two tensor sizes, supported primitives). Nothing is compiled or run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from gla_ref.pallas import _compat, chunk_gla, chunk_simple_gla, fused_chunk_gla

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
        with _compat.abstract_gpu("NVIDIA H100"):
            lowered = jax.jit(_fwd_and_bwd(name, C, "gpu", with_states)).trace(*args).lower(
                lowering_platforms=("cuda",))
        assert "__gpu$xla.gpu.triton" in lowered.as_text(), "expected Triton kernels"
