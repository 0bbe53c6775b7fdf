"""The repository's map, ARCHITECTURE.md, against the tree it describes.

The map has one table row per folder of ``gla_ref/`` and one per top-level module, each naming what
the code there may import. The tests below read those rows and check, by reading the source (``ast``),
that

* the rows and the package folders (and top-level modules) are the same set;
* every ``gla_ref`` import, at module level or inside a function, and every framework import follows
  the row of the file's folder (own folder and its subfolders are always allowed);
* no private name (``_x``) crosses a module boundary: ``from gla_ref.m import _x`` and ``m._x`` on a
  name bound by an import of a gla_ref module are refused (private *modules* such as ``_validate`` may
  be imported and used by their public names; ``jax._src`` and other third-party names are not ours);
* no file of ``gla_ref`` is longer than ``MAX_LINES``;
* importing the framework-free packages loads neither torch, JAX nor Triton.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gla_ref"
MAP = ROOT / "ARCHITECTURE.md"

FRAMEWORKS = ("numpy", "matplotlib", "torch", "jax", "flax", "triton")
"""Third-party packages the map's rows allow or not; other imports (stdlib, IPython, nvidia) are free."""

HEAVY = ("torch", "jax", "triton", "flax")
"""Frameworks a framework-free import must not load."""

FRAMEWORK_FREE = ("gla_ref.testing", "gla_ref.reference", "gla_ref.layers", "gla_ref.sequence_parallel",
                  "gla_ref.teaching", "gla_ref.tasks", "gla_ref.bench", "gla_ref.viz")
"""Packages importable before any framework is installed (the map's rules list them); besides them, every
top-level module but the two aliases below and every module of gla_ref.viz."""

FRAMEWORK_ALIASES = ("gla_ref.torch_ref", "gla_ref.jax_ref")
"""Top-level modules that are a framework's reference module itself, so they load it."""

MAX_LINES = 600
LONG_FILES: dict[str, str] = {}
"""Files allowed past MAX_LINES, as ``"gla_ref/path.py": "why it cannot be split"``. Keep it empty."""

NAMEDTUPLE_API = {"_fields", "_field_defaults", "_replace", "_asdict", "_make"}
"""Underscore names that are public API (of namedtuples), not private ones."""

OUTSIDE = ("tests/", "benchmarks/", "notebooks/", "book/")
"""Top-level folders the map also describes, one row each."""


# ---- the map ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One row of the map: where, what it may import from gla_ref (dotted names) and which frameworks."""

    path: str
    modules: frozenset
    frameworks: frozenset
    line: int


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse_map(text: str) -> tuple[dict[str, Rule], list[str]]:
    """The rows of the map's tables whose first cell is a backticked ``gla_ref/...`` path, and the first
    cells of the other rows (the folders around the package)."""
    rules, others = {}, []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            continue
        cells = _cells(line)
        first = re.fullmatch(r"`([^`]+)`", cells[0])
        if first is None:
            continue
        path = first.group(1)
        if not path.startswith("gla_ref/"):
            others.append(path)
            continue
        assert len(cells) == 3, f"ARCHITECTURE.md:{number}: a row has three cells (where | what | may import)"
        assert path not in rules, f"ARCHITECTURE.md:{number}: {path} has two rows"
        allowed = cells[2]
        names = re.findall(r"`([^`]+)`", allowed)
        words = set(re.findall(r"[a-z]+", re.sub(r"`[^`]*`", " ", allowed)))
        rules[path] = Rule(path, frozenset(_dotted(name) for name in names),
                           frozenset(words & set(FRAMEWORKS)), number)
    return rules, others


def _dotted(name: str) -> str:
    """``triton/common/`` or ``pallas/compat.py`` (paths under gla_ref/) as a dotted module name."""
    name = name.removesuffix("/").removesuffix(".py")
    return "gla_ref." + name.replace("/", ".")


def _as_path(name: str) -> str:
    """A dotted gla_ref module as the map writes it: ``triton/common/`` or ``pallas/compat.py``."""
    path = name.removeprefix("gla_ref.").replace(".", "/")
    return path + "/" if (PACKAGE.parent / name.replace(".", "/") / "__init__.py").is_file() else path + ".py"


def _row_of(file: Path, rules: dict[str, Rule]) -> Rule | None:
    """The rule of a gla_ref file: its own row at the top level, its folder's row below it."""
    relative = file.relative_to(PACKAGE.parent).as_posix()
    if file.parent == PACKAGE:
        return rules.get(relative)
    return rules.get(file.parent.relative_to(PACKAGE.parent).as_posix() + "/")


# ---- the source ------------------------------------------------------------------------------------------


