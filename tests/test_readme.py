"""README stays true: CI runs its commands, the Quickstart works as it says, and its rule table
matches the catalogue."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from recheck.catalogue import all_rules

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _ci_environments() -> list[list[str]]:
    """The command lines of .ci/run, cut where each fresh virtual environment is made."""
    environments: list[list[str]] = [[]]
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        line = line.strip()
        if line.startswith("fresh_venv "):
            environments.append([])
        elif line and not line.startswith("#"):
            environments[-1].append(line)
    return environments


def test_ci_runs_every_readme_command_in_its_own_fresh_environment():
    commands = _readme_commands()
    # the Quickstart check of the zoo, the main suite, the real-library tests
    assert len(commands) == 3, commands
    assert commands[0].endswith("recheck check fixtures/models/zoo.py")
    assert [shlex.split(part) for part in commands[1].split("&&")[1:]] == [
        ["mypy"], ["ruff", "check", "."], ["python", "-m", "pytest"]]  # the static checks, then the suite
    assert "RECHECK_REQUIRE_LIBRARIES=1" in commands[2]
    environments = _ci_environments()
    homes = []
    for command in commands:
        home = [i for i, lines in enumerate(environments) if command in lines]
        assert home, f"CI does not run the README's command {command!r}"
        homes.append(home[0])
    assert len(set(homes)) == len(commands), "two README commands share one CI environment"
    for command, home in zip(commands, homes):
        lines = environments[home]
        before = lines[: lines.index(command)]
        # what README says to install first: PyTorch (and torchvision for the real libraries)
        installs = [line for line in before if "pip install" in line]
        assert installs and all(re.search(r"pip install -q torch==[\d.]+( torchvision==[\d.]+)?$", line)
                                for line in installs), (command, installs)


def test_the_quickstart_count_is_the_zoo_count():
    zoo = (ROOT / "fixtures" / "models" / "zoo.py").read_text()
    regions = re.findall(r"^ *def (region_\w+)\(\)", zoo, re.M)
    assert f"{len(regions)} regions in `fixtures/models/zoo.py`" in README
    assert f"{len(regions) - 1} regions" in README  # without numpy (one example needs it)


def test_rule_table_matches_the_catalogue():
    rows = re.findall(r"^\| (RC\d{3}) \| ([a-z0-9-]+) \|", README, re.M)
    assert rows == [(r.code, r.name) for r in all_rules()]


WITHOUT_NUMPY = """
import sys
sys.modules["numpy"] = None  # as in a fresh environment with torch alone
import warnings
warnings.simplefilter("ignore")  # torch: "Failed to initialize NumPy"
from recheck.cli import main
sys.exit(main(["check", "fixtures/models/zoo.py"]))
"""


@pytest.mark.slow
def test_the_quickstart_check_works_without_numpy():
    out = subprocess.run([sys.executable, "-c", WITHOUT_NUMPY], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1, out.stderr  # hazards found, nothing broke
    summary = out.stdout.rstrip().splitlines()[-1]
    assert re.fullmatch(r"recheck: checked 31 regions: 18 with findings \(\d+ differences\), 13 clean", summary)
    assert "region_numpy_random" not in out.stdout


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


def test_every_tool_recheck_key_is_documented():
    from recheck.config import SCHEMA

    configuration = _section("Configuration")
    for key in SCHEMA:
        assert f"`{key.replace('_', '-')}`" in configuration, f"[tool.recheck] key {key!r} is not in README"


def test_every_command_line_option_is_documented():
    import argparse

    from recheck.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for name, command in commands.choices.items():
        for action in command._actions:
            spelled = [o for o in action.option_strings if o != "-h" and o != "--help"]
            if isinstance(action, argparse.BooleanOptionalAction):
                spelled = [o for o in spelled if not o.startswith("--no-")]
            if spelled and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", README) for o in spelled):
                missing.append(f"recheck {name} {spelled[0]}")
    assert not missing, f"options README does not mention: {missing}"


def test_the_fast_subset_is_documented_and_the_marker_exists():
    from recheck.config import tomllib  # tomli before Python 3.11

    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(marker.startswith("slow:") for marker in pytest_ini["markers"])
    assert 'python -m pytest -m "not slow"' in README


def test_every_test_readme_cites_exists():
    """README's safety section cites the test that holds each guarantee; a renamed or removed
    test would leave the guarantee standing on nothing."""
    cited = sorted(set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", README)))
    assert cited, "README cites no test"
    missing = []
    for path, name in cited:
        source = ROOT / path
        if not source.is_file() or not re.search(rf"^\s*def {name}\(", source.read_text(encoding="utf-8"), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"README cites tests that do not exist: {missing}"
