"""The one runner: ``python -m gla_ref.bench run SUITE`` measures a suite row by row into one file per suite per device.

The file, ``<out>/<suite>_<device>.json`` (default ``benchmarks/results``; ``--smoke``: a temporary folder),
is rewritten atomically after every row, so a run killed at any moment (the GPU machine's 10-minute limit)
loses at most the row it was measuring. Run the same command again and it continues where it stopped:
rows carry their own key (:attr:`gla_ref.bench.suites.Task.key`) and the rows already in the file are not
measured again. The file is stamped by :func:`gla_ref.bench.timing.environment` (commit, date, device,
versions, ptxas, FLA); at a new commit a run starts afresh unless ``--resume`` keeps the earlier rows (each
row names its own commit and date). A row being measured when a run was killed is tried again once; killed
twice, it is recorded as an error and skipped. ``--budget-s`` stops before a row that would not finish
within the budget (judged by the slowest row of the same kind in the file: :func:`expected_s`), so a run ends
cleanly inside a time limit.

Importing this module loads no framework.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time

from gla_ref.bench import suites as S

MAX_ATTEMPTS = 2
"""Runs in which a row may be cut short before it is recorded as an error and skipped."""


class RunError(RuntimeError):
    """A run that cannot start (a planned suite, no GPU without --smoke, a file another script wrote)."""


def parse_only(specs) -> dict:
    """``["name=chunk_gla,T=1024", "name=fla.chunk_gla"]`` → ``{"name": {"chunk_gla", "fla.chunk_gla"},
    "T": {"1024"}}``: values of one field are alternatives, fields must all match."""
    out: dict = {}
    for spec in specs or ():
        for part in filter(None, (p.strip() for p in spec.split(","))):
            field, sep, value = part.partition("=")
            if not sep or not field or not value:
                raise ValueError(f"--only takes FIELD=VALUE pairs separated by commas (e.g. name=chunk_gla,T=1024), "
                                 f"got {part!r}")
            out.setdefault(field.strip(), set()).add(value.strip())
    return out


def select(tasks, only: dict) -> list:
    """The tasks whose fields (:meth:`~gla_ref.bench.suites.Task.fields`) match every field of ``only``; a
    ValueError naming a field no task has."""
    if not only:
        return list(tasks)
    known = set().union(*(t.fields() for t in tasks)) if tasks else set()
    unknown = sorted(set(only) - known)
    if unknown:
        raise ValueError(f"--only: no row has the field(s) {unknown}; fields: {sorted(known)}")
    return [t for t in tasks if all(t.fields().get(f) in values for f, values in only.items())]


def default_out(smoke: bool) -> pathlib.Path:
    """Where results go: a temporary folder for smoke runs (they must never replace a GPU result), else the
    checkout's ``benchmarks/results`` (``./benchmarks/results`` when gla_ref is installed elsewhere)."""
    if smoke:
        return pathlib.Path(tempfile.gettempdir()) / "gla_ref_bench_smoke"
    checkout = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    return checkout if checkout.is_dir() else pathlib.Path.cwd() / "benchmarks" / "results"


