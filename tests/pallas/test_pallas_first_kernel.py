"""Chapter 5's first Pallas kernel (gla_ref.teaching.pallas_first_kernel): the chunk-local cumulative log-gate.

Interpreted on the CPU against a float64 NumPy cumsum per chunk, its argument errors, and its
lowering for TPU (Mosaic) and GPU (Triton) without either device.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from gla_ref.pallas import compat  # noqa: E402
from gla_ref.teaching.pallas_first_kernel import check, chunk_local_cumsum  # noqa: E402
from gla_ref.testing import assert_close  # noqa: E402


def _reference(g, C):
    g = np.asarray(g, np.float64)
    BH, T, K = g.shape
    return np.cumsum(g.reshape(BH, T // C, C, K), axis=2).reshape(BH, T, K)


def test_matches_float64_cumsum_per_chunk():
    err = check(chunk_local_cumsum)  # the assertions chapter 5's exercise holds the reader's kernel to
    assert 0 <= err < 1e-6


@pytest.mark.parametrize("wrong", ["global cumsum", "reversed", "dropped chunk"])
def test_check_rejects_wrong_kernels(wrong):
    def fn(g, C, interpret):
        b = chunk_local_cumsum(g, C, interpret=interpret)
        if wrong == "global cumsum":
            return jnp.cumsum(g, axis=1)
        if wrong == "reversed":
            return jnp.flip(chunk_local_cumsum(jnp.flip(g, 1), C, interpret=interpret), 1)
        return b.at[:, -C:].set(0.0)

    with pytest.raises(AssertionError):
        check(fn)


def test_bf16_input_accumulates_in_float32():
    g = -jnp.abs(jax.random.normal(jax.random.key(1), (2, 32, 16))).astype(jnp.bfloat16)
    b = chunk_local_cumsum(g, 16, interpret=True)
    assert b.dtype == jnp.float32
    assert_close("b (bf16 gates)", _reference(g.astype(jnp.float32), 16), b, 1e-6)


@pytest.mark.parametrize("g, C, err, match", [
    (jnp.zeros((32, 16)), 16, ValueError, "g must be"),
    (jnp.zeros((1, 32, 16), jnp.int32), 16, TypeError, "floating"),
    (jnp.zeros((1, 30, 16)), 16, ValueError, "multiple of chunk_size"),
    (jnp.zeros((1, 32, 16)), 0, ValueError, "chunk_size"),
    (jnp.zeros((1, 32, 16)), 16.0, ValueError, "chunk_size"),
])
def test_bad_arguments_are_named(g, C, err, match):
    with pytest.raises(err, match=match):
        chunk_local_cumsum(g, C, interpret=True)


def test_lowers_for_tpu_and_gpu():
    x = jax.ShapeDtypeStruct((4, 128, 128), jnp.float32)
    tpu = jax.export.export(jax.jit(lambda g: chunk_local_cumsum(
        g, 64, compiler_params=compat.tpu_compiler_params("parallel", "parallel"))), platforms=["tpu"])(x)
    assert tpu.mlir_module().count("tpu_custom_call") == 1
    with compat.abstract_gpu("NVIDIA H200"):
        gpu = jax.jit(lambda g: chunk_local_cumsum(g, 64, compiler_params=compat.triton_compiler_params())).trace(
            x).lower(lowering_platforms=("cuda",)).as_text()
    assert "__gpu$xla.gpu.triton" in gpu
    assert "grid_x = 4" in gpu and "grid_y = 2" in gpu  # the Pallas grid (BH, T / C) as the CUDA grid
