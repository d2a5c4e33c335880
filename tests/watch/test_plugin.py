"""The pytest plugin, driven through pytester.

Plugin autoloading is switched off in every run (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``) and
the plugin is loaded with ``-p``, so these tests behave the same before and after the
``pytest11`` entry point is installed, and no other installed plugin interferes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch._dynamo  # noqa: F401  (see below)

import recheck.watcher  # noqa: F401

# In-process pytester runs restore sys.modules afterwards, dropping every module first
# imported inside the run; importing torch's lazily loaded parts (checkpoint imports
# torch._dynamo on first call) and recheck's watcher here keeps them loaded once.

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "recheck._pytest_plugin")

CLEAN_AND_HAZARD = """
import torch
from torch.utils.checkpoint import checkpoint

SCALE = 1.0

def scaled(x):
    return torch.tanh(x * SCALE) * 2

def test_clean():
    torch.manual_seed(0)
    drop = torch.nn.Dropout(0.5)
    x = torch.randn(4, 8, requires_grad=True)
    checkpoint(lambda t: drop(t).sin(), x, use_reentrant=False).sum().backward()

def test_global_flipped():
    global SCALE
    x = torch.randn(4, 8, requires_grad=True)
    y = checkpoint(scaled, x, use_reentrant=False)
    SCALE = 2.0
    try:
        y.sum().backward()
    finally:
        SCALE = 1.0

def test_no_checkpoint():
    assert torch.ones(2).sum() == 2
"""


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    # subprocess runs import recheck from this checkout, installed or not
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("RECHECK_REQUIRE_LIBRARIES", raising=False)


def test_off_by_default_and_torch_not_imported(pytester):
    pytester.makepyfile(test_plain="""
        import sys
        def test_torch_not_loaded():
            assert "torch" not in sys.modules
    """)
    result = pytester.runpytest_subprocess(*PLUGIN)
    result.assert_outcomes(passed=1)
    assert "recheck summary" not in result.stdout.str()


def test_recheck_fails_the_hazard_and_summarises(pytester):
    pytester.makepyfile(test_model=CLEAN_AND_HAZARD)
    result = pytester.runpytest(*PLUGIN, "--recheck")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*recheck: watching every test (early_stop=as called, store=digest)*",
        "*test_global_flipped*",
        "recheck: recomputation differs from the original forward (2 differences)",
        "*global: global `test_model.SCALE` was 1.0 at forward and 2.0 at recompute*",
        "*= recheck summary =*",
        "recheck: 3 test(s) watched; 2 region(s), 2 invocation(s), 2 recomputation(s) verified, "
        "2 finding(s) in 1 test(s)",
        "  findings: test_model.py::test_global_flipped",
        "tests that made no checkpoint call: 1",
        "  test_model.py::test_no_checkpoint",
    ])
    # a clean failure: no plugin traceback in the failure text
    assert "_pytest_plugin.py" not in result.stdout.str()


def test_without_option_tests_pass_and_markers_opt_in_or_out(pytester):
    pytester.makepyfile(test_model=CLEAN_AND_HAZARD + """
import pytest

@pytest.mark.recheck(store="copy")
def test_marked():
    test_global_flipped()

@pytest.mark.no_recheck(reason="known")
def test_opted_out():
    test_global_flipped()
