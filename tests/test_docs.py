"""The documentation stays true: every code block in ``docs/`` and README is run or marked as not
run, README's commands are the ones CI runs, and every CLI option and ``[tool.recheck]`` key of
the code appears in the docs.

The convention (documented in ``docs/development.md``): a fence's language and an HTML comment on
the line just before it say how the block is tested.

- ```` ```pycon ````: a doctest; a page's pycon blocks run in order in one namespace.
- ```` ```toml ````: a ``pyproject.toml`` fragment, loaded and validated as ``[tool.recheck]``.
- ``<!-- file: NAME -->``: the block is written to ``NAME`` in a fresh folder (one per page).
- ``<!-- output: recheck ARGS -->``: ``recheck ARGS`` runs in that folder (the project root when the
  page writes no file) and its standard output must be the block, exactly (``RECHECK_UPDATE_DOCS=1``
  rewrites a block whose output changed, for a change that means it).
- ``<!-- ci -->``: every line is a command ``.ci/run`` runs, each in its own fresh environment.
- ``<!-- not run -->`` (or ``<!-- not run: why -->``): shown, never run.
"""

from __future__ import annotations

import argparse
import contextlib
import doctest
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: the site's pages, research notes aside (working notes, not the manual)
PAGES = sorted(p for p in DOCS.rglob("*.md") if "research" not in p.relative_to(DOCS).parts)
README = ROOT / "README.md"
FENCE = re.compile(r"(?:^<!-- (?P<marker>[^\n]*?) -->\n)?^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```$", re.M | re.S)


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    marker: str
    body: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    return [Block(page, text.count("\n", 0, m.start()) + 1, m["lang"], (m["marker"] or "").strip(), m["body"])
            for m in FENCE.finditer(text)]


ALL_BLOCKS = [block for page in PAGES + [README] for block in _blocks(page)]


def _kind(block: Block) -> str | None:
    marker = block.marker
    if marker == "not run" or marker.startswith("not run:"):
        return "not run"
    for kind in ("file:", "output:"):
        if marker.startswith(kind):
            return kind[:-1]
    if marker == "ci":
        return "ci"
    if not marker and block.lang in ("pycon", "toml"):
        return block.lang
    return None


def test_every_code_block_is_run_or_marked_not_run():
    unmarked = [f"{block} ({block.lang or 'no language'}, marker {block.marker!r})"
                for block in ALL_BLOCKS if _kind(block) is None]
    assert not unmarked, f"code blocks neither tested nor marked <!-- not run -->: {unmarked}"


def test_pages_show_tested_blocks():
    kinds = {_kind(block) for block in ALL_BLOCKS}
    assert {"pycon", "toml", "file", "output", "ci"} <= kinds


# -- pycon: doctests ------------------------------------------------------------------------------

DOCTEST_PAGES = sorted({block.page for block in ALL_BLOCKS if _kind(block) == "pycon"})


