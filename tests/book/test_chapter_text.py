"""What the chapters say: no chapter, appendix or the README speaks of the repository's issues (the book is for
readers; engineering history lives in git and the appendices)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEXTS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md")) + [ROOT / "README.md"]
ISSUE = re.compile(r"(\brepository issues?\b|\bGitHub issues?\b|\bissue #\d+|\bissue tracker\b|\bclosing note\b)", re.IGNORECASE)


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_no_text_speaks_of_repository_issues(path):
    found = [(n, line.strip()) for n, line in enumerate(path.read_text().splitlines(), 1) if ISSUE.search(line)]
    assert not found, found


def test_the_pattern_finds_what_it_forbids():
    assert all(ISSUE.search(s) for s in ("as repository issue 15 asked", "see issue #3", "GitHub issues"))
    assert not any(ISSUE.search(s) for s in ("the SMs issue instructions", "issued in 3 ms", "Python issues them", "to issue 200 steps"))
