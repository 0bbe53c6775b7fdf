"""The suites: named sets of shapes, each with its candidates, its measures, its cost and the chapter that reads it.

``python -m gla_ref.bench list`` shows them; ``python -m gla_ref.bench run SUITE`` measures one into
``benchmarks/results/<suite>_<device>.json`` (:mod:`gla_ref.bench.runner`). A suite's :meth:`Suite.tasks`
is its plan: one ``(candidate, point, measures)`` per row, the full plan on a GPU, a tiny one (``smoke``:
1–2 points, float32, shapes Triton's and Pallas' interpreters run in seconds) on a CPU. A *planned* suite
has shapes but no runner yet: ``list`` says so and ``run`` refuses, naming what is missing.

The H200 minutes are estimates from the stored results of the scripts each suite replaces (their
``wall_s``), until the suite itself has run (``minutes_measured``). ``headline``'s: speed_vs_fla.py's 23 minutes
for the same shapes in one process, plus a fresh process per candidate and shape for the first call
(first_call.py: 1.5–2 minutes each for ours; FLA's longer). Importing this module loads no framework.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from gla_ref.bench.candidates import candidate
from gla_ref.bench.inputs import HEADLINE_SHAPES, PAPER_SETUPS, VARLEN_LENGTHS

TS = (1024, 2048, 4096, 8192, 16384)
"""The lengths of the speed comparisons (1K…16K)."""
TIMED = ("fwd", "fwd_bwd", "peak", "roofline")


@dataclasses.dataclass(frozen=True)
class Task:
    """One row to measure: a candidate, a point (:mod:`gla_ref.bench.candidates`), the measures."""

    name: str
    point: dict
    measures: tuple

    @property
    def key(self) -> str:
        """The row's own key, ``name=... B=... T=...`` (the point's fields in a fixed order): what a resumed run
        skips, and what ``--only`` filters on."""
        return " ".join(f"{k}={_text(v)}" for k, v in [("name", self.name), *sorted_point(self.point)])

    def fields(self) -> dict:
        """The key's fields as text (``name``, every point key, and ``KxV``): what ``--only`` matches."""
        out = {k: _text(v) for k, v in [("name", self.name), *sorted_point(self.point)]}
        if "K" in self.point and "V" in self.point:
            out["KxV"] = f"{self.point['K']}x{self.point['V']}"
        return out


POINT_ORDER = ("setup", "devices", "B", "T", "H", "K", "V", "dtype", "gate", "chunk_size", "lengths", "attention")


