"""Cost models: FLOPs and bytes of each form and kernel, device peaks, the roofline.

Plain arithmetic on sizes, no framework and no device: chapters 1 and 3 count FLOPs with it, chapters
4 and 7 set measured times against what the work and the traffic allow.
"""

from __future__ import annotations

def two_level_flop_split(T, C, c, K, V):
    """FLOPs per head and sequence of the two-level chunkwise GLA forward (Fig. 3 / Fig. 7 of the
    paper), split by where they can run: half-precision matmuls (tensor cores) vs full-precision
    log-space work (Eq. 4). A multiply-add is 2 FLOPs; whole c×c tiles are counted (kernels compute
    a tile, then mask it). With N = ⌈T/C⌉ chunks (the last padded) and n = C/c sub-chunks a chunk:

    * ``state``: ``(K ⊙ Γ)ᵀ V`` per chunk, 2·C·K·V, so 2·N·C·K·V;
    * ``inter_chunk``: ``(Q ⊙ Λ) S`` per chunk, the same 2·N·C·K·V;
    * ``inter_sub_chunk``: the n(n−1)/2 tiles below the diagonal of each chunk's P, 2·c²·K each;
    * ``pv``: P times V over the n(n+1)/2 lower tiles of each chunk (diagonal tiles included:
      P is cast to the input dtype for this product, as kernels do), 2·c²·V each;
    * ``intra_sub_chunk``: the n diagonal tiles of P by Eq. 4, 2·c²·K each, every term also paying
      an exp and a subtraction (not counted) — the only full-precision part.

    Returns those five counts plus ``half_matmul`` (the first four summed), ``full_precision``
    (= ``intra_sub_chunk``) and ``half_fraction`` = half / (half + full). ``c = C`` is the one-level
    log-space form (``chunk_gla``): the whole intra-chunk P in full precision.
    """
    check_positive_ints(T=T, C=C, c=c, K=K, V=V)
    if C % c:
        raise ValueError(f"c={c} must divide C={C}")
    N, n = -(-T // C), C // c
    counts = {
        "state": 2 * N * C * K * V,
        "inter_chunk": 2 * N * C * K * V,
        "inter_sub_chunk": N * n * (n - 1) // 2 * 2 * c * c * K,
        "pv": N * n * (n + 1) // 2 * 2 * c * c * V,
        "intra_sub_chunk": N * n * 2 * c * c * K,
    }
    half = counts["state"] + counts["inter_chunk"] + counts["inter_sub_chunk"] + counts["pv"]
    full = counts["intra_sub_chunk"]
    return {**counts, "half_matmul": half, "full_precision": full, "half_fraction": half / (half + full)}


# Chapter 1 counts per head and per sequence (multiply by B·H); a multiply-add is 2 FLOPs, so an


# [m, n] @ [n, p] matmul costs 2·m·n·p. Only matmul FLOPs are counted (mask, softmax, normaliser


# and additions of states are lower order). K = V = d, the head dimension.


def check_positive_ints(**sizes):
    """Each keyword's value is a positive Python int (not a bool), else a ValueError naming the keyword:
    the sizes every cost model and timer takes (``B=..., T=..., K=...``)."""
    for name, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")


def flops_attention(T, d):
    """Parallel (softmax or linear) attention, O(T²d): ``QKᵀ`` is 2·T·T·d, the ``T×T`` weights
    times V another 2·T·T·d, so 4·T²·d. Dense: the causal mask does not remove work here."""
    check_positive_ints(T=T, d=d)
    return 4 * T * T * d


def flops_linear_recurrent(T, d):
    """The recurrent form of linear attention, O(Td²): per token ``S += k_tᵀ v_t`` (2·d²) and
    ``o_t = q_t S_t`` (2·d²), so 4·T·d². The reassociated ``Q(KᵀV)`` costs the same."""
    check_positive_ints(T=T, d=d)
    return 4 * T * d * d


def flops_chunkwise(T, C, d):
    """The chunkwise form, O(TCd + Td²): per chunk, intra ``(Q Kᵀ ⊙ M) V`` is 4·C²·d and inter
    ``Q S`` plus the state update ``Kᵀ V`` is 4·C·d². With N = ⌈T/C⌉ chunks (the last one padded
    to C, as kernels do) the total is N·(4C²d + 4Cd²) = 4TCd + 4Td² when C divides T.
    C = T is the parallel form plus the state; C = 1 the recurrent form plus the 1×1 "attention"."""
    check_positive_ints(T=T, C=C, d=d)
    N = -(-T // C)
    return N * (4 * C * C * d + 4 * C * d * d)


def kv_cache_bytes(T, H, d, dtype_bytes=2):
    """Bytes of a softmax-attention KV cache after T tokens: keys and values, each ``[T, H, d]``,
    per sequence and layer. Grows linearly with T."""
    check_positive_ints(T=T, H=H, d=d, dtype_bytes=dtype_bytes)
    return 2 * T * H * d * dtype_bytes


def state_bytes(H, K, V, dtype_bytes=4):
    """Bytes of the linear-attention state, one ``[K, V]`` matrix per head (float32 by default),
    per sequence and layer. Independent of T."""
    check_positive_ints(H=H, K=K, V=V, dtype_bytes=dtype_bytes)
    return H * K * V * dtype_bytes


def gla_io_bytes(B, T, H, K, V, dtype_bytes=2, gate="gla") -> int:
    """Bytes a GLA forward must read and write at least: q, k, v, the gates (fp32) and o."""
    gate_elems = {"none": 0, "const": H, "scalar": B * T * H, "gla": B * T * H * K}[gate]
    return (2 * B * T * H * K + 2 * B * T * H * V) * dtype_bytes + 4 * gate_elems


DATASHEET_PEAKS = {
    # Dense (no sparsity) bf16 tensor-core and fp32 CUDA-core rates and HBM bandwidth of the SXM parts,
    # from NVIDIA's H100 and H200 datasheets; keys as torch.cuda.get_device_name() returns them.
    "NVIDIA H100 80GB HBM3": {"bf16_TFLOPs": 989.0, "fp32_TFLOPs": 67.0, "hbm_GBps": 3350.0},
    "NVIDIA H200": {"bf16_TFLOPs": 989.0, "fp32_TFLOPs": 67.0, "hbm_GBps": 4800.0},
}
"""Datasheet peaks by device name. Every peaks dict here, measured ones included, has these keys."""


def datasheet_peaks(device: str):
    """The datasheet peaks of a device named as in a result's ``env["device"]``; None if unknown."""
    peaks = DATASHEET_PEAKS.get(device)
    return None if peaks is None else dict(peaks)


# Forward cost models. A cost is {"tc_flops", "fp32_flops", "bytes"} for a whole batch: matmul FLOPs


# on tensor cores (16-bit or TF32 operands), FLOPs of full-precision work off them (Eq. 4 in log


# space), and the compulsory HBM traffic: every kernel reads each input and writes each output


# once (a tile re-read by several programs is taken to hit L2). Elementwise work (exp, masks) is not


# counted. q, k, v, o take act_bytes (bf16: 2); gates and every intermediate are float32, except the
# materialised chunk states, which take state_bytes (default act_bytes: chunk_gla and chunk_simple_gla
# store them in the input dtype; 4 with their states_in_fp32=True).


def _cost(tc_flops=0, fp32_flops=0, nbytes=0):
    return {"tc_flops": tc_flops, "fp32_flops": fp32_flops, "bytes": nbytes}


def _add_costs(costs):
    return _cost(*(sum(c[key] for c in costs) for key in ("tc_flops", "fp32_flops", "bytes")))


def _chunk_state_bytes(B, T, H, K, V, C, dtype_bytes):
    """The states of every chunk, ``[B, H, ⌈T/C⌉, K, V]``, as chunk_gla materialises them, at
    ``dtype_bytes`` an element."""
    return B * -(-T // C) * state_bytes(H, K, V, dtype_bytes)


def _state_dtype_bytes(act_bytes, state_bytes):
    """Bytes of an element of a stored intermediate (a chunk state, A): ``state_bytes``, or the
    activations' when None (the default of chunk_gla and chunk_simple_gla: the input dtype)."""
    return act_bytes if state_bytes is None else state_bytes


def chunk_gla_stage_costs(B, T, H, K, V, C=64, c=16, act_bytes=2, gate_bytes=4, state_bytes=None,
                          a_bytes=None) -> dict:
    """Cost of each forward kernel of ``gla_ref.triton.chunk_gla`` (chapter 4), the FLOPs from
    :func:`two_level_flop_split`: ``cumsum`` (g, q, k → b, the float32 chunk-local cumulative
    log-gate log Λ, and the decayed operands ``scale·Q ⊙ Λ`` and ``K ⊙ Γ`` in the input dtype),
    ``state`` (the inter-chunk recurrence: K ⊙ Γ, v and each chunk's last b row → a state per
    chunk), ``intra`` (q, k, b → the ``C × C`` blocks A: sub-chunk pairs on tensor cores,
    diagonal tiles in float32) and ``output`` (Q ⊙ Λ, states, A, v → o by ``(Q ⊙ Λ) S + A V``). The states take
    ``state_bytes`` an element: None means ``act_bytes`` (chunk_gla's default), 4 its
    ``states_in_fp32=True``; A takes ``a_bytes``: None means ``act_bytes`` (stored in the input
    dtype), 4 for builds that stored it in float32."""
    state_bytes = _state_dtype_bytes(act_bytes, state_bytes)
    a_bytes = _state_dtype_bytes(act_bytes, a_bytes)
    check_positive_ints(B=B, T=T, H=H, K=K, V=V, C=C, c=c, act_bytes=act_bytes, gate_bytes=gate_bytes,
                   state_bytes=state_bytes, a_bytes=a_bytes)
    f = {key: B * H * n for key, n in two_level_flop_split(T, C, c, K, V).items() if key != "half_fraction"}
    xk, xv = B * T * H * K, B * T * H * V  # elements of q, k or b; of v or o
    states, A = _chunk_state_bytes(B, T, H, K, V, C, state_bytes), B * T * H * C * a_bytes
    last_rows = B * H * -(-T // C) * K * 4  # γ: the last b row of every chunk, float32
    return {
        "cumsum": _cost(nbytes=xk * (gate_bytes + 4 + 4 * act_bytes)),
        "state": _cost(f["state"], 0, (xk + xv) * act_bytes + last_rows + states),
        "intra": _cost(f["inter_sub_chunk"], f["intra_sub_chunk"], 2 * xk * act_bytes + xk * 4 + A),
        "output": _cost(f["inter_chunk"] + f["pv"], 0, xk * act_bytes + states + A + 2 * xv * act_bytes),
    }


def fused_chunk_gla_cost(B, T, H, K, V, C=16, act_bytes=2, gate_bytes=4) -> dict:
    """Cost of ``gla_ref.triton.fused_chunk_gla``'s forward (Alg. 5): q, k, v, g read, o written once in
    its dtype, no state leaving the chip. The whole ``C × C`` block P by Eq. 4 in float32 (``c = C``),
    the rest on tensor cores. (The kernel rebuilds P in each of a head's value blocks: it issues
    those float32 FLOPs ``⌈V/BV⌉`` times; the model counts the algorithm's.)"""
    check_positive_ints(B=B, T=T, H=H, K=K, V=V, C=C, act_bytes=act_bytes, gate_bytes=gate_bytes)
    f = two_level_flop_split(T, C, C, K, V)
    xk, xv = B * T * H * K, B * T * H * V
    return _cost(B * H * (f["state"] + f["inter_chunk"] + f["pv"]), B * H * f["intra_sub_chunk"],
                 xk * (2 * act_bytes + gate_bytes) + 2 * xv * act_bytes)


def chunk_simple_gla_cost(B, T, H, K, V, C=64, act_bytes=2, gate_bytes=4, state_bytes=None) -> dict:
    """Cost of ``gla_ref.triton.chunk_simple_gla``'s forward: a scalar gate per token and head, so
    the intra-chunk block is one ``C × C`` matmul (``c = C``, all on tensor cores); kernels: cumsum,
    state (a state per chunk, ``state_bytes`` an element: None means ``act_bytes``, the kernel's
    default), output (q, k, v, b, states → o); b is the chunk-local cumulative log-gate log Λ."""
    state_bytes = _state_dtype_bytes(act_bytes, state_bytes)
    check_positive_ints(B=B, T=T, H=H, K=K, V=V, C=C, act_bytes=act_bytes, gate_bytes=gate_bytes,
                   state_bytes=state_bytes)
    f = two_level_flop_split(T, C, C, K, V)
    xk, xv, xg = B * T * H * K, B * T * H * V, B * T * H
    states = _chunk_state_bytes(B, T, H, K, V, C, state_bytes)
    nbytes = (xg * (gate_bytes + 4)                                   # cumsum
              + (xk + xv) * act_bytes + xg * 4 + states               # state
              + (2 * xk + 2 * xv) * act_bytes + xg * 4 + states)      # output
    return _cost(B * H * (f["half_matmul"] + f["full_precision"]), 0, nbytes)


def sdpa_causal_cost(B, T, H, K, V, act_bytes=2) -> dict:
    """Cost of causal softmax attention by a FlashAttention-2-style forward: the ``T(T+1)/2`` pairs of
    the causal triangle at 2K FLOPs (``QKᵀ``) plus 2V (``PV``) each, on tensor cores (the softmax's
    exp not counted); q, k, v read and o written once, one float32 log-sum-exp per query kept for
    the backward. K = V = d gives half of :func:`flops_attention` plus the diagonal's 2Td."""
    check_positive_ints(B=B, T=T, H=H, K=K, V=V, act_bytes=act_bytes)
    pairs = T * (T + 1) // 2
    xk, xv = B * T * H * K, B * T * H * V
    return _cost(B * H * pairs * 2 * (K + V), 0, (2 * xk + 2 * xv) * act_bytes + B * H * T * 4)


def forward_cost(name, B, T, H, K, V, act_bytes=2, state_bytes=None, a_bytes=None) -> dict:
    """The forward cost of a candidate of ``benchmarks/bench_triton.py`` by its name, at the default
    chunk sizes of its kernel (chunk_gla and chunk_simple_gla 64 with sub-chunks of 16,
    fused_chunk_gla 16); ``state_bytes`` and ``a_bytes`` as in :func:`chunk_gla_stage_costs`."""
    models = {
        "chunk_gla": lambda: _add_costs(chunk_gla_stage_costs(B, T, H, K, V, act_bytes=act_bytes,
                                                              state_bytes=state_bytes, a_bytes=a_bytes).values()),
        "fused_chunk_gla": lambda: fused_chunk_gla_cost(B, T, H, K, V, act_bytes=act_bytes),
        "chunk_simple_gla": lambda: chunk_simple_gla_cost(B, T, H, K, V, act_bytes=act_bytes,
                                                          state_bytes=state_bytes),
        "sdpa_flash": lambda: sdpa_causal_cost(B, T, H, K, V, act_bytes=act_bytes),
    }
    if name not in models:
        raise ValueError(f"name must be one of {sorted(models)}, got {name!r}")
    return models[name]()


def forward_allocations(name, B, T, H, K, V, act_bytes=2, state_bytes=None, a_bytes=None, decayed=True) -> dict:
    """Bytes of each tensor that one forward of a ``gla_ref.triton`` kernel allocates at its default
    chunk size (64), no final state asked for, and holds at its end; their sum is the forward's peak
    memory above its inputs: ``chunk_gla`` b (the float32 chunk-local cumulative log-gate log Λ),
    ``qt`` (scale·Q ⊙ Λ from step 1, with ``decayed``), the states of every chunk, A and o;
    ``chunk_simple_gla`` the summed scalar gate, b, the states and o; ``fused_chunk_gla`` o alone.
    Keys name the tensors as the kernels do. (chunk_gla's step 1 also writes K ⊙ Γ, freed once the
    states are built, before A and o exist: it sets the peak instead of them only where K ⊙ Γ
    outweighs A and o together, K·act_bytes > 64·a_bytes + V·act_bytes, which no shape with V ≥ K
    does; that case raises a ValueError here.) The states take ``state_bytes`` an element: None means
    ``act_bytes`` (the kernels' default, states in the input dtype), 4 their ``states_in_fp32=True``
    (and every build before that option existed); chunk_gla's A takes ``a_bytes``: None means
    ``act_bytes`` (the input dtype), 4 for builds that stored it in float32. ``decayed=False``: builds
    before step 1 wrote the decayed operands (results stamped before 2026-11-26)."""
    state_bytes = _state_dtype_bytes(act_bytes, state_bytes)
    a_bytes = _state_dtype_bytes(act_bytes, a_bytes)
    check_positive_ints(B=B, T=T, H=H, K=K, V=V, act_bytes=act_bytes, state_bytes=state_bytes, a_bytes=a_bytes)
    xk, xv, xg = B * T * H * K, B * T * H * V, B * T * H
    if name == "chunk_gla" and decayed and K * act_bytes > 64 * a_bytes + V * act_bytes:
        raise ValueError(f"K={K}, V={V}: K ⊙ Γ outweighs A and o, so the peak is reached before the forward's "
                         "end; this model covers K * act_bytes <= 64 * a_bytes + V * act_bytes")
    qt = {"qt": xk * act_bytes} if decayed else {}
    allocs = {
        "chunk_gla": lambda: {"b": xk * 4, **qt, "states": _chunk_state_bytes(B, T, H, K, V, 64, state_bytes),
                              "A": B * T * H * 64 * a_bytes, "o": xv * act_bytes},
        "chunk_simple_gla": lambda: {"g": xg * 4, "b": xg * 4,
                                     "states": _chunk_state_bytes(B, T, H, K, V, 64, state_bytes),
                                     "o": xv * act_bytes},
        "fused_chunk_gla": lambda: {"o": xv * act_bytes},
    }
    if name not in allocs:
        raise ValueError(f"name must be one of {sorted(allocs)}, got {name!r}")
    return allocs[name]()


def roofline(cost: dict, peaks: dict, ms=None) -> dict:
    """A cost against a device's peaks (chapter 4's roofline bound with two compute ceilings):
    ``compute_ms`` = tensor-core FLOPs at the bf16 peak plus full-precision FLOPs at the fp32 peak,
    ``memory_ms`` = bytes at the HBM bandwidth, ``bound_ms`` the larger, ``limit`` which one it is,
    ``intensity`` FLOPs per byte.
    Given a measured time ``ms``: achieved ``TFLOPs`` and ``GBps``, and ``fraction`` = bound_ms / ms
    (1 means running at the roof)."""
    compute_ms = (cost["tc_flops"] / peaks["bf16_TFLOPs"] + cost["fp32_flops"] / peaks["fp32_TFLOPs"]) / 1e9
    memory_ms = cost["bytes"] / peaks["hbm_GBps"] / 1e6
    flops = cost["tc_flops"] + cost["fp32_flops"]
    out = {"compute_ms": compute_ms, "memory_ms": memory_ms, "bound_ms": max(compute_ms, memory_ms),
           "limit": "compute" if compute_ms >= memory_ms else "memory", "intensity": flops / cost["bytes"]}
    if ms is not None:
        if not ms > 0:
            raise ValueError(f"ms must be a positive time, got {ms!r}")
        out.update(TFLOPs=flops / ms / 1e9, GBps=cost["bytes"] / ms / 1e6, fraction=out["bound_ms"] / ms)
    return out


# TPU forward model (chapter 5). No TPU was available to this project: these are predictions from the
# cost models above, not measurements.

TPU_DATASHEET_PEAKS = {
    # Per chip, from Google Cloud's TPU v5e and v6e (Trillium) documentation: dense bf16 peak, HBM
    # bandwidth and the side of the MXU (systolic matrix unit) array. fp32_TFLOPs is not on those pages:
    # it is a model assumption, the bf16 peak / TPU_FP32_PASSES (a float32 matmul at HIGHEST precision is
    # done as six bf16 passes on the MXU).
    "TPU v5e": {"bf16_TFLOPs": 197.0, "hbm_GBps": 819.0, "mxu": 128},
    "TPU v6e": {"bf16_TFLOPs": 918.0, "hbm_GBps": 1640.0, "mxu": 256},
}
TPU_FP32_PASSES = 6
for _peaks in TPU_DATASHEET_PEAKS.values():
    _peaks["fp32_TFLOPs"] = _peaks["bf16_TFLOPs"] / TPU_FP32_PASSES
del _peaks


def mxu_utilisation(rows: int, mxu: int) -> float:
    """Model assumption: a matmul whose smallest side is ``rows`` uses ``min(1, rows / mxu)`` of an
    ``mxu × mxu`` systolic array (a 16-row tile fills 16/128 of a v5e MXU, 16/256 of a v6e one)."""
    check_positive_ints(rows=rows, mxu=mxu)
    return min(1.0, rows / mxu)


def tpu_forward_model(name, B, T, H, K, V, device, C=64, tile_rows=16, act_bytes=2) -> dict:
    """Predicted forward time of a Pallas kernel on a TPU: the roofline of the cost models above with
    each matmul's FLOPs slowed by its :func:`mxu_utilisation`.

    ``name``: ``"chunk_gla"`` (non-fused, two-level tiles of ``tile_rows``; bytes of
    :func:`chunk_gla_stage_costs` as the Pallas kernels move them: float32 states, no A in HBM),
    ``"fused_chunk_gla"`` (the same chunk math, no state leaving the chip: bytes of
    :func:`fused_chunk_gla_cost`) or ``"chunk_simple_gla"`` (scalar gate, ``mode="chunk"``: every
    intra-chunk FLOP a matmul; bytes of :func:`chunk_simple_gla_cost` with float32 states); FLOPs
    of :func:`two_level_flop_split` for all three; ``tile_rows = C`` is the whole-chunk tile the Mosaic launcher uses
    for a scalar gate, 16 the two-level one. ``device`` is a key of :data:`TPU_DATASHEET_PEAKS`.
    The chunk-state and inter-chunk matmuls have ``min(C, K, V)`` as smallest side, the intra-chunk
    ones ``tile_rows``; GLA's diagonal tiles run in float32 at the modelled fp32 rate.

    Returns ``{"compute_ms", "memory_ms", "bound_ms", "limit", "ideal_compute_ms", "mxu_fraction"}``:
    ``ideal_compute_ms`` with every matmul at full MXU use, ``mxu_fraction`` = ideal / penalised
    matmul time."""
    if device not in TPU_DATASHEET_PEAKS:
        raise ValueError(f"device must be one of {sorted(TPU_DATASHEET_PEAKS)}, got {device!r}")
    models = ("chunk_gla", "fused_chunk_gla", "chunk_simple_gla")
    if name not in models:
        raise ValueError(f"name must be one of {models}, got {name!r}")
    check_positive_ints(B=B, T=T, H=H, K=K, V=V, C=C, tile_rows=tile_rows, act_bytes=act_bytes)
    if C % tile_rows:
        raise ValueError(f"tile_rows={tile_rows} must divide C={C}")
    peaks = TPU_DATASHEET_PEAKS[device]
    split = {key: B * H * n for key, n in two_level_flop_split(T, C, tile_rows, K, V).items()
             if key != "half_fraction"}
    if name == "chunk_gla":  # Pallas: float32 states; A rebuilt on chip by the output kernel, which reads k
        stages = chunk_gla_stage_costs(B, T, H, K, V, C, tile_rows, act_bytes, state_bytes=4)
        A, xk = B * T * H * C * act_bytes, B * T * H * K
        nbytes = (stages["cumsum"]["bytes"] + stages["state"]["bytes"] + stages["output"]["bytes"]
                  - A + xk * act_bytes)
    elif name == "fused_chunk_gla":
        nbytes = fused_chunk_gla_cost(B, T, H, K, V, C, act_bytes)["bytes"]
    else:  # mode="chunk" (float32 states); mode="auto" without states runs the fused kernel
        nbytes = chunk_simple_gla_cost(B, T, H, K, V, C, act_bytes, state_bytes=4)["bytes"]
    big, small = min(C, K, V), tile_rows
    matmuls = [(split["state"], big), (split["inter_chunk"], big), (split["inter_sub_chunk"], small),
               (split["pv"], small)]
    fp32 = split["intra_sub_chunk"]
    if name == "chunk_simple_gla":  # the diagonal tiles are matmuls too: (Q Kᵀ) ⊙ D
        matmuls.append((fp32, small))
        fp32 = 0
    mxu = peaks["mxu"]
    ideal_mm = sum(f for f, _ in matmuls) / peaks["bf16_TFLOPs"] / 1e9
    penalised_mm = sum(f / mxu_utilisation(m, mxu) for f, m in matmuls) / peaks["bf16_TFLOPs"] / 1e9
    fp32_ms = fp32 / peaks["fp32_TFLOPs"] / 1e9
    compute_ms, memory_ms = penalised_mm + fp32_ms, nbytes / peaks["hbm_GBps"] / 1e6
    return {"compute_ms": compute_ms, "memory_ms": memory_ms, "bound_ms": max(compute_ms, memory_ms),
            "limit": "compute" if compute_ms >= memory_ms else "memory",
            "ideal_compute_ms": ideal_mm + fp32_ms, "mxu_fraction": ideal_mm / penalised_mm}
