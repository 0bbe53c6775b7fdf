"""Stored results: where they are, how they are read, and the curves chapters draw from them.

Benchmark scripts (``benchmarks/*.py`` in the repository) write JSON files named
``<prefix>_<device>.json`` into ``benchmarks/results/``. The same files travel inside the
package as ``gla_ref.bench.stored``, so a pip-installed ``gla_ref`` finds them too:
:func:`results_dir` says which folder is read, :func:`latest_results` picks the newest file of a kind.
"""

from __future__ import annotations

import pathlib


ENV_STAMP = ("device", "date", "python")
"""Keys every stored result's ``env`` must hold (written by :func:`gla_ref.bench.environment`)."""


def slug(text: str) -> str:
    """``text`` as part of a file name: lower case, every run of other characters one underscore
    (``"NVIDIA H200"`` → ``"nvidia_h200"``): how result files name their device."""
    import re

    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def load_results(path) -> dict:
    """A stored benchmark result (JSON). A ValueError unless it carries the stamp of where it was
    measured, ``env`` with :data:`ENV_STAMP` and a torch or jax version, and a list of ``rows``."""
    import json

    path = pathlib.Path(path)
    data = json.loads(path.read_text())
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        raise ValueError(f"{path.name}: no 'env' stamp; a result must record its device, versions and "
                         "date (gla_ref.bench.environment())")
    missing = [key for key in ENV_STAMP if not env.get(key)]
    if not any(env.get(fw) for fw in ("torch", "jax")):
        missing.append("a torch or jax version")
    if missing:
        raise ValueError(f"{path.name}: the 'env' stamp lacks {', '.join(missing)}")
    if not isinstance(data.get("rows"), list):
        raise ValueError(f"{path.name}: expected a list of rows under 'rows'")
    return data


