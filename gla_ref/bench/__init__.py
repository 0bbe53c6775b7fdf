"""Measuring GLA: the benchmark registry and its runner, cost models, timers, stored results, stages.

The registry (``python -m gla_ref.bench list``; ``python -m gla_ref.bench run SUITE``):

* :mod:`gla_ref.bench.inputs`     — what the kernels are fed: the paper's gate strength and setups, torch
  and JAX inputs, packed batches;
* :mod:`gla_ref.bench.candidates` — what is timed: every candidate by name, ours and the peers' (FLA,
  SDPA, the PyTorch chunk form), built lazily; a missing peer is reported, never a crash;
* :mod:`gla_ref.bench.measures`   — forward, forward+backward, peak memory as training allocates it, first
  call in a fresh process, the roofline fraction: one definition each, their methods in words;
* :mod:`gla_ref.bench.suites`     — the named sets of shapes (headline, paper, varlen, long, pallas,
  sequence_parallel; decode, throughput and mqar planned), each with its cost and chapter;
* :mod:`gla_ref.bench.runner`     — one resumable runner writing one file per suite per device.

The pieces they stand on:

* :mod:`gla_ref.bench.models`  — FLOPs and bytes of each form and kernel, device peaks, the roofline
  (plain arithmetic: chapters 1, 3, 4 and 7);
* :mod:`gla_ref.bench.timing`  — CUDA-event, JAX and wall-clock timers, peak memory, the stamp
  (:func:`environment`) every stored result carries;
* :mod:`gla_ref.bench.results` — reading the stored results (shipped with the package) and the curves
  drawn from them;
* :mod:`gla_ref.bench.stages`  — the forward passes cut into the stages chapters 4 and 7 time apart;
* :mod:`gla_ref.bench.profiling` — CUDA time per kernel of a repeated step, and the host's side of it;
* :mod:`gla_ref.bench.ranks`   — the step each rank of a sequence-parallel candidate runs.

Special studies that are not suites are small scripts in the repository's ``benchmarks/`` folder, built
on this registry (``benchmarks/README.md`` maps each to the suite that replaces it). Every name below is
importable from ``gla_ref.bench`` itself; importing it loads no framework.
"""

from gla_ref.bench.candidates import CANDIDATES, Unavailable, candidate, instantiate  # noqa: F401
from gla_ref.bench.inputs import (  # noqa: F401
    GATE_STRENGTH,
    HEADLINE_SHAPES,
    PAPER_GATE,
    PAPER_SETUPS,
    VARLEN_LENGTHS,
    jax_inputs,
    packed_inputs,
    parse_shape,
    torch_inputs,
)
from gla_ref.bench.measures import METHODS, first_call, measure, peak_memory, roofline_fraction  # noqa: F401

from gla_ref.bench.models import (  # noqa: F401
    DATASHEET_PEAKS,
    chunk_gla_stage_costs,
    chunk_simple_gla_cost,
    datasheet_peaks,
    flops_attention,
    flops_chunkwise,
    flops_linear_recurrent,
    forward_allocations,
    forward_cost,
    fused_chunk_gla_cost,
    gla_io_bytes,
    kv_cache_bytes,
    roofline,
    sdpa_causal_cost,
    state_bytes,
    two_level_flop_split,
)
from gla_ref.bench.results import (  # noqa: F401
    ENV_STAMP,
    SCRIPTS,
    common_series,
    crossover_T,
    hint,
    latest_results,
    load_results,
    results_dir,
    series,
    slug,
    write_result,
)
from gla_ref.bench.runner import list_text, run_suite  # noqa: F401
from gla_ref.bench.stages import torch_chunk_parts, triton_chunk_stages  # noqa: F401
from gla_ref.bench.suites import SUITES, suite  # noqa: F401
from gla_ref.bench.timing import (  # noqa: F401
    copy_bandwidth_cuda,
    cuda_graph,
    environment,
    matmul_tflops_cuda,
    peak_memory_cuda,
    repository_commit,
    show_tuning,
    start_gpu_run,
    time_cuda,
    time_jax,
    time_wall,
)
