"""The repository's address is declared once (pyproject.toml) and every link follows it; the package
list of pyproject.toml covers every package folder (a wheel missing one would break outside the checkout)."""

from __future__ import annotations

import importlib.util
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("repository", ROOT / "book" / "repository.py")
repository = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repository)


def test_every_link_of_the_project_names_the_declared_repository():
    url = repository.declared()
    assert url.startswith("https://github.com/")
    bad = {str(p.relative_to(ROOT)): found for p in repository.files() if (found := repository.problems(p.read_text(), url))}
    assert not bad, f"run `python book/repository.py --write` after changing pyproject.toml: {bad}"
    names = {p.name for p in repository.files()}
    assert {"README.md", "_config.yml", "01_linear_attention.md", "01_linear_attention.ipynb"} <= names


def test_the_library_reads_the_same_address():
    from gla_ref.runtime import repository_url

    assert repository_url() == repository.declared()


def test_rewrite_moves_the_projects_links_and_leaves_others():
    text = ('[![Open In Colab](x)](https://colab.research.google.com/github/old/name/blob/main/notebooks/01_linear_attention.ipynb)\n'
            '%pip install -q "gla_ref @ git+https://github.com/old/name"\n'
            '[src](https://github.com/old/name/blob/main/gla_ref/torch_ref.py) and '
            '[fla](https://github.com/fla-org/flash-linear-attention/blob/main/fla/ops/gla/chunk.py).\n'
            'repository:\n  url: https://github.com/old/name\n')
    url = "https://github.com/new-owner/new.repo"
    assert len(repository.problems(text, url)) == 4
    out = repository.rewrite(text, url)
    assert repository.problems(out, url) == []
    assert out.count("new-owner/new.repo") == 4 and "fla-org/flash-linear-attention/blob/main/fla" in out


def test_links_to_missing_files_and_other_branches_are_reported():
    url = repository.declared()
    assert repository.problems(f"{url}/blob/main/gla_ref/no_such_file.py", url)
    assert repository.problems(f"{url}/tree/dev/gla_ref", url)


def test_pyproject_lists_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gla_ref").rglob("__init__.py")}
    assert set(config["packages"]) == folders | {"gla_ref.bench.stored"}
    assert config["package-dir"] == {"gla_ref.bench.stored": "benchmarks/results"}
