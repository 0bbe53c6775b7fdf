"""Every Triton kernel family captured in a CUDA graph (``gla_ref.bench.cuda_graph``), forward and backward: a
replay computes the eager call's outputs, final state and gradients bit for bit, also on new input values copied
into the captured buffers. A packed batch cannot be captured (its offsets are read on the host) and says so.
CUDA graphs exist only on a GPU: on a CPU this module is skipped as a whole."""

import pytest

torch = pytest.importorskip("torch")

from gla_ref import bench  # noqa: E402
from gla_ref.testing import as_torch, random_inputs  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kernels():
    from gla_ref.triton import chunk_gla, chunk_simple_gla, fused_chunk_gla, fused_recurrent_gla

    return {"chunk_gla": (chunk_gla, "gla"), "fused_chunk_gla": (fused_chunk_gla, "gla"),
            "fused_recurrent_gla": (fused_recurrent_gla, "gla"), "chunk_simple_gla": (chunk_simple_gla, "scalar")}


def leaves(dtype, gate, seed, B=2, T=100, H=3, K=40, V=24):
    """q, k, v in ``dtype``, float32 log-gates and initial state, all requiring grad (T, K, V not multiples of 16)."""
    x = as_torch(random_inputs(B, T, H, K, V, gate, seed=seed, tau=16.0, initial_state=True), dtype, "cuda", True)
    return [x[n] for n in ("q", "k", "v", "g", "initial_state")]


def step_of(fn, xs, do, dht):
    """One forward+backward from fixed cotangents; returns o, the final state and the five gradients."""
    def step():
        for x in xs:
            x.grad = None
        q, k, v, g, h0 = xs
        o, ht = fn(q, k, v, g, initial_state=h0, output_final_state=True)
        torch.autograd.backward([o, ht], [do, dht])
        return [o.detach(), ht.detach()] + [x.grad for x in xs]
    return step


def replay_mismatches(name, dtype) -> list[str]:
    """What a replay of ``name``'s captured forward+backward in ``dtype`` gets different from the eager call:
    first on the captured values, then on new ones copied into the same buffers."""
    fn, gate = kernels()[name]
    xs = leaves(dtype, gate, seed=0)
    do = torch.randn(xs[0].shape[:3] + (xs[2].shape[-1],), device="cuda").to(dtype)
    dht = torch.randn_like(xs[4])
    step = step_of(fn, xs, do, dht)
    graph, captured = bench.cuda_graph(step)
    names = ["o", "final_state", "dq", "dk", "dv", "dg", "dh0"]
    wrong = []
    for seed in (0, 1):
        with torch.no_grad():
            for x, new in zip(xs, leaves(dtype, gate, seed)):
                x.copy_(new)
        eager = [t.clone() for t in step()]
        graph.replay()                                    # into ``captured``: o, ht and the gradients it allocated
        torch.cuda.synchronize()
        assert all(torch.isfinite(t).all() for t in eager)
        wrong += [f"{n} (inputs {seed})" for n, a, b in zip(names, captured, eager) if not torch.equal(a, b)]
    return wrong


def test_replay_equals_eager_bit_for_bit():
    """Every kernel family in float32, float16 and bfloat16 (one test: on a CPU it is one skip, not twelve)."""
    wrong = {(name, str(dtype)): replay_mismatches(name, dtype) for name in kernels() for dtype in DTYPES}
    assert {case: w for case, w in wrong.items() if w} == {}


def test_a_packed_batch_cannot_be_captured():
    """cu_seqlens is read on the host (one sync a call): capturing it fails with torch's capture error."""
    from gla_ref.triton import chunk_gla

    q, k, v, g, _ = leaves(torch.bfloat16, "gla", seed=0, B=1)
    cu_seqlens = torch.tensor([0, 30, 100], device="cuda")
    with torch.no_grad():
        chunk_gla(q, k, v, g, cu_seqlens=cu_seqlens)      # compiled and tuned outside the capture
        with pytest.raises(RuntimeError, match="captur"):
            bench.cuda_graph(lambda: chunk_gla(q, k, v, g, cu_seqlens=cu_seqlens), warmup=0)