""")
    result = pytester.runpytest(*PLUGIN, "--strict-markers")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*test_marked*", "*first difference at index*"])
    result = pytester.runpytest(*PLUGIN, "--recheck", "-k", "opted_out or clean")
    result.assert_outcomes(passed=2)


def test_marker_with_unknown_option_is_a_usage_error(pytester):
    pytester.makepyfile(test_bad="""
        import pytest
        @pytest.mark.recheck(tolerance=1)
        def test_x():
            pass
    """)
    result = pytester.runpytest(*PLUGIN)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*@pytest.mark.recheck takes only the keywords early_stop, store, atol, rtol, max_ulp; got tolerance*"])


def test_markers_are_registered(pytester):
    result = pytester.runpytest(*PLUGIN, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.recheck(early_stop=None, store='digest', atol=None, rtol=None, max_ulp=None):*",
                                 "@pytest.mark.no_recheck(reason=None):*"])
    result = pytester.runpytest(*PLUGIN, "--help")
    result.stdout.fnmatch_lines(["recheck: verify activation-checkpoint recomputation:", "*--recheck-store=*"])


def test_ini_and_tool_recheck_and_json_report(pytester):
    pytester.makepyprojecttoml("""
        [tool.pytest.ini_options]
        recheck = true

        [tool.recheck]
        store = "copy"
        report = "out/recheck.json"
    """)
    pytester.makepyfile(test_model=CLEAN_AND_HAZARD)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*store=copy*", "*first difference at index*"])
    document = json.loads((pytester.path / "out" / "recheck.json").read_text())
    assert document["options"]["store"] == "copy" and document["options"]["early_stop"] is None
    by_test = {test["nodeid"]: test for test in document["tests"]}
    assert set(by_test) == {f"test_model.py::test_{n}" for n in ("clean", "global_flipped", "no_checkpoint")}
    kinds = {f["kind"] for f in by_test["test_model.py::test_global_flipped"]["findings"]}
    assert kinds == {"global", "recompute"}


def test_invalid_tool_recheck_is_a_usage_error(pytester):
    pytester.makepyprojecttoml("""
        [tool.recheck]
        store = "everything"
    """)
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest(*PLUGIN, "--recheck")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*recheck: *pyproject.toml: store: invalid value in [[]tool.recheck[]]*everything*"])


def test_tool_recheck_is_not_read_unless_recheck_is_enabled(pytester):
    # a typo in a key only the linter reads must not fail every plain pytest run
    pytester.makepyprojecttoml("""
        [tool.recheck]
        selct = ["RC1"]
        store = "everything"
    """)
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK


def test_checkpoint_imported_in_conftest_before_the_plugin_configured(pytester):
    pytester.makeconftest("""
        from torch.utils.checkpoint import checkpoint as early_checkpoint
        import functools
        stored = functools.partial(early_checkpoint, use_reentrant=True)
    """)
    pytester.makepyfile(test_early="""
        import torch
        from conftest import stored

        class Counter(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.calls = 0
            def forward(self, x):
                self.calls += 1
                return x.sin()

        def test_counter():
            stored(Counter(), torch.randn(3, requires_grad=True)).sum().backward()
    """)
    result = pytester.runpytest(*PLUGIN, "--recheck")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*attribute `self.calls` updated again by the recompute: 1 -> 2*"])


@pytest.mark.skipif("xdist" not in sys.modules and not __import__("importlib").util.find_spec("xdist"),
                    reason="pytest-xdist is not installed")
@pytest.mark.slow
def test_xdist_summary_is_built_on_the_controller(pytester):
    pytester.makepyfile(test_model=CLEAN_AND_HAZARD)
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "xdist", "-n", "2", "--recheck",
                                           "--recheck-report=run.json")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*= recheck summary =*",
        "recheck: 3 test(s) watched; 2 region(s), 2 invocation(s), 2 recomputation(s) verified, "
        "2 finding(s) in 1 test(s)",
    ])
    document = json.loads((pytester.path / "run.json").read_text())
    assert len(document["tests"]) == 3


LATE_PRINT = """
import pytest
import torch
from torch.utils.checkpoint import checkpoint

def late_print(x):
    y = x.sin().exp()
    print("after the last saved tensor")
    return y

def test_late_print():
    checkpoint(late_print, torch.randn(4, requires_grad=True), use_reentrant=False).sum().backward()

@pytest.mark.recheck(early_stop=False)
def test_marked_full_replay():
    test_late_print()
"""


def test_early_stop_off_from_the_command_line_the_ini_and_a_marker(pytester):
    pytester.makepyfile(test_late=LATE_PRINT)
    plain = pytester.runpytest(*PLUGIN, "--recheck")  # the call's own early stop: the print never reruns
    plain.assert_outcomes(passed=1, failed=1)         # ... except in the marked test
    plain.stdout.fnmatch_lines(["*side_effect (latent): 1 line written to stdout again during recompute*"])
    replayed = pytester.runpytest(*PLUGIN, "--recheck", "--recheck-early-stop=off")
    replayed.assert_outcomes(failed=2)
    replayed.stdout.fnmatch_lines(["*recheck: watching every test (early_stop=off, store=digest)*"])
    pytester.makeini("[pytest]\nrecheck = true\nrecheck_early_stop = off\n")
    pytester.runpytest(*PLUGIN).assert_outcomes(failed=2)


def test_a_tolerance_from_the_command_line_must_be_whole(pytester):
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest(*PLUGIN, "--recheck", "--recheck-atol", "1e-3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*atol was given without rtol*"])
    ok = pytester.runpytest(*PLUGIN, "--recheck", "--recheck-atol", "1e-3", "--recheck-rtol", "0")
    ok.assert_outcomes(passed=1)
    ok.stdout.fnmatch_lines(["*store=copy, tolerance: up to atol=0.001, rtol=0 allowed*"])


TWIN_IN_A_TEST = """
import pytest
import torch
from torch.utils.checkpoint import checkpoint

import recheck

SCALE = [1.0]

def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    x = torch.randn(2, 4, requires_grad=True)
    def step():
        model.zero_grad()
        checkpoint(model, x, use_reentrant=False).sum().backward()
    return model, step

def test_twin_in_a_watched_test():
    model, step = make()
    checkpoint(model, torch.ones(2, 4, requires_grad=True), use_reentrant=False).sum().backward()
    recheck.assert_step_equal(step)
    report = recheck.check_step(step)
    assert report.ok, report
    checkpoint(model, torch.ones(2, 4, requires_grad=True), use_reentrant=False).sum().backward()

def test_twin_finds_the_hazard():
    def scaled(t):
        return torch.tanh(t * SCALE[0])
    x = torch.ones(2, 4, requires_grad=True)
    def step():
        y = checkpoint(scaled, x, use_reentrant=False)
        SCALE[0] += 1.0
        y.sum().backward()
    with pytest.raises(recheck.RecomputeMismatch, match="recomputation differs"):
        recheck.assert_step_equal(step)
"""


def test_assert_step_equal_runs_in_a_test_watched_by_the_plugin(pytester):
    """The test's own twin check takes the interception over for its length; the plugin's
    watch goes on around it (its calls before and after are watched) and says so in a note."""
    pytester.makepyfile(test_step_twin_in_plugin=TWIN_IN_A_TEST)
    result = pytester.runpytest(*PLUGIN, "--recheck", "--recheck-report=run.json")
    result.assert_outcomes(passed=2)
    assert "already intercepted" not in result.stdout.str()
    document = json.loads((pytester.path / "run.json").read_text())
    by_test = {test["nodeid"].rpartition("::")[2]: test for test in document["tests"]}
    watched = by_test["test_twin_in_a_watched_test"]
    assert watched["stats"]["invocations"] == 2 and watched["stats"]["verified"] == 2
    assert not watched["findings"]
    assert any("check_step" in note for note in watched["notes"]), watched["notes"]
    assert not by_test["test_twin_finds_the_hazard"]["findings"]  # the twin check's, not the plugin's


@pytest.mark.parametrize("where", ["option", "ini", "tool"])
def test_a_folder_as_the_report_path_is_a_usage_error_naming_it(pytester, where):
    (pytester.path / "reports").mkdir()
    (pytester.path / "afile").write_text("")
    pytester.makepyfile(test_x="def test_x(): pass")
    for given in ("reports", "afile/run.json"):  # a folder; a path below a file
        args: list[str] = []
        if where == "option":
            args = [f"--recheck-report={given}"]
        elif where == "ini":
            pytester.makeini(f"[pytest]\nrecheck_report = {given}\n")
        else:
            pytester.makepyprojecttoml(f'[tool.recheck]\nreport = "{given}"\n')
        result = pytester.runpytest(*PLUGIN, "--recheck", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (given, result.stdout.str(), result.stderr.str())
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
        result.stderr.fnmatch_lines([f"*recheck: the JSON report path {str(pytester.path / given)!r}*"])
        for name in ("pytest.ini", "pyproject.toml"):
            (pytester.path / name).unlink(missing_ok=True)


def test_a_report_that_cannot_be_written_at_the_end_is_a_clear_error_not_an_internal_one(pytester):
    pytester.makepyfile(test_x="""
        from pathlib import Path
        def test_x():
            Path("late").write_text("")  # the report's folder, made a file during the run
    """)
    result = pytester.runpytest(*PLUGIN, "--recheck", "--recheck-report=late/run.json")
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text
    result.stdout.fnmatch_lines([f"recheck: could not write the JSON report to {str(pytester.path / 'late' / 'run.json')!r}: *"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
