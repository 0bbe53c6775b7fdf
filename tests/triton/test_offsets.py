"""FLA's conventions for the offsets of a packed batch (``cu_seqlens``) in the four Triton kernel families.

FLA's users pass int32 as often as int64 offsets, slices of larger tensors (any stride), and packed
batches holding empty sequences. Here, for ``chunk_gla``, ``chunk_simple_gla`` (g and g_gamma),
``fused_chunk_gla`` and ``fused_recurrent_gla``: int32, strided and NumPy offsets give exactly what
contiguous int64 offsets give (o, final state and every gradient); zero-length sequences (first, in
the middle, last, and next to one-token sequences) match the float64 recurrence run on each sequence
alone, with the final state of an empty sequence its initial state (zeros without one) and its dh0
the final state's cotangent, bit for bit. The kind errors (a list, a float tensor, ...) are in
test_triton_varlen.py. On CPU the kernels run in Triton's interpreter, in float32, at tiny sizes.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gla_ref import device  # noqa: E402
from gla_ref.testing import as_torch, random_inputs, recurrence64, recurrence64_grads, rel_rmse  # noqa: E402
from gla_ref.testing.triton_cases import grads  # noqa: E402
from gla_ref.triton import chunk_gla, chunk_simple_gla, fused_chunk_gla, fused_recurrent_gla  # noqa: E402
from gla_ref.triton.common.host import prepare_packed  # noqa: E402

DEV = device.torch_device()
H, K, V = 1, 16, 24
TOL = 1e-4  # relative RMSE of float32 kernels against float64, as in test_triton_varlen.py

FAMILIES = {  # name → (function, gate family, keyword arguments)
    "chunk": (chunk_gla, "gla", {"chunk_size": 16}),
    "simple": (chunk_simple_gla, "scalar", {"chunk_size": 16}),
    "simple-gamma": (chunk_simple_gla, "const", {"chunk_size": 16}),
    "fused_chunk": (fused_chunk_gla, "gla", {"chunk_size": 16}),
    "fused_recurrent": (fused_recurrent_gla, "gla", {}),
}


def _inputs(family, lengths, h0=True, seed=0):
    """Float64 NumPy inputs of a packed batch (B = 1) and the cotangents do, dS of o and the final states."""
    gate = FAMILIES[family][1]
    T, N = sum(lengths), len(lengths)
    x = random_inputs(1, T, H, K, V, gate, seed=seed)
    rng = np.random.default_rng(seed + 1)
    x["initial_state"] = rng.standard_normal((N, H, K, V)) if h0 else None
    return x, rng.standard_normal((1, T, H, V)), rng.standard_normal((N, H, K, V))


def _run(family, x, do, dS, cu_seqlens):
    """The family's kernel forward and backward in float32: ``(o, S, {input: gradient})``."""
    fn, gate, kwargs = FAMILIES[family]
    t = {n: a.detach().requires_grad_() for n, a in as_torch(x, device=DEV).items() if a is not None}
    gates = {"g_gamma": t["g"]} if gate == "const" else {"g": t["g"]}
    o, S = fn(t["q"], t["k"], t["v"], **gates, initial_state=t.get("initial_state"), output_final_state=True,
              cu_seqlens=cu_seqlens, **kwargs)
    got = grads((o, S), (torch.tensor(do, dtype=o.dtype, device=DEV), torch.tensor(dS, dtype=S.dtype, device=DEV)),
                list(t.values()))
    return o, S, dict(zip(t, got))


def _forward(family, x, cu_seqlens):
    """The family's kernel forward only (no graph): ``(o, S)``."""
    fn, gate, kwargs = FAMILIES[family]
    t = as_torch(x, device=DEV)
    gates = {"g_gamma": t["g"]} if gate == "const" else {"g": t["g"]}
    with torch.no_grad():
        return fn(t["q"], t["k"], t["v"], **gates, initial_state=t["initial_state"], output_final_state=True,
                  cu_seqlens=cu_seqlens, **kwargs)


def _offsets(lengths):
    return np.cumsum([0, *lengths])


def _recurrence64_packed(x, do, dS, lengths):
    """The float64 recurrence and its gradients on each sequence alone, joined (dg of g_gamma summed)."""
    bounds = _offsets(lengths)
    outs, states, parts = [], [], []
    for n, (bos, eos) in enumerate(zip(bounds[:-1], bounds[1:])):
        seq = {name: x[name][:, bos:eos] for name in ("q", "k", "v")}
        seq["g"] = x["g"] if x["g"].ndim == 1 else x["g"][:, bos:eos]
        seq["initial_state"] = None if x["initial_state"] is None else x["initial_state"][n:n + 1]
        o, S = recurrence64(**seq)
        outs.append(o)
        states.append(S)
        parts.append(recurrence64_grads(**seq, do=do[:, bos:eos], dS=dS[n:n + 1]))
    joined = {name: np.concatenate([p[name] for p in parts], 0 if name == "initial_state" else 1)
              for name in ("q", "k", "v", "initial_state") if parts[0][name] is not None}
    dg = [p["g"] for p in parts]
    joined["g"] = sum(dg) if x["g"].ndim == 1 else np.concatenate(dg, 1)
    return np.concatenate(outs, 1), np.concatenate(states, 0), joined


# ----------------------------------------------------------------------------- the chunk table

