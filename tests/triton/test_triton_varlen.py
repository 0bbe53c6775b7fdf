"""Packed batches (``cu_seqlens``) in the Triton kernels, and bf16 refused under the interpreter.

Every packed case runs one kernel forward and backward on N sequences packed in a B = 1 batch
(lengths that are not multiples of the chunk, a one-token sequence, a sequence of several chunks),
then checks o, the final states ``[N, H, K, V]`` and the gradient of every input (q, k, v, g,
g_gamma, initial_state) twice: against the same kernel run on each sequence alone (a plain B = 1
call, joined), and against the float64 reference with the same cu_seqlens. Bad offsets must raise
before any launch. On CPU the kernels run in Triton's interpreter (fp32, fp16, tiny shapes); with
CUDA the same cases also run bf16, plus packed batches of realistic lengths and head sizes.
"""

from __future__ import annotations

import importlib.util
import itertools
from typing import NamedTuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gla_ref import device  # noqa: E402
from gla_ref.testing import as_torch, assert_close, random_inputs  # noqa: E402
from gla_ref.torch_ref import chunk_gla as chunk_ref  # noqa: E402
from gla_ref.torch_ref import recurrent_gla  # noqa: E402
from gla_ref.triton import chunk as chunk_module  # noqa: E402
from gla_ref.triton import chunk_gla, chunk_simple_gla, fused_chunk_gla, fused_recurrent_gla  # noqa: E402
from gla_ref.teaching import historical  # noqa: E402
from gla_ref.testing.triton_cases import forbid_launch, grads  # noqa: E402
from gla_ref.triton import chunk_simple as simple_module  # noqa: E402
from gla_ref.triton import fused_chunk as fused_chunk_module  # noqa: E402
from gla_ref.triton.fused_chunk import backward as fused_chunk_bwd  # noqa: E402
from gla_ref.triton import fused_recurrent as fused_recurrent_module  # noqa: E402
from gla_ref.triton.common.host import prepare_packed  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = device.torch_device()
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# Relative RMSE bounds. Against float64: as in the fixed-length tests of each kernel. Against the
# same kernel on each sequence alone: the same arithmetic (fp32 ~1e-7 in the interpreter); on a GPU
# the packed and the single-sequence calls may autotune to other block sizes, so sums of fp32 dots
# round differently and half-precision outputs may differ in their last bit.
TOL = {F32: 1e-4, F16: 5e-3, BF16: 3e-2}
TOL_ALONE = {F32: 1e-5, F16: 2e-3, BF16: 1e-2}

KERNELS = {  # name → (function, gate family, keyword arguments)
    "chunk": (chunk_gla, "gla", {"chunk_size": 16}),
    "simple": (chunk_simple_gla, "scalar", {"chunk_size": 16}),
    "simple-gamma": (chunk_simple_gla, "gamma", {"chunk_size": 16}),
    "fused_chunk": (fused_chunk_gla, "gla", {"chunk_size": 16}),
    "fused_recurrent": (fused_recurrent_gla, "gla", {}),
    "fused_recurrent-reverse": (fused_recurrent_gla, "gla", {"reverse": True}),
}
H, K, V = 2, 20, 24  # K and V not powers of two


class Case(NamedTuple):
    kernel: str
    lengths: tuple
    dtype: torch.dtype = F32
    h0: bool = True
    final: bool = True
    H: int = H
    K: int = K
    V: int = V
    alone: bool = True  # also run each sequence alone (the interpreter's time: one case per kernel)


def _cases():
    mixed, long_short = (5, 1, 17, 9), (64, 3)  # chunk 16: 1, 1, 2, 1 chunks; 4 and 1
    cases = [
        Case("chunk", mixed),
        Case("chunk", long_short, F16, h0=False, final=False, alone=False),
        Case("simple", mixed, h0=False),
        Case("simple-gamma", long_short, final=False),
        Case("fused_chunk", mixed),
        Case("fused_chunk", (20, 3), F16, final=False, alone=False),  # the interpreter's slowest kernel
        Case("fused_recurrent", mixed, F16),
        Case("fused_recurrent", long_short, h0=False, alone=False),
        Case("fused_recurrent-reverse", mixed),  # no reverse in the reference: checked alone only
    ]
    if CUDA:
        cases += [c._replace(dtype=BF16) for c in cases]
        realistic = (700, 1, 64, 1500, 33)  # alone: every length a new autotune key, minutes of tuning
        cases += [Case(kernel, realistic, dtype, H=4, K=128, V=256, alone=False)
                  for kernel in ("chunk", "simple", "fused_chunk", "fused_recurrent") for dtype in (F32, BF16)]
    return cases


