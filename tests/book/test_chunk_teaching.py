"""Chapter 3 teaching helpers: the two-level FLOP split (gla_ref.bench) and the Figure-3 block
map (gla_ref.viz.plots), each against a count written here tile by tile or token pair by pair."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from gla_ref.bench import two_level_flop_split  # noqa: E402
from gla_ref.viz.plots import CHUNK_MAP_KINDS, chunk_block_labels, plot_chunk_map, plot_error_curves  # noqa: E402

SIZES = [  # (T, C, c, K, V)
    (4096, 64, 16, 128, 128),  # the chapter's realistic case
    (128, 32, 8, 16, 24),
    (100, 32, 8, 7, 5),  # T not a multiple of C: the last chunk is padded
    (64, 64, 64, 8, 8),  # c = C: one-level log-space form
    (48, 16, 1, 4, 3),  # c = 1: only the diagonal in full precision
    (5, 16, 4, 3, 2),  # T < C: one padded chunk
]


def brute_force_split(T, C, c, K, V):
    """Walk the c×c tiles of the padded T×T map one by one and add up each tile's FLOPs."""
    N = -(-T // C)
    tiles = N * C // c
    half = full = 0
    for s in range(tiles):  # query sub-chunk
        for u in range(s + 1):  # key sub-chunk, not in the future
            if s * c // C != u * c // C:
                continue  # earlier chunk: reached through the state, no tile computed
            if u == s:
                full += 2 * c * c * K  # Eq. 4 in log space
            else:
                half += 2 * c * c * K  # (Q ⊙ ·)(K ⊙ ·)ᵀ
            half += 2 * c * c * V  # P @ V
    for _ in range(N):
        half += 2 * C * K * V + 2 * C * K * V  # state update and inter-chunk output
    return half, full


@pytest.mark.parametrize("T,C,c,K,V", SIZES)
def test_split_matches_tile_by_tile_count(T, C, c, K, V):
    split = two_level_flop_split(T, C, c, K, V)
    half, full = brute_force_split(T, C, c, K, V)
    assert split["half_matmul"] == half
    assert split["full_precision"] == full
    assert split["half_fraction"] == pytest.approx(half / (half + full), rel=1e-15)
    parts = ("state", "inter_chunk", "inter_sub_chunk", "pv")
    assert sum(split[p] for p in parts) == split["half_matmul"]


@pytest.mark.parametrize("T,C,c,K,V", [s for s in SIZES if s[0] % s[1] == 0 and s[0] <= 256])
def test_split_matches_the_block_map(T, C, c, K, V):
    """The token pairs of each colour in the map, turned into tiles, give the same FLOPs."""
    counts = np.bincount(chunk_block_labels(T, C, c).ravel(), minlength=4)
    diag_tiles = counts[3] // (c * (c + 1) // 2)  # each diagonal tile has c(c+1)/2 causal pairs
    off_tiles = counts[2] // (c * c)
    split = two_level_flop_split(T, C, c, K, V)
    assert split["intra_sub_chunk"] == diag_tiles * 2 * c * c * K
    assert split["inter_sub_chunk"] == off_tiles * 2 * c * c * K
    assert split["pv"] == (diag_tiles + off_tiles) * 2 * c * c * V


def test_split_one_level_and_trend():
    """c = C leaves no inter-sub-chunk tile; halving c halves the full-precision work."""
    one = two_level_flop_split(1024, 64, 64, 64, 64)
    assert one["inter_sub_chunk"] == 0
    assert one["full_precision"] == (1024 // 64) * 2 * 64 * 64 * 64
    fulls = [two_level_flop_split(1024, 64, c, 64, 64)["full_precision"] for c in (64, 32, 16, 8)]
    assert fulls == [fulls[0] // 2 ** i for i in range(4)]


@pytest.mark.parametrize("kwargs,name", [
    (dict(T=0, C=64, c=16, K=8, V=8), "T"),
    (dict(T=64, C=64, c=24, K=8, V=8), "c=24"),
    (dict(T=64, C=64, c=16, K=8.0, V=8), "K"),
    (dict(T=64, C=True, c=1, K=8, V=8), "C"),
])
def test_split_rejects_bad_sizes(kwargs, name):
    with pytest.raises(ValueError, match=name):
        two_level_flop_split(**kwargs)


def test_block_labels_by_pair():
    T, C, c = 40, 16, 4  # T not a multiple of C
    labels = chunk_block_labels(T, C, c)
    assert labels.shape == (T, T)
    for i in range(T):
        for j in range(T):
            want = 0 if j > i else 1 if i // C != j // C else 2 if i // c != j // c else 3
            assert labels[i, j] == want, (i, j)
    assert len(CHUNK_MAP_KINDS) == 4


@pytest.mark.parametrize("T,C,c,name", [(8, 4, 3, "c=3"), (0, 4, 2, "T"), (8, 4.0, 2, "C")])
def test_block_labels_reject_bad_sizes(T, C, c, name):
    with pytest.raises(ValueError, match=name):
        chunk_block_labels(T, C, c)


def test_plots_draw():
    import matplotlib.pyplot as plt

    ax = plot_chunk_map(32, 16, 4)
    assert len(ax.images) == 1 and ax.get_legend() is not None
    ax = plot_error_curves([16, 32], {"ok": [1e-3, 2e-3], "fails": [1e-4, float("inf")]})
    assert len(ax.get_lines()) >= 3  # two curves plus the inf marker
    plt.close("all")