SCRIPTS = {
    "triton_bench": "bench_triton.py",
    "chunk_size_sweep": "bench_chunk_size.py",
    "pallas_bench": "bench_pallas.py",
    "grad_memory": "grad_memory.py",
    "chunk_profile": "profile_chunk.py",
    "triton_accuracy": "triton_accuracy.py",
    "triton_config_sweep": "triton_config_sweep.py",
    "notebooks": "run_notebooks.py",
    "gpu_notebook_check": "run_notebooks.py",
    "mqar": "mqar_sweep.py",
    "sequence_parallel": "sequence_parallel_bench.py",
    "fla_layer": "fla_layer_check.py",
    "paper_setups": "bench_paper_setups.py",
    "varlen": "bench_varlen.py",
    "head_sizes_accuracy": "triton_accuracy.py --shapes heads",
    "paper_chunk_size_sweep": "bench_chunk_size.py --B 32 --H 4 --K 128 --V 256 --T 2048 "
                              "--out benchmarks/results/paper_chunk_size_sweep_<device>.json",
    "first_call": "first_call.py",
    "config_timings": "first_call.py --out benchmarks/results/config_timings_<device>.json",
    "speed_vs_fla": "speed_vs_fla.py",
    "cuda_graphs": "cuda_graphs.py",
    "state_configs": "state_configs.py",
    "state_tiles_speed": "speed_vs_fla.py --gpu-turns LOCK --shapes KxV --only chunk_gla --out X (one process per shape),"
                         " then speed_vs_fla.py --merge X ... --out benchmarks/results/state_tiles_speed_<device>.json",
    "state_tiles_fla_64x64": "speed_vs_fla.py --shapes 64x64 --T 1024 2048 4096 --only chunk_gla fla.chunk_gla"
                             " --out benchmarks/results/state_tiles_fla_64x64_<device>.json",
    "fused_rerun_speed_vs_fla": "speed_vs_fla.py --shapes 64x64 128x128 --out benchmarks/results/fused_rerun_speed_vs_fla_<device>.json"
                                " (then --shapes 128x256, and 256x512, --only chunk_gla fused_chunk_gla fla.chunk_gla:"
                                " one process each, rows merged)",
    "gc_in_state_kernel": "speed_vs_fla.py --shapes 128x128 256x512 --T 1024 16384 --only chunk_gla"
                          " (from the stored base_commit, and from it with the stored patch applied; rows merged)",
    "decayed_operands": "speed_vs_fla.py --shapes 128x128 --only chunk_gla fla.chunk_gla (then --shapes 256x512"
                        " --T 1024 4096 16384; rows merged), profile_chunk.py --T 1024 4096 16384 --only chunk_gla (and"
                        " --shape 256x512 --forward --T 1024 16384: profile_rows); ab_rows from a one-off A/B of the forward"
                        " against the stored base_commit (see the file's note)",
    "launch_cache": "speed_vs_fla.py --shapes 64x64 --only chunk_gla fused_chunk_gla fla.chunk_gla (then --shapes 128x128,"
                    " and 128x256, --only chunk_gla fla.chunk_gla: one process each, rows merged), launch_overhead.py"
                    " (ab_rows, launch_us); base_rows from the stored base_commit (see the file's note)",
    "fused_tiles": "fused_tiles.py --fla (one process per shape, rows merged with --keep)",
    "fused_dk_sync": "speed_vs_fla.py --shapes 128x256 --gpu-turns LOCK (and 256x512, side by side: speed_T1024_rows);"
                     " rows, kernel_rows and config_rows from one-off A/B scripts against the stored base_commit"
                     " (see the file's note)",
    "all_shapes_vs_fla": "speed_vs_fla.py --gpu-turns LOCK --shapes KxV --only chunk_gla fused_chunk_gla fla.chunk_gla"
                         " --out X (and --only chunk_simple_gla fla.chunk_simple_gla: eight processes side by side),"
                         " then speed_vs_fla.py --merge X ... --out benchmarks/results/all_shapes_vs_fla_<device>.json",
    "fused_tf32_rounding": "triton_accuracy.py fused_chunk_gla (its inputs, run and errors, and speed_vs_fla.py's measure,"
                           " called by a one-off A/B script on the stored base_commit, with and without the stored patch;"
                           " see the file's note)",
    "fused_dg_error_model": "fused_dg_error_model.py",
    "chunk_simple_rerun": "speed_vs_fla.py --gpu-turns LOCK --shapes KxV --only chunk_simple_gla fla.chunk_simple_gla"
                          " --out X (128x128 and 64x64 side by side), then speed_vs_fla.py --merge X ... --out"
                          " benchmarks/results/chunk_simple_rerun_<device>.json",
    "fused_dg_restart": "triton_accuracy.py fused_chunk_gla (its inputs, run and errors, and speed_vs_fla.py's measure,"
                        " called by a one-off A/B script stored in the file, at the branch and at base_commit), and"
                        " profile_chunk.py --shape KxV --T 4096 --only fused_chunk_gla (kernel_rows)",
    "fused_state_operands": "triton_accuracy.py fused_chunk_gla (variant_accuracy_rows), and one-off scripts stored in the"
                            " file (scripts.ab_time: rows, fused_chunk_gla's forward and backward at base_commit and after,"
                            " one process; scripts.variants: variant_rows and layout_rows, the forward and dv kernels at"
                            " fixed configs; see its note)",
    "forward_only": "profile_chunk.py (kernel_times) and speed_vs_fla.py (make_inputs), called by one-off scripts stored"
                    " in the file, at its base_commit with its patch applied (the patch's benchmarks/forward_only.py"
                    " --T 16384: rows, accuracy; scripts.ab_lean with scripts.make_variants: variant_rows;"
                    " scripts.regs_json: sm90_registers, compiled on a CPU; see its note); gates_and_A_rows from"
                    " scripts.gates_and_A_bench (see gates_and_A_note)",
    "fused_key_split_probe": "profile_chunk.py (kernel_times) and speed_vs_fla.py (make_inputs), called by the one-off"
                             " script stored in the file (see its about and note)",
    "fused_profile": "profile_chunk.py --shape KxV --T 4096 --only fused_chunk_gla (rows); ncu_rows and warps_rows from"
                     " one-off Nsight Compute and forced-config scripts stored in the file (see its note)",
    "pallas_accuracy": "pallas_accuracy.py",
    "pallas_mosaic_gpu": "pallas_mosaic_gpu_check.py",
    "pallas_long_T_accuracy": "pallas_mosaic_gpu_check.py --accuracy-T 4096 16384 --variants fused chunk --no-timing"
                             " --out benchmarks/results/pallas_long_T_accuracy_<device>.json (rows under 'accuracy'"
                             " moved to 'rows')",
    "mosaic_scalar_gate": "pallas_mosaic_gpu_check.py --accuracy-T --T 4096 16384 --cases 'pallas chunk_simple_gla g"
                          " mosaic_gpu' 'pallas chunk_simple_gla g gpu' 'triton chunk_simple_gla g'"
                          " --out benchmarks/results/mosaic_scalar_gate_<device>.json",
    "mosaic_glue": "pallas_mosaic_gpu_check.py --glue --T 4096 16384 (rows; before: see the file's note), with"
                   " --accuracy-T --T 4096 16384 --cases 'pallas chunk_gla mosaic_gpu' 'triton chunk_gla' (after_timing)"
                   " and --accuracy-T 2048 --variants chunk fused simple_chunk gamma_chunk --no-timing"
                   " (after_accuracy), each --out a file merged into benchmarks/results/mosaic_glue_<device>.json",
    "mosaic_forward": "pallas_mosaic_gpu_check.py --glue --T 4096 16384 (rows, gate_kernel_check), with"
                      " --accuracy-T 2048 --variants chunk fused simple_chunk gamma_chunk --no-timing (accuracy),"
                      " --accuracy-T --T 4096 16384 --cases 'pallas chunk_gla mosaic_gpu' 'triton chunk_gla'"
                      " (timing) and kernel_rows at T=4096, 16384 (kernels), each --out a file merged into"
                      " benchmarks/results/mosaic_forward_<device>.json (gate_kernel_only: see the file's note)",
    "mosaic_loops": "pallas_mosaic_gpu_check.py --accuracy-T --T 4096 16384 --cases 'pallas chunk_gla mosaic_gpu'"
                    " 'triton chunk_gla' (rows), with --accuracy-T 2048 --variants chunk fused simple_chunk gamma_chunk"
                    " --no-timing (accuracy) and kernel_rows at T=4096, 16384 (kernels), each --out a file merged into"
                    " benchmarks/results/mosaic_loops_<device>.json; the A/B rows from the one-off scripts stored in"
                    " the file (ab_scripts), the Nsight Compute and ptxas figures from its note",
}
"""The script in the repository's ``benchmarks/`` that writes each kind (file prefix) of result."""