def _case_id(c):
    return (f"{c.kernel}-{str(c.dtype)[6:]}-L{'_'.join(map(str, c.lengths))}-H{c.H}K{c.K}V{c.V}"
            f"{'-h0' if c.h0 else ''}{'-final' if c.final else ''}")


def _offsets(lengths):
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(DEV)


def _inputs(c):
    """Packed kernel inputs (B = 1): q, k, v, g, g_gamma (either may be None), initial_state [N, H, K, V]."""
    gate = KERNELS[c.kernel][1]
    T = sum(c.lengths)
    x = random_inputs(1, T, c.H, c.K, c.V, "gla" if gate == "gla" else "scalar", seed=T + c.K)
    t = as_torch(x, dtype=c.dtype, device=DEV)
    t["g"] = t["g"].float()
    t["g_gamma"] = None
    if gate == "gamma":
        t["g"] = None
        t["g_gamma"] = as_torch(random_inputs(1, 1, c.H, 1, 1, "const", seed=1), device=DEV)["g"]
    gen = torch.Generator().manual_seed(len(c.lengths))
    t["initial_state"] = torch.randn(len(c.lengths), c.H, c.K, c.V, generator=gen).to(DEV) if c.h0 else None
    return {n: a for n, a in t.items() if a is not None}


def _run(c, t, cu_seqlens=None):
    """The case's kernel on the tensors t (g and g_gamma optional): ``(o, final_state)``."""
    fn, _, kwargs = KERNELS[c.kernel]
    gates = (t.get("g"), t.get("g_gamma")) if fn is chunk_simple_gla else (t.get("g"),)
    return fn(t["q"], t["k"], t["v"], *gates, initial_state=t.get("initial_state"), output_final_state=c.final,
              cu_seqlens=cu_seqlens, **kwargs)


def _leaves(t):
    return {n: a.detach().clone().requires_grad_() for n, a in t.items()}


def _sequence(name, a, n, bos, eos):
    """Sequence n's part of a packed input: its initial state, its tokens, or the per-head g_gamma."""
    if name == "initial_state":
        return a[n:n + 1]
    return a if name == "g_gamma" else a[:, bos:eos]


def _alone(c, t, do, dht):
    """Each sequence through the same kernel as a plain B = 1 batch, joined: o, final states and gradients."""
    bounds = _offsets(c.lengths).tolist()
    outs, states, parts = [], [], []
    for n, (bos, eos) in enumerate(itertools.pairwise(bounds)):
        seq = _leaves({name: _sequence(name, a, n, bos, eos) for name, a in t.items()})
        o, ht = _run(c, seq)
        parts.append(dict(zip(seq, grads((o, ht), (do[:, bos:eos], None if ht is None else dht[n:n + 1]),
                                         list(seq.values())))))
        outs.append(o)
        states.append(ht)
    joined = {name: (torch.stack([p[name] for p in parts]).sum(0) if name == "g_gamma"
                     else torch.cat([p[name] for p in parts], dim=0 if name == "initial_state" else 1))
              for name in t}
    return torch.cat(outs, 1), (torch.cat(states) if c.final else None), joined


def _reference(c, t, cu_seqlens, do, dht):
    """The float64 recurrence over the packed batch (g and g_gamma add up): o, final states and gradients."""
    r = {n: a.detach().double().requires_grad_() for n, a in t.items()}
    g = r.get("g")
    if "g_gamma" in r:
        g = r["g_gamma"] if g is None else g + r["g_gamma"]
    form, extra = (chunk_ref, {"chunk_size": 16}) if sum(c.lengths) > 1024 else (recurrent_gla, {})
    o, ht = form(r["q"], r["k"], r["v"], g, initial_state=r.get("initial_state"), output_final_state=c.final,
                 cu_seqlens=cu_seqlens, **extra)
    got = grads((o, ht), (do.double(), None if dht is None else dht.double()), list(r.values()))
    return o, ht, dict(zip(r, got))


