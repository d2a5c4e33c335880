"""Arguments of ``recheck check``, ``recheck cost`` and ``check()``/``check_step()`` checked before anything runs.

A tolerance is validated by one rule (``Tolerance.of``) on every face: an infinite ``--atol``
or a ``--max-ulp`` beyond what the comparison can hold is a usage error (exit 2) before the
user's file is imported, never an error of each region.  ``--repeats`` is bounded.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from recheck.cli import main

RUNS_LEAVE_A_MARK = textwrap.dedent('''
    from pathlib import Path

    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint


    def region_marks():
        Path(__file__).with_name("ran").touch()
        return nn.Linear(3, 3), (torch.randn(2, 3),)


    def step():
        Path(__file__).with_name("ran").touch()
        x = torch.randn(2, 3, requires_grad=True)
        checkpoint(torch.tanh, x, use_reentrant=False).sum().backward()
''')


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        return int(exc.code)


@pytest.fixture
def marks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "marks.py").write_text(RUNS_LEAVE_A_MARK)
    return tmp_path


HUGE = str(10 ** 30)


@pytest.mark.parametrize("argv, message", [
    pytest.param(["check", "marks.py", "--atol", "inf", "--rtol", "0"], "argument --atol: atol must be a finite number",
                 id="atol-inf"),
    pytest.param(["check", "marks.py", "--atol", "0", "--rtol", "inf"], "argument --rtol: rtol must be a finite number",
                 id="rtol-inf"),
    pytest.param(["check", "marks.py", "--atol", "1e400", "--rtol", "0"], "argument --atol: atol must be a finite",
                 id="atol-overflows"),
    pytest.param(["check", "marks.py", "--max-ulp", HUGE], "argument --max-ulp: max_ulp must be a whole number from 0",
                 id="max-ulp-huge"),
    pytest.param(["check", "--step", "marks.py:step", "--atol", "inf", "--rtol", "0"],
                 "argument --atol: atol must be a finite", id="step-atol-inf"),
    pytest.param(["check", "--step", "marks.py:step", "--max-ulp", HUGE], "argument --max-ulp: max_ulp must be a whole",
                 id="step-max-ulp-huge"),
    pytest.param(["check", "--step", "marks.py:step", "--repeats", str(10 ** 20)],
                 "argument --repeats: must be between 1 and", id="step-repeats-huge"),
    pytest.param(["check", "--step", "marks.py:step", "--repeats", "1e20"],
                 "argument --repeats: not a whole number: '1e20'", id="step-repeats-float"),
    pytest.param(["cost", "marks.py:step", "--repeats", str(10 ** 20)], "argument --repeats: --repeats must be between",
                 id="cost-repeats-huge"),
])
def test_an_out_of_range_argument_is_a_usage_error_before_anything_runs(marks, capsys, argv, message):
    assert _exit_code(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "raised" not in err
    assert not (marks / "ran").exists()


@pytest.mark.parametrize("table, message", [
    pytest.param("atol = inf\nrtol = 0\n", "atol must be a finite number of 0 or more, got inf", id="atol-inf"),
    pytest.param(f"max-ulp = {HUGE}\n", "max_ulp must be a whole number from 0 to", id="max-ulp-huge"),
])
def test_an_out_of_range_tolerance_in_tool_recheck_is_a_configuration_error(marks, capsys, table, message):
    (marks / "pyproject.toml").write_text("[tool.recheck]\n" + table)
    assert _exit_code(["check", "marks.py"]) == 2
    err = capsys.readouterr().err
    assert message in err and "pyproject.toml" in err and "raised" not in err
    assert not (marks / "ran").exists()


def test_the_library_refuses_a_max_ulp_the_comparison_cannot_hold():
    from recheck import check

    calls = []

    def region(x):
        calls.append(1)
        return x * 2

    with pytest.raises(ValueError, match="max_ulp must be a whole number from 0 to"):
        check(region, torch.randn(2, requires_grad=True), max_ulp=10 ** 30)
    assert not calls
    assert check(region, torch.randn(2, requires_grad=True), max_ulp=2 ** 63 - 1).ok


@pytest.mark.parametrize("modules, optimizers, message", [
    pytest.param([5], (), r"check_step\(\): modules\[0\] must be a torch.nn.Module, got int", id="module-int"),
    pytest.param(torch.nn.Linear(2, 2), (), r"check_step\(\): modules must be a sequence of torch.nn.Module, "
                 r"got Linear", id="modules-not-a-sequence"),
    pytest.param((), [torch.nn.Linear(2, 2)], r"check_step\(\): optimizers\[0\] must be a torch.optim.Optimizer, "
                 r"got Linear", id="optimizer-module"),
    pytest.param((), "adam", r"check_step\(\): optimizers must be a sequence of torch.optim.Optimizer, got str",
                 id="optimizers-str"),
])
def test_check_step_names_a_bad_modules_or_optimizers_element(modules, optimizers, message):
    from recheck import check_step

    calls = []
    with pytest.raises(TypeError, match=message):
        check_step(lambda: calls.append(1), modules=modules, optimizers=optimizers)
    assert not calls


@pytest.mark.parametrize("flags, message", [
    pytest.param(["--recheck-max-ulp", HUGE], "max_ulp must be a whole number from 0 to 2**63 - 1", id="max-ulp-huge"),
    pytest.param(["--recheck-atol", "inf", "--recheck-rtol", "0"], "atol must be a finite number", id="atol-inf"),
])
def test_pytest_recheck_refuses_the_same_tolerances_before_any_test_runs(tmp_path, flags, message):
    import os
    import subprocess
    import sys

    (tmp_path / "test_marks.py").write_text("from pathlib import Path\n\n\ndef test_marks():\n"
                                            "    Path(__file__).with_name('ran').touch()\n")
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                             "recheck._pytest_plugin", "--recheck", *flags, "test_marks.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 4, result.stdout + result.stderr  # pytest's usage error
    assert message in result.stderr
    assert not (tmp_path / "ran").exists()