def sorted_point(point: dict):
    """The point's items, in :data:`POINT_ORDER` (then any other key by name)."""
    rank = {k: i for i, k in enumerate(POINT_ORDER)}
    return sorted(point.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def _text(value) -> str:
    if isinstance(value, (list, tuple)):
        return "+".join(map(str, value))
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    return str(value)


@dataclasses.dataclass(frozen=True)
class Suite:
    """A named set of shapes. ``plan(smoke) -> [Task]``; ``planned``: what is missing for a suite that has no
    runner yet (None: runnable); ``minutes``: estimated H200 minutes for the whole suite; ``isolate``: each row
    in its own process (a compile that hangs is killed after ``row_timeout_s``, which also bounds the fresh process
    of a first call); ``stop_after_oom``: once a
    candidate runs out of memory, its larger T at the same sizes are skipped; ``timing``: the timer's warm-up
    and repetitions; ``pairs``: (ours, peer) whose time ratios the result lists; ``kind``: the machine it needs."""

    name: str
    what: str
    chapter: str
    shapes: str
    minutes: float
    candidates: tuple
    measures: tuple
    plan: Callable[[bool], list] | None = None
    planned: str | None = None
    minutes_measured: bool = False
    isolate: bool = False
    row_timeout_s: float = 240.0
    stop_after_oom: bool = False
    timing: dict = dataclasses.field(default_factory=dict)
    pairs: tuple = ()
    kind: str = "nvidia-h200"
    replaces: tuple = ()

    def tasks(self, smoke: bool = False) -> list:
        """The rows of this suite, in the order they run."""
        if self.plan is None:
            raise NotRunnable(self)
        return self.plan(smoke)


class NotRunnable(RuntimeError):
    """``run`` of a planned suite: it has shapes but no runner yet."""

    def __init__(self, suite: Suite):
        super().__init__(f"suite {suite.name!r}: planned, no runner yet — {suite.planned}")


def _gate(name):
    return candidate(name).gates[0]


def _grid(names, sizes, Ts, measures, first_at_first_T=False, **fixed):
    """Tasks over ``sizes`` (dicts), then ``Ts``, then candidates, each at its default gate."""
    out = []
    for size in sizes:
        for i, T in enumerate(Ts):
            for name in names:
                extra = ("first",) if first_at_first_T and i == 0 else ()
                point = {**fixed, **size, "T": T, "gate": fixed.get("gate", _gate(name))}
                out.append(Task(name, point, extra + tuple(measures)))
    return out


HEADLINE = ("chunk_gla", "fused_chunk_gla", "chunk_simple_gla", "fla.chunk_gla", "fla.chunk_simple_gla",
            "sdpa_flash", "torch_ref.chunk_gla")
SQUARE_ONLY = ("sdpa_flash", "torch_ref.chunk_gla")
"""Softmax attention needs K = V; the PyTorch chunk form is the I/O-unaware baseline: both at K = V only."""


def _headline(smoke):
    if smoke:
        return _grid(("chunk_gla", "fla.chunk_gla"), [{"K": 16, "V": 16}], (20,), TIMED, True,
                     B=1, H=1, dtype="float32")
    tasks = _grid(HEADLINE, [{"K": K, "V": V} for K, V in HEADLINE_SHAPES], TS, TIMED, True, B=8, H=16,
                  dtype="bfloat16")
    return [t for t in tasks if t.name not in SQUARE_ONLY or t.point["K"] == t.point["V"]]


def _paper(smoke):
    v1, icml, right = (PAPER_SETUPS[s] for s in ("v1_fig2_left", "icml_fig2", "v1_fig2_right"))
    if smoke:
        return [Task("chunk_gla.state", {"setup": "v1_fig2_right", "B": 1, "T": 32, "H": 1, "K": 16, "V": 16,
                                         "dtype": "float32", "gate": "gla", "chunk_size": 16}, ("fwd",)),
                Task("sdpa_flash", {"setup": "icml_fig2", "B": 1, "T": 32, "H": 1, "K": 16, "V": 16,
                                    "dtype": "float32", "gate": "none"}, TIMED)]
    out = []
    att = {"H": v1["attention"]["H"], "K": v1["attention"]["D"], "V": v1["attention"]["D"]}
    for T in TS:
        gla = {k: v1["gla"][k] for k in ("H", "K", "V")}
        for name in ("chunk_gla", "fused_chunk_gla"):
            out.append(Task(name, {"setup": "v1_fig2_left", "B": v1["B"], "T": T, **gla, "dtype": "bfloat16",
                                   "gate": "gla"}, TIMED))
        for name in ("sdpa_flash", "sdpa_cudnn"):
            out.append(Task(name, {"setup": "v1_fig2_left", "B": v1["B"], "T": T, **att, "dtype": "bfloat16",
                                   "gate": "none"}, TIMED))
    for T in TS:
        lin = {"H": icml["gla"]["H"], "K": icml["gla"]["K"], "V": icml["gla"]["V"]}
        for name in ("chunk_simple_gla", "fused_chunk_gla", "torch_ref.chunk_gla"):
            out.append(Task(name, {"setup": "icml_fig2", "B": icml["B"], "T": T, **lin, "dtype": "bfloat16",
                                   "gate": "none", "chunk_size": 64}, TIMED))
        for name in ("sdpa_flash", "sdpa_cudnn"):
            out.append(Task(name, {"setup": "icml_fig2", "B": icml["B"], "T": T, **lin, "dtype": "bfloat16",
                                   "gate": "none"}, TIMED))
    stages = ("torch_ref.chunk_gla.inter", "torch_ref.chunk_gla.intra", "chunk_gla.cumsum", "chunk_gla.state",
              "chunk_gla.intra", "chunk_gla.output", "chunk_gla", "fused_chunk_gla")
    for C in right["chunk_sizes"]:
        for name in stages:
            out.append(Task(name, {"setup": "v1_fig2_right", "B": right["B"], "T": right["T"],
                                   **{k: right["gla"][k] for k in ("H", "K", "V")}, "dtype": "bfloat16",
                                   "gate": "gla", "chunk_size": C}, ("fwd",)))
    return out


def _varlen(smoke):
    names = ("chunk_gla", "chunk_gla.padded") if smoke else ("chunk_gla", "chunk_gla.padded", "fla.chunk_gla")
    sizes = {"H": 1, "K": 16, "V": 16, "dtype": "float32"} if smoke else {"H": 16, "K": 128, "V": 128,
                                                                           "dtype": "bfloat16"}
    lengths = (9, 1, 20) if smoke else VARLEN_LENGTHS
    measures = ("fwd_bwd", "peak") if smoke else ("first", *TIMED[:3])
    return [Task(name, {"B": 1, "T": sum(lengths), **sizes, "gate": "gla", "lengths": list(lengths)}, measures)
            for name in names]


LONG = ("chunk_gla", "fused_chunk_gla", "chunk_simple_gla", "fla.chunk_gla", "fla.chunk_simple_gla")


def _long(smoke):
    if smoke:
        return _grid(("chunk_gla",), [{"K": 16, "V": 16}], (16,), TIMED[:3], B=1, H=1, dtype="float32")
    return _grid(LONG, [{"K": 128, "V": 128}], tuple(2 ** e for e in range(15, 23)), TIMED[:3], B=1, H=16,
                 dtype="bfloat16")


PALLAS = tuple(f"pallas.{k}[{launcher}]" for k in ("chunk_gla", "fused_chunk_gla", "chunk_simple_gla")
               for launcher in ("gpu", "mosaic_gpu", "tpu")) + ("jax_ref.chunk_gla", "chunk_gla", "fused_chunk_gla")


PALLAS_FUSED_64 = ("pallas.fused_chunk_gla[gpu]", "pallas.fused_chunk_gla[mosaic_gpu]", "fused_chunk_gla")
"""Also at K = V = 64, where the Mosaic GPU fused kernels fit (K ≤ 64)."""


def _pallas(smoke):
    if smoke:
        return _grid(("pallas.chunk_gla[gpu]",), [{"K": 16, "V": 16}], (16,), ("fwd", "peak"), B=1, H=1,
                     dtype="float32", chunk_size=16)
    Ts, fixed = (1024, 4096, 16384), {"B": 8, "H": 16, "dtype": "bfloat16"}
    return (_grid(PALLAS, [{"K": 128, "V": 128}], Ts, TIMED, **fixed)
            + _grid(("pallas.chunk_simple_gla[gpu]", "pallas.chunk_simple_gla[mosaic_gpu]", "chunk_simple_gla"),
                    [{"K": 128, "V": 128}], Ts, TIMED, gate="scalar", **fixed)
            + _grid(PALLAS_FUSED_64, [{"K": 64, "V": 64}], Ts, TIMED, **fixed))


def _sequence_parallel(smoke):
    if smoke:
        return [Task("sp.torch.chunk_gla", {"devices": 2, "B": 1, "T": 32, "H": 1, "K": 16, "V": 16,
                                            "dtype": "float32", "gate": "gla", "chunk_size": 16}, ("fwd_bwd", "peak"))]
    return [Task("sp.torch.chunk_gla", {"devices": n, "B": 1, "T": 2 ** e, "H": 16, "K": 128, "V": 128,
                                        "dtype": "bfloat16", "gate": "gla"}, ("fwd_bwd", "peak"))
            for n in (1, 2) for e in range(14, 23)]


def _suites():
    entries = [
        Suite("headline", "the speed targets: forward and forward+backward time, peak memory, first call (fresh "
              "process, at each shape's first T) and the forward's roofline fraction of our Triton kernels against "
              "FLA's, same process, same inputs", "7 (benchmarks), 4 (first call)",
              "B=8, H=16, bf16, gates of the paper's strength; (K, V) = 64x64, 128x128, 128x256, 256x512; "
              "T = 1K, 2K, 4K, 8K, 16K; SDPA flash and the PyTorch chunk form at K = V", 65, HEADLINE,
              ("first",) + TIMED, _headline, stop_after_oom=True,
              pairs=(("chunk_gla", "fla.chunk_gla"), ("fused_chunk_gla", "fla.chunk_gla"),
                     ("chunk_simple_gla", "fla.chunk_simple_gla")),
              replaces=("speed_vs_fla.py", "bench_triton.py")),
        Suite("paper", "the GLA paper's own speed figures rerun: v1 Fig. 2 left (GLA vs FlashAttention-2, fwd+bwd "
              "and memory), ICML Fig. 2 (linear attention with and without materialised states vs FlashAttention-2 "
              "and the PyTorch chunk form) and v1 Fig. 2 right (forward stages against chunk size)", "7 (the paper's "
              "figures), 3 (chunk size)", "v1 Fig. 2 left: B=32, GLA H=4 K=128 V=256 vs attention 16 heads of 64; "
              "ICML Fig. 2: B=32, H=16, K=V=64, no gate, C=64; both T = 1K…16K; chunk sizes: B=32, T=2048, H=4, "
              "K=128, V=256, C = 16…256", 6, ("chunk_gla", "fused_chunk_gla", "chunk_simple_gla",
                                              "torch_ref.chunk_gla", "sdpa_flash", "sdpa_cudnn",
                                              "torch_ref.chunk_gla.inter", "torch_ref.chunk_gla.intra",
                                              "chunk_gla.cumsum", "chunk_gla.state", "chunk_gla.intra",
                                              "chunk_gla.output"), TIMED, _paper,
              timing={"warmup": 5, "rep": 20},
              replaces=("bench_paper_setups.py", "bench_chunk_size.py")),
        Suite("varlen", "a packed batch of mixed lengths (cu_seqlens) against the same sequences padded, and "
              "against FLA's varlen chunk_gla: time, peak memory, first call", "7 (variable lengths)",
              "12 sequences of 1…9000 tokens (32 769 in all, 108 000 padded), H=16, K=V=128, bf16", 8,
              ("chunk_gla", "chunk_gla.padded", "fla.chunk_gla"), ("first",) + TIMED[:3], _varlen,
              replaces=("bench_varlen.py",)),
        Suite("long", "the longest sequences one H200 holds: forward+backward time and peak memory as T doubles "
              "until each candidate runs out of memory", "7 (long sequences)",
              "B=1, H=16, K=V=128, bf16, T = 32K, 64K, …, 4M (larger T skipped after an out-of-memory)", 15, LONG,
              TIMED[:3], _long, stop_after_oom=True),
        Suite("pallas", "the Pallas kernels on every launcher (Triton backend, Mosaic GPU, TPU where present), the "
              "JAX reference under jit and our Triton kernels at the same sizes: compile time apart, forward and "
              "forward+backward, XLA's memory plan", "5 (Pallas)",
              "B=8, H=16, bf16, C=64, T = 1K, 4K, 16K; K=V=128 (GLA gates; chunk_simple_gla with g_gamma and with "
              "a scalar gate), the fused kernels also at K=V=64", 40, PALLAS + ("chunk_simple_gla",), TIMED, _pallas,
              isolate=True,
              row_timeout_s=300.0, timing={"warmup": 5, "rep": 50},
              replaces=("bench_pallas.py", "pallas_harness.py", "pallas_mosaic_gpu_check.py (timing)")),
        Suite("sequence_parallel", "one sequence over 2 GPUs against 1: a training step's time (slowest rank), peak "
              "memory (largest rank) and the bytes each rank moves, T doubling until out of memory",
              "9 (sequence parallelism)", "B=1, H=16, K=V=128, bf16, devices = 1, 2, T = 16K…4M", 10,
              ("sp.torch.chunk_gla",), ("fwd_bwd", "peak"), _sequence_parallel, stop_after_oom=True,
              timing={"warmup": 3, "rep": 10}, kind="nvidia-h200-x2", replaces=("sequence_parallel_bench.py",)),
        Suite("decode", "token-by-token generation: the recurrent step with a state (ours and FLA's "
              "fused_recurrent_gla) against softmax attention reading a KV cache, per token and per batch",
              "8 (models)", "the GLA LM at 340M and 1.3B widths, B = 1, 8, 64, contexts 1K…16K", 15,
              ("fused_recurrent_gla", "fla.fused_recurrent_gla", "sdpa_flash"), ("fwd", "peak"),
              planned="needs the model-scale work: gla_ref.layers' language model with a decoding cache "
                      "(generate with past_key_values) and a task that times it"),
        Suite("throughput", "training throughput (tokens/s) and memory of the GLA language model against FLA's GLA "
              "model and a Transformer of the same width", "8 (models)",
              "340M and 1.3B configurations, T = 2K, 4K, 8K, tokens per step 0.5M", 30,
              ("chunk_gla", "fla.chunk_gla", "sdpa_flash"), ("fwd_bwd", "peak"),
              planned="needs the model-scale work: the GLA LM's training step at the paper's sizes as a candidate "
                      "(gla_ref.layers) and FLA's and a Transformer's beside it"),
        Suite("mqar", "multi-query associative recall accuracy of the four gate families against width and number "
              "of pairs (paper Fig. 4)", "8 (MQAR)", "widths 32/64/128 × 8/16/32 pairs, T = 128, 4 mixers × 3 seeds, "
              "1200 steps each", 6, ("fused_recurrent_gla",), ("accuracy",),
              planned="needs the model-scale work: a training-run candidate (gla_ref.tasks.mqar) and an accuracy "
                      "measure in the registry; benchmarks/mqar_sweep.py runs it meanwhile",
              replaces=("mqar_sweep.py",)),
    ]
    return {s.name: s for s in entries}


SUITES = _suites()
"""Every suite by name, runnable ones first."""


def suite(name: str) -> Suite:
    """The suite called ``name``; a ValueError listing the names otherwise."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; suites: {', '.join(SUITES)}")
    return SUITES[name]
