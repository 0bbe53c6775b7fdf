"""torch.compile and the Triton families (CPU: Triton's interpreter; the GPU run is reported apart).

While torch.compile traces, the four families (``chunk_simple_gla`` on the sum of its gates) go through their custom operators
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
from gla_ref.triton import (chunk, chunk_gla, chunk_simple, chunk_simple_gla, fused_chunk, fused_chunk_gla,  # noqa: E402
                            fused_recurrent, fused_recurrent_gla)

B, T, H, K, V = 1, 20, 2, 16, 24
FAMILIES = {"chunk_gla": (lambda *a, **kw: chunk_gla(*a, chunk_size=16, **kw), chunk.ChunkGLA, [16, 0]),
            "fused_recurrent_gla": (fused_recurrent_gla, fused_recurrent.FusedRecurrentGLA, [0]),
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
    gates = (g, None) if name != "chunk_gla" else (g, g)  # chunk_gla needs its gates
    for args in ((q, k, v, gates[0], h0, 0.25, True, options, None, None, None, [0, 0, 0]),
                 (q, k, v, gates[1], None, 0.25, False, options, None, None, None, [0, 0, 0])):
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


def test_simple_gla_compiles_with_both_gates():
    """chunk_simple_gla traced: g and g_gamma summed in the graph, the operator on the sum, autograd splitting its
    gradient (dg_gamma summed over batch and tokens as eager does, possibly in another order)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, T, H, d, generator=gen) for d in (K, K, V))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen)) / 4
    gamma = -torch.rand(H, generator=gen) * 0.1
    h0 = torch.randn(B, H, K, V, generator=gen)

    def step(fn):
        xs = [x.clone().requires_grad_() for x in (q, k, v, g, gamma, h0)]
        o, ht = fn(*xs[:4], g_gamma=xs[4], initial_state=xs[5], output_final_state=True, chunk_size=16)
        (o.square().sum() + ht.square().sum()).backward()
        return [o.detach(), ht.detach(), *[x.grad for x in xs]]

    g_total = chunk_simple.total_gate(g, gamma, q).requires_grad_()
    result = torch.library.opcheck(chunk_simple.ChunkSimpleGLAOp.fwd,
                                   (q, k, v, g_total, h0, 0.25, True, [16, 0], None, None, None, [0, 0, 0]))
    assert set(result.values()) == {"SUCCESS"}, result
    eager = step(chunk_simple_gla)
    torch._dynamo.reset()
    compiled = step(torch.compile(chunk_simple_gla, fullgraph=True, backend="aot_eager"))
    for what, a, b in zip(("o", "final state", "dq", "dk", "dv", "dg", "dg_gamma", "dh0"), eager, compiled):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6 * float(a.abs().max())), what
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[2], compiled[2])


@pytest.mark.parametrize("backend", ["chunk", "fused_recurrent", "fused_chunk"])
def test_layer_on_a_kernel_backend_compiles_to_one_graph(backend):
    torch.manual_seed(0)
    layer = GatedLinearAttention(32, 2, backend=backend)
    x = torch.randn(1, 19, 32)
    y, S = layer(x, output_final_state=True)
    torch._dynamo.reset()
    yc, Sc = torch.compile(lambda x: layer(x, output_final_state=True), fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(y, yc) and torch.equal(S, Sc)


def test_a_layer_compiled_before_its_first_call():
    """In a fresh process, a layer on a kernel backend compiled before it ever ran: the layer imported the
    kernels when it was built, so the trace finds them (an import inside the trace would break the graph)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch
        from gla_ref.layers.torch import GatedLinearAttention
        layer = GatedLinearAttention(32, 2, backend="chunk")
        x = torch.randn(1, 19, 32)
        step = torch.compile(lambda x: layer(x, output_final_state=True), fullgraph=True, backend="aot_eager")
        yc, Sc = step(x)
        y, S = layer(x, output_final_state=True)
        print(torch.equal(y, yc) and torch.equal(S, Sc))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.split()[-1] == "True", run.stderr[-2000:]