def write_atomic(path: pathlib.Path, data: dict) -> None:
    """``data`` as JSON at ``path``, by a rename: a reader (or a kill) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data, indent=1))
    os.replace(tmp, path)


def ratios(rows, pairs) -> list:
    """Per point (the row's fields but name and gate): ``"ours/peer fwd"``, ``"ours/peer fwd_bwd"`` and
    ``"ours/peer fwd_bwd peak"`` for each (ours, peer) of ``pairs`` where both rows have them (< 1: ours is
    faster or smaller)."""
    def where(row):
        return tuple((k, json.dumps(v)) for k, v in point_of(row).items() if k != "gate")

    by = {(row["name"], where(row)): row for row in rows}
    out = []
    for place in dict.fromkeys(where(row) for row in rows):
        entry = {k: json.loads(v) for k, v in place}
        for ours, peer in pairs:
            a, b = by.get((ours, place), {}), by.get((peer, place), {})
            for key in ("fwd", "fwd_bwd"):
                if key in a and key in b:
                    entry[f"{ours}/{peer} {key}"] = a[key]["median_ms"] / b[key]["median_ms"]
            if a.get("fwd_bwd_peak_bytes") and b.get("fwd_bwd_peak_bytes"):
                entry[f"{ours}/{peer} fwd_bwd peak"] = a["fwd_bwd_peak_bytes"] / b["fwd_bwd_peak_bytes"]
        if len(entry) > len(place):
            out.append(entry)
    return out


def point_of(row: dict) -> dict:
    """The point a row was measured at (its fields of :data:`gla_ref.bench.suites.POINT_ORDER`)."""
    return {k: row[k] for k in S.POINT_ORDER if k in row}


def _mib(n) -> str:
    return f"{n / 2**20:.1f} MiB"


def format_row(row: dict) -> str:
    """The numbers of a row in one line (progress)."""
    if "unavailable" in row:
        return f"unavailable: {row['unavailable']}"
    if "skipped" in row:
        return f"skipped: {row['skipped']}"
    bits = []
    for key, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
        if key in row:
            bits.append(f"{label} {row[key]['median_ms']:.3f} ms")
    for key in ("fwd_peak", "fwd_bwd_peak"):
        if f"{key}_bytes" in row:
            bits.append(f"{key.replace('_', ' ').replace('fwd bwd', 'fwd+bwd')} {_mib(row[f'{key}_bytes'])}"
                        f" (spread {row.get(f'{key}_spread_bytes', 0)} B)")
    if "first_fwd_bwd_s" in row:
        bits.append(f"first call {row['first_fwd_bwd_s']:.1f} s")
    if row.get("roofline_fraction") is not None:
        bits.append(f"roofline {row['roofline_fraction']:.2f}")
    bits += [f"{k}: {v}" for k, v in row.items() if k.endswith("error")]
    return " · ".join(bits) or "(nothing measured)"


CUDA_FAULTS = ("CUDA error", "AcceleratorError", "illegal memory access", "misaligned address", "device-side assert")
"""Words of an error that leaves the process's CUDA context unusable (a kernel's fault is sticky)."""


def cuda_fault(row: dict):
    """The first error of ``row`` that says a kernel faulted on the GPU in this process (None if none does; the
    first call's fresh process, ``first_error``, does not count)."""
    return next((v for k, v in row.items() if k.endswith("error") and k != "first_error"
                 and any(w in str(v) for w in CUDA_FAULTS)), None)


def measure_task(task, suite, on_gpu: bool, device_name: str) -> dict:
    """The numbers of one task, in this process: its candidate made for its point, the first call in a fresh
    process when asked for, then the suite's other measures. A candidate that cannot run here gives
    ``{"unavailable": why}``; any other failure an ``error``."""
    from gla_ref.bench import measures as M
    from gla_ref.bench.candidates import Unavailable, instantiate

    try:
        inst = instantiate(task.name, task.point)
    except Unavailable as err:
        return {"unavailable": str(err)}
    except Exception as err:  # recorded: one bad row must not end the suite
        return {"error": M.describe_error(err)}
    out = M.first_call(task.name, task.point, timeout=suite.row_timeout_s) if "first" in task.measures else {}
    out.update(M.measure(inst, task.measures, on_gpu=on_gpu, device=device_name, timing=suite.timing))
    return out


def _measure_in_child(task, suite) -> dict:
    """:func:`measure_task` in a fresh process (``suite.isolate``), killed after ``suite.row_timeout_s``."""
    import signal
    import subprocess
    import sys

    spec = json.dumps({"suite": suite.name, "name": task.name, "point": task.point, "measures": list(task.measures)})
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "gla_ref.bench", "_row", spec], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=suite.row_timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"did not finish in {suite.row_timeout_s:.0f} s (the row's process was killed)"}
    for line in reversed(out.splitlines()):
        if line.startswith("ROW "):
            return json.loads(line[4:])
    tail = " | ".join(line for line in out.splitlines()[-3:] if line.strip())[:300]
    return {"error": f"the row's process exited with code {proc.returncode}: {tail}"}


def row_child(spec: str) -> None:
    """Inside the process of an isolated row: measure it and print ``ROW {json}`` (a JAX candidate's process
    never imports torch)."""
    from gla_ref.bench.candidates import candidate

    spec = json.loads(spec)
    if candidate(spec["name"]).framework == "jax":
        import jax

        first = jax.devices()[0]
        on_gpu, device_name = first.platform == "gpu", first.device_kind
    else:
        on_gpu, device_name = setup_device()
    task = S.Task(spec["name"], spec["point"], tuple(spec["measures"]))
    print("ROW " + json.dumps(measure_task(task, S.suite(spec["suite"]), on_gpu, device_name)), flush=True)


