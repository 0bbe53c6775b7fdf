"""Execute notebooks with nbclient in *this* Python (the reader's fresh environment).

    python execute.py OUT_DIR NOTEBOOK.ipynb ...

Each notebook runs with OUT_DIR as its working directory and is written back there executed. The kernel
is this interpreter (a kernelspec in a private JUPYTER_PATH, so no kernel of the machine is picked up).
Writes OUT_DIR/summary.json: per notebook, "ok" or the error, and the seconds it took.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

import nbclient
import nbformat


def private_kernel(root: pathlib.Path) -> str:
    spec = root / "kernels" / "reader"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "reader", "language": "python"}))
    os.environ["JUPYTER_PATH"] = str(root)
    return "reader"


def main(out_dir, notebooks) -> int:
    root = pathlib.Path(tempfile.mkdtemp(prefix="reader-jupyter-"))
    try:
        return run_all(out_dir, notebooks, private_kernel(root))
    finally:
        shutil.rmtree(root)


def run_all(out_dir, notebooks, kernel) -> int:
    summary = {}
    for name in notebooks:
        path = pathlib.Path(out_dir) / name
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        try:
            nbclient.NotebookClient(nb, kernel_name=kernel, timeout=900,
                                    resources={"metadata": {"path": str(out_dir)}}).execute()
            status = "ok"
        except Exception as err:  # noqa: BLE001  (reported, and the run goes on to the next notebook)
            status = f"error: {type(err).__name__}: {str(err)[-3000:]}"
        nbformat.write(nb, path)
        summary[name] = {"status": status, "seconds": round(time.perf_counter() - t0, 1)}
        print(name, status[:200], summary[name]["seconds"], flush=True)
    (pathlib.Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
    return sum(run["status"] != "ok" for run in summary.values())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