def results_dir() -> pathlib.Path:
    """The folder results are read from: ``benchmarks/results`` of the checkout this ``gla_ref`` was
    imported from (a clone, an editable install), else the copy installed with the package
    (``gla_ref/bench/stored`` of a wheel)."""
    here = pathlib.Path(__file__).resolve().parent
    checkout = here.parents[1] / "benchmarks" / "results"
    return checkout if checkout.is_dir() else here / "stored"


def kinds() -> set:
    """Every kind (file prefix) of stored result: the scripts' (:data:`SCRIPTS`) and the suites'
    (:data:`gla_ref.bench.suites.SUITES`)."""
    from gla_ref.bench.suites import SUITES

    return set(SCRIPTS) | set(SUITES)


def latest_results(prefix: str, folder=None):
    """``(path, result)`` of the newest ``<prefix>_<device>.json`` in ``folder`` (default: the one
    :func:`results_dir` names): the latest date in its stamp, then the most rows (a full run over a
    partial one of the same day), then the file name. None when there is no such file. A file of a longer
    kind that starts with this one is not this kind's (``paper_setups_*`` is not a ``paper`` suite's result,
    nor ``pallas_bench_*`` a ``pallas`` one's)."""
    folder = results_dir() if folder is None else pathlib.Path(folder)
    longer = [kind for kind in kinds() if kind.startswith(prefix + "_")]
    found = [(p, load_results(p)) for p in sorted(folder.glob(f"{prefix}_*.json"))
             if not any(p.name.startswith(kind + "_") for kind in longer)]
    return max(found, key=lambda pr: (pr[1]["env"]["date"], len(pr[1]["rows"]), pr[0].name)) if found else None


