"""The launch shortcut of gla_ref.triton (:mod:`gla_ref.triton.common.launch_cache`).

On a CPU Triton interprets and there is no compiled binary to keep, so stand-ins play Triton's part: a base
``run`` counts the launches that took Triton's path and returns a stand-in binary that records how it was
called. On a GPU the last test runs chunk GLA through both paths and compares every output and gradient
bit for bit.
"""

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from triton.compiler.compiler import CompiledKernel  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from gla_ref.triton.common import launch_cache as _launch  # noqa: E402


class Binary(CompiledKernel):
    """Stands in for a compiled kernel: records the grid and arguments of every direct call."""

    module = None  # what CompiledKernel.__del__ looks at

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args: self.calls.append((grid, args))


def kernel(x, y, n, BLOCK):
    """The Python function behind the stand-in kernels (never compiled here)."""


def slow_run(self, *args, **kwargs):
    """Triton's path, as the stand-ins see it: counted, the config chosen, the binary handed back."""
    self.slow += 1
    self.best_config = self.config
    return self.binary


@pytest.fixture
def tuner(monkeypatch):
    """An autotuner over a JIT kernel(x, y, n, BLOCK), given the shortcut by cache_launches, whose Triton
    path is :func:`slow_run`."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv(_launch.SWITCH, raising=False)
    monkeypatch.setattr(Autotuner, "run", slow_run)
    config = triton.Config({"BLOCK": 32}, num_warps=4)
    t = _launch.cache_launches(triton.autotune(configs=[config], key=[])(JITFunction(kernel)))
    t.binary, t.config, t.slow = Binary(), config, 0
    return t


def grid(meta):
    return (triton.cdiv(meta["n"], meta["BLOCK"]), 2)


def launch(t, x, y, n=100, **kwargs):
    return t.run(x, y, grid=grid, warmup=False, n=n, **kwargs)


def test_a_repeated_launch_skips_triton_and_calls_the_binary_in_argument_order(tuner):
    x, y = torch.zeros(8), torch.ones(8)
    assert launch(tuner, x, y) is tuner.binary and tuner.slow == 1 and tuner.binary.calls == []
    x2, y2 = torch.zeros(8), torch.ones(8)               # new tensors, same kinds: the same binary serves
    assert launch(tuner, x2, y2) is tuner.binary and tuner.slow == 1
    (called_grid, args), = tuner.binary.calls
    assert called_grid == (4, 2, 1)                      # the grid at the config's block, padded to three axes
    assert args[0] is x2 and args[1] is y2 and args[2:] == (100, 32)
    assert tuner.best_config is tuner.config


@pytest.mark.parametrize("change", ["misaligned tensor", "other dtype", "other int", "int becomes float",
                                    "None for a tensor", "other keyword set"])
def test_whatever_triton_may_compile_apart_takes_triton_s_path_again(tuner, change):
    x, y = torch.zeros(8), torch.ones(8)
    launch(tuner, x, y)
    if change == "misaligned tensor":
        launch(tuner, torch.zeros(9)[1:], y)             # 4 bytes past a 16-byte boundary
    elif change == "other dtype":
        launch(tuner, x.half(), y)
    elif change == "other int":
        launch(tuner, x, y, n=101)
    elif change == "int becomes float":
        launch(tuner, x, y, n=100.0)                     # equal and equally hashed, yet another argument type
    elif change == "None for a tensor":
        launch(tuner, x, None)
    else:
        launch(tuner, x, y, extra=1)
    assert tuner.slow == 2 and tuner.binary.calls == []


def test_the_key_separates_devices(tuner, monkeypatch):
    x, y = torch.zeros(8), torch.ones(8)
    launch(tuner, x, y)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    launch(tuner, x, y)
    assert tuner.slow == 2


@pytest.mark.parametrize("why", ["switch off", "warmup"])
def test_the_switch_and_a_warmup_always_take_triton_s_path(tuner, monkeypatch, why):
    x, y = torch.zeros(8), torch.ones(8)
    launch(tuner, x, y)
    if why == "switch off":
        monkeypatch.setenv(_launch.SWITCH, "0")
        launch(tuner, x, y)
    else:
        tuner.run(x, y, grid=grid, warmup=True, n=100)
    assert tuner.slow == 2 and tuner.binary.calls == []


@pytest.mark.parametrize("why", ["no binary", "pre_hook", "default left"])
def test_launches_the_shortcut_cannot_reproduce_always_take_triton_s_path(tuner, why):
    if why == "no binary":                               # what the interpreter hands back
        tuner.binary = None
    elif why == "pre_hook":
        tuner.config = triton.Config({"BLOCK": 32}, pre_hook=lambda args: None)
    else:
        tuner.arg_names = tuner.arg_names + ["flag"]      # a parameter with a default that no call names
    x, y = torch.zeros(8), torch.ones(8)
    for _ in range(3):
        launch(tuner, x, y)
    assert tuner.slow == 3
    assert list(tuner.launches.values()) == [False]


def test_the_table_starts_afresh_past_its_size(tuner, monkeypatch):
    monkeypatch.setattr(_launch, "MAX_KEYS", 3)
    x, y = torch.zeros(8), torch.ones(8)
    for n in range(5):
        launch(tuner, x, y, n=n)
    assert len(tuner.launches) == 2                      # cleared at the fourth key, then two more
    launch(tuner, x, y, n=4)
    assert tuner.slow == 5 and len(tuner.binary.calls) == 1


def test_cache_launches_swaps_compiled_kernels_and_leaves_interpreted_ones():
    jitted = _launch.cache_launches(JITFunction(kernel))
    assert type(jitted) is _launch.CachedJIT and jitted.launches == {}
    tuned = _launch.cache_launches(triton.autotune(configs=[triton.Config({})], key=[])(JITFunction(kernel)))
    assert type(tuned) is _launch.CachedAutotuner and isinstance(tuned, Autotuner) and tuned.launches == {}

    class Interpreted:                                   # neither a JITFunction nor an autotuner over one
        fn = kernel

    plain = Interpreted()
    assert _launch.cache_launches(plain) is plain and type(plain) is Interpreted


def test_the_library_s_kernels_carry_the_shortcut_when_compiled():
    from gla_ref import device
    from gla_ref.triton.chunk.cumsum import chunk_cumsum_kernel
    from gla_ref.triton.chunk.output import chunk_output_kernel

    expected = (_launch.CachedJIT, _launch.CachedAutotuner)
    if device.triton_interpret():
        assert type(chunk_cumsum_kernel) is not _launch.CachedJIT
        assert type(chunk_output_kernel) is Autotuner            # interpreted inside: left as Triton made it
    else:
        assert (type(chunk_cumsum_kernel), type(chunk_output_kernel)) == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need a GPU")
def test_chunk_gla_through_the_shortcut_equals_triton_s_path_bit_for_bit(monkeypatch):
    """Every kernel of a chunk GLA step takes the shortcut on the second call, aligned or not, and the
    outputs, final state and every gradient equal those of Triton's path exactly."""
    import torch.nn.functional as F

    from gla_ref.triton import chunk_gla
    from gla_ref.triton.chunk.cumsum import chunk_cumsum_kernel

    slow = []
    for cls in (Autotuner, JITFunction):
        original = cls.run
        monkeypatch.setattr(cls, "run", lambda self, *a, _f=original, **k: slow.append(self) or _f(self, *a, **k))

    def step(offset, seed):
        gen = torch.Generator(device="cuda").manual_seed(seed)

        def leaf(*shape, dtype=torch.bfloat16, gate=False):  # ``offset`` elements past an aligned address
            x = torch.randn(offset + torch.Size(shape).numel(), generator=gen, device="cuda")
            x = (F.logsigmoid(x) / 16 if gate else x).to(dtype)
            return x[offset:].view(shape).requires_grad_()

        B, T, H, K, V = 2, 100, 3, 40, 24
        q, k, v = leaf(B, T, H, K), leaf(B, T, H, K), leaf(B, T, H, V)
        g, h0 = leaf(B, T, H, K, dtype=torch.float32, gate=True), leaf(B, H, K, V, dtype=torch.float32)
        o, ht = chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True)
        (o.float().sum() + ht.square().sum()).backward()
        return [o, ht, q.grad, k.grad, v.grad, g.grad, h0.grad]

    for offset in (0, 1):                                # 16-byte aligned, then 2 bytes off
        first = step(offset, seed=offset)
        slow.clear()
        fast = step(offset, seed=offset)
        assert slow == []                                # no kernel went through Triton's dispatch
        monkeypatch.setenv(_launch.SWITCH, "0")
        reference = step(offset, seed=offset)
        monkeypatch.delenv(_launch.SWITCH)
        assert len(slow) >= 10
        for a, b, c in zip(first, fast, reference):
            assert torch.equal(a, b) and torch.equal(b, c)
    assert len(chunk_cumsum_kernel.launches) >= 2       # the misaligned inputs were a launch of their own
