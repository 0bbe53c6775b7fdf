"""gla_ref.device.debug: a context-local switch (nesting, exceptions, threads, asyncio tasks, the
plain call), and valid inputs, gates of 0 and -80 included, pass its checks in every form."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("jax")

from gla_ref import device, jax_ref, pallas, torch_ref  # noqa: E402
from gla_ref import triton as gtriton  # noqa: E402
from gla_ref.testing import as_jax, as_torch, random_inputs, recurrence64, rel_rmse  # noqa: E402


def in_fresh_context(fn):
    """Run fn in a copy of the current context, so a plain debug(...) call cannot reach other tests."""
    return contextvars.copy_context().run(fn)


def test_off_by_default():
    assert device.is_debug() is False


def test_with_sets_and_restores_and_nests():
    with device.debug(True):
        assert device.is_debug()
        with device.debug(False):
            assert not device.is_debug()
            with device.debug(True):
                assert device.is_debug()
            assert not device.is_debug()
        assert device.is_debug()
    assert not device.is_debug()


def test_exception_inside_the_with_restores():
    with pytest.raises(RuntimeError, match="inside"):
        with device.debug(True):
            raise RuntimeError("inside")
    assert not device.is_debug()


def test_plain_call_lasts_for_the_context():
    def body():
        device.debug(True)
        assert device.is_debug()
        with device.debug(False):
            assert not device.is_debug()
        assert device.is_debug()  # back to the plain call's value
        device.debug(False)
        return device.is_debug()

    assert in_fresh_context(body) is False
    assert not device.is_debug()


def test_with_restores_the_value_from_before_the_call():
    """The with form sets on entering as well, and undoes its own call on leaving."""
    def body():
        scope = device.debug(True)
        device.debug(False)  # changed between the call and the with
        with scope:
            assert device.is_debug()
        return device.is_debug()

    assert in_fresh_context(body) is False


def test_threads_do_not_share_the_switch():
    seen = {}

    def worker(name, enabled):
        with device.debug(enabled):
            barrier.wait(timeout=10)  # both threads are inside their with at once
            seen[name] = device.is_debug()
            barrier.wait(timeout=10)

    barrier = threading.Barrier(2)
    with device.debug(True):
        threads = [threading.Thread(target=worker, args=(n, e)) for n, e in (("on", True), ("off", False))]
        fresh = []
        late = threading.Thread(target=lambda: fresh.append(device.is_debug()))
        for t in (*threads, late):
            t.start()
        for t in (*threads, late):
            t.join(timeout=10)
        assert device.is_debug()
    assert seen == {"on": True, "off": False}
    assert fresh == [False]  # a new thread starts with the switch off, whatever its parent has
    assert not device.is_debug()


def test_plain_call_in_a_thread_stays_there():
    thread = threading.Thread(target=device.debug, args=(True,))
    thread.start()
    thread.join(timeout=10)
    assert not device.is_debug()


def test_asyncio_tasks_do_not_share_the_switch():
    async def task(enabled, ready, other_ready):
        with device.debug(enabled):
            ready.set()
            await other_ready.wait()  # the other task is inside its with now
            return device.is_debug()

    async def main():
        a, b = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(task(True, a, b), task(False, b, a))

    assert asyncio.run(main()) == [True, False]


@pytest.mark.parametrize("enabled", [1, 0, None, "yes"])
def test_enabled_is_a_strict_bool(enabled):
    with pytest.raises(TypeError, match="^enabled must be a bool"):
        device.debug(enabled)
    assert not device.is_debug()


# ----------------------------------------------------------------------------- valid inputs pass

B, T, H, K, V = 1, 20, 1, 16, 16
GATE_VALUES = {"g0": 0.0, "g-80": -80.0}


def gated_inputs(value, width):
    """Random q, k, v and an initial state; every log-gate equal to ``value`` (shape [B, T, H(, K)])."""
    x = random_inputs(B=B, T=T, H=H, K=K, V=V, gate="none", initial_state=True)
    x["g"] = np.full((B, T, H, K) if width == "K" else (B, T, H), value)
    return x


def torch_gla(f, **kw):
    return lambda x: f(**as_torch(x, device=device.torch_device()), output_final_state=True, **kw)


def jax_gla(f, **kw):
    return lambda x: f(**as_jax(x), output_final_state=True, **kw)


FORMS = {  # name → (call on NumPy inputs, gate width)
    "torch_ref.chunk_gla": (torch_gla(torch_ref.chunk_gla, chunk_size=8), "K"),
    "jax_ref.chunk_gla": (jax_gla(jax_ref.chunk_gla, chunk_size=8), "K"),
    "triton.chunk_gla": (torch_gla(gtriton.chunk_gla, chunk_size=16), "K"),
    "triton.chunk_simple_gla": (torch_gla(gtriton.chunk_simple_gla, chunk_size=16), "scalar"),
    "triton.fused_chunk_gla": (torch_gla(gtriton.fused_chunk_gla), "K"),
    "triton.fused_recurrent_gla": (torch_gla(gtriton.fused_recurrent_gla), "K"),
    "pallas.chunk_gla": (jax_gla(pallas.chunk_gla, chunk_size=16), "K"),
    "pallas.chunk_simple_gla": (jax_gla(pallas.chunk_simple_gla, chunk_size=16), "scalar"),
}


@pytest.mark.parametrize("gate", GATE_VALUES)
@pytest.mark.parametrize("form", FORMS)
def test_valid_gates_pass_the_debug_checks(form, gate):
    """g = 0 (no decay) and g = -80 (all but a reset) are valid: no error, and the right numbers."""
    call, width = FORMS[form]
    x = gated_inputs(GATE_VALUES[gate], width)
    with device.debug(True):
        o, S = call(x)
    o64, S64 = recurrence64(**x)
    assert rel_rmse(o64, o) < 1e-5 and rel_rmse(S64, S) < 1e-5
