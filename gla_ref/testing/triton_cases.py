"""What the Triton tests share: output checks, the float64 comparison of outputs and every gradient, launch
guards for the bad-input tests, the poisoned inputs of the debug-mode tests, and a recorder of allocations.

Imports torch: import it by name (``gla_ref.testing`` itself loads no framework).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gla_ref.testing import assert_close

F32 = torch.float32


def check_outputs(c, o, ht):
    """o in the case's dtype and shape; the final state float32 [B, H, K, V] exactly when asked for."""
    assert o.dtype == c.dtype and o.shape == (c.B, c.T, c.H, c.V)
    assert (ht is None) != c.final
    if c.final:
        assert ht.dtype == F32 and ht.shape == (c.B, c.H, c.K, c.V)


def float64_copies(t):
    """float64 leaves of the kernel's own (rounded) inputs, asking for gradients where they do."""
    return {n: (None if a is None else a.detach().double().requires_grad_(a.requires_grad)) for n, a in t.items()}


def grads(outputs, cotangents, inputs):
    """Gradients of ``inputs`` from the cotangents of the outputs that exist (final state may be None)."""
    pairs = [(x, d) for x, d in zip(outputs, cotangents) if x is not None]
    return torch.autograd.grad([x for x, _ in pairs], inputs, [d for _, d in pairs])


def compare_with_reference(c, t, r, names, out, ref_out, label, dev):
    """Random cotangents on o and (when asked) the final state through kernel and float64 reference;
    o, the final state and the gradient of every input in ``names`` within ``c.tol[c.dtype]``."""
    (o, ht), (ro, rht) = out, ref_out
    gen = torch.Generator(device=dev).manual_seed(1)
    do = torch.randn(o.shape, generator=gen, device=dev).to(c.dtype)
    dht = torch.randn(ht.shape, generator=gen, device=dev) if c.final else None
    got_grads = grads((o, ht), (do, dht), [t[n] for n in names])
    ref_grads = grads((ro, rht), (do.double(), None if dht is None else dht.double()), [r[n] for n in names])

    tol = c.tol[c.dtype]
    errors = {"o": assert_close("o", ro, o, tol)}
    if c.final:
        errors["final_state"] = assert_close("final_state", rht, ht, tol)
    for n, ref, got in zip(names, ref_grads, got_grads):
        assert got.dtype == t[n].dtype and got.shape == t[n].shape
        errors["d" + n] = assert_close("d" + n, ref, got, tol)
    print(label, {k: f"{e:.1e}" for k, e in errors.items()})


def forbid_launch(monkeypatch, owner, names):
    """Any launch fails the test (errors must come from the checks made before it): each of
    ``owner``'s attributes in ``names`` is replaced by a function that fails when called."""
    def launched(*args, **kwargs):
        raise AssertionError("a kernel was launched")

    for name in names:
        monkeypatch.setattr(owner, name, launched)


def poisoned(x):
    """Inputs that debug mode must refuse, from the good inputs ``x`` (q, k, v, g [B,T,H,K], initial_state):
    name → (q, g, initial_state, argument named in the message)."""
    nan_q = x["q"].clone()
    nan_q[0, 1, 0, 2] = float("nan")
    inf_h0 = x["initial_state"].clone()
    inf_h0[0, 0, 1, 1] = float("inf")
    positive_g = x["g"].clone()
    positive_g[0, 2, 0, 3] = 0.5
    return {
        "nan-q": (nan_q, x["g"], x["initial_state"], "q"),
        "inf-h0": (x["q"], x["g"], inf_h0, "initial_state"),
        "positive-g": (x["q"], positive_g, x["initial_state"], "g"),
    }


def bad_inputs(good):
    """Bad inputs every K-wise gated kernel must refuse before launch, from ``good(K=...)`` (inputs with
    initial_state): name → (arguments, keyword arguments, error type, text the message must contain)."""
    x = good()
    q, k, v, g, h0 = x["q"], x["k"], x["v"], x["g"], x["initial_state"]
    big = good(K=300)
    return {
        "q-rank": ((q[0], k, v, g), {}, ValueError, "q must have shape"),
        "k-shape": ((q, k[:, :2], v, g), {}, ValueError, "k must have shape"),
        "v-shape": ((q, k, v[:, :2], g), {}, ValueError, "v must have shape"),
        "g-rank3": ((q, k, v, g[..., 0]), {}, ValueError, "g must have shape"),
        "g-shape": ((q, k, v, g[:, :2]), {}, ValueError, "g must have shape"),
        "h0-shape": ((q, k, v, g), {"initial_state": h0[..., :4]}, ValueError, "initial_state must have shape"),
        "h0-dtype": ((q, k, v, g), {"initial_state": h0.half()}, TypeError, "initial_state"),
        "h0-device": ((q, k, v, g), {"initial_state": h0.to("meta")}, ValueError, "initial_state is on"),
        "float64": ((q.double(), k.double(), v.double(), g), {}, TypeError, "float64"),
        "int": ((q.int(), k.int(), v.int(), g), {}, TypeError, "q must have a floating dtype"),
        "mixed-dtype": ((q, k.half(), v, g), {}, TypeError, "share one dtype"),
        "K>256": ((big["q"], big["k"], big["v"], big["g"]), {}, ValueError, "at most 256"),
        "scale-nan": ((q, k, v, g), {"scale": float("nan")}, ValueError, "scale"),
        "scale-str": ((q, k, v, g), {"scale": "0.5"}, TypeError, "scale"),
    }


class Allocations(TorchDispatchMode):
    """Records every tensor an op creates in storage of its own while the mode is active (views and
    in-place results share an input's storage and are left out, as are empty tensors)."""

    def __init__(self):
        super().__init__()
        self.tensors = []  # kept alive, so no two records can share an address

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {x.untyped_storage().data_ptr() for x in tree_flatten((args, kwargs))[0]
                  if isinstance(x, torch.Tensor)}
        self.tensors += [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)
                         and x.untyped_storage().nbytes() > 0 and x.untyped_storage().data_ptr() not in inputs]
        return out

    def bytes(self):
        return sum(x.untyped_storage().nbytes() for x in self.tensors)
