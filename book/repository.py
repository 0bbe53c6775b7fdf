"""Keep every link to this project's repository on the one address ``pyproject.toml`` declares.

    python book/repository.py          # list the links that disagree with [project.urls] Repository
    python book/repository.py --write  # rewrite them (after changing the address in pyproject.toml)

A link is the project's when it is a Colab link to a notebook, a ``git+`` install line, the book's
``repository: url:``, or a GitHub link to the declared repository or to a file of this one. Each must
name the declared owner and repository and the branch :data:`BRANCH`, and a file link must name a file
or folder that exists. ``tests/package/test_repository.py`` runs the check in CI; ``gla_ref.runtime.repository_url``
reads the same declaration at run time.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BRANCH = "main"
"""The branch the Colab badges and source links point at."""

GITHUB = re.compile(r"(?P<git>git\+)?https://github\.com/(?P<owner>[\w.-]+)/(?P<repo>[\w-]+(?:\.[\w-]+)*)"
                    r"(?:/(?P<kind>blob|tree)/(?P<branch>[\w.-]+)/(?P<path>[\w./-]*[\w/-]))?")
COLAB = re.compile(r"https://colab\.research\.google\.com/github/(?P<owner>[\w.-]+)/(?P<repo>[\w.-]+?)"
                   r"/blob/(?P<branch>[\w.-]+)/(?P<path>[\w./-]*\w)")
CONFIG_URL = re.compile(r"(?m)^(?P<indent>\s+url:\s*)(?P<url>https://github\.com/\S+)\s*$")


def declared() -> str:
    """``[project.urls] Repository`` of pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"].rstrip("/")


def files() -> list:
    """The files that link to the repository: README, the book's pages and configuration, every chapter."""
    found = [ROOT / "README.md", ROOT / "book" / "_config.yml", *sorted((ROOT / "book").glob("*.md"))]
    found += sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md")) + sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return [path for path in found if path.is_file()]


def _ours(match, owner_repo) -> bool:
    if match.re is COLAB or match.group("git"):
        return True
    if f"{match.group('owner')}/{match.group('repo')}" == owner_repo:
        return True
    return bool(match.group("path")) and (ROOT / match.group("path")).exists()


def problems(text: str, url: str) -> list:
    """What is wrong with the project's links in ``text`` against the declared ``url``."""
    owner_repo = url.removeprefix("https://github.com/")
    found = []
    for pattern in (GITHUB, COLAB):
        for match in pattern.finditer(text):
            if not _ours(match, owner_repo):
                continue
            name = f"{match.group('owner')}/{match.group('repo')}"
            if name != owner_repo:
                found.append(f"{match.group(0)} names {name}, not {owner_repo}")
            if match.groupdict().get("branch") not in (None, BRANCH):
                found.append(f"{match.group(0)} names branch {match.group('branch')}, not {BRANCH}")
            path = match.groupdict().get("path")
            if path and not (ROOT / path).exists():
                found.append(f"{match.group(0)} links to {path}, which is not in the repository")
    for match in CONFIG_URL.finditer(text):
        if match.group("url").rstrip("/") != url:
            found.append(f"repository url {match.group('url')} is not {url}")
    return found


def rewrite(text: str, url: str) -> str:
    """``text`` with every link of the project pointed at ``url`` (paths and branches kept)."""
    owner_repo = url.removeprefix("https://github.com/")

    def swap(match):
        if not _ours(match, owner_repo):
            return match.group(0)
        start, end = match.span("owner")[0] - match.start(), match.span("repo")[1] - match.start()
        return match.group(0)[:start] + owner_repo + match.group(0)[end:]

    text = COLAB.sub(swap, GITHUB.sub(swap, text))
    return CONFIG_URL.sub(lambda m: m.group("indent") + url, text)


def main(argv) -> int:
    url = declared()
    bad = {path: problems(path.read_text(), url) for path in files()}
    bad = {path: found for path, found in bad.items() if found}
    if "--write" in argv:
        for path in bad:
            path.write_text(rewrite(path.read_text(), url))
        bad = {path: found for path in bad if (found := problems(path.read_text(), url))}
    for path, found in bad.items():
        for line in found:
            print(f"{path.relative_to(ROOT)}: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
