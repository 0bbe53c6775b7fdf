"""Packed batches (``cu_seqlens``) in the references: each sequence as if run alone, against the
float64 recurrence run sequence by sequence (forward and every gradient), and bad offsets rejected
before any math."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from gla_ref import jax_ref, torch_ref  # noqa: E402
from gla_ref._validate import check_cu_seqlens  # noqa: E402
from gla_ref.testing import (GATES, as_jax, as_torch, random_inputs, recurrence64, recurrence64_grads,  # noqa: E402
                             rel_rmse)

LENGTHS = (5, 1, 17, 9)  # T = 32: a one-token sequence, lengths that are not multiples of the chunk (8)
OFFSETS = np.cumsum((0,) + LENGTHS)
H, K, V = 2, 6, 5
TOL, GRAD_TOL = 2e-5, 1e-4


def forms(R):
    return {"recurrent": (R.recurrent_gla, {}), "parallel": (R.parallel_gla, {}),
            "chunk8": (R.chunk_gla, dict(chunk_size=8)),
            "two_level8/4": (R.chunk_gla_two_level, dict(chunk_size=8, sub_chunk_size=4))}


FORMS = {"torch": forms(torch_ref), "jax": forms(jax_ref)}


def packed_inputs(gate, h0, seed=0):
    """Float64 NumPy inputs of one packed batch (B = 1, T = 32) with N = 4 initial states, and the
    cotangents do, dS of a loss touching o and the final states."""
    x = random_inputs(B=1, T=int(OFFSETS[-1]), H=H, K=K, V=V, gate=gate, seed=seed)
    rng = np.random.default_rng(seed + 1)
    x["initial_state"] = rng.standard_normal((len(LENGTHS), H, K, V)) if h0 else None
    return x, rng.standard_normal(x["v"].shape), rng.standard_normal((len(LENGTHS), H, K, V))


def sequence(x, n):
    """Sequence n of the packed inputs x, alone (B = 1), with its own initial state."""
    bos, eos = OFFSETS[n], OFFSETS[n + 1]
    g = x["g"]
    seq = {name: x[name][:, bos:eos] for name in ("q", "k", "v")}
    seq["g"] = g if g is None or g.ndim == 1 else g[:, bos:eos]
    seq["initial_state"] = None if x["initial_state"] is None else x["initial_state"][n:n + 1]
    return seq


def recurrence64_packed(x, do, dS):
    """The float64 recurrence and its gradients, run on each sequence alone and joined:
    ``(o, S [N, H, K, V], grads)``; dg of a per-head ``[H]`` gate sums over the sequences."""
    outs, states, grads = [], [], []
    for n in range(len(LENGTHS)):
        seq = sequence(x, n)
        o, S = recurrence64(**seq)
        outs.append(o)
        states.append(S)
        bos, eos = OFFSETS[n], OFFSETS[n + 1]
        grads.append(recurrence64_grads(**seq, do=do[:, bos:eos], dS=dS[n:n + 1]))
    joined = {name: np.concatenate([d[name] for d in grads], axis=0 if name == "initial_state" else 1)
              for name in ("q", "k", "v", "initial_state") if grads[0][name] is not None}
    if x["g"] is not None:
        dg = [d["g"] for d in grads]
        joined["g"] = sum(dg) if x["g"].ndim == 1 else np.concatenate(dg, axis=1)
    return np.concatenate(outs, 1), np.concatenate(states, 0), joined


def torch_run(f, x, do, dS, **kw):
    """f on torch copies of x with cu_seqlens; returns (o, S, gradients of Σ o·do + Σ S·dS)."""
    xt = as_torch(x, requires_grad=True)
    o, S = f(**xt, output_final_state=True, cu_seqlens=torch.tensor(OFFSETS), **kw)
    ((o * torch.tensor(do, dtype=o.dtype)).sum() + (S * torch.tensor(dS, dtype=S.dtype)).sum()).backward()
    return o, S, {name: t.grad for name, t in xt.items() if t is not None}


def jax_run(f, x, do, dS, **kw):
    """The same with jax.vjp, cu_seqlens an int32 JAX array (x64 is off)."""
    names = [name for name, a in x.items() if a is not None]
    xj = as_jax(x)
    cu = jnp.asarray(OFFSETS, jnp.int32)

    def call(*arrays):
        return f(**{**xj, **dict(zip(names, arrays))}, output_final_state=True, cu_seqlens=cu, **kw)

    (o, S), pullback = jax.vjp(call, *(xj[name] for name in names))
    grads = pullback((jnp.asarray(do, o.dtype), jnp.asarray(dS, S.dtype)))
    return o, S, dict(zip(names, grads))


RUN = {"torch": torch_run, "jax": jax_run}


@pytest.mark.parametrize("h0", [True, False], ids=["h0", "no-h0"])
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("form", FORMS["torch"])
def test_torch_matches_recurrence64_per_sequence(form, gate, h0):
    check_against_recurrence64("torch", form, gate, h0)


@pytest.mark.parametrize("form,gate,h0", [("recurrent", "const", False), ("chunk8", "gla", True),
                                           ("chunk8", "scalar", False)])
def test_jax_matches_recurrence64_per_sequence(form, gate, h0):
    """JAX compiles each form per shape (slow on a CPU): the gradients of the packed path on a few
    cases; the forms' own math is covered by test_jax_ref.py, the forward of the rest below."""
    check_against_recurrence64("jax", form, gate, h0)


