"""Golden fixtures: each folder of ``fixtures/lint`` is linted and compared with ``expected.txt``.

Run ``python tests/lint/test_golden.py --update CASE`` to rewrite one case's expectations
(read the difference before committing it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from recheck.lint.engine import lint_paths
from recheck.lint.settings import LintOptions

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lint"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.txt").is_file())


def actual(case: str, jobs: int = 1) -> list[str]:
    folder = FIXTURES / case
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        result = lint_paths([Path(".")], LintOptions(root=folder, cache_dir=None, jobs=jobs))
    finally:
        os.chdir(cwd)
    assert not result.errors, result.errors
    return sorted(f"{f.path}:{f.line}:{f.column}: {f.code}" for f in result.findings)


def expected(case: str) -> list[str]:
    return sorted(line for line in (FIXTURES / case / "expected.txt").read_text().splitlines() if line.strip())


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    assert actual(case) == expected(case)


def test_cases_exist():
    assert {"gcl_subclass", "loop_call", "timm_seq", "closures", "entry_points", "cross_file"} <= set(CASES)


if __name__ == "__main__":  # pragma: no cover - maintenance helper
    if len(sys.argv) == 3 and sys.argv[1] == "--update":
        (FIXTURES / sys.argv[2] / "expected.txt").write_text("".join(line + "\n" for line in actual(sys.argv[2])))
    else:
        sys.exit("usage: python tests/lint/test_golden.py --update CASE")
