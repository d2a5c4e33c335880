"""A report a person reads in a minute (issue 45): the one text renderer of every face.

At most ten entries, causes before the differences they cause, each with its count and its
``recheck explain`` pointer, then how many more ``--verbose`` / JSON hold; colour only on a
terminal that shows it (``NO_COLOR`` respected); JSON keeps everything, in its old layout.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from recheck.findings import Finding, Invocation, Report
from recheck.output.json import check_document, steps_document
from recheck.output.text import ENTRIES_SHOWN, format_report

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "fixtures" / "models" / "zoo.py"
ESCAPE = re.compile("\x1b\\[")


def _finding(kind: str, number: int, code: str | None = None, region: str = "Block.forward (m.py:8)",
             index: int = 1, of: int = 1) -> Finding:
    return Finding(kind, f"{kind} difference number {number}", code=code, region=region,
                   subject=f"thing {number}", detail=f"the detail of {number}",
                   invocation=Invocation(index, of, {}, "train.py:30"))


def _thirty() -> Report:
    """30 findings in 30 entries: consequences found first, the causes after them."""
    found = [_finding("gradient", n) for n in range(10)]
    found += [_finding("recompute", n) for n in range(10, 20)]
    found += [_finding("rng", n, code="RC002") for n in range(20, 25)]
    found += [_finding("state", n, code="RC104", region="Attention.forward (m.py:20)") for n in range(25, 30)]
    return Report(found, title="watch: 30 checkpoint invocation(s) of 2 region(s), 30 verified")


def _entries(text: str) -> list[str]:
    return re.findall(r"^  \[\d+\] .*$", text, re.M)


def test_a_report_of_thirty_findings_shows_ten_entries_then_counts_the_rest():
    text = format_report(_thirty())
    shown = _entries(text)
    assert len(shown) == ENTRIES_SHOWN == 10
    assert "20 more entries (20 findings) in --verbose / JSON" in text
    assert "the detail of" not in text  # a long report shows headlines; the detail is in --verbose
    assert len(text.splitlines()) < 50


def test_verbose_shows_every_entry_with_its_detail():
    text = format_report(_thirty(), verbose=True)
    assert len(_entries(text)) == 30
    assert "more entr" not in text
    assert all(f"the detail of {n}" in text for n in range(30))


def test_causes_precede_the_differences_they_cause():
    shown = _entries(format_report(_thirty(), verbose=True))
    kinds = [re.match(r"  \[\d+\] (\w+)", line).group(1) for line in shown]
    assert kinds == ["rng"] * 5 + ["state"] * 5 + ["recompute"] * 10 + ["gradient"] * 10
    # the cut keeps the causes
    assert [k for k in kinds[:ENTRIES_SHOWN]] == ["rng"] * 5 + ["state"] * 5


def test_an_entry_says_its_count_and_its_explain_pointer():
    repeated = [_finding("buffer", 1, code="RC106", index=i, of=6) for i in range(1, 7)]
    text = format_report(Report(repeated))
    assert "[1] buffer: buffer difference number 1 ×6" in text
    assert "see `recheck explain RC106`" in text
    assert text.splitlines()[0].endswith("(6 differences)")


def test_the_header_counts_findings_by_layer_class():
    text = format_report(_thirty())
    assert "findings by layer  Block 25, Attention 5" in text


def test_a_short_report_keeps_its_detail():
    text = format_report(Report([_finding("rng", 1, code="RC002")]))
    assert "the detail of 1" in text and "more entr" not in text


def test_a_report_that_fits_a_screen_keeps_the_detail_of_every_entry():
    # five entries with their detail fit a screen: where each difference starts stays in view
    text = format_report(Report([_finding("recompute", n, region=f"Block{n}.forward (m.py:{n})") for n in range(5)]))
    assert len(_entries(text)) == 5
    assert all(f"the detail of {n}" in text for n in range(5))


def test_str_of_a_report_points_at_the_python_calls_that_show_the_rest():
    assert "in report.format(verbose=True) / report.to_json()" in str(_thirty())
    assert len(_entries(_thirty().format(verbose=True))) == 30


def test_colour_only_when_asked():
    assert not ESCAPE.search(format_report(_thirty()))
    assert ESCAPE.search(format_report(_thirty(), colour=True))


# --- the command line: colour on a terminal only, NO_COLOR respected, --verbose ---

REGION = f"{ZOO}:region_dropout_rng_not_preserved"


def _check(capsys, monkeypatch, *args: str, tty: bool = False) -> str:
    from recheck.cli import main

    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty, raising=False)
    status = main(["check", "--quiet", *args, REGION])
    assert status == 1
    return capsys.readouterr().out


@pytest.mark.parametrize(("tty", "no_color", "coloured"), [
    (False, None, False), (True, None, True), (True, "1", False),
])
def test_check_paints_its_report_only_on_a_terminal_without_no_color(capsys, monkeypatch, tty, no_color,
                                                                      coloured):
    monkeypatch.delenv("TERM", raising=False)
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    out = _check(capsys, monkeypatch, tty=tty)
    assert bool(ESCAPE.search(out)) is coloured
    assert "recomputation differs" in out


def test_check_json_keeps_its_layout(capsys, monkeypatch):
    from recheck.cli import main

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert main(["check", "--quiet", "--format", "json", REGION]) == 1
    out = capsys.readouterr().out
    assert not ESCAPE.search(out)  # JSON is never painted
    document = json.loads(out)
    assert list(document) == ["reports", "summary"]
    assert list(document["summary"]) == ["regions", "with_findings", "differences", "errors", "interrupted", "text"]
    (report,) = document["reports"]
    assert list(report) == ["target", "ok", "title", "findings", "notes", "stats"]
    # every finding, none cut, each the one finding record
    assert len(report["findings"]) == document["summary"]["differences"] > 0
    assert [Finding.from_dict(f).to_dict() for f in report["findings"]] == report["findings"]


class _Outcome:
    def __init__(self, data: dict) -> None:
        self.data = data

    def to_dict(self) -> dict:
        return dict(self.data)


def test_the_json_documents_of_check_are_the_old_layout():
    report = _thirty()
    outcomes = [("a.py:region", report), ("b.py:region", _Outcome({"error": "boom", "traceback": None}))]
    assert check_document(outcomes, regions=1, with_findings=1, differences=30, errors=1, interrupted=False,
                          text="t") == {
        "reports": [{"target": "a.py:region", **report.to_dict()},
                    {"target": "b.py:region", "error": "boom", "traceback": None}],
        "summary": {"regions": 1, "with_findings": 1, "differences": 30, "errors": 1, "interrupted": False,
                    "text": "t"}}
    assert steps_document(outcomes, with_findings=1, errors=1, interrupted=True, text="s") == {
        "steps": [{"target": "a.py:region", **report.to_dict()},
                  {"target": "b.py:region", "error": "boom", "traceback": None}],
        "summary": {"steps": 2, "with_findings": 1, "errors": 1, "interrupted": True, "text": "s"}}


# --- pytest --recheck: the failure message and the terminal summary are the same renderer ---

pytest_plugins = ["pytester"]

MANY_HAZARDS = """
import torch
from torch.utils.checkpoint import checkpoint

