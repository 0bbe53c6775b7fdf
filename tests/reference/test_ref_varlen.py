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
from gla_ref.testing import (GATES, as_jax, as_torch, random_inputs, recurrence64, recurrence64_grads,  # noqa: E402
                             rel_rmse, to_numpy)

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


def sequence(x, n, offsets=OFFSETS):
    """Sequence n of the packed inputs x, alone (B = 1), with its own initial state."""
    bos, eos = offsets[n], offsets[n + 1]
    g = x["g"]
    seq = {name: x[name][:, bos:eos] for name in ("q", "k", "v")}
    seq["g"] = g if g is None or g.ndim == 1 else g[:, bos:eos]
    seq["initial_state"] = None if x["initial_state"] is None else x["initial_state"][n:n + 1]
    return seq


def recurrence64_packed(x, do, dS, offsets=OFFSETS):
    """The float64 recurrence and its gradients, run on each sequence alone and joined:
    ``(o, S [N, H, K, V], grads)``; dg of a per-head ``[H]`` gate sums over the sequences. An empty
    sequence (equal offsets) adds no rows, and its final state is its initial state."""
    outs, states, grads = [], [], []
    for n in range(len(offsets) - 1):
        seq = sequence(x, n, offsets)
        o, S = recurrence64(**seq)
        outs.append(o)
        states.append(S)
        bos, eos = offsets[n], offsets[n + 1]
        grads.append(recurrence64_grads(**seq, do=do[:, bos:eos], dS=dS[n:n + 1]))
    joined = {name: np.concatenate([d[name] for d in grads], axis=0 if name == "initial_state" else 1)
              for name in ("q", "k", "v", "initial_state") if grads[0][name] is not None}
    if x["g"] is not None:
        dg = [d["g"] for d in grads]
        joined["g"] = sum(dg) if x["g"].ndim == 1 else np.concatenate(dg, axis=1)
    return np.concatenate(outs, 1), np.concatenate(states, 0), joined


def torch_run(f, x, do, dS, **kw):
    """f on torch copies of x with cu_seqlens (OFFSETS unless given); returns (o, S, gradients of
    Σ o·do + Σ S·dS)."""
    xt = as_torch(x, requires_grad=True)
    kw.setdefault("cu_seqlens", torch.tensor(OFFSETS))
    o, S = f(**xt, output_final_state=True, **kw)
    ((o * torch.tensor(do, dtype=o.dtype)).sum() + (S * torch.tensor(dS, dtype=S.dtype)).sum()).backward()
    return o, S, {name: t.grad for name, t in xt.items() if t is not None}


def jax_run(f, x, do, dS, **kw):
    """The same with jax.vjp, cu_seqlens an int32 JAX array of OFFSETS (x64 is off) unless given."""
    names = [name for name, a in x.items() if a is not None]
    xj = as_jax(x)
    kw.setdefault("cu_seqlens", jnp.asarray(OFFSETS, jnp.int32))

    def call(*arrays):
        return f(**{**xj, **dict(zip(names, arrays))}, output_final_state=True, **kw)

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

