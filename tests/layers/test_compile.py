"""torch.compile(fullgraph=True) on a CPU: the reference backend traces into one graph (no host reads of
values, so no graph break and no device sync), and gives the eager numbers; an invalid gate stays loud.

``backend="eager"`` runs the captured graph as it is: graph breaks are Dynamo's (what ``fullgraph`` forbids),
whatever compiler comes after. The kernel backends as torch custom ops are checked on the GPU.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from gla_ref import torch_ref  # noqa: E402
from gla_ref.layers.torch import GatedLinearAttention  # noqa: E402
from gla_ref.models.torch import GLAConfig, GLAForCausalLM  # noqa: E402
from gla_ref.testing import assert_close  # noqa: E402


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="eager")


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_layer_compiles_to_one_graph_with_eager_numbers(backend):
    torch.manual_seed(0)
    layer = GatedLinearAttention(32, 2, backend=backend)
    x = torch.randn(2, 19, 32, requires_grad=True)
    y, S = layer(x, output_final_state=True)
    (y.sum() + S.sum()).backward()
    dx, dw = x.grad.clone(), layer.q_proj.weight.grad.clone()
    x.grad, layer.q_proj.weight.grad = None, None
    yc, Sc = _compiled(lambda x: layer(x, output_final_state=True))(x)
    (yc.sum() + Sc.sum()).backward()
    for name, a, b in (("y", y, yc), ("S", S, Sc), ("dx", dx, x.grad), ("dW_q", dw, layer.q_proj.weight.grad)):
        assert_close(name, a.detach(), b.detach(), 1e-6)


def test_model_loss_compiles_to_one_graph():
    torch.manual_seed(0)
    model = GLAForCausalLM(GLAConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_heads=2))
    ids = torch.randint(0, 64, (2, 19))
    eager = model(ids, labels=ids).loss
    compiled = _compiled(lambda ids: model(ids, labels=ids).loss)(ids)
    assert math.isfinite(float(eager.detach())) and abs(float(eager.detach()) - float(compiled)) < 1e-5


def test_an_invalid_gate_is_nan_inside_a_compiled_graph():
    """Eager, a positive gate is a ValueError; compiled, where nothing is read on the host, it is NaN."""
    q, k, v = (torch.randn(1, 8, 1, 4) for _ in range(3))
    g = -torch.rand(1, 8, 1, 4)
    with pytest.raises(ValueError, match="g"):
        torch_ref.chunk_gla(q, k, v, g.abs() + 0.5, chunk_size=4)
    o, _ = _compiled(lambda g: torch_ref.chunk_gla(q, k, v, g, chunk_size=4))(g)
    assert torch.isfinite(o).all()
    bad = g.clone()
    bad[0, 5, 0, 2] = 0.5
    o, _ = _compiled(lambda g: torch_ref.chunk_gla(q, k, v, g, chunk_size=4))(bad)
    assert torch.isnan(o).any()
