"""FLOP and memory models of gla_ref.bench (chapter 1): small cases counted by hand, and the
counts of the dense forms checked against PyTorch's own FLOP counter."""

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from gla_ref.reference import attention as A  # noqa: E402
from gla_ref import bench  # noqa: E402
from gla_ref.testing import as_torch, random_inputs  # noqa: E402


def test_flops_attention_by_hand():
    # T=3, d=2: QKᵀ has 3·3 entries of 2 multiply-adds = 18 MACs = 36 FLOPs;
    # the [3,3] weights times V [3,2]: 3·2 outputs of 3 MACs = 18 MACs = 36 FLOPs; total 72
    assert bench.flops_attention(3, 2) == 72
    # T=1, d=1: one product q·k (2 FLOPs) and one weight times v (2 FLOPs)
    assert bench.flops_attention(1, 1) == 4


def test_flops_linear_recurrent_by_hand():
    # T=3, d=2 per token: kᵀv outer product into S, 2·2 MACs = 8 FLOPs; q S: 2 outputs of 2 MACs
    # = 8 FLOPs; 16 per token, 48 for three tokens
    assert bench.flops_linear_recurrent(3, 2) == 48


def test_flops_chunkwise_by_hand():
    # T=4, C=2, d=3, N=2 chunks; per chunk: QKᵀ 2·2·3 MACs = 24 FLOPs, (·)V 2·3·2 MACs = 24,
    # Q S 2·3·3 MACs = 36, KᵀV 3·3·2 MACs = 36 → 120 per chunk, 240 in all
    assert bench.flops_chunkwise(4, 2, 3) == 240
    # T=5, C=2: three chunks, the last padded to 2 tokens → 360
    assert bench.flops_chunkwise(5, 2, 3) == 360
    # padding costs: T=129 with C=64 pays for 192 tokens and is not cheaper than T² attention
    assert bench.flops_chunkwise(129, 64, 64) == bench.flops_chunkwise(192, 64, 64)
    assert bench.flops_chunkwise(129, 64, 64) > bench.flops_attention(129, 64)


@pytest.mark.parametrize("T,C,d", [(64, 16, 8), (256, 64, 64), (96, 32, 128)])
def test_chunkwise_end_points_and_closed_form(T, C, d):
    assert bench.flops_chunkwise(T, C, d) == 4 * T * C * d + 4 * T * d * d  # C divides T
    # C = T: the parallel form plus computing the final state (Q·S_0 and KᵀV: 4Td²)
    assert bench.flops_chunkwise(T, T, d) == bench.flops_attention(T, d) + 4 * T * d * d
    # C = 1: the recurrent form plus the 1×1 "attention" q_t·k_t and its product with v_t
    assert bench.flops_chunkwise(T, 1, d) == bench.flops_linear_recurrent(T, d) + 4 * T * d


@pytest.mark.parametrize("T,C,d", [(64, 64, 64), (128, 64, 64), (192, 64, 64), (1024, 64, 64),
                                   (192, 64, 128), (256, 64, 128)])
def test_chunkwise_cheaper_than_parallel_exactly_when_T_exceeds_C_plus_d(T, C, d):
    # with C dividing T: 4TCd + 4Td² < 4T²d  ⇔  C + d < T
    cheaper = bench.flops_chunkwise(T, C, d) < bench.flops_attention(T, d)
    assert cheaper == (T > C + d)


def _counted(fn, *args, **kw):
    with FlopCounterMode(display=False) as counter:
        fn(*args, **kw)
    return counter.get_total_flops()


def test_dense_counts_match_torch_flop_counter():
    B, T, H, d = 2, 24, 3, 8
    x = as_torch(random_inputs(B=B, T=T, H=H, K=d, V=d, gate="none"))
    q, k, v = x["q"], x["k"], x["v"]
    assert _counted(A.softmax_attention, q, k, v) == B * H * bench.flops_attention(T, d)
    assert _counted(A.linear_attention_qk_first, q, k, v) == B * H * bench.flops_attention(T, d)
    assert _counted(A.linear_attention_kv_first, q, k, v) == B * H * bench.flops_linear_recurrent(T, d)


def test_memory_models_by_hand_and_against_real_cache():
    # T=10 tokens, H=2 heads, d=4, fp16: keys 10·2·4 + values 10·2·4 = 160 numbers · 2 bytes
    assert bench.kv_cache_bytes(10, 2, 4, 2) == 320
    # one 4×4 fp32 matrix per head: 2·16·4
    assert bench.state_bytes(2, 4, 4) == 128
    assert bench.state_bytes(2, 4, 6, dtype_bytes=2) == 96
    x = as_torch(random_inputs(B=1, T=10, H=2, K=4, V=4, gate="none"))
    cache = A.KVCache()
    A.softmax_attention_recurrent(x["q"], x["k"], x["v"], cache=cache)
    assert cache.nbytes == bench.kv_cache_bytes(10, 2, 4, dtype_bytes=4)