def release_gpu():
    """After a row: wait for the GPU (a kernel's fault surfaces here) and hand the row's freed blocks back (its
    tensors went with measure_task's frame), so the next row starts from an empty cache."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def setup_device():
    """Triton's interpreter chosen on a machine without CUDA (before anything imports Triton), autotuning
    lines on; ``(on_gpu, device name)``."""
    from gla_ref import device
    from gla_ref.bench.timing import show_tuning

    show_tuning()
    device.use_triton_interpreter()
    import torch

    on_gpu = torch.cuda.is_available()
    return on_gpu, torch.cuda.get_device_name() if on_gpu else "cpu"


def _start(path, suite, env, smoke, resume, fresh, echo):
    """The file to continue (its rows kept) or a fresh one, by the rules of the module's docstring."""
    fresh_file = {"suite": suite.name, "about": suite.what, "chapter": suite.chapter, "shapes": suite.shapes,
                  "smoke": smoke, "env": env, "commits": [env.get("commit")], "methods": None, "candidates": None,
                  "complete": False, "planned_rows": 0, "pending": {}, "rows": [], "ratios": [], "wall_s": 0.0}
    if not path.exists() or fresh:
        return fresh_file
    try:
        old = json.loads(path.read_text())
    except ValueError:
        old = None
    if not isinstance(old, dict) or old.get("suite") != suite.name:
        raise RunError(f"{path} was not written by this runner for suite {suite.name!r} (an older script's result?); "
                       f"--fresh replaces it (git keeps the old one)")
    if old.get("smoke") != smoke:
        raise RunError(f"{path} holds a {'smoke' if old.get('smoke') else 'full'} run; --fresh replaces it")
    same = old["env"].get("commit") == env.get("commit")
    if not same and not resume:
        echo(f"{path.name}: measured at commit {old['env'].get('commit')}, this is {env.get('commit')}: starting "
             f"afresh (--resume keeps its {len(old['rows'])} rows)")
        return fresh_file
    old["env"] = env
    old["commits"] = list(dict.fromkeys([*old.get("commits", []), env.get("commit")]))
    echo(f"{path.name}: continuing, {len(old['rows'])} rows already measured")
    return old


def expected_s(task, rows, tasks_by_key) -> float:
    """How long ``task`` may take, for ``--budget-s``: the slowest row in the file of the same candidate with the
    same first-call measure, else of any candidate with it (a first call compiles in a fresh process: the slow
    rows), else 0."""
    first = "first" in task.measures

    def alike(row):
        other = tasks_by_key.get(row["key"])
        return other is not None and ("first" in other.measures) == first and "row_s" in row

    same = [r["row_s"] for r in rows if alike(r) and r["name"] == task.name]
    kind = [r["row_s"] for r in rows if alike(r)]
    return max(same or kind or [0.0])


def _oom_before(task, rows) -> int | None:
    """The smallest T below the task's at which the same candidate at the same other sizes ran out of memory."""
    from gla_ref.bench.measures import is_oom

    def rest(name, point):
        return name, json.dumps({k: v for k, v in point.items() if k != "T"}, sort_keys=True)

    mine = rest(task.name, task.point)
    hits = [r["T"] for r in rows if rest(r["name"], point_of(r)) == mine and r.get("T", 0) < task.point.get("T", 0)
            and (is_oom(r) or "out of memory" in r.get("skipped", ""))]
    return min(hits) if hits else None


