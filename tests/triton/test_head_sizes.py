"""Head sizes that models use: K up to 256 and V up to (at least) 1024 in every kernel (issue 13).

The GLA paper's heads are K = 128, V = 256 (340M) and K = 256, V = 512 (1.3B). Every Triton kernel
(chunk_gla, chunk_simple_gla, fused_chunk_gla, fused_recurrent_gla, and the historical forward)
runs at (K, V) = (256, 512), (100, 1000) (neither a power of two: masks and padding) and
(64, 1024); every Pallas kernel (chunk_gla, fused_chunk_gla, chunk_simple_gla) at the first two.
o, the final state and every gradient (dq, dk, dv, dg, dh0) are compared with the float64
recurrence of :mod:`recurrence64`, under random cotangents on o and on the final state.

What a large V exercises: the chunk kernels tile V on a grid axis or in a loop; fused_recurrent
splits V over programs and adds float32 partials of dq, dk, dg; fused_chunk's dq/dk kernels hold
at most 256 values and, above that, add float32 partials of ``⌈V/256⌉`` slices (its allocation
model is checked too); Pallas tiles V in blocks of 128 (TPU) or 64 (GPU).

On a CPU the kernels run in Triton's interpreter (float32 and float16) and Pallas' interpreter,
with B = H = 1 and T = 20: two chunks of 16 (the second short), except chunk and chunk_simple at
V < 1024, one chunk of 32 (their state kernels dominate the interpreted time). A case costs 2–10 s;
the file about 2 minutes of CPU in one process, about 80 s with ``pytest -n 2``. The slowest
cases (fused_chunk's V-sliced backward, the float16 ones) are marked ``# slow`` below and still
run. With CUDA the same cases run natively at T = 1000 (``T_DEVICE``), plus bfloat16 at the
paper's two heads.
"""

from __future__ import annotations

from typing import NamedTuple
import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from gla_ref import device  # noqa: E402
from gla_ref.pallas import chunk as pallas_chunk_module  # noqa: E402
from gla_ref.pallas import chunk_gla as pallas_chunk_gla  # noqa: E402
from gla_ref.pallas import chunk_simple_gla as pallas_chunk_simple_gla  # noqa: E402
from gla_ref.pallas import fused_chunk_gla as pallas_fused_chunk_gla  # noqa: E402
from gla_ref.pallas import simple as pallas_simple_module  # noqa: E402
from gla_ref.testing import (as_jax, as_torch, assert_close, random_inputs, recurrence64,  # noqa: E402
                             recurrence64_grads)
from gla_ref.triton import chunk_gla, chunk_simple_gla, fused_chunk_gla, fused_recurrent_gla  # noqa: E402
from gla_ref.triton.common import host as _common  # noqa: E402
from gla_ref.triton import chunk as chunk_module  # noqa: E402
from gla_ref.triton import chunk_simple as simple_module  # noqa: E402
from gla_ref.triton import fused_chunk as fused_chunk_module  # noqa: E402
from gla_ref.triton.fused_chunk import forward as fused_chunk_fwd  # noqa: E402
from gla_ref.triton import fused_recurrent as fused_recurrent_module  # noqa: E402
from gla_ref.teaching import historical as historical_module  # noqa: E402
from gla_ref.testing.triton_cases import Allocations, forbid_launch  # noqa: E402
from gla_ref.triton.fused_chunk.forward import launch_meta, value_block  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = device.torch_device()
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

T_CPU = 20
"""Tokens on a CPU: two chunks of 16 (the second one short), so a state crosses a chunk boundary."""
T_DEVICE = 1000
"""Tokens where the kernels run natively (CUDA for Triton, a GPU or TPU for Pallas): many chunks."""
T = T_DEVICE if CUDA else T_CPU
# the Pallas interpreter's programs are large and run once: skip XLA's slow optimisations
CPU_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

# Relative RMSE bounds per input dtype for every tensor, as in the kernels' own test files:
# fp32 takes IEEE dots (~1e-6 seen), fp16 and bf16 round inputs and matmul operands.
TOL = {F32: 1e-4, F16: 5e-3, BF16: 3e-2}

