"""Shared pytest setup: Triton's interpreter switch, JAX's memory allocation and a JAX x64 fixture.

Helpers the tests share live in gla_ref.testing (the float64 ground truth, inputs, case tables), never in a
test module: a test module imports no other module of tests/."""

from __future__ import annotations

import os
import pathlib

import pytest

from gla_ref.device import has_triton, use_triton_interpreter

# Without CUDA, Triton must be in interpreter mode before anything imports it (torch's FLOP
# counter does, in tests/bench/test_bench_models.py), or its library functions cannot be interpreted.
# `make jax-latest` runs the jax-only tests in an environment without torch and Triton.
if has_triton():
    use_triton_interpreter()
# JAX takes 75 % of a GPU's memory when it starts in a process: with several pytest-xdist workers on one GPU the
# others then run out of memory (on the H200, 2026-11-28, 101 of 755 Triton tests failed that way under -n 8).
# Allocating on demand instead changes nothing on a CPU; an explicit setting in the environment is kept.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Processes the tests start (benchmark scripts, multi-process workers) import the gla_ref of this tree, installed
# or not (the GPU machine runs the tests from a copy of the tree without installing it).
ROOT = str(pathlib.Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


@pytest.fixture
def x64():
    """Enable JAX float64 for one test only, so other tests (Pallas kernels) keep float32 defaults."""
    import jax

    with jax.enable_x64(True):
        yield
