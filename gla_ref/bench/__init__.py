"""Measuring GLA: cost models, timers, stored results, and the forms cut into timeable stages.

* :mod:`gla_ref.bench.models`  — FLOPs and bytes of each form and kernel, device peaks, the roofline
  (plain arithmetic: chapters 1, 3, 4 and 7);
* :mod:`gla_ref.bench.timing`  — CUDA-event, JAX and wall-clock timers, peak memory, the stamp
  (:func:`environment`) every stored result carries;
* :mod:`gla_ref.bench.results` — reading the stored results (shipped with the package) and the curves
  drawn from them;
* :mod:`gla_ref.bench.stages`  — the forward passes cut into the stages chapters 4 and 7 time apart.

The scripts that produce results live in the repository's ``benchmarks/`` folder, not here. Every name
below is importable from ``gla_ref.bench`` itself; importing it loads no framework.
"""

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
from gla_ref.bench.stages import torch_chunk_parts, triton_chunk_stages  # noqa: F401
from gla_ref.bench.timing import (  # noqa: F401
    copy_bandwidth_cuda,
    cuda_graph,
    environment,
    matmul_tflops_cuda,
    peak_memory_cuda,
    show_tuning,
    start_gpu_run,
    time_cuda,
    time_jax,
    time_wall,
)
