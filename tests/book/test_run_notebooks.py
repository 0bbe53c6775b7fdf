"""benchmarks/run_notebooks.py: a notebook that runs is ok, a failing cell is reported (with
--allow-errors, every failing cell), and the setup cell's device line is recorded."""

from __future__ import annotations


import nbformat

from gla_ref import bench
from gla_ref.testing.scripts import load_script

rn = load_script("run_notebooks")


def _notebook(tmp_path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_a_clean_notebook_is_ok_and_its_device_line_recorded(tmp_path):
    status = rn.execute(_notebook(tmp_path, "print('setup')\nprint('CPU: here')", "x = 1 + 1\nassert x == 2"))
    assert status["ok"] and status["device_line"] == "CPU: here" and status["wall_s"] >= 0


def test_the_slowest_cell_is_named_with_its_seconds(tmp_path):
    status = rn.execute(_notebook(tmp_path, "print('dev')", "import time; time.sleep(0.6)", "y = 2"))
    (first, seconds), *_ = status["slowest_cells"].items()
    assert first == "cell 1" and 0.6 <= seconds < 5 and len(status["slowest_cells"]) == 3


def test_failing_cells_are_reported(tmp_path):
    path = _notebook(tmp_path, "print('dev')", "assert 1 == 2, 'first'", "raise ValueError('second')")
    stop_at_first = rn.execute(path)
    assert not stop_at_first["ok"] and len(stop_at_first["errors"]) == 1 and "first" in stop_at_first["errors"][0]
    every = rn.execute(path, allow_errors=True)
    assert not every["ok"] and len(every["errors"]) == 2
    assert "AssertionError: first" in every["errors"][0] and "ValueError: second" in every["errors"][1]


def test_outside_runs_a_copy_and_counts_figures(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    path = _notebook(source, "print('torch 2.13')\nprint('CPU: here')",
                     "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()",
                     "print('no stored result here')")
    out = tmp_path / "record.json"
    assert rn.main([str(path), "--outside", str(tmp_path / "empty"), "--out", str(out)]) == 0
    (run,) = bench.load_results(out)["rows"]
    assert run["notebook"] == "nb.ipynb" and run["autotuning_lines"] == 0
    assert run["setup_lines"] == ["torch 2.13", "CPU: here"] and run["figures"] == 1
    assert run["committed_figures"] == 0 and run["says_no_stored_result"]
    assert (tmp_path / "empty" / "nb.ipynb").is_file()


def test_a_bare_assert_is_located_by_cell_and_line(tmp_path):
    path = _notebook(tmp_path, "print('dev')", "x = 3", "y = x + 1\nassert y == 5\nprint(y)")
    (error,) = rn.execute(path)["errors"]
    assert error.startswith("cell 2: AssertionError") and "assert y == 5" in error, error