def _check(label, c, expected, got, tol):
    (ro, rht, rgrads), (o, ht, dgrads) = expected, got
    errors = {"o": assert_close("o", ro, o, tol)}
    if c.final:
        errors["final_state"] = assert_close("final_state", rht, ht, tol)
    for name, ref in rgrads.items():
        errors["d" + name] = assert_close("d" + name, ref, dgrads[name], tol)
    print(label, {k: f"{e:.1e}" for k, e in errors.items()})


@pytest.mark.parametrize("c", _cases(), ids=_case_id)
def test_packed_batch(c):
    """o, final states [N, H, K, V] and every gradient: as each sequence alone, and as float64."""
    cu_seqlens = _offsets(c.lengths)
    t = _leaves(_inputs(c))
    o, ht = _run(c, t, cu_seqlens)
    assert o.dtype == c.dtype and o.shape == t["v"].shape
    assert (ht is None) != c.final
    if c.final:
        assert ht.dtype == F32 and ht.shape == (len(c.lengths), c.H, c.K, c.V)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen).to(c.dtype).to(DEV)
    dht = torch.randn(ht.shape, generator=gen).to(DEV) if c.final else None
    packed_grads = dict(zip(t, grads((o, ht), (do, dht), list(t.values()))))
    for name, d in packed_grads.items():
        assert d.dtype == t[name].dtype and d.shape == t[name].shape

    if c.alone:
        _check("alone", c, _alone(c, t, do, dht), (o, ht, packed_grads), TOL_ALONE[c.dtype])
    if not KERNELS[c.kernel][2].get("reverse"):  # the reference has no reverse direction
        _check("float64", c, _reference(c, t, cu_seqlens, do, dht), (o, ht, packed_grads), TOL[c.dtype])


def test_chunk_table():
    """The host-built table: each sequence cut into chunks from its own first token, in order."""
    q = torch.zeros(1, 32, 1, 16, device=DEV)
    _, varlen = prepare_packed(q, q, q, None, gate_ranks=(None,), cu_seqlens=_offsets((5, 1, 17, 9)),
                               chunk_size=16)
    assert (varlen.N, varlen.C, varlen.NT) == (4, 16, 5)
    assert varlen.chunk_indices.tolist() == [[0, 0], [1, 0], [2, 0], [2, 1], [3, 0]]
    assert varlen.chunk_offsets.tolist() == [0, 1, 2, 4, 5]
    assert varlen.chunk_indices.dtype == varlen.chunk_offsets.dtype == torch.int32


# ----------------------------------------------------------------------------- bad offsets

LAUNCHERS = {  # name → (function, its autograd Function whose apply must not run, gate family)
    "chunk_gla": (chunk_gla, chunk_module.ChunkGLAFunction, "gla"),
    "chunk_simple_gla": (chunk_simple_gla, simple_module.ChunkSimpleGLAFunction, "scalar"),
    "fused_chunk_gla": (fused_chunk_gla, fused_chunk_module.FusedChunkGLA, "gla"),
    "fused_recurrent_gla": (fused_recurrent_gla, fused_recurrent_module.FusedRecurrentGLA, "gla"),
}


def _bad_offsets():
    """name → (cu_seqlens, keyword arguments, error type, text the message must contain), for T = 8.
    (Offsets that repeat, an empty sequence, and int32, strided or NumPy offsets are valid: test_offsets.py.)"""
    good = _offsets((3, 5))
    kinds = "cu_seqlens must be a 1-D int32 or int64 torch.Tensor or NumPy array"
    cases = {
        "not-from-0": (_offsets((3, 5)) + 1, {}, ValueError, "start at 0"),
        "not-to-T": (_offsets((3, 4)), {}, ValueError, "end at T"),
        "decreasing": (torch.tensor([0, 6, 3, 8], device=DEV), {}, ValueError,
                       r"must not decrease .* cu_seqlens\[1\] = 6 > cu_seqlens\[2\] = 3"),
        "decreasing-numpy": (np.array([0, 6, 3, 8]), {}, ValueError, "must not decrease"),
        "float": (good.float(), {}, TypeError, f"{kinds} .* got dtype float32"),
        "bool": (good.bool(), {}, TypeError, f"{kinds} .* got dtype bool"),
        "uint8": (good.to(torch.uint8), {}, TypeError, f"{kinds} .* got dtype uint8"),
        "numpy-float": (good.cpu().numpy().astype(np.float64), {}, TypeError, f"{kinds} .* got dtype float64"),
        "list": ([0, 3, 8], {}, TypeError, f"{kinds} .* got list"),
        "tuple": ((0, 3, 8), {}, TypeError, f"{kinds} .* got tuple"),
        "2-D": (good[None], {}, ValueError, r"cu_seqlens must be a 1-D .* got shape \(1, 3\)"),
        "one-offset": (good[:1], {}, ValueError, r"cu_seqlens must be a 1-D .* \(N >= 1\)"),
        "meta": (good.to("meta"), {}, ValueError, "cu_seqlens is a meta tensor"),
        "h0-per-batch": (good, {"initial_state": torch.zeros(1, 1, 8, 8, device=DEV)}, ValueError,
                         r"initial_state must have shape \[N, H, K, V\]"),
    }
    if CUDA:
        cases["other-device"] = (good.cpu(), {}, ValueError, "cu_seqlens is on cpu but q is on cuda")
    if importlib.util.find_spec("jax") is not None:  # the other framework's array
        import jax.numpy as jnp

        cases["jax-array"] = (jnp.asarray([0, 3, 8]), {}, TypeError, f"{kinds} .* got .*Array")
    return cases


