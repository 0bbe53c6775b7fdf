"""Execute every chapter notebook with nbclient on this machine and record how each one ran.

``python benchmarks/run_notebooks.py [NOTEBOOK ...] [--allow-errors]`` (default: notebooks/[0-9]*.ipynb)
executes each notebook in a fresh kernel from its first cell (the committed outputs are replaced, the
files on disk are not touched), and writes ``benchmarks/results/notebooks_<device>.json``: per notebook,
ok or the errors of the failing cells (execution stops at the first unless ``--allow-errors``), the wall
time with its slowest cells, and what the setup cell printed about the device. It is how the chapters are checked on a GPU; on
a CPU, ``make test`` runs them through nbval instead.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
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
        raised = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300] if str(err).strip() else ''}"
    failed = [f"cell {i}: {o['ename']}: {o['evalue'][:300]}"
              for i, c in enumerate(nb.cells) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    errors = failed or ([raised] if raised else [])
    status = {"ok": not errors, **({"errors": errors} if errors else {})}
    status["wall_s"] = round(time.perf_counter() - start, 1)
    status["slowest_cells"] = slowest_cells(nb)
    setup = next((c for c in nb.cells if c.cell_type == "code"), None)
    streams = [o.get("text", "") for o in (setup.outputs if setup else []) if o.get("output_type") == "stream"]
    status["device_line"] = "".join(streams).strip().splitlines()[-1] if any(streams) else ""
    return status


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


def main():
    args = [a for a in sys.argv[1:] if a != "--allow-errors"]
    paths = [pathlib.Path(p) for p in args] or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    env = bench.environment()
    runs = {}
    for path in paths:
        runs[path.name] = execute(path.resolve(), allow_errors="--allow-errors" in sys.argv)
        print(path.name, runs[path.name], flush=True)
    slug = bench.slug(env["device"])
    out = RESULTS / f"notebooks_{slug}.json"
    out.write_text(json.dumps({"env": env, "notebooks": runs}, indent=1))
    print("wrote", out)
    sys.exit(0 if all(r["ok"] for r in runs.values()) else 1)


if __name__ == "__main__":
    main()