SHAPES = [(256, 512), (100, 1000), (64, 1024)]  # (K, V): the 1.3B head, an awkward one, the widest V
PAPER_HEADS = [(128, 256), (256, 512)]  # 340M and 1.3B

# kernel → (function, gate family of random_inputs, options)
TRITON = {
    "chunk": (chunk_gla, "gla", dict(chunk_size=16)),
    "chunk_simple": (chunk_simple_gla, "scalar", dict(chunk_size=16)),
    "fused_chunk": (fused_chunk_gla, "gla", dict(chunk_size=16)),
    "fused_recurrent": (fused_recurrent_gla, "gla", {}),
}
NAMES = ("q", "k", "v", "g", "initial_state")


class Case(NamedTuple):
    kernel: str
    dtype: torch.dtype
    K: int
    V: int
    T: int = T
    opts: dict = {}  # overrides TRITON's options


def _triton_cases():
    cases = []
    for kernel in TRITON:
        for K, V in SHAPES:
            # float16 at the awkward shape: half-precision tiles with masked edges. chunk and
            # chunk_simple spend most of their interpreted time in the state kernels, whose cost
            # grows with the chunks: one chunk of 32 (20 rows) except at V = 1024, two of 16 there
            opts = dict(chunk_size=32) if kernel.startswith("chunk") and V != 1024 and not CUDA else {}
            cases.append(Case(kernel, F16 if (K, V) == (100, 1000) else F32, K, V, opts=opts))
    if CUDA:  # bf16 (refused by the interpreter) at the paper's heads
        cases += [Case(kernel, BF16, K, V) for kernel in TRITON for K, V in PAPER_HEADS]
    # the recurrent kernel at the two large heads interprets token by token: 22 s of CPU each
    return [pytest.param(c, marks=pytest.mark.slow) if c.kernel == "fused_recurrent" and c.K * c.V >= 100_000 else c
            for c in cases]


def _case_id(c):
    opts = "".join(f"-{k}{v}" for k, v in c.opts.items())
    return f"{c.kernel}-{str(c.dtype)[6:]}-K{c.K}V{c.V}T{c.T}{opts}"


def _reference(t, do, dS):
    """float64 recurrence on the kernel's own (rounded) inputs: (o, S_T) and every input's gradient."""
    a = {n: None if x is None else x.detach().double().cpu().numpy() for n, x in t.items()}
    args = dict(initial_state=a["initial_state"])
    o, S = recurrence64(a["q"], a["k"], a["v"], a["g"], **args)
    grads = recurrence64_grads(a["q"], a["k"], a["v"], a["g"], **args,
                               do=do.double().cpu().numpy(), dS=dS.double().cpu().numpy())
    return o, S, grads