BAD = [  # (case, offsets, dtype ("int64", "int32", "float32", "bool" or "list"), error, message pattern)
    ("list", [0, 5, 32], "list", TypeError, r"^cu_seqlens must be a 1-D int32 or int64 \S+ or NumPy array .* got list"),
    ("float", [0.0, 5.0, 32.0], "float32", TypeError, r"^cu_seqlens must be .* got dtype float32"),
    ("bool", [False, True], "bool", TypeError, r"^cu_seqlens must be .* got dtype bool"),
    ("2-D", [[0, 5, 32]], "int64", ValueError, r"^cu_seqlens must be a 1-D .* got shape \(1, 3\)"),
    ("one-offset", [0], "int64", ValueError, r"^cu_seqlens must be a 1-D .* \(N >= 1\)"),
    ("start-1", [1, 5, 32], "int64", ValueError, r"^cu_seqlens must start at 0 and end at T = 32"),
    ("end-31", [0, 5, 31], "int64", ValueError, r"^cu_seqlens must start at 0 and end at T = 32"),
    ("end-33", [0, 5, 33], "int64", ValueError, r"^cu_seqlens must start at 0 and end at T = 32"),
    ("decreasing", [0, 20, 10, 32], "int32", ValueError,
     r"^cu_seqlens must not decrease .* cu_seqlens\[1\] = 20 > cu_seqlens\[2\] = 10"),
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
        with pytest.raises(error, match=match):
            f(**x, cu_seqlens=offsets_as(fw, offsets, dtype), **kw)
        if dtype != "list":  # the same offsets as a NumPy array: the same error
            with pytest.raises(error, match=match):
                f(**x, cu_seqlens=np.asarray(offsets, dtype), **kw)


# ----------------------------------------------------------------------------- FLA's offsets conventions

def torch_offset_kinds(offsets):
    """The offsets as every kind a torch form takes: name → cu_seqlens (int64 first, the baseline)."""
    cu = torch.tensor(offsets, dtype=torch.int64)
    wide = torch.stack([cu, cu + 1000], 1)  # a column of it: stride 2
    return {"int64": cu, "int32": cu.int(), "strided-int64": wide[:, 0], "strided-int32": wide.int()[:, 0],
            "numpy-int64": np.asarray(offsets, np.int64), "numpy-int32": np.asarray(offsets, np.int32),
            "numpy-strided": np.stack([np.asarray(offsets), np.asarray(offsets)], 1)[:, 1]}


def test_torch_offset_kinds_give_identical_results():
    """int32, strided and NumPy offsets give exactly what int64 gives, o, state and every gradient, in
    every torch form (FLA's kernels take int32 and int64; NumPy is converted at the door)."""
    x, do, dS = packed_inputs("gla", h0=True, seed=4)
    kinds = torch_offset_kinds(OFFSETS.tolist())
    assert not kinds["strided-int64"].is_contiguous() and not kinds["numpy-strided"].flags.c_contiguous
    for name, (f, kw) in FORMS["torch"].items():
        results = {}
        for kind, cu in kinds.items():
            xt = as_torch(x, requires_grad=True)
            o, S = f(**xt, output_final_state=True, cu_seqlens=cu, **kw)
            grads = torch.autograd.grad((o * torch.tensor(do)).sum() + (S * torch.tensor(dS)).sum(),
                                        list(xt.values()))
            results[kind] = (o, S, *grads)
        for kind, got in results.items():
            assert all(torch.equal(a, b) for a, b in zip(results["int64"], got)), (name, kind)


def test_jax_offset_kinds_give_identical_results():
    """JAX int32 and NumPy int32/int64 (strided too) offsets give the same o and state."""
    x, _, _ = packed_inputs("scalar", h0=True, seed=5)
    xj = as_jax(x)
    f, kw = FORMS["jax"]["chunk8"]
    o, S = f(**xj, output_final_state=True, cu_seqlens=jnp.asarray(OFFSETS, jnp.int32), **kw)
    for cu in (np.asarray(OFFSETS, np.int64), np.asarray(OFFSETS, np.int32),
               np.stack([OFFSETS, OFFSETS], 1)[:, 0]):
        o2, S2 = f(**xj, output_final_state=True, cu_seqlens=cu, **kw)
        assert np.array_equal(o, o2) and np.array_equal(S, S2)


@pytest.mark.parametrize("fw", FORMS)
def test_offsets_of_the_other_framework_are_refused(fw):
    """A torch tensor is no offsets for JAX, a JAX array none for torch: TypeErrors naming cu_seqlens."""
    x = (as_torch if fw == "torch" else as_jax)(packed_inputs("gla", h0=False)[0])
    other = jnp.asarray(OFFSETS, jnp.int32) if fw == "torch" else torch.tensor(OFFSETS)
    expected = "torch.Tensor" if fw == "torch" else "jax.Array"
    for f, kw in FORMS[fw].values():
        with pytest.raises(TypeError, match=rf"^cu_seqlens must be a 1-D int32 or int64 {expected} or NumPy array"):
            f(**x, cu_seqlens=other, **kw)


def test_torch_offsets_on_another_device_are_refused():
    """A meta tensor (no values) and a tensor on a device other than q's: ValueErrors naming cu_seqlens."""
    x = as_torch(packed_inputs("gla", h0=False)[0])
    meta = torch.tensor(OFFSETS).to("meta")
    for f, kw in FORMS["torch"].values():
        with pytest.raises(ValueError, match=r"^cu_seqlens is a meta tensor"):
            f(**x, cu_seqlens=meta, **kw)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"^cu_seqlens is on cuda:0 but q is on cpu"):
            torch_ref.chunk_gla(**x, cu_seqlens=torch.tensor(OFFSETS, device="cuda"))


EMPTY = (0, 5, 0, 1, 17, 0, 9, 0)  # T = 32: empty sequences first, between others and last


@pytest.mark.parametrize("h0", [True, False], ids=["h0", "no-h0"])
@pytest.mark.parametrize("gate", ["gla", "const"])
def test_empty_sequences_match_recurrence64(gate, h0):
    """Zero-length sequences (FLA accepts them): no rows of o, the final state is the initial state
    (zeros without one) and dh0 is dS for them, exactly; the rest as the float64 recurrence, in every
    torch form and (once: JAX compiles per shape) in JAX's chunk form."""
    offsets = np.cumsum((0,) + EMPTY)
    N = len(EMPTY)
    x = random_inputs(B=1, T=32, H=H, K=K, V=V, gate=gate, seed=6)
    rng = np.random.default_rng(7)
    x["initial_state"] = rng.standard_normal((N, H, K, V)) if h0 else None
    do, dS = rng.standard_normal(x["v"].shape), rng.standard_normal((N, H, K, V))
    o64, S64, grads64 = recurrence64_packed(x, do, dS, offsets)
    empty = [n for n, length in enumerate(EMPTY) if length == 0]
    cases = [("torch", form) for form in FORMS["torch"]] + ([("jax", "chunk8")] if gate == "gla" and h0 else [])
    for fw, form in cases:
        f, kw = FORMS[fw][form]
        cu = torch.tensor(offsets) if fw == "torch" else np.asarray(offsets, np.int32)
        o, S, grads = RUN[fw](f, x, do, dS, cu_seqlens=cu, **kw)
        S, grads = to_numpy(S), {name: to_numpy(d) for name, d in grads.items()}
        assert o.shape == o64.shape and S.shape == S64.shape
        assert rel_rmse(o64, o) < TOL and rel_rmse(S64, S) < TOL, (fw, form)
        assert set(grads) == set(grads64)
        for name, d64 in grads64.items():
            assert rel_rmse(d64, grads[name]) < GRAD_TOL, (fw, form, name)
        h0_rows = x["initial_state"][empty] if h0 else np.zeros((len(empty), H, K, V))
        assert np.array_equal(S[empty], h0_rows.astype(np.float32)), (fw, form)  # float32 inputs
        if h0:
            assert np.array_equal(grads["initial_state"][empty], dS[empty].astype(np.float32)), (fw, form)


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
