"""torch.compile and the Triton families (CPU: Triton's interpreter; the GPU run is reported apart).

While torch.compile traces, ``fused_recurrent_gla`` and ``fused_chunk_gla`` go through their custom operators
(gla_ref.triton.common.ops): checked by ``torch.library.opcheck`` (schema, fake tensors, autograd registration,
AOT dispatch), and compiled with ``fullgraph=True`` (no graph break) they give the eager call's o, final state
and every gradient bit for bit. ``backend="aot_eager"`` traces forward and backward as inductor would,
without generating code.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from gla_ref.layers.torch import GatedLinearAttention  # noqa: E402
from gla_ref.triton import fused_chunk, fused_chunk_gla, fused_recurrent, fused_recurrent_gla  # noqa: E402

B, T, H, K, V = 1, 20, 2, 16, 24
FAMILIES = {"fused_recurrent_gla": (fused_recurrent_gla, fused_recurrent.FusedRecurrentGLA, [0]),
            "fused_chunk_gla": (fused_chunk_gla, fused_chunk.FusedChunkGLA, [16, 0])}


def _inputs(seed=0, T=T, B=B):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, d, generator=gen) for d in (K, K, V))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen)) / 4
    return [x.requires_grad_() for x in (q, k, v, g, torch.randn(B, H, K, V, generator=gen))]


def _step(fn, xs, **kw):
    q, k, v, g, h0 = xs
    o, ht = fn(q, k, v, g, initial_state=h0, output_final_state=True, **kw)
    (o.square().sum() + ht.square().sum()).backward()
    return [o.detach(), ht.detach(), *[x.grad for x in xs]]


@pytest.mark.parametrize("name", FAMILIES)
def test_operators_pass_opcheck(name):
    _, door, options = FAMILIES[name]
    q, k, v, g, h0 = _inputs()
    for args in ((q, k, v, g, h0, 0.25, True, options, None, None, None, []),
                 (q, k, v, None, None, 0.25, False, options, None, None, None, [])):
        result = torch.library.opcheck(door.op.fwd, args)
        assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("name", FAMILIES)
def test_fullgraph_compile_equals_eager_bit_for_bit(name):
    fn = FAMILIES[name][0]
    eager = _step(fn, _inputs())
    torch._dynamo.reset()
    compiled = _step(torch.compile(fn, fullgraph=True, backend="aot_eager"), _inputs())
    for what, a, b in zip(("o", "final state", "dq", "dk", "dv", "dg", "dh0"), eager, compiled):
        assert torch.equal(a, b), what


def test_packed_batch_compiles_with_a_break_at_the_offsets():
    """cu_seqlens is read on the host at the door (one graph break); the rest is compiled, with eager's numbers."""
    cu = torch.tensor([0, 7, 8, 20])
    kw = dict(cu_seqlens=cu)
    xs = _inputs()
    xs[4] = torch.randn(3, H, K, V).requires_grad_()
    eager = _step(fused_recurrent_gla, xs, **kw)
    torch._dynamo.reset()
    ys = [x.detach().clone().requires_grad_() for x in xs]
    compiled = _step(torch.compile(fused_recurrent_gla, backend="aot_eager"), ys, **kw)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


@pytest.mark.parametrize("backend", ["fused_recurrent", "fused_chunk"])
def test_layer_on_a_kernel_backend_compiles_to_one_graph(backend):
    torch.manual_seed(0)
    layer = GatedLinearAttention(32, 2, backend=backend)
    x = torch.randn(1, 19, 32)
    y, S = layer(x, output_final_state=True)
    torch._dynamo.reset()
    yc, Sc = torch.compile(lambda x: layer(x, output_final_state=True), fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(y, yc) and torch.equal(S, Sc)