@pytest.mark.parametrize("form", ["parallel", "two_level8/4"])
def test_jax_forward_matches_recurrence64_per_sequence(form):
    f, kw = FORMS["jax"][form]
    x, do, dS = packed_inputs("gla", h0=True, seed=2)
    o64, S64, _ = recurrence64_packed(x, do, dS)
    o, S = f(**as_jax(x), output_final_state=True, cu_seqlens=jnp.asarray(OFFSETS, jnp.int32), **kw)
    assert rel_rmse(o64, o) < TOL and rel_rmse(S64, S) < TOL


def check_against_recurrence64(fw, form, gate, h0):
    f, kw = FORMS[fw][form]
    x, do, dS = packed_inputs(gate, h0)
    o64, S64, grads64 = recurrence64_packed(x, do, dS)
    o, S, grads = RUN[fw](f, x, do, dS, **kw)
    assert o.shape == o64.shape and S.shape == (len(LENGTHS), H, K, V)
    assert rel_rmse(o64, o) < TOL and rel_rmse(S64, S) < TOL
    assert set(grads) == set(grads64)
    for name, d64 in grads64.items():
        assert rel_rmse(d64, grads[name]) < GRAD_TOL, name


@pytest.mark.parametrize("fw,forms", [("torch", list(FORMS["torch"])), ("jax", ["chunk8"])])
def test_each_sequence_as_if_run_alone_through_the_same_form(fw, forms):
    """Form by form, the packed call gives what the form gives on each sequence by itself."""
    x, _, _ = packed_inputs("gla", h0=True, seed=3)
    convert = as_torch if fw == "torch" else as_jax
    cu = torch.tensor(OFFSETS) if fw == "torch" else jnp.asarray(OFFSETS, jnp.int32)
    for f, kw in (FORMS[fw][form] for form in forms):
        o, S = f(**convert(x), output_final_state=True, cu_seqlens=cu, **kw)
        for n in range(len(LENGTHS)):
            o_n, S_n = f(**convert(sequence(x, n)), output_final_state=True, **kw)
            assert rel_rmse(o_n, o[:, OFFSETS[n]:OFFSETS[n + 1]]) < 1e-6
            assert rel_rmse(S_n, S[n:n + 1]) < 1e-6


@pytest.mark.parametrize("fw", FORMS)
def test_final_state_only_when_asked_and_h0_defaults_to_zeros(fw):
    x, _, _ = packed_inputs("scalar", h0=False)
    convert, cu = ((as_torch, torch.tensor(OFFSETS)) if fw == "torch"
                   else (as_jax, np.asarray(OFFSETS)))  # jax also takes a NumPy int64 array
    f, kw = FORMS[fw]["chunk8"]
    o, S = f(**convert(x), cu_seqlens=cu, **kw)
    assert S is None
    o64 = np.concatenate([recurrence64(**sequence(x, n))[0] for n in range(len(LENGTHS))], 1)
    assert rel_rmse(o64, o) < TOL


def test_jax_offsets_closed_over_by_jit():
    """Under a caller's jit, cu_seqlens is a constant closed over (its values set shapes)."""
    x, _, _ = packed_inputs("gla", h0=True)
    xj = as_jax(x)
    cu = jnp.asarray(OFFSETS, jnp.int32)
    eager = jax_ref.chunk_gla(**xj, chunk_size=8, cu_seqlens=cu)[0]
    jitted = jax.jit(lambda q, k, v, g, h0: jax_ref.chunk_gla(
        q, k, v, g, initial_state=h0, chunk_size=8, cu_seqlens=cu)[0])(*xj.values())
    assert rel_rmse(eager, jitted) < 1e-6
    with pytest.raises(TypeError, match="^cu_seqlens must be concrete"):
        jax.jit(lambda cu: jax_ref.chunk_gla(**xj, chunk_size=8, cu_seqlens=cu))(cu)