def package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(file: Path) -> str:
    parts = list(file.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    """Whether the dotted name is a module or package of this tree."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def owner(name: str) -> str:
    """The longest prefix of a dotted name that is a module of this tree."""
    parts = name.split(".")
    while len(parts) > 1 and not is_module(".".join(parts)):
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True)
class Import:
    line: int
    target: str  # the module imported: a gla_ref module of this tree, or a top-level third-party name
    name: str | None  # the name taken from it (``from target import name``), else None
    text: str  # the statement, for messages


@lru_cache(maxsize=None)
def _tree(file: Path) -> ast.Module:
    return ast.parse(file.read_text(), filename=str(file))


def _absolute(file: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module
    package = module_name(file).split(".")
    if file.name != "__init__.py":
        package.pop()
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _literal_import(node: ast.AST) -> str | None:
    """The module of ``importlib.import_module("x")`` or ``import_module("x")``, written as a literal."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called != "import_module" or not isinstance(node.args[0].value, str):
        return None
    return node.args[0].value


def imports(file: Path) -> list[Import]:
    """Every import in the file, wherever it is written, with the module it reaches."""
    found = []
    for node in ast.walk(_tree(file)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(node.lineno, _target(alias.name), None, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(file, node)
            for alias in node.names:
                if module.split(".")[0] == "gla_ref" and is_module(f"{module}.{alias.name}"):
                    target = f"{module}.{alias.name}"
                else:
                    target = _target(module)
                written = "." * node.level + (node.module or "")
                found.append(Import(node.lineno, target, alias.name, f"from {written} import {alias.name}"))
        elif (literal := _literal_import(node)) is not None:
            found.append(Import(node.lineno, _target(literal), None, f"import_module({literal!r})"))
    return found


def _target(module: str) -> str:
    return owner(module) if module.split(".")[0] == "gla_ref" else module.split(".")[0]


def allowed(rule: Rule, file: Path, target: str) -> bool:
    if target == "gla_ref":  # the package itself holds only the version
        return True
    own = module_name(file) if file.parent == PACKAGE else module_name(file.parent / "__init__.py")
    if file.parent != PACKAGE and (target == own or target.startswith(own + ".")):
        return True  # its own folder and everything below it
    return any(target == name or target.startswith(name + ".") for name in rule.modules)


def import_problems(rules: dict[str, Rule]) -> list[str]:
    problems = []
    for file in package_files():
        rule = _row_of(file, rules)
        where = file.relative_to(PACKAGE.parent).as_posix()
        if rule is None:
            problems.append(f"{where}: no row of ARCHITECTURE.md covers this file")
            continue
        for found in imports(file):
            if found.target.split(".")[0] == "gla_ref":
                if found.target == module_name(file) or allowed(rule, file, found.target):
                    continue
                may = ", ".join(sorted(_as_path(n) for n in rule.modules)) or "nothing of gla_ref"
                problems.append(f"{where}:{found.line}: `{found.text}` reaches {_as_path(found.target)}, which the row "
                                f"{rule.path} (ARCHITECTURE.md:{rule.line}) does not allow; it may import {may}")
            elif found.target in FRAMEWORKS and found.target not in rule.frameworks:
                may = ", ".join(sorted(rule.frameworks)) or "no framework"
                problems.append(f"{where}:{found.line}: `{found.text}` imports {found.target}, which the row "
                                f"{rule.path} (ARCHITECTURE.md:{rule.line}) does not allow; it may import {may}")
    return problems


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name not in NAMEDTUPLE_API


def _bound_modules(file: Path) -> dict[str, str]:
    """Names the file binds by importing a gla_ref module (or a name from one), with the dotted name
    each stands for: ``import gla_ref.a.b`` binds ``gla_ref``; ``import gla_ref.a as m`` binds ``m`` to
    gla_ref.a; ``from gla_ref.a import b`` binds ``b`` to gla_ref.a.b; ``m = import_module("gla_ref.a")``."""
    bound = {}
    for node in ast.walk(_tree(file)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gla_ref":
                    bound[alias.asname or "gla_ref"] = alias.name if alias.asname else "gla_ref"
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(file, node)
            if module.split(".")[0] == "gla_ref":
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            literal = _literal_import(node.value)
            if literal is not None and literal.split(".")[0] == "gla_ref":
                bound[node.targets[0].id] = literal
    return bound


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when the root is not a plain name."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + names[::-1]


def private_problems() -> list[str]:
    problems = []
    for file in package_files():
        where = file.relative_to(PACKAGE.parent).as_posix()
        here = module_name(file)
        bound = _bound_modules(file)
        for node in ast.walk(_tree(file)):
            if isinstance(node, ast.ImportFrom):
                module = _absolute(file, node)
                if module.split(".")[0] != "gla_ref" or owner(module) == here:
                    continue
                for alias in node.names:
                    if _private(alias.name) and not is_module(f"{module}.{alias.name}"):
                        problems.append(f"{where}:{node.lineno}: `from {module} import {alias.name}` takes a private "
                                        f"name from another module")
                continue
            chain = None
            if isinstance(node, ast.Attribute) and _private(node.attr):
                chain = _chain(node)
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                  and _private(node.args[1].value)):
                chain = _chain(node.args[0])
                chain = chain + [node.args[1].value] if chain else None
            if not chain or chain[0] not in bound:
                continue
            dotted = ".".join([bound[chain[0]]] + chain[1:])
            if is_module(dotted) or owner(dotted) == here:
                continue  # a private module reached by its name, or the file's own name
            problems.append(f"{where}:{node.lineno}: `{'.'.join(chain)}` reaches the private name {dotted}")
    return sorted(set(problems))


# ---- the tests -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rules() -> dict[str, Rule]:
    return parse_map(MAP.read_text())[0]


def test_the_readme_links_the_map():
    assert "(ARCHITECTURE.md)" in (ROOT / "README.md").read_text(), "README.md must link ARCHITECTURE.md"


def test_every_package_folder_has_one_row_and_every_row_a_folder(rules):
    folders = {p.parent.relative_to(PACKAGE.parent).as_posix() + "/" for p in PACKAGE.rglob("__init__.py")
               if p.parent != PACKAGE and "__pycache__" not in p.parts}
    rows = {path for path in rules if path.endswith("/")}
    assert not folders - rows, f"package folders without a row in ARCHITECTURE.md: {sorted(folders - rows)}"
    assert not rows - folders, f"rows of ARCHITECTURE.md naming no package folder: {sorted(rows - folders)}"


def test_every_top_level_module_has_one_row(rules):
    modules = {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.glob("*.py")}
    rows = {path for path in rules if path.endswith(".py")}
    assert not modules - rows, f"top-level modules without a row in ARCHITECTURE.md: {sorted(modules - rows)}"
    assert not rows - modules, f"rows of ARCHITECTURE.md naming no top-level module: {sorted(rows - modules)}"


def test_the_folders_around_the_package_have_rows():
    others = parse_map(MAP.read_text())[1]
    assert sorted(others) == sorted(OUTSIDE), f"rows outside gla_ref/: {others}, expected {list(OUTSIDE)}"
    assert all((ROOT / path).is_dir() for path in others)


def test_every_name_a_row_allows_exists(rules):
    stale = [f"{rule.path} (ARCHITECTURE.md:{rule.line}) allows {name}, which is no module of gla_ref"
             for rule in rules.values() for name in sorted(rule.modules) if not is_module(name)]
    assert not stale, "\n".join(stale)


def test_the_map_keeps_its_fixed_rules(rules):
    """What no edit of a row may allow: production importing teaching/, triton/common/ importing a family."""
    teaching = [rule.path for rule in rules.values() if not rule.path.startswith("gla_ref/teaching/")
                and any(name == "gla_ref.teaching" or name.startswith("gla_ref.teaching.") for name in rule.modules)]
    assert not teaching, f"rows letting production import teaching/: {teaching}"
    common = rules["gla_ref/triton/common/"].modules
    families = [name for name in common if name.startswith("gla_ref.triton") and
                not (name + ".").startswith("gla_ref.triton.common.")]
    assert not families, f"gla_ref/triton/common/ may not import a kernel family: {families}"


def test_imports_follow_the_map(rules):
    problems = import_problems(rules)
    assert not problems, "imports the map does not allow:\n" + "\n".join(problems)


def test_no_private_name_crosses_a_module_boundary():
    problems = private_problems()
    assert not problems, ("private names used outside their module (make the helper public in a shared "
                          "module):\n" + "\n".join(problems))


def test_files_stay_short():
    lengths = {p.relative_to(PACKAGE.parent).as_posix(): len(p.read_text().splitlines()) for p in package_files()}
    long = {path: n for path, n in lengths.items() if n > MAX_LINES and path not in LONG_FILES}
    assert not long, f"files over {MAX_LINES} lines (split them into a folder): {long}"
    fixed = [path for path in LONG_FILES if lengths.get(path, 0) <= MAX_LINES]
    assert not fixed, f"LONG_FILES names files that are now short or gone: {fixed}"


def test_framework_free_imports_load_no_framework():
    top = [module_name(p) for p in sorted(PACKAGE.glob("*.py")) if module_name(p) not in FRAMEWORK_ALIASES]
    viz = [module_name(p) for p in sorted((PACKAGE / "viz").glob("*.py"))]
    names = list(dict.fromkeys(top + list(FRAMEWORK_FREE) + viz))
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            f"    loaded = sorted(set({list(HEAVY)!r}) & set(sys.modules))\n"
            "    if loaded:\n"
            "        print(f'{name} loads {loaded}')\n"
            "        break\n"
            "else:\n"
            "    print('none')\n")
    path = [str(ROOT)] + [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}  # this tree's gla_ref, wherever it is installed
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none", out.stdout