BAD = _bad_offsets()


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("case", BAD)
def test_bad_offsets_raise_before_launch(case, launcher, monkeypatch):
    fn, function, gate = LAUNCHERS[launcher]
    forbid_launch(monkeypatch, function, ["apply"])
    x = as_torch(random_inputs(1, 8, 1, 8, 8, gate), device=DEV)
    cu_seqlens, kwargs, error, text = BAD[case]
    with pytest.raises(error, match=text):
        fn(x["q"], x["k"], x["v"], x["g"], cu_seqlens=cu_seqlens, **kwargs)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_packed_batch_needs_one_row(launcher, monkeypatch):
    fn, function, gate = LAUNCHERS[launcher]
    forbid_launch(monkeypatch, function, ["apply"])
    x = as_torch(random_inputs(2, 8, 1, 8, 8, gate), device=DEV)
    with pytest.raises(ValueError, match="B = 1"):
        fn(x["q"], x["k"], x["v"], x["g"], cu_seqlens=_offsets((3, 5)))


# ----------------------------------------------------------------------------- bf16 under the interpreter

def _historical_steps():
    return {"historical-pipeline": lambda x: historical.fused_chunk_gla_historical(x["q"], x["k"], x["v"], x["g"]),
            "historical-cumsum": lambda x: historical.historical_decay_cumsum(x["g"])}


@pytest.mark.parametrize("name", [*LAUNCHERS, "chunk_simple_gla-g_gamma", "g-only", *_historical_steps()])
def test_interpreter_refuses_bf16(name, monkeypatch):
    """Triton's interpreter computes bf16 tl.dot wrongly (values near 1e10): every wrapper refuses bf16
    there before launch, saying what to use. (On a GPU the interpreter is simulated: the same check runs.)"""
    monkeypatch.setattr(device, "triton_interpret", lambda: True)
    for function in LAUNCHERS.values():
        forbid_launch(monkeypatch, function[1], ["apply"])
    x = as_torch(random_inputs(1, 8, 2, 8, 8, "scalar" if name.startswith("chunk_simple") else "gla"), device=DEV)
    bf = {n: a.bfloat16() for n, a in x.items() if a is not None}
    with torch.no_grad(), pytest.raises(TypeError, match="bfloat16.*interpreter.*float32 or float16"):
        if name in LAUNCHERS:
            LAUNCHERS[name][0](bf["q"], bf["k"], bf["v"], bf["g"])
        elif name == "chunk_simple_gla-g_gamma":
            chunk_simple_gla(x["q"], x["k"], x["v"], g_gamma=torch.full((2,), -0.1, dtype=BF16, device=DEV))
        elif name == "g-only":
            chunk_gla(x["q"], x["k"], x["v"], bf["g"])
        else:
            forbid_launch(monkeypatch, historical, ["launch_decay_cumsum"])
            _historical_steps()[name](bf)


def test_fused_chunk_gate_gradient_restarts_in_packed_sequences(monkeypatch):
    """fused_chunk_gla's gate gradient restarts (every RESTART tokens) from each packed sequence's own first token:
    blocks of 64 tokens of each, the last one short."""
    monkeypatch.setattr(fused_chunk_bwd, "RESTART", 64)
    test_packed_batch(Case("fused_chunk", (90, 20, 70), alone=False))
