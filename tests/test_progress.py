"""recheck.progress: a bar on a terminal's stderr, nothing elsewhere; its hooks in lint, check, cost."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from recheck import progress as progress_module
from recheck.cli import main
from recheck.lint.engine import lint_paths
from recheck.lint.settings import LintOptions
from recheck.progress import colour_enabled, paint, progress, shows_progress

ROOT = Path(__file__).resolve().parent.parent


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(progress_module, "_MIN_INTERVAL", 0)  # draw every step, for the tests to read
    return Terminal()


def test_a_bar_is_drawn_on_a_terminal_and_cleared_at_the_end(terminal):
    with progress("checking", total=3, unit="region", stream=terminal) as bar:
        assert bar.shown
        for name in ("a", "b", "c"):
            bar.describe(name)
            bar.advance()
    drawn = terminal.getvalue()
    assert "checking" in drawn and "3/3" in drawn and "region" in drawn and ", c" in drawn
    assert "\x1b[32m" in drawn  # green
    assert drawn.rstrip(" ").endswith("\r")  # cleared: the terminal is left as it was


@pytest.mark.parametrize("why", ["not a terminal", "quiet", "TERM=dumb"])
def test_nothing_is_drawn(why, terminal, monkeypatch):
    stream: io.StringIO = io.StringIO() if why == "not a terminal" else terminal
    if why == "TERM=dumb":
        monkeypatch.setenv("TERM", "dumb")
    with progress("checking", total=2, stream=stream, quiet=why == "quiet") as bar:
        assert not bar.shown
        bar.advance()
        bar.count(1, 2)
        bar.describe("x")
        assert bar.out is stream
    assert stream.getvalue() == ""


def test_no_color_keeps_the_bar_and_drops_the_colour(terminal, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    with progress("checking", total=1, stream=terminal) as bar:
        bar.advance()
    assert "checking" in terminal.getvalue() and "\x1b[3" not in terminal.getvalue()


def test_without_a_terminal_tqdm_is_not_even_imported():
    code = ("import sys\nfrom recheck.progress import progress\n"
            "with progress('x', total=2) as bar:\n    bar.advance()\nprint('tqdm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False" and out.stderr == ""


def test_count_follows_a_growing_total(terminal):
    with progress("parsing", unit="file", stream=terminal) as bar:
        bar.count(0, 10)
        bar.count(4, 10)
        bar.count(10, 25)  # a later round found more files
        assert (bar._bar.n, bar._bar.total) == (10, 25)


def test_a_bar_without_total_keeps_its_clock_moving_and_its_ticker_stops(terminal, monkeypatch):
    monkeypatch.setattr(progress_module, "_TICK", 0.01)
    redrawn = threading.Event()
    with progress("measuring step", stream=terminal) as bar:
        original = bar._bar.refresh

        def refresh(*args, **kwargs):
            redrawn.set()
            return original(*args, **kwargs)

        bar._bar.refresh = refresh
        assert redrawn.wait(timeout=30), "the ticker never redrew the bar"
    assert "measuring step: 00:0" in terminal.getvalue()
    assert not [t for t in threading.enumerate() if t.name == "recheck-progress"]


def test_redirected_prints_and_stderr_go_above_the_bar(terminal, capsys):
    with progress("checking", total=1, stream=terminal) as bar:
        with bar.redirected():
            print("from the region")
            print("a warning, say", file=sys.stderr)
            print("partial", end="")
        bar.advance()
    assert capsys.readouterr() == ("", "")
    drawn = terminal.getvalue()
    assert "from the region\n" in drawn and "a warning, say\n" in drawn and "partial\n" in drawn


def test_redirected_without_a_bar_sends_prints_to_stderr(capsys):
    with progress("checking", total=1, stream=io.StringIO()) as bar:
        assert bar.out is not sys.stdout
    with progress("checking", total=1) as bar:  # stderr (captured) is not a terminal
        with bar.redirected():
            print("printed")
    out, err = capsys.readouterr()
    assert out == "" and err == "printed\n"


def test_paint(terminal, monkeypatch):
    assert paint("ok", "green", terminal) == "\x1b[32mok\x1b[0m"
    assert paint("ok", "green", io.StringIO()) == "ok"
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_enabled(terminal) and paint("ok", "green", terminal) == "ok"
    monkeypatch.setenv("NO_COLOR", "")  # empty: as if unset (no-color.org)
    assert colour_enabled(terminal)


def test_shows_progress_defaults_to_stderr(terminal, monkeypatch):
    monkeypatch.setattr(sys, "stderr", terminal)
    assert shows_progress()
    assert not shows_progress(quiet=True)


# -- the hooks ----------------------------------------------------------------------------


CHECKPOINTED = textwrap.dedent('''
    from torch.utils.checkpoint import checkpoint

    from helpers_{i} import helper


    def forward(block, x):
        return checkpoint(helper, block, x, use_reentrant=False)
''')


@pytest.fixture
def tree(tmp_path):
    for i in range(20):
        (tmp_path / f"model_{i}.py").write_text(CHECKPOINTED.format(i=i))
        (tmp_path / f"helpers_{i}.py").write_text("def helper(block, x):\n    return block(x)\n")
    (tmp_path / "unrelated.py").write_text("x = 1\n")
    return tmp_path


def test_lint_paths_reports_each_parsed_file_as_the_rounds_find_them(tree):
    calls: list[tuple[int, int]] = []
    result = lint_paths([tree], LintOptions(cache_dir=None, jobs=2), progress=lambda d, t: calls.append((d, t)))
    dones = [d for d, _ in calls]
    totals = [t for _, t in calls]
    assert dones == sorted(dones) and totals == sorted(totals)
    assert all(d <= t for d, t in calls)
    assert calls[-1] == (result.stats["parsed"], result.stats["parsed"]) == (40, 40)
    assert totals[0] == 20  # the checkpointing files first; their helpers in the next round


def test_lint_draws_a_bar_on_a_terminal_and_not_with_quiet(tree, terminal, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stderr", terminal)
    main(["lint", "--no-cache", str(tree)])
    assert "parsing" in terminal.getvalue() and "40/40" in terminal.getvalue()
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    main(["lint", "--no-cache", "--quiet", str(tree)])
    assert "parsing" not in quiet.getvalue()


def test_lint_import_path_stays_cheap():
    code = "import sys\nimport recheck.commands.lint, recheck.progress\nprint(sorted(m for m in ('torch', 'tqdm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


REGIONS = textwrap.dedent('''
    import warnings

    import torch
    from torch import nn


    def region_a():
        torch.manual_seed(0)
        return nn.Linear(3, 3), (torch.randn(2, 3),)


    def _loud(x):
        print("region prints")
        return torch.tanh(x)


    def region_b():
        return _loud, (torch.randn(2, 3, requires_grad=True),)
''')


def test_check_counts_regions_on_a_terminal_and_keeps_stdout_for_the_report(tmp_path, terminal, monkeypatch,
                                                                           capsys):
    regions = tmp_path / "shown_regions.py"
    regions.write_text(REGIONS)
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["check", str(regions)]) == 1  # region_b prints again on recompute
    drawn = terminal.getvalue()
    assert "checking" in drawn and "2/2" in drawn and "shown_regions.py:region_b" in drawn
    assert "region prints" in drawn
    out = capsys.readouterr().out
    assert "region prints" not in out.splitlines()  # only quoted in the report
    assert "\x1b[" not in out  # stdout is not a terminal: no colour
    quiet = Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    main(["check", "--quiet", str(regions)])
    assert "checking" not in quiet.getvalue() and "region prints" in quiet.getvalue()


def test_check_summary_is_coloured_on_a_terminal(tmp_path, monkeypatch, capsys):
    regions = tmp_path / "shown_regions.py"
    regions.write_text(REGIONS)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(progress_module, "_is_terminal", lambda stream: stream is sys.stdout)
    assert main(["check", f"{regions}:region_a"]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("\x1b[32mrecheck: checked 1 region")
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["check", f"{regions}:region_a"]) == 0
    assert "\x1b[" not in capsys.readouterr().out


def test_check_reports_wrap_to_the_terminal_s_width(tmp_path, monkeypatch, capsys):
    regions = tmp_path / "shown_regions.py"
    regions.write_text(REGIONS)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.chdir(tmp_path)  # short paths: a word longer than the line stays whole
    assert main(["check", "shown_regions.py:region_b"]) == 1  # a report (the region prints again)
    plain = capsys.readouterr().out
    assert max(map(len, plain.splitlines())) > 60  # a pipe: lines as rendered
    monkeypatch.setattr(progress_module, "_is_terminal", lambda stream: stream is sys.stdout)
    assert main(["check", "shown_regions.py:region_b"]) == 1
    wrapped = capsys.readouterr().out
    report = wrapped.split("\nrecheck: checked")[0]
    assert max(map(len, report.splitlines())) <= 60
    assert " ".join(report.split()) == " ".join(plain.split("\nrecheck: checked")[0].split())  # every word kept


def test_cost_shows_what_it_measures_and_keeps_its_json_clean(tmp_path, terminal, monkeypatch, capsys):
    step = tmp_path / "train.py"
    step.write_text(textwrap.dedent('''
        import torch
        from torch import nn
        from torch.utils.checkpoint import checkpoint

        model = nn.Linear(4, 4)

        def step():
            print("step prints")
            x = torch.randn(2, 4, requires_grad=True)
            checkpoint(model, x, use_reentrant=False).sum().backward()
    '''))
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["cost", f"{step}:step", "--repeats", "1", "--format", "json"]) == 0
    import json

    json.loads(capsys.readouterr().out)  # the step's prints did not land in the JSON
    drawn = terminal.getvalue()
    assert f"measuring {step}:step" in drawn and "checkpointed and bypassed, 1 timed run each" in drawn
    assert "step prints" in drawn
