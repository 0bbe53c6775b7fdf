"""The autotune wrapper of gla_ref.triton: pruning by block size and compiling the kept configs side by side.

Compiling for a GPU needs one, so here a stand-in kernel records what it is asked to compile; the GPU tests and
``benchmarks/first_call.py`` run the real thing.
"""

import pytest

pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton.runtime import _async_compile  # noqa: E402

from gla_ref import device  # noqa: E402
from gla_ref.triton.common import host as _common  # noqa: E402


class Recorder:
    """Stands in for a JIT kernel: records each warmup's arguments and whether an async compile mode was on."""

    def __init__(self):
        self.calls = []

    def warmup(self, *, grid, **kwargs):
        self.calls.append((kwargs, _async_compile.active_mode.get() is not None, grid))


CONFIGS = [triton.Config({"BK": b}, num_warps=w, num_stages=2) for b, w in ((32, 4), (64, 4), (128, 8))]


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(device, "triton_interpret", lambda: False)
    monkeypatch.delenv(_common.COMPILE_WORKERS, raising=False)


def test_precompile_warms_every_config_inside_an_async_compile_mode(on_gpu):
    kernel = Recorder()
    _common.precompile(kernel, CONFIGS, {"x": "tensor", "K": 100})
    assert len(kernel.calls) == 3
    for config, (kwargs, in_mode, grid) in zip(CONFIGS, kernel.calls):
        assert kwargs == {"x": "tensor", "K": 100, **config.all_kwargs()}
        assert in_mode and grid == (1,)
    assert _async_compile.active_mode.get() is None  # the mode ends with the call


@pytest.mark.parametrize("case", ["one config", "one worker", "interpreter"])
def test_precompile_leaves_the_autotuner_alone(case, on_gpu, monkeypatch):
    kernel = Recorder()
    configs = CONFIGS[:1] if case == "one config" else CONFIGS
    if case == "one worker":
        monkeypatch.setenv(_common.COMPILE_WORKERS, "1")
    if case == "interpreter":
        monkeypatch.setattr(device, "triton_interpret", lambda: True)
    _common.precompile(kernel, configs, {"K": 100})
    assert kernel.calls == []


@triton.jit
def _copy(x, y, K: tl.constexpr, BK: tl.constexpr):
    o = tl.arange(0, BK)
    tl.store(y + o, tl.load(x + o, mask=o < K), mask=o < K)


def test_prune_drops_oversized_blocks_and_precompiles_the_rest(on_gpu, monkeypatch):
    seen = []
    monkeypatch.setattr(_common, "precompile", lambda kernel, configs, args: seen.append((kernel, configs, args)))
    tuned = _common.autotune(CONFIGS, key=["K"], BK="K")(_copy)
    kept = tuned.early_config_prune(CONFIGS, {"x": 1, "y": 2}, K=40, grid=(3,), warmup=False)  # as kernel[grid] calls
    assert [c.kwargs["BK"] for c in kept] == [32, 64]  # 40 pads to 64: the 128-wide block only adds masked work
    assert seen == [(_copy, kept, {"x": 1, "y": 2, "K": 40})]