def run_suite(name, *, only=(), out=None, smoke=False, resume=False, fresh=False, budget_s=None, echo=print):
    """Measure suite ``name`` (its rows matching ``only``, :func:`parse_only`) into ``<out>/<name>_<device>.json``
    and return that path; see the module's docstring for resuming, ``--resume``, ``--fresh`` and the budget."""
    from gla_ref.bench import measures as M
    from gla_ref.bench.candidates import CANDIDATES
    from gla_ref.bench.inputs import PAPER_GATE
    from gla_ref.bench.results import slug
    from gla_ref.bench.timing import environment

    suite = S.suite(name)
    if suite.planned:
        raise RunError(str(S.NotRunnable(suite)))
    plan = suite.tasks(smoke)
    tasks = select(plan, parse_only(only) if not isinstance(only, dict) else only)
    on_gpu, device_name = setup_device()
    if not (on_gpu or smoke):
        raise RunError(f"suite {name!r} needs a CUDA GPU ({suite.kind}); --smoke runs it on a CPU at tiny shapes")
    env = environment()
    env.setdefault("ptxas", None)  # stamped on a GPU; None says there was none
    path = pathlib.Path(out or default_out(smoke)) / f"{name}_{slug(env['device'])}.json"
    data = _start(path, suite, env, smoke, resume, fresh, echo)
    data["methods"] = {m: M.METHODS[m] for m in M.MEASURES if m in suite.measures}
    data["candidates"] = {c: CANDIDATES[c].what for c in suite.candidates if c in CANDIDATES}
    data["gate"] = PAPER_GATE
    done = {row["key"] for row in data["rows"]}
    todo = [t for t in tasks if t.key not in done]
    data["planned_rows"] = len(plan)
    echo(f"{name}: {len(tasks)} rows ({len(tasks) - len(todo)} in the file), device {env['device']}, commit "
         f"{env.get('commit')}; writing {path}")
    start, wall0 = time.perf_counter(), data.get("wall_s", 0.0)
    by_key = {t.key: t for t in tasks}

    def save():
        data["wall_s"] = wall0 + time.perf_counter() - start
        data["ratios"] = ratios(data["rows"], suite.pairs)
        data["complete"] = not data["pending"] and {t.key for t in plan} <= {r["key"] for r in data["rows"]}
        write_atomic(path, data)

    for i, task in enumerate(todo, 1):
        elapsed = time.perf_counter() - start
        expected = expected_s(task, data["rows"], by_key)
        if budget_s is not None and elapsed + expected > budget_s:
            echo(f"stopped: {elapsed:.0f} s spent, the next row may take {expected:.0f} s, the budget is {budget_s:.0f} s;"
                 f" {len(todo) - i + 1} rows left: run the same command again to continue")
            break
        row = {"key": task.key, "name": task.name, **dict(S.sorted_point(task.point)), "commit": env.get("commit"),
               "date": env["date"]}
        attempts = data["pending"].get(task.key, 0)
        oom_T = _oom_before(task, data["rows"]) if suite.stop_after_oom else None
        t0 = time.perf_counter()
        if attempts >= MAX_ATTEMPTS:
            row["error"] = f"cut short in {attempts} runs while being measured (a time limit?): not tried again"
        elif oom_T is not None:
            row["skipped"] = f"out of memory at T={oom_T}"
        else:
            data["pending"][task.key] = attempts + 1
            save()
            try:
                row.update(_measure_in_child(task, suite) if suite.isolate else measure_task(task, suite, on_gpu,
                                                                                              device_name))
                if on_gpu:
                    release_gpu()
            except Exception as err:  # a kernel's fault surfaces at the next synchronisation
                row["error"] = M.describe_error(err)
        row["row_s"] = time.perf_counter() - t0
        data["pending"].pop(task.key, None)
        data["rows"].append(row)
        save()
        echo(f"[{len(tasks) - len(todo) + i}/{len(tasks)}] {task.key}: {format_row(row)} ({row['row_s']:.1f} s)")
        if on_gpu and not suite.isolate and CANDIDATES[task.name].framework != "ranks" and cuda_fault(row):
            raise RunError(f"{task.key} faulted on the GPU ({cuda_fault(row)}); its row is recorded, and this process's "
                           f"CUDA context cannot run more: run the same command again to continue with the next row")
    save()
    left = len(tasks) - len({r["key"] for r in data["rows"]} & {t.key for t in tasks})
    echo(f"{name}: {'complete' if not left else f'{left} rows left'}; wrote {path}")
    return path


def list_text(verbose: bool = False) -> str:
    """What ``python -m gla_ref.bench list`` prints: every suite, its status, rows, estimated H200 minutes,
    chapter, machine and shapes (``verbose``: also its candidates, the candidates' registry and the methods)."""
    from gla_ref.bench.candidates import CANDIDATES
    from gla_ref.bench.measures import METHODS

    lines = [f"{'suite':<18} {'status':<24} {'rows':>5} {'H200 min':>12}  {'machine':<15} chapter"]
    for s in S.SUITES.values():
        status = "planned, no runner yet" if s.planned else "runnable"
        rows = "—" if s.planned else str(len(s.tasks()))
        minutes = f"{s.minutes:g} " + ("(measured)" if s.minutes_measured else "(est.)")
        lines.append(f"{s.name:<18} {status:<24} {rows:>5} {minutes:>12}  {s.kind:<15} {s.chapter}")
        lines.append(f"    {s.shapes}")
        if s.planned:
            lines.append(f"    missing: {s.planned}")
        if verbose:
            lines.append(f"    measures: {', '.join(s.measures)}; candidates: {', '.join(s.candidates)}")
    if verbose:
        lines.append("\ncandidates:")
        lines += [f"  {c.name:<36} {c.side:<5} {c.framework:<6} {c.what}" for c in CANDIDATES.values()]
        lines.append("\nmethods:")
        lines += [f"  {key}: {text}" for key, text in METHODS.items()]
    return "\n".join(lines)