SCALE = 1.0
SOURCE = "def region_{i}(x):\\n    return torch.tanh(x * SCALE) * {i}\\n"
for i in range(12):
    exec(SOURCE.format(i=i))
REGIONS = [globals()[f"region_{i}"] for i in range(12)]

def test_many_hazards():
    global SCALE
    x = torch.randn(4, requires_grad=True)
    outs = [checkpoint(region, x, use_reentrant=False) for region in REGIONS]
    SCALE = 2.0
    sum(out.sum() for out in outs).backward()
    SCALE = 1.0
"""


def test_pytest_shows_ten_entries_unless_verbose(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the plugin only by -p (see tests/watch/test_plugin.py)
    import torch._dynamo  # noqa: F401  (keep torch's lazily loaded parts loaded across in-process runs)

    import recheck.watcher  # noqa: F401

    pytester.makepyfile(test_many=MANY_HAZARDS)
    result = pytester.runpytest("-p", "recheck._pytest_plugin", "--recheck")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "more entries" in text and "in pytest -v / --recheck-report" in text
    summary = text[text.index("recheck summary"):]
    assert "[10] global" in summary and "[11]" not in summary  # the run's entries, cut as every face cuts
    verbose = pytester.runpytest("-p", "recheck._pytest_plugin", "--recheck", "-v").stdout.str()
    assert "[12] global" in verbose and "more entries" not in verbose


def test_the_layer_line_names_five_classes_and_counts_the_others():
    found = [_finding("state", n, code="RC104", region=f"Layer{n}.forward (m.py:{n})") for n in range(8)]
    line = next(t for t in format_report(Report(found)).splitlines() if "findings by layer" in t)
    assert line.endswith("Layer4 1, 3 more classes")


# --- recheck run: the same renderer on stderr, --verbose, plain in a pipe ---

MANY_HAZARDS_PROGRAM = MANY_HAZARDS + """
test_many_hazards()
"""


def test_run_cuts_its_report_unless_verbose_and_is_plain_in_a_pipe(tmp_path):
    import subprocess

    program = tmp_path / "many.py"
    program.write_text(MANY_HAZARDS_PROGRAM, encoding="utf-8")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "recheck", "run", *args, str(program)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": ""})

    short, full = run(), run("--verbose")
    assert short.returncode == full.returncode == 1, short.stderr
    assert "more entries" in short.stderr and "[11]" not in short.stderr
    assert "[12] global" in full.stderr and "more entries" not in full.stderr
    assert not ESCAPE.search(short.stderr + full.stderr)  # stderr is a pipe here: never painted


def test_the_layer_line_counts_a_step_s_end_state_as_such():
    # check_step's end-state differences belong to the step, not to a layer called "step step"
    found = [_finding("recompute", n) for n in range(2)]
    found += [Finding("gradient", f"gradient {n} differs", region="step train_step (train.py:9)",
                      subject=f"grad {n}") for n in range(3)]
    line = next(t for t in format_report(Report(found)).splitlines() if "findings by layer" in t)
    assert line.endswith("findings by layer  end of step 3, Block 2"), line