@pytest.mark.parametrize("f,args", [
    (bench.flops_attention, (0, 4)),
    (bench.flops_linear_recurrent, (4, 2.0)),
    (bench.flops_chunkwise, (4, 0, 2)),
    (bench.kv_cache_bytes, (4, True, 2)),
    (bench.state_bytes, (2, 4, -1)),
])
def test_bad_sizes(f, args):
    with pytest.raises(ValueError, match="must be a positive int"):
        f(*args)


def test_chapter1_plots_draw_the_model_counts():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gla_ref.viz import plots

    Ts = [64, 256, 1024]
    ax = plots.plot_flops_vs_length(Ts, chunk_sizes=[16, 64], d=32)
    ys = [list(line.get_ydata()) for line in ax.get_lines()]
    assert ys[0] == [bench.flops_attention(T, 32) for T in Ts]
    assert ys[2] == [bench.flops_chunkwise(T, 64, 32) for T in Ts]
    assert ys[-1] == [bench.flops_linear_recurrent(T, 32) for T in Ts]
    ax = plots.plot_memory_vs_length(Ts, H=4, d=32)
    cache, state = (list(line.get_ydata()) for line in ax.get_lines())
    assert cache == [bench.kv_cache_bytes(T, 4, 32, 2) / 2**20 for T in Ts]
    assert state == [bench.state_bytes(4, 32, 32, 4) / 2**20] * 3
    axes = plots.plot_attention_maps({"a": torch.eye(3), "b": -torch.eye(3)})
    assert [a.get_title() for a in axes] == ["a", "b"]
    plt.close("all")


# ---------------------------------------------------------------- TPU forward model (chapter 5)

def test_mxu_utilisation_is_rows_over_the_array_side():
    from gla_ref.bench.models import mxu_utilisation

    assert mxu_utilisation(16, 128) == 16 / 128 and mxu_utilisation(16, 256) == 16 / 256
    assert mxu_utilisation(64, 128) == 0.5 and mxu_utilisation(512, 256) == 1.0
    with pytest.raises(ValueError, match="rows must be a positive int"):
        mxu_utilisation(0, 128)


def test_tpu_model_at_full_mxu_use_is_the_roofline():
    """With every matmul at least as wide as the MXU (C = K = V = 128 on a v5e), the model's times are
    the plain roofline of chunk_simple_gla_cost (float32 states); 16-row tiles are slower to compute."""
    from gla_ref.bench import models as m

    peaks = m.TPU_DATASHEET_PEAKS["TPU v5e"]
    assert peaks["fp32_TFLOPs"] == peaks["bf16_TFLOPs"] / m.TPU_FP32_PASSES
    shape = (2, 1024, 4, 128, 128)
    whole = m.tpu_forward_model("chunk_simple_gla", *shape, "TPU v5e", C=128, tile_rows=128)
    plain = m.roofline(m.chunk_simple_gla_cost(*shape, C=128, state_bytes=4), peaks)
    assert whole["mxu_fraction"] == 1.0
    assert whole["compute_ms"] == pytest.approx(plain["compute_ms"], rel=1e-12)
    assert whole["memory_ms"] == pytest.approx(plain["memory_ms"], rel=1e-12)
    tiles = m.tpu_forward_model("chunk_simple_gla", *shape, "TPU v5e", C=128, tile_rows=16)
    assert tiles["compute_ms"] > 2 * whole["compute_ms"] and tiles["memory_ms"] == whole["memory_ms"]
    # the fused path moves no state: fewer bytes than the non-fused one, the same FLOPs
    fused, chunk = (m.tpu_forward_model(n, *shape, "TPU v6e") for n in ("fused_chunk_gla", "chunk_gla"))
    assert fused["memory_ms"] < chunk["memory_ms"] and fused["compute_ms"] == chunk["compute_ms"]
    assert fused["mxu_fraction"] < m.tpu_forward_model("fused_chunk_gla", *shape, "TPU v5e")["mxu_fraction"]


@pytest.mark.parametrize("kwargs, match", [({"device": "TPU v4"}, "device must be one of"),
                                           ({"name": "sdpa"}, "name must be one of"),
                                           ({"tile_rows": 48}, "must divide C")])
def test_tpu_model_rejects_bad_arguments(kwargs, match):
    from gla_ref.bench.models import tpu_forward_model

    args = {"name": "chunk_gla", "B": 1, "T": 64, "H": 1, "K": 64, "V": 64, "device": "TPU v5e", **kwargs}
    with pytest.raises(ValueError, match=match):
        tpu_forward_model(**args)