@pytest.mark.parametrize("c", _triton_cases(), ids=_case_id)
def test_triton_kernel_against_float64_recurrence(c):  # slow: fused_chunk (V sliced) and the fp16 cases
    fn, gate, opts = TRITON[c.kernel]
    opts = {**opts, **c.opts}
    x = random_inputs(1, c.T, 1, c.K, c.V, gate, seed=c.K + c.V, initial_state=True)
    t = as_torch(x, dtype=c.dtype, device=DEV)
    for n in NAMES:
        t[n].requires_grad_()
    o, ht = fn(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"], output_final_state=True, **opts)
    assert o.shape == (1, c.T, 1, c.V) and o.dtype == c.dtype
    assert ht.shape == (1, 1, c.K, c.V) and ht.dtype == F32

    gen = torch.Generator(device=DEV).manual_seed(1)
    do = torch.randn(o.shape, generator=gen, device=DEV).to(c.dtype)
    dS = torch.randn(ht.shape, generator=gen, device=DEV)
    got = torch.autograd.grad([o, ht], [t[n] for n in NAMES], [do, dS])
    ro, rS, rgrads = _reference(t, do, dS)

    tol = TOL[c.dtype]
    errors = {"o": assert_close("o", ro, o, tol), "final_state": assert_close("final_state", rS, ht, tol)}
    for n, grad in zip(NAMES, got):
        assert grad.shape == t[n].shape and grad.dtype == t[n].dtype, f"d{n}: {grad.shape} {grad.dtype}"
        errors["d" + n] = assert_close("d" + n, rgrads[n], grad, tol)
    print(_case_id(c), {k: f"{e:.1e}" for k, e in errors.items()})


@pytest.mark.parametrize("K, V", SHAPES, ids=[f"K{K}V{V}" for K, V in SHAPES])
def test_historical_forward_against_float64_recurrence(K, V):
    """The five-step historical pipeline (forward only; BK, BV ≤ 64 split K and V over programs)."""
    x = random_inputs(1, T, 1, K, V, "gla", seed=K + V, initial_state=True)
    t = as_torch(x, device=DEV)
    with torch.no_grad():
        o, ht = historical_module.fused_chunk_gla_historical(t["q"], t["k"], t["v"], t["g"],
                                                             initial_state=t["initial_state"],
                                                             output_final_state=True)
    ro, rS = recurrence64(*(x[n] for n in ("q", "k", "v", "g")), initial_state=x["initial_state"])
    assert_close("o", ro, o, TOL[F32])
    assert_close("final_state", rS, ht, TOL[F32])


# ----------------------------------------------------------------------------- fused_chunk's V slices

def test_fused_chunk_slices_values_above_256():
    """V = 300: two slices of 256 values for dq and dk, V = 256: one (the whole V in one program)."""
    q, v = torch.empty(1, 4, 1, 64), torch.empty(1, 4, 1, 300)
    grid, meta = launch_meta(q, v, 16, "V")
    assert grid == (2, 1, 2) and (meta["BK"], meta["BV"]) == (32, 256)  # BK · BV = 8192 state elements
    grid, meta = launch_meta(q, v[..., :256], 16, "V")
    assert grid == (2, 1, 1) and meta["BV"] == 256
    grid, meta = launch_meta(q, v, 16, "K")  # the forward and dv kernels hold every key, split V
    assert grid == (3, 1) and (meta["BK"], meta["BV"]) == (64, 128)


def test_fused_chunk_widens_whole_key_tiles_only_when_the_grid_fills_the_gpu():
    """value_block(BK, V, heads, SMs): 16384 state elements when ⌈V/BV⌉ · heads programs still reach the SM
    count, else 8192; never without an SM count (the interpreter)."""
    assert value_block(128, 256, 128, 132) == 128      # 2 · 128 programs for 132 SMs: wide
    assert value_block(128, 128, 128, 132) == 64       # wide would leave 128 programs for 132 SMs
    assert value_block(128, 256, 128, None) == 64      # no SM count: narrow
    assert (value_block(256, 512, 128, 132), value_block(256, 512, 1, 132)) == (64, 32)
    assert value_block(64, 64, 128, 132) == 64         # V = 64 fits either way


def test_fused_chunk_takes_the_wide_tile_at_chunk_size_16_only(monkeypatch):
    monkeypatch.setattr(fused_chunk_fwd, "sm_count", lambda x: 1)  # any grid fills one SM
    q, v = torch.empty(1, 4, 1, 256), torch.empty(1, 4, 1, 512)
    assert [launch_meta(q, v, C, "K")[1]["BV"] for C in (16, 32, 64)] == [64, 32, 32]
    assert launch_meta(q, v, 16, "V")[1]["BV"] == 256 and launch_meta(q, v, 16, "V")[1]["BK"] == 32  # dq, dk: one tile


def test_fused_chunk_allocates_its_model_when_V_is_sliced():
    """Forward: its outputs only. Backward: the float32 partials of dq, dk, dg (2 slices at V = 300),
    their float32 sums and the fp16 casts, dv and dh0 — the bytes of fused_chunk.allocated_bytes."""
    B, T_, H, K, V = 1, 20, 1, 20, 300
    t = as_torch(random_inputs(B, T_, H, K, V, "gla", initial_state=True), dtype=F16, device=DEV)
    t["g"] = t["g"].float()  # float32 gates: dg is its float32 sum; dq, dk are cast to float16
    for n in NAMES:
        t[n].requires_grad_()
    call = lambda: fused_chunk_gla(t["q"], t["k"], t["v"], t["g"], initial_state=t["initial_state"],
                                   output_final_state=True)
    if not device.triton_interpret():  # the autotuner allocates while it benchmarks the first calls
        o, ht = call()
        torch.autograd.grad([o, ht], [t[n] for n in NAMES], [torch.ones_like(o), torch.ones_like(ht)])
    with Allocations() as forward:
        o, ht = call()
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    with Allocations() as backward:
        got = torch.autograd.grad([o, ht], [t[n] for n in NAMES], [do, dht])
    expected = fused_chunk_module.allocated_bytes(B, T_, H, K, V, F16, F32, True, True)
    assert (forward.bytes(), backward.bytes()) == expected
    partials = [tuple(x.shape) for x in backward.tensors if x.dim() == 5]
    assert partials == [(2, B, T_, H, K)] * 3  # dq, dk, dg: one float32 partial per slice of values
    ro, rS, rgrads = _reference(t, do, dht)
    for n, grad in zip(NAMES, got):
        assert_close("d" + n, rgrads[n], grad, TOL[F16])


# ----------------------------------------------------------------------------- Pallas

PALLAS = {  # name → (call with a gate array g, gate family of random_inputs)
    "chunk": (lambda q, k, v, g, **kw: pallas_chunk_gla(q, k, v, g, **kw), "gla"),
    "fused_chunk": (lambda q, k, v, g, **kw: pallas_fused_chunk_gla(q, k, v, g, **kw), "gla"),
    "simple_chunk": (lambda q, k, v, g, **kw: pallas_chunk_simple_gla(q, k, v, g, mode="chunk", **kw), "scalar"),
    "simple_fused": (lambda q, k, v, g, **kw: pallas_chunk_simple_gla(q, k, v, g, mode="fused", **kw), "scalar"),
}
PALLAS_SHAPES = [(256, 512), (100, 1000)]


def _pallas_cases():
    cases = [(name, K, V, None) for name in PALLAS for K, V in PALLAS_SHAPES]
    # the Mosaic launcher, interpreted (NaN-filled scratch, the race detector): V in 8 blocks of 128
    # (its non-fused path's value blocks are covered by test_pallas.py at V = 136, two blocks)
    cases += [("fused_chunk", 100, 1000, "tpu")]
    return cases


def _pallas_id(case):
    name, K, V, launcher = case
    return f"{name}-K{K}V{V}" + (f"-{launcher}" if launcher else "")


@pytest.mark.parametrize("case", _pallas_cases(), ids=_pallas_id)
def test_pallas_kernel_against_float64_recurrence(case):
    from gla_ref.pallas import compat

    name, K, V, launcher = case
    call, gate = PALLAS[name]
    platform = device.jax_platform()
    native = platform == (launcher or "gpu")  # else Pallas' interpreter runs it
    T_ = T_DEVICE if native else T_CPU
    x = random_inputs(1, T_, 1, K, V, gate, seed=K + V, initial_state=True)
    rng = np.random.default_rng(1)
    do, dS = rng.standard_normal((1, T_, 1, V)), rng.standard_normal((1, 1, K, V))
    kw = dict(chunk_size=16)
    place = contextlib.nullcontext()
    if launcher == "tpu":
        params = compat.tpu_interpret_params(detect_races=True, random_seed=7) if not native else None
        assert native or params is not None, f"jax {jax.__version__} has no pltpu.InterpretParams"
        kw.update(launcher="tpu", interpret=params if not native else None)
        compat.reset_tpu_interpreter()
        if not native:
            place = jax.default_device(jax.devices("cpu")[0])

    def outputs_and_grads(q, k, v, g, h0):
        (o, S), pullback = jax.vjp(lambda *a: call(*a[:4], initial_state=a[4], output_final_state=True, **kw),
                                   q, k, v, g, h0)
        return (o, S), pullback((jnp.asarray(do, o.dtype), jnp.asarray(dS, S.dtype)))

    with place:
        j = as_jax(x)
        args = tuple(j[n] for n in NAMES)
        lowered = jax.jit(outputs_and_grads).lower(*args)
        compiled = lowered.compile(CPU_COMPILE) if not native else lowered.compile()
        (o, S), got = compiled(*args)
    if launcher == "tpu":
        assert compat.races_found() is not True, "the TPU interpreter detected a data race"
    ro, rS = recurrence64(*(x[n] for n in ("q", "k", "v", "g")), initial_state=x["initial_state"])
    rgrads = recurrence64_grads(*(x[n] for n in ("q", "k", "v", "g")), initial_state=x["initial_state"],
                                do=do, dS=dS)
    tol = TOL[F32]
    errors = {"o": assert_close("o", ro, o, tol), "final_state": assert_close("final_state", rS, S, tol)}
    for n, grad in zip(NAMES, got):
        errors["d" + n] = assert_close("d" + n, rgrads[n], grad, tol)
    print(_pallas_id(case), {k: f"{e:.1e}" for k, e in errors.items()})


# ----------------------------------------------------------------------------- limits, checked before launch

def _torch_inputs(K, V):
    x = as_torch(random_inputs(1, 3, 1, K, V, "gla", initial_state=True), device=DEV)
    return x["q"], x["k"], x["v"], x["g"], x["initial_state"]


TOO_BIG = {"K=257": (257, 8, "q, k: head dim K=257 must be at most 256"),
           "V=4097": (8, 4097, "v: head dim V=4097 must be at most 4096")}


@pytest.fixture
def no_triton_launch(monkeypatch):
    """Any Triton launch fails the test: the errors must come from the checks made before it."""
    forbid_launch(monkeypatch, chunk_module.ChunkGLAFunction, ["apply"])
    forbid_launch(monkeypatch, simple_module.ChunkSimpleGLAFunction, ["apply"])
    forbid_launch(monkeypatch, fused_chunk_module.FusedChunkGLA, ["apply"])
    forbid_launch(monkeypatch, fused_recurrent_module.FusedRecurrentGLA, ["apply"])
    forbid_launch(monkeypatch, historical_module, ["launch_decay_cumsum", "launch_prepare_qg_kg",
                                                   "launch_fused_chunk", "launch_inner_chunk"])


@pytest.mark.parametrize("kernel", [*TRITON, "historical"])
@pytest.mark.parametrize("size", TOO_BIG)
def test_triton_refuses_head_dims_above_the_limits(kernel, size, no_triton_launch):
    K, V, message = TOO_BIG[size]
    q, k, v, g, h0 = _torch_inputs(K, V)
    if kernel == "chunk_simple":
        g = g[..., 0]
    fn = historical_module.fused_chunk_gla_historical if kernel == "historical" else TRITON[kernel][0]
    with pytest.raises(ValueError, match=message):
        fn(q, k, v, g, initial_state=h0)


def test_triton_limits_are_the_documented_ones():
    assert (_common.MAX_K, _common.MAX_V) == (256, 4096)
    q, k, v, g, h0 = _torch_inputs(256, 4096)  # the largest accepted sizes pass the checks
    dims = _common.prepare(q, k, v, g, h0)
    assert (dims.K, dims.V) == (256, 4096)


@pytest.mark.parametrize("kernel", ["chunk", "fused_chunk", "simple"])
@pytest.mark.parametrize("size", TOO_BIG)
def test_pallas_refuses_head_dims_above_the_limits(kernel, size, monkeypatch):
    K, V, message = TOO_BIG[size]
    forbid_launch(monkeypatch, pallas_chunk_module, ["run"])
    forbid_launch(monkeypatch, pallas_simple_module, ["run"])
    q = jnp.zeros((1, 3, 1, K))
    v, g = jnp.zeros((1, 3, 1, V)), jnp.full((1, 3, 1, K), -0.1)
    fn = {"chunk": pallas_chunk_gla, "fused_chunk": pallas_fused_chunk_gla,
          "simple": lambda q, k, v, g: pallas_chunk_simple_gla(q, k, v, g[..., 0])}[kernel]
    with pytest.raises(ValueError, match=message):
        fn(q, q, v, g)
