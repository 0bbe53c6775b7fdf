"""benchmarks/launch_overhead.py's two modes are the library's switch (its timings run on a GPU)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from triton.compiler.compiler import CompiledKernel  # noqa: E402

from gla_ref.testing.scripts import load_script  # noqa: E402
from gla_ref.triton.common import launch_cache as _launch  # noqa: E402


@pytest.fixture(scope="module")
def launch_overhead():
    return load_script("launch_overhead")


@pytest.mark.parametrize("mode, shortcut", [("shortcut", True), ("triton", False)])
def test_each_mode_sets_the_switch_the_shortcut_reads(launch_overhead, monkeypatch, mode, shortcut):
    """With the mode's value in GLA_REF_LAUNCH_CACHE, a repeated launch takes the shortcut or Triton's path."""
    monkeypatch.setenv(_launch.SWITCH, launch_overhead.MODES[mode])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    slow = []

    class Kernel:
        arg_names, launches = ["x"], {}

    class Binary(CompiledKernel):  # a compiled kernel whose direct calls do nothing
        module = None

        def __init__(self):
            pass

        def __getitem__(self, grid):
            return lambda *args: None

    def slow_run(*args, **kwargs):
        slow.append(args)
        return Binary()

    for _ in range(2):
        _launch.cached_run(Kernel(), slow_run, (torch.zeros(4),), {"grid": (1,), "warmup": False})
    assert len(slow) == (1 if shortcut else 2)
