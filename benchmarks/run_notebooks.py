"""Execute every chapter notebook with nbclient on this machine and record how each one ran.

``python benchmarks/run_notebooks.py [NOTEBOOK ...] [--allow-errors] [--outside DIR] [--out PATH]``
(default: notebooks/[0-9]*.ipynb) executes each notebook in a fresh kernel from its first cell (the
committed outputs are replaced, the files on disk are not touched), and writes
``benchmarks/results/notebooks_<device>.json`` (or ``--out``), a row per notebook (``bench.load_results``
reads it): ok or the errors of the failing cells (execution stops at the first unless ``--allow-errors``), the wall time with its slowest
cells, what the setup cell printed (framework versions, then the device line), the figures drawn
against the committed copy, how many autotuning lines the Triton kernels printed, and whether any
output says a stored result is missing.

``--outside DIR`` runs each notebook from a copy in the empty folder DIR, as a reader who installed
the wheel does: the kernel then imports the installed ``gla_ref``, not this checkout. It is how the
chapters are checked on a GPU; on a CPU, ``make test`` runs them through nbval and the reader's test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import shutil
import time

import nbclient
import nbformat

from gla_ref import bench

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def execute(path: pathlib.Path, timeout_s: int = 600, allow_errors: bool = False) -> dict:
    """Run one notebook top to bottom; ok, wall seconds, the first output line of the setup cell.
    With ``allow_errors`` every cell runs and each failing cell's error is listed."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3", allow_errors=allow_errors,
                                     resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    try:
        client.execute()
        raised = None
    except Exception as err:  # a failing cell, a timeout, or a kernel that would not start: recorded, not raised
        raised = describe_failure(nb, err)
    failed = [f"cell {i}: {o['ename']}: {o['evalue'][:300]}{marked_line(chr(10).join(o.get('traceback', [])))}"
              for i, c in enumerate(nb.cells) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    errors = failed or ([raised] if raised else [])
    status = {"ok": not errors, **({"errors": errors} if errors else {})}
    status["wall_s"] = round(time.perf_counter() - start, 1)
    status["slowest_cells"] = slowest_cells(nb)
    setup = next((c for c in nb.cells if c.cell_type == "code"), None)
    streams = [o.get("text", "") for o in (setup.outputs if setup else []) if o.get("output_type") == "stream"]
    status["setup_lines"] = "".join(streams).strip().splitlines()
    status["device_line"] = status["setup_lines"][-1] if status["setup_lines"] else ""
    status["figures"] = figures(nb)
    status["says_no_stored_result"] = "no stored" in output_text(nb).lower()
    status["autotuning_lines"] = sum(line.startswith("autotuning ") for line in output_text(nb).splitlines())
    return status


def _outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def figures(nb) -> int:
    """How many figures (PNG or SVG outputs) a notebook holds."""
    return sum(any(kind in o.get("data", {}) for kind in ("image/png", "image/svg+xml")) for o in _outputs(nb))


def output_text(nb) -> str:
    """Everything a notebook printed or displayed as text."""
    return "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) + str(o.get("evalue", ""))
                   for o in _outputs(nb))


def marked_line(traceback: str) -> str:
    """`` at <line>`` for the last line IPython marks (``---->``) in a traceback (colour codes removed), else ''."""
    marked = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", traceback).splitlines()
              if line.lstrip().startswith("---->")]
    return f" at {marked[-1][:200]}" if marked else ""


def describe_failure(nb, err: Exception) -> str:
    """The error that stopped a run when no cell holds it as an output: the last cell that started
    (``cell N``), the error's last line (empty for a bare ``assert``) and the line IPython marked."""
    started = [i for i, c in enumerate(nb.cells) if "iopub.execute_input" in c.get("metadata", {}).get("execution", {})]
    lines = str(err).strip().splitlines()
    where = f"cell {started[-1]}: " if started else ""
    return f"{where}{type(err).__name__}: {lines[-1][:300] if lines else ''}{marked_line(str(err))}"


def slowest_cells(nb, n: int = 3) -> dict:
    """Seconds of the ``n`` slowest code cells, from the timing nbclient records in each cell's metadata."""
    seconds = {}
    for i, cell in enumerate(nb.cells):
        run = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in run and "shell.execute_reply" in run:
            start, end = (datetime.datetime.fromisoformat(run[k].replace("Z", "+00:00"))
                          for k in ("iopub.execute_input", "shell.execute_reply"))
            seconds[f"cell {i}"] = round((end - start).total_seconds(), 1)
    return dict(sorted(seconds.items(), key=lambda kv: -kv[1])[:n])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
    parser.add_argument("--allow-errors", action="store_true")
    parser.add_argument("--outside", type=pathlib.Path, help="run copies in this (empty) folder")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    env = bench.environment()
    out = args.out or RESULTS / f"notebooks_{bench.slug(env['device'])}.json"
    rows = []
    for path in paths:
        run = path
        if args.outside:
            args.outside.mkdir(parents=True, exist_ok=True)
            run = pathlib.Path(shutil.copy(path, args.outside / path.name)).resolve()
        rows.append({"notebook": path.name, **execute(run, allow_errors=args.allow_errors),
                     "committed_figures": figures(nbformat.read(path, as_version=4))})
        print(rows[-1], flush=True)
        record = {"env": env, "outside": str(args.outside) if args.outside else None, "rows": rows}
        out.write_text(json.dumps(record, indent=1))  # after every notebook: a run cut short keeps what ran
    print("wrote", out)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
