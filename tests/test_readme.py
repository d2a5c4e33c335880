"""README stays true: CI runs its test command, and its rule table matches the catalogue."""

import re
import shlex
from pathlib import Path

from recheck.catalogue import all_rules

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_ci_runs_the_readme_test_commands():
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    commands = [line.strip() for block in blocks for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 2, commands  # the main suite, then the real-library tests
    ci_lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    for command in commands:
        assert command in ci_lines, f"CI does not run the README's test command {command!r}"
    assert shlex.split(commands[0].split("&&")[-1]) == ["python", "-m", "pytest"]
    assert "RECHECK_REQUIRE_LIBRARIES=1" in commands[1]


def test_rule_table_matches_the_catalogue():
    rows = re.findall(r"^\| (RC\d{3}) \| ([a-z0-9-]+) \|", README, re.M)
    assert rows == [(r.code, r.name) for r in all_rules()]