def write_result(result: dict, prefix: str, folder, out=None, smoke: bool = False) -> pathlib.Path:
    """Write a benchmark result as JSON and return its path: ``out`` if given, else
    ``<folder>/<prefix>_<device>.json``, or ``<tempdir>/<prefix>_smoke_<device>.json`` for a ``smoke`` run
    (a smoke run exercises the script and must not replace a stored GPU result)."""
    import json
    import tempfile

    name = f"{prefix}_smoke" if smoke else prefix
    where = pathlib.Path(tempfile.gettempdir()) if smoke else pathlib.Path(folder)
    path = pathlib.Path(out) if out else where / f"{name}_{slug(result['env']['device'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return path


def hint(prefix: str) -> str:
    """What to run to produce a result of kind ``prefix`` (printed where none is stored): a suite's
    ``python -m gla_ref.bench run``, or a script's command from a fresh clone of the repository (the
    benchmark scripts are not installed with the package)."""
    from gla_ref.bench.suites import SUITES
    from gla_ref.runtime import repository_url

    if prefix not in kinds():
        raise ValueError(f"prefix must be one of {sorted(kinds())}, got {prefix!r}")
    url = repository_url()
    # a kind both a script and a suite write is still the script's until its chapter reads the suite's file
    command = (f"python benchmarks/{SCRIPTS[prefix]}" if prefix in SCRIPTS
               else f"python -m gla_ref.bench run {prefix}")
    return (f"no stored {prefix} result in {results_dir()}; on a CUDA GPU run:\n"
            f"  git clone {url} && cd {url.rstrip('/').rsplit('/', 1)[-1]} && "
            f"pip install -e '.[all]' && {command}")


def series(result: dict, name: str, metric: str = "fwd_bwd"):
    """``(Ts, values)`` of one candidate of a stored result, sorted by T. ``metric`` is a row key: a
    timing dict gives its ``median_ms`` (``"fwd"``, ``"fwd_bwd"``), a number is taken as it is
    (``"fwd_bwd_peak_bytes"``; ``"median_ms"``, ``"compile_ms"`` of Pallas results). Rows without it
    (an error, out of memory) are left out."""
    pts = sorted((r["T"], r[metric]["median_ms"] if isinstance(r[metric], dict) else r[metric])
                 for r in result["rows"] if r.get("name") == name and metric in r)
    return [T for T, _ in pts], [x for _, x in pts]


def common_series(result: dict, names, metric: str = "fwd_bwd"):
    """``(Ts, {name: values})`` of several candidates (:func:`series`) on the lengths they all have."""
    per = {name: dict(zip(*series(result, name, metric))) for name in names}
    Ts = sorted(set.intersection(*(set(p) for p in per.values()))) if per else []
    return Ts, {name: [p[T] for T in Ts] for name, p in per.items()}


def crossover_T(Ts, a, b):
    """The length at which curve ``a`` first falls to curve ``b`` (a linear-time kernel against
    quadratic attention, say): ``log(a/b)`` interpolated linearly in ``log T`` between the two
    measured lengths around its first sign change. None when ``a`` is not above ``b`` at the first
    length, or never falls to it."""
    import math

    if not len(Ts) == len(a) == len(b) or len(Ts) < 2:
        raise ValueError(f"Ts, a and b must have one length >= 2, got {len(Ts)}, {len(a)}, {len(b)}")
    if any(x <= 0 for x in (*Ts, *a, *b)) or any(t1 <= t0 for t0, t1 in zip(Ts, Ts[1:])):
        raise ValueError("Ts must be increasing, and Ts, a and b positive")
    r = [math.log(x / y) for x, y in zip(a, b)]
    if r[0] <= 0:
        return None
    for i in range(len(r) - 1):
        if r[i + 1] <= 0:  # the zero of the line through (log T_i, r_i) and (log T_i+1, r_i+1)
            x0, x1 = math.log(Ts[i]), math.log(Ts[i + 1])
            return math.exp(x0 + r[i] * (x1 - x0) / (r[i] - r[i + 1]))
    return None