def test_device_offsets_are_the_callers_tensor_or_a_contiguous_int64_copy():
    """The kernels read ``cu_seqlens + i`` as contiguous int64: the caller's tensor when it is one (no copy),
    else a copy of the checked values; empty sequences get no chunks."""
    q = torch.zeros(1, 38, 1, 16, device=DEV)
    lengths = (0, 5, 0, 17, 16, 0)
    cu = torch.tensor(_offsets(lengths), device=DEV)
    _, varlen = prepare_packed(q, q, q, None, gate_ranks=(None,), cu_seqlens=cu, chunk_size=16)
    assert varlen.cu_seqlens is cu
    assert (varlen.N, varlen.NT) == (6, 4)
    assert varlen.chunk_indices.tolist() == [[1, 0], [3, 0], [3, 1], [4, 0]]
    assert varlen.chunk_offsets.tolist() == [0, 0, 1, 1, 3, 4, 4]
    wide = torch.stack([cu, cu], 1)
    for other in (cu.int(), wide[:, 1], wide.int()[:, 0], _offsets(lengths), _offsets(lengths).astype(np.int32)):
        _, packed = prepare_packed(q, q, q, None, gate_ranks=(None,), cu_seqlens=other, chunk_size=16)
        got = packed.cu_seqlens
        assert got.dtype == torch.int64 and got.is_contiguous() and got.device == q.device
        assert torch.equal(got, cu)
        assert torch.equal(packed.chunk_indices, varlen.chunk_indices)
        assert torch.equal(packed.chunk_offsets, varlen.chunk_offsets)


# ----------------------------------------------------------------------------- kinds of offsets

@pytest.mark.parametrize("family", FAMILIES)
def test_offset_kinds_give_exactly_the_int64_results(family):
    """Strided int32 offsets (a column of a 2-D tensor): o, final state and every gradient equal the
    contiguous int64 results bit for bit; NumPy offsets and a ``torch.arange(0, 10, 1)[::2]`` kind of
    slice, the forward. (Before, a strided tensor was read as if contiguous: a crash in the interpreter,
    reads out of bounds on a GPU; int32 was refused. The door's copy of every kind is checked above.)"""
    lengths = (3, 1, 6)
    x, do, dS = _inputs(family, lengths, seed=2)
    cu = torch.tensor(_offsets(lengths), device=DEV)
    column = torch.stack([cu + 7, cu], 1).int()[:, 1]
    assert column.dtype == torch.int32 and column.stride() == (2,)
    o, S, got = _run(family, x, do, dS, column)
    base = _run(family, x, do, dS, cu)
    assert torch.equal(o, base[0]) and torch.equal(S, base[1])
    assert all(torch.equal(got[name], d) for name, d in base[2].items())
    o_np, S_np = _forward(family, x, _offsets(lengths).astype(np.int32))
    assert torch.equal(o_np, base[0]) and torch.equal(S_np, base[1])
    sliced = torch.arange(0, 10, 1, device=DEV)[::2]  # [0, 2, 4, 6, 8]: T = 8, stride 2
    assert sliced.stride() == (2,)
    x8 = _inputs(family, (2, 2, 2, 2), seed=3)[0]
    o8, S8 = _forward(family, x8, sliced)
    o8c, S8c = _forward(family, x8, sliced.contiguous())
    assert torch.equal(o8, o8c) and torch.equal(S8, S8c)


# ----------------------------------------------------------------------------- empty sequences

EMPTY = (0, 5, 0, 1, 17, 0, 1, 9, 0)  # T = 33: empty first, between others and last; one-token sequences


@pytest.mark.parametrize("family", FAMILIES)
def test_empty_sequences_match_float64(family):
    """Zero-length sequences: o, final states and the gradients of q, k, v, g (or g_gamma) and h0 as the
    float64 recurrence on each sequence alone; an empty sequence's state is its h0 and its dh0 the final
    state's cotangent, exactly. Without h0 (offsets [0, 0, 16] as well) its state is zeros."""
    x, do, dS = _inputs(family, EMPTY, seed=4)
    o, S, got = _run(family, x, do, dS, torch.tensor(_offsets(EMPTY), device=DEV))
    o64, S64, grads64 = _recurrence64_packed(x, do, dS, EMPTY)
    errors = {"o": rel_rmse(o64, o), "final_state": rel_rmse(S64, S)}
    errors.update({"d" + name: rel_rmse(d64, got[name]) for name, d64 in grads64.items()})
    assert set(got) == set(grads64)
    assert max(errors.values()) < TOL, errors
    empty = [n for n, length in enumerate(EMPTY) if length == 0]
    h0 = torch.tensor(x["initial_state"], dtype=torch.float32, device=DEV)
    assert torch.equal(S[empty], h0[empty])
    assert torch.equal(got["initial_state"][empty], torch.tensor(dS, dtype=torch.float32, device=DEV)[empty])

    for lengths in (EMPTY, (0, 0, 16)):
        x, do, dS = _inputs(family, lengths, h0=False, seed=5)
        o, S = _forward(family, x, torch.tensor(_offsets(lengths), device=DEV))
        o64, S64 = _recurrence64_packed(x, do, dS, lengths)[:2]
        assert rel_rmse(o64, o) < TOL and rel_rmse(S64, S) < TOL, lengths
        assert not S[[n for n, length in enumerate(lengths) if length == 0]].any()
