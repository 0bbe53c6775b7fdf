"""MQAR accuracy of the four gate families against model width and number of pairs (chapter 8, Fig. 4).

    python benchmarks/mqar_sweep.py            # a CUDA GPU, about 6 minutes: results/mqar_<device>.json
    python benchmarks/mqar_sweep.py --smoke    # any machine, seconds: tiny runs, a temporary file

Every run trains a fresh two-layer, two-head :class:`gla_ref.layers.torch.GLALM` (mixer ``linear``,
``retnet``, ``scalar`` or ``gla``; :func:`gla_ref.tasks.mqar.build_model`) on multi-query associative recall
(:func:`gla_ref.tasks.mqar.make_mqar`) with :func:`gla_ref.tasks.mqar.train`, and records its accuracy on held-out
examples (:func:`gla_ref.tasks.mqar.run`). The default grid: widths 32/64/128 × 8/16/32 pairs at T = 128 ×
the four mixers × seeds 0, 1, 2, each run 1200 AdamW steps of 128 examples (vocabulary 512), every
mixer with FLA's short convolution on q, k, v (``--no-short-conv`` leaves it out; the file's env
records which). The layers use the ``fused_recurrent`` Triton kernel (one kernel per pass, compiled in
seconds; these tiny models are bound by launches, where the multi-kernel ``chunk`` path loses);
``--backend reference`` needs no Triton but moves far more memory. Pace measured on an H200 with 8
workers at T = 256 (batch 128): about 42, 50 and 80 ms per step at widths 64, 128 and 256.

The runs go seed-major (:func:`gla_ref.tasks.mqar.plan`) to ``--workers`` processes sharing the GPU: tiny
models leave most of it idle, so several train at once. A line is printed as each run ends, and the JSON
is rewritten after each, so a run cut short leaves its rows. With ``--budget-s`` (default 450) no run
starts once the time spent plus the longest run so far would pass the budget, so later seeds are
dropped first and every setting keeps its first seed; ``complete`` says whether every planned run
finished. Check the pace first with a short probe, e.g.
``--seeds 0 --pairs 16 --steps 300 --out /tmp/mqar_probe.json`` (12 runs).

The file is ``{"env": bench.environment() + the settings, "complete", "planned", "rows": [...]}`` with
the row keys of :func:`gla_ref.tasks.mqar.run`; chapter 8 reads it with ``bench.latest_results("mqar")``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gla_ref import bench  # noqa: E402
from gla_ref.tasks import mqar

RESULTS = ROOT / "benchmarks" / "results"
FULL = dict(widths=[32, 64, 128], pairs=[8, 16, 32], seeds=[0, 1, 2], seq_len=128, vocab_size=512,
            steps=1200, batch_size=128, lr=3e-3, num_test=1024, workers=8, budget_s=330.0,
            backend="fused_recurrent", short_conv=True)
SMOKE = dict(widths=[16], pairs=[2], seeds=[0], seq_len=16, vocab_size=16, steps=3, batch_size=4, lr=3e-3,
             num_test=16, workers=1, budget_s=0.0, backend="reference", short_conv=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mixers", nargs="+", default=list(mqar.MIXERS), choices=mqar.MIXERS)
    p.add_argument("--widths", type=int, nargs="+", help=f"model widths d (default {FULL['widths']})")
    p.add_argument("--pairs", type=int, nargs="+", help=f"key-value pairs P (default {FULL['pairs']})")
    p.add_argument("--seeds", type=int, nargs="+", help=f"seeds (default {FULL['seeds']})")
    p.add_argument("--seq-len", type=int, help=f"T (default {FULL['seq_len']})")
    p.add_argument("--vocab-size", type=int, help=f"vocabulary (default {FULL['vocab_size']})")
    p.add_argument("--steps", type=int, help=f"training steps per run (default {FULL['steps']})")
    p.add_argument("--batch-size", type=int, help=f"examples per step (default {FULL['batch_size']})")
    p.add_argument("--lr", type=float, help=f"peak learning rate (default {FULL['lr']})")
    p.add_argument("--num-test", type=int, help=f"held-out examples per run (default {FULL['num_test']})")
    p.add_argument("--workers", type=int, help=f"processes sharing the device (default {FULL['workers']})")
    p.add_argument("--budget-s", type=float, help=f"start no run past this many seconds; 0: no limit "
                                                  f"(default {FULL['budget_s']})")
    p.add_argument("--backend", choices=("reference", "chunk", "fused_chunk", "fused_recurrent"),
                   help=f"layer backend (default {FULL['backend']}: one small Triton kernel, compiled in "
                        f"seconds; reference: PyTorch, no compile, more memory traffic)")
    p.add_argument("--short-conv", action=argparse.BooleanOptionalAction,
                   help=f"FLA's short convolution on q, k, v in every mixer (default {FULL['short_conv']})")
    p.add_argument("--smoke", action="store_true", help="tiny runs on the CPU, a temporary output")
    p.add_argument("--out", type=pathlib.Path, help="JSON path (default results/mqar_<device>.json)")
    args = p.parse_args(argv)
    for key, value in (SMOKE if args.smoke else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def _init_worker(threads):
    import torch

    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision("high")  # TF32 matmuls on the GPU


def run_one(job):
    """One run in a worker: ``job = (mixer, width, config as dict, backend, device, short_conv)`` → a row."""
    mixer, width, config, backend, dev, short_conv = job
    return mqar.run(mixer, width, mqar.MQARConfig(**config), backend=backend, device=dev, short_conv=short_conv)


def jobs(args, dev):
    base = mqar.MQARConfig(seq_len=args.seq_len, num_pairs=min(args.pairs), vocab_size=args.vocab_size,
                           steps=args.steps, batch_size=args.batch_size, lr=args.lr, num_test=args.num_test)
    return [(m, d, dataclasses.asdict(dataclasses.replace(base, num_pairs=P, seed=s)), args.backend, dev,
             args.short_conv)
            for m, d, P, s in mqar.plan(args.mixers, args.widths, args.pairs, args.seeds)]


def write(path, env, rows, planned):
    """Rewrite the result file (through a temporary name, so a reader never sees half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"env": env, "complete": len(rows) == planned, "planned": planned,
                               "rows": rows}, indent=1))
    tmp.replace(path)