# ----------------------------------------------------------------------------- bad offsets

BAD = [  # (case, offsets, dtype ("int64", "int32" or "list"), error, message pattern)
    ("list", [0, 5, 32], "list", TypeError, r"^cu_seqlens must be a 1-D int64"),
    ("float", [0.0, 5.0, 32.0], "float32", TypeError, r"^cu_seqlens must be .* got dtype float32"),
    ("2-D", [[0, 5, 32]], "int64", ValueError, r"^cu_seqlens must be a 1-D .* got shape \(1, 3\)"),
    ("one-offset", [0], "int64", ValueError, r"^cu_seqlens must be a 1-D .* \(N >= 1\)"),
    ("start-1", [1, 5, 32], "int64", ValueError, r"^cu_seqlens must start at 0 and end at T = 32"),
    ("end-31", [0, 5, 31], "int64", ValueError, r"^cu_seqlens must start at 0 and end at T = 32"),
    ("end-33", [0, 5, 33], "int64", ValueError, r"^cu_seqlens must start at 0 and end at T = 32"),
    ("empty-sequence", [0, 5, 5, 32], "int64", ValueError, r"^cu_seqlens must increase strictly .*\[1\] = 5"),
    ("decreasing", [0, 20, 10, 32], "int64", ValueError, r"^cu_seqlens must increase strictly"),
]


def offsets_as(fw, offsets, dtype):
    if dtype == "list":
        return offsets
    if fw == "torch":
        return torch.tensor(offsets, dtype=getattr(torch, dtype))
    return jnp.asarray(np.asarray(offsets, dtype))


@pytest.mark.parametrize("case,offsets,dtype,error,match", BAD, ids=[c[0] for c in BAD])
@pytest.mark.parametrize("fw", FORMS)
def test_bad_offsets_raise_before_any_math(fw, case, offsets, dtype, error, match, monkeypatch):
    R = torch_ref if fw == "torch" else jax_ref
    for private in ("_recurrent_gla", "_parallel_gla", "_chunk_gla", "_chunk_gla_two_level"):
        monkeypatch.setattr(R, private, None)  # any math run would fail with a different error
    x = (as_torch if fw == "torch" else as_jax)(packed_inputs("gla", h0=False)[0])
    for f, kw in FORMS[fw].values():
        with pytest.raises(error, match=match.replace("int64", "int32 or int64") if fw == "jax" else match):
            f(**x, cu_seqlens=offsets_as(fw, offsets, dtype), **kw)


def test_torch_takes_int64_only_jax_also_int32():
    x = as_torch(packed_inputs("gla", h0=False)[0])
    with pytest.raises(TypeError, match=r"^cu_seqlens must be a 1-D int64 .* got dtype int32"):
        torch_ref.chunk_gla(**x, cu_seqlens=torch.tensor(OFFSETS, dtype=torch.int32))
    assert check_cu_seqlens(np.asarray(OFFSETS, np.int32), 32, 1, dtypes=("int32", "int64")) == len(LENGTHS)


@pytest.mark.parametrize("fw", FORMS)
def test_batch_and_state_shapes_with_offsets(fw):
    """Packed means B = 1; the initial state then has one row per sequence, [N, H, K, V]."""
    x, _, _ = packed_inputs("gla", h0=True)
    convert = as_torch if fw == "torch" else as_jax
    cu = offsets_as(fw, OFFSETS.tolist(), "int64")
    f = FORMS[fw]["chunk8"][0]
    two = {name: np.concatenate([a, a]) for name, a in x.items()}  # B = 2 (and 8 states)
    with pytest.raises(ValueError, match=r"^cu_seqlens needs one packed sequence batch, B = 1, got B = 2"):
        f(**convert(two), cu_seqlens=cu)
    x["initial_state"] = x["initial_state"][:1]
    with pytest.raises(ValueError, match=r"^initial_state must have shape \[N, H, K, V\] = \(4, 2, 6, 5\)"):
        f(**convert(x), cu_seqlens=cu)