@pytest.mark.parametrize("page", DOCTEST_PAGES, ids=lambda p: p.name)
def test_doctests(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = "\n".join(block.body for block in _blocks(page) if _kind(block) == "pycon")
    parser = doctest.DocTestParser()
    test = parser.get_doctest(source, {}, page.name, str(page), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = io.StringIO()
    runner.run(test, out=out.write)
    assert runner.failures == 0, out.getvalue()


# -- toml: [tool.recheck] ------------------------------------------------------------------------

TOML_BLOCKS = [block for block in ALL_BLOCKS if _kind(block) == "toml"]


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=str)
def test_toml_blocks_are_valid_configuration(block, tmp_path):
    from recheck.config import load_config

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(block.body, encoding="utf-8")
    config = load_config(path=pyproject)  # raises ConfigError naming the key
    assert config.values, f"{block}: no [tool.recheck] key"


# -- file: and output: -----------------------------------------------------------------------------

OUTPUT_BLOCKS = [block for block in ALL_BLOCKS if _kind(block) == "output"]


@pytest.mark.parametrize("block", OUTPUT_BLOCKS, ids=str)
def test_shown_output_is_the_real_output(block, tmp_path, monkeypatch, capsys):
    from recheck.cli import main

    files = [b for b in _blocks(block.page) if _kind(b) == "file"]
    for file in files:
        (tmp_path / file.marker.split(":", 1)[1].strip()).write_text(file.body, encoding="utf-8")
    monkeypatch.chdir(tmp_path if files else ROOT)
    command = shlex.split(block.marker.split(":", 1)[1])
    assert command[0] == "recheck", block.marker
    with contextlib.suppress(SystemExit):
        main(command[1:])
    out = capsys.readouterr().out
    if out != block.body and os.environ.get("RECHECK_UPDATE_DOCS") == "1":
        shown = f"<!-- {block.marker} -->\n```{block.lang}\n"
        text = block.page.read_text(encoding="utf-8")
        block.page.write_text(text.replace(shown + block.body, shown + out, 1), encoding="utf-8")
        pytest.skip(f"{block}: rewritten with the new output (RECHECK_UPDATE_DOCS=1)")
    assert out == block.body, (f"{block}: the output of `{shlex.join(command)}` changed (RECHECK_UPDATE_DOCS=1 "
                               f"rewrites the block); it is now:\n{out}")


def test_every_file_block_is_used_by_an_output_block():
    for block in ALL_BLOCKS:
        if _kind(block) == "file":
            name = block.marker.split(":", 1)[1].strip()
            assert any(name in shlex.split(b.marker.split(":", 1)[1]) for b in OUTPUT_BLOCKS
                       if b.page == block.page), f"{block}: no output block runs {name}"


# -- ci: the commands CI runs ----------------------------------------------------------------------

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


def _ci_commands(page: Path) -> list[str]:
    return [line.strip() for block in _blocks(page) if _kind(block) == "ci"
            for line in block.body.splitlines() if line.strip()]


def test_ci_runs_every_documented_command_in_its_own_fresh_environment():
    commands = list(dict.fromkeys(c for page in PAGES + [README] for c in _ci_commands(page)))
    # the Quickstart check of the zoo, the main suite, the real-library tests, the docs build
    assert len(commands) == 4, commands
    environments = _ci_environments()
    homes = []
    for command in commands:
        home = [i for i, lines in enumerate(environments) if command in lines]
        assert home, f"CI does not run the documented command {command!r}"
        homes.append(home[0])
    assert len(set(homes)) == len(commands), "two documented commands share one CI environment"
    for command, home in zip(commands, homes):
        lines = environments[home]
        installs = [line for line in lines[: lines.index(command)] if "pip install" in line]
        # what the docs say to install first: PyTorch (and torchvision for the real libraries); the docs
        # build needs nothing first
        assert all(re.search(r"pip install -q torch==[\d.]+( torchvision==[\d.]+)?$", line) for line in installs), (
            command, installs)


def test_readme_quickstart_and_test_commands_are_cis():
    commands = _ci_commands(README)
    assert commands[0].endswith("recheck check fixtures/models/zoo.py"), commands
    assert [shlex.split(part) for part in commands[1].split("&&")[1:]] == [
        ["mypy"], ["ruff", "check", "."], ["python", "-m", "pytest"]]  # the static checks, then the suite
    assert set(commands) <= set(_ci_commands(DOCS / "getting-started.md") + _ci_commands(DOCS / "development.md"))


def test_the_quickstart_count_is_the_zoo_count():
    zoo = (ROOT / "fixtures" / "models" / "zoo.py").read_text()
    regions = re.findall(r"^ *def (region_\w+)\(\)", zoo, re.M)
    for page in (README, DOCS / "getting-started.md"):
        text = page.read_text(encoding="utf-8")
        assert f"{len(regions)} regions in `fixtures/models/zoo.py`" in text, page
        assert f"{len(regions) - 1} regions" in text, page  # without numpy (one example needs it)


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

# -- the docs cover the code -------------------------------------------------------------------------

def _all_docs() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in PAGES)


def test_every_tool_recheck_key_is_documented():
    from recheck.config import SCHEMA

    configuration = (DOCS / "configuration.md").read_text(encoding="utf-8")
    first_cells = [line.split("|")[1] for line in configuration.splitlines() if line.startswith("| ")]
    missing = [key for key in SCHEMA if not any(f"`{key.replace('_', '-')}`" in cell for cell in first_cells)]
    assert not missing, f"[tool.recheck] keys without a row in docs/configuration.md: {missing}"


def test_every_command_line_option_is_documented():
    from recheck.cli import build_parser

    docs = _all_docs()
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for name, command in commands.choices.items():
        for action in command._actions:
            spelled = [o for o in action.option_strings if o != "-h" and o != "--help"]
            if isinstance(action, argparse.BooleanOptionalAction):
                spelled = [o for o in spelled if not o.startswith("--no-")]
            if spelled and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", docs) for o in spelled):
                missing.append(f"recheck {name} {spelled[0]}")
    assert not missing, f"options the docs do not mention: {missing}"


def test_readme_links_resolve():
    """README is read on GitHub and PyPI, outside the site's strict build: its relative links are
    checked here."""
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    assert links, "README links to no docs page"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to paths that do not exist: {missing}"

def test_the_fast_subset_is_documented_and_the_marker_exists():
    from recheck.config import tomllib  # tomli before Python 3.11

    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(marker.startswith("slow:") for marker in pytest_ini["markers"])
    assert 'python -m pytest -m "not slow"' in (DOCS / "development.md").read_text(encoding="utf-8")


def test_every_test_the_docs_cite_exists():
    """The safety page cites the test that holds each guarantee; a renamed or removed test would
    leave the guarantee standing on nothing."""
    cited = sorted(set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", _all_docs() + README.read_text(encoding="utf-8"))))
    assert cited, "the docs cite no test"
    missing = []
    for path, name in cited:
        source = ROOT / path
        if not source.is_file() or not re.search(rf"^\s*def {name}\(", source.read_text(encoding="utf-8"), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"the docs cite tests that do not exist: {missing}"

