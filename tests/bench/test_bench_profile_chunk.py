"""benchmarks/profile_chunk.py's host-side clock: what issue_ms and wall_ms measure (its CUDA profile runs on a GPU)."""

import pytest

from gla_ref.testing.scripts import load_script

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def profile_chunk():
    return load_script("profile_chunk")


def test_host_times_split_issuing_from_waiting(profile_chunk):
    """A fake clock: each step takes 2 ms of host time and the final sync waits 30 ms more. issue_ms is the
    host's time per step; wall_ms adds the wait, spread over the steps; the warm-up step is not counted."""
    now, calls = [0.0], []

    def step():
        calls.append("step")
        now[0] += 2e-3

    def sync():
        calls.append("sync")
        now[0] += 30e-3

    host = profile_chunk.host_times(step, 10, sync=sync, clock=lambda: now[0])
    assert calls == ["step", "sync"] + ["step"] * 10 + ["sync"]
    assert host["issue_ms"] == pytest.approx(2.0)
    assert host["wall_ms"] == pytest.approx(2.0 + 30 / 10)


def test_make_step_runs_a_forward_and_backward_with_fresh_gradients(profile_chunk):
    x = torch.ones(2, 3, 1, 4, requires_grad=True)
    inputs = [x, x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_(), x]
    runs = []

    def fn(q, k, v, g):
        runs.append(torch.is_grad_enabled())
        return q * 2.0

    step = profile_chunk.make_step(fn, inputs)
    step()
    once = x.grad.clone()
    assert torch.count_nonzero(once) > 0
    step()  # gradients are reset before each step: the same gradient again, not twice it
    assert torch.equal(x.grad, once) and runs == [True, True]
    profile_chunk.make_step(fn, inputs, forward=True)()
    assert runs[-1] is False