def execute(todo, args, on_row):
    """Run the jobs on ``args.workers`` processes (in this one when 1), keeping at most that many in
    flight and starting none past the budget; ``on_row(row)`` as each ends. Returns the rows."""
    start, rows, longest = time.perf_counter(), [], 0.0

    def may_start():
        return not args.budget_s or time.perf_counter() - start + longest <= args.budget_s

    if args.workers == 1:
        _init_worker(1)
        for job in todo:
            if not may_start():
                break
            rows.append(run_one(job))
            longest = max(longest, rows[-1]["seconds"])
            on_row(rows[-1])
        return rows
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=_init_worker,
                                                initargs=(1,)) as pool:
        queue, running = list(todo), set()
        while queue or running:
            while queue and len(running) < args.workers and may_start():
                running.add(pool.submit(run_one, queue.pop(0)))
            if not running:
                break
            done, running = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                rows.append(fut.result())
                longest = max(longest, rows[-1]["seconds"])
                on_row(rows[-1])
    return rows


def main(argv=None):
    args = parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        sys.exit("mqar_sweep.py trains many models and needs CUDA; on a CPU run it with --smoke")
    dev = "cuda" if cuda and not args.smoke else "cpu"
    todo = jobs(args, dev)
    settings = {k: getattr(args, k) for k in ("mixers", "widths", "pairs", "seeds", "seq_len", "vocab_size",
                                              "steps", "batch_size", "lr", "num_test", "workers", "budget_s",
                                              "backend", "short_conv")}
    env = {**bench.environment(), "smoke": args.smoke, **settings}
    default_dir = pathlib.Path(tempfile.gettempdir()) if args.smoke else RESULTS
    path = args.out or default_dir / f"mqar_{'smoke_' if args.smoke else ''}{bench.slug(env['device'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"{len(todo)} runs on {env['device']} with {args.workers} worker(s); writing {path}", flush=True)
    start, rows = time.perf_counter(), []

    def on_row(row):
        rows.append(row)
        print(f"[{len(rows):>3}/{len(todo)} {time.perf_counter() - start:6.0f} s] {row['mixer']:<7} "
              f"d={row['hidden_size']:<4} P={row['num_pairs']:<3} seed={row['seed']}  acc {100 * row['accuracy']:5.1f} %  "
              f"test loss {row['test_loss']:.3f}  ({row['seconds']:.0f} s)", flush=True)
        write(path, {**env, "wall_s": round(time.perf_counter() - start, 1)}, rows, len(todo))

    execute(todo, args, on_row)
    write(path, {**env, "wall_s": round(time.perf_counter() - start, 1)}, rows, len(todo))
    for (m, P, d), s in mqar.summarize(rows).items():
        print(f"{m:<7} P={P:<3} d={d:<4} acc {100 * s['mean']:5.1f} % (min {100 * s['min']:.1f}, "
              f"max {100 * s['max']:.1f}, {s['n']} seeds)")
    print(f"{len(rows)} of {len(todo)} runs in {time.perf_counter() - start:.0f} s; wrote {path}")


if __name__ == "__main__":
    main()
