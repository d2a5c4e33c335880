"""User code that exits or is interrupted, on every face that runs it (``check``, ``check --step``, ``cost``).

A region, a region builder or a step that calls ``sys.exit(N)`` (or raises any other
``BaseException`` but ``KeyboardInterrupt``) is that target's error: recheck goes on with the
others and exits 2, never with the user's N (``sys.exit(0)`` would be a false pass).  Ctrl-C
still stops the run, after printing what was checked so far, with status 130.  Whatever the
user's code raises, every patch recheck installed is undone.
"""

from __future__ import annotations

import gc
import json
import sys
import textwrap
import warnings

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint

from recheck.cli import main
from recheck.intercept import patches

USER_CODE = textwrap.dedent('''
    import sys

    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    CHECK_OPTIONS = {"region_hazard": {"preserve_rng_state": False}}


    class Abort(BaseException):
        pass


    class Exits(nn.Module):
        def __init__(self, code, in_backward=False):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.code = code
            self.in_backward = in_backward

        def forward(self, x):
            if not self.in_backward or torch._C._current_graph_task_id() != -1:
                sys.exit(self.code)
            return self.lin(x)


    class Interrupts(nn.Module):
        def forward(self, x):
            raise KeyboardInterrupt


    class Aborts(nn.Module):
        def forward(self, x):
            raise Abort("planted")


    def region_clean():
        return nn.Linear(3, 3), (torch.randn(2, 3),)


    def region_exits():
        return Exits(0), (torch.randn(2, 3),)


    def region_exits_in_recompute():
        return Exits(0, in_backward=True), (torch.randn(2, 3),)


    def region_exits_7():
        return Exits(7), (torch.randn(2, 3),)


    def region_aborts():
        return Aborts(), (torch.randn(2, 3, requires_grad=True),)


    def region_interrupts():
        return Interrupts(), (torch.randn(2, 3, requires_grad=True),)


    def region_hazard():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)), (torch.randn(4, 3),)


    def builder_exits():
        sys.exit(0)


    def builder_exits_3():
        sys.exit(3)


    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))


    def step_exits():
        x = torch.randn(2, 3, requires_grad=True)
        checkpoint(Exits(0), x, use_reentrant=False).sum().backward()


    def step_exits_in_recompute():
        x = torch.randn(2, 3, requires_grad=True)
        checkpoint(Exits(0, in_backward=True), x, use_reentrant=False).sum().backward()


    def step_interrupts():
        x = torch.randn(2, 3, requires_grad=True)
        checkpoint(Interrupts(), x, use_reentrant=False).sum().backward()


    def step_hazard():
        x = torch.randn(4, 3)
        checkpoint(model, x, use_reentrant=False, preserve_rng_state=False).sum().backward()


    def step_clean():
        x = torch.randn(2, 3, requires_grad=True)
        checkpoint(torch.tanh, x, use_reentrant=False).sum().backward()


    def step():
        sys.exit(0)
''')


@pytest.fixture(scope="module", autouse=True)
def imported_once(tmp_path_factory):
    """One check first, so that what torch imports on first use (sympy adds a warnings filter) is imported."""
    path = tmp_path_factory.mktemp("warm") / "warm.py"
    path.write_text("import torch\n\n\ndef region_warm():\n    return torch.nn.Linear(2, 2), (torch.randn(1, 2),)\n")
    assert main(["check", "-q", str(path)]) == 0


@pytest.fixture
def user_code(tmp_path):
    path = tmp_path / "user_code.py"
    path.write_text(USER_CODE)
    return path


def _patched_objects() -> dict[str, object]:
    """Every object recheck patches while it runs user code, by identity."""
    inner = torch_checkpoint.checkpoint
    code, closure = getattr(inner, "__code__", None), getattr(inner, "__closure__", None) or ()
    cells = dict(zip(code.co_freevars, closure)) if code is not None else {}
    objects = {
        "torch.utils.checkpoint.checkpoint": inner,
        "checkpoint's function": cells[patches.CELL_VARIABLE].cell_contents if patches.CELL_VARIABLE in cells else None,
        "CheckpointFunction.forward": vars(torch_checkpoint.CheckpointFunction)["forward"],
        "torch.nn.Module.__call__": torch.nn.Module.__call__,
        "torch.nn.Module._call_impl": torch.nn.Module._call_impl,
        "sys.stdout": sys.stdout,
        "sys.stderr": sys.stderr,
        "warnings.showwarning": warnings.showwarning,
        "warnings.filters": list(warnings.filters),
        "grad mode": torch.is_grad_enabled(),
        "garbage collector": gc.isenabled(),
    }
    for name in ("_checkpoint_without_reentrant_generator", "_checkpoint_without_reentrant_impl"):
        if hasattr(torch_checkpoint, name):
            objects[f"torch.utils.checkpoint.{name}"] = getattr(torch_checkpoint, name)
    return objects


def run(argv: list[str]) -> int:
    """``recheck ARGV`` in this process; asserts every patched object is its original again after."""
    before = _patched_objects()
    code = main(argv)
    after = _patched_objects()
    assert patches.installed() is None
    changed = [name for name in before if after[name] is not before[name] and after[name] != before[name]]
    assert not changed, f"left patched: {changed}"
    return code


def test_the_patched_objects_include_what_watch_patches():
    import recheck

    before = _patched_objects()
    with recheck.watch(raise_on_finding=False):
        during = _patched_objects()
    changed = {name for name in before if during[name] is not before[name] and during[name] != before[name]}
    assert "checkpoint's function" in changed  # so the fixture below would see it left behind


def test_a_region_that_exits_is_its_error_and_the_others_still_run(user_code, capsys):
    code = run(["check", f"{user_code}:region_exits", f"{user_code}:region_hazard",
                 f"{user_code}:region_exits_7", f"{user_code}:region_aborts"])
    assert code == 2
    out, err = capsys.readouterr()
    assert f"recheck check: error: {user_code}:region_exits: the region raised SystemExit (sys.exit(0))" in err
    assert f"{user_code}:region_exits_7: the region raised SystemExit (sys.exit(7))" in err
    assert f"{user_code}:region_aborts: the region raised Abort: planted" in err
    assert "in forward" in err  # the user's traceback
    assert "rng" in out  # region_hazard's finding is still reported
    assert out.rstrip().splitlines()[-1].startswith("recheck: checked 1 region: 1 with findings")


def test_a_region_that_exits_in_its_recompute_is_its_error(user_code, capsys):
    assert run(["check", f"{user_code}:region_exits_in_recompute", f"{user_code}:region_hazard"]) == 2
    out, err = capsys.readouterr()
    assert f"{user_code}:region_exits_in_recompute: the region raised SystemExit (sys.exit(0))" in err
    assert "1 with findings" in out


def test_json_reports_an_exiting_region_as_an_error(user_code, capsys):
    assert run(["check", f"{user_code}:region_exits", f"{user_code}:region_hazard", "--format", "json"]) == 2
    payload = json.loads(capsys.readouterr().out)
    by_target = {r["target"].rsplit(":", 1)[1]: r for r in payload["reports"]}
    assert by_target["region_exits"]["error"] == "the region raised SystemExit (sys.exit(0))"
    assert by_target["region_hazard"]["ok"] is False
    assert payload["summary"]["errors"] == 1


def test_a_region_builder_that_exits_is_its_error(user_code, capsys):
    code = run(["check", f"{user_code}:builder_exits", f"{user_code}:builder_exits_3", f"{user_code}:region_hazard"])
    assert code == 2
    out, err = capsys.readouterr()
    assert f"{user_code}:builder_exits: {user_code}:builder_exits raised SystemExit (sys.exit(0))" in err
    assert f"{user_code}:builder_exits_3 raised SystemExit (sys.exit(3))" in err
    assert "1 with findings" in out


@pytest.mark.parametrize("watch_only", [False, True], ids=["twin", "watch-only"])
@pytest.mark.parametrize("exiting", ["step_exits", "step_exits_in_recompute", "step"])
def test_a_step_that_exits_is_its_error_and_the_others_still_run(user_code, capsys, exiting, watch_only):
    flags = ["--watch-only"] if watch_only else []
    assert run(["check", *flags, "--step", f"{user_code}:{exiting}", "--step", f"{user_code}:step_hazard"]) == 2
    out, err = capsys.readouterr()
    assert f"recheck check: error: {user_code}:{exiting}: the step raised SystemExit (sys.exit(0))" in err
    assert f"step {user_code}:step_hazard" in out
    assert out.rstrip().endswith("recheck: ran 2 steps: 1 with findings, 1 error")


@pytest.mark.parametrize("mode", [[], ["--plan", "--schedule", "gpipe", "--microbatches", "2"]],
                         ids=["measure", "plan"])
def test_a_cost_step_that_exits_is_an_error(user_code, capsys, mode):
    assert run(["cost", f"{user_code}:step", "--repeats", "1", *mode]) == 2
    err = capsys.readouterr().err
    assert f"{user_code}:step" in err and "SystemExit (sys.exit(0))" in err


def test_ctrl_c_in_a_region_prints_what_was_checked_so_far(user_code, capsys):
    code = run(["check", f"{user_code}:region_clean", f"{user_code}:region_interrupts", f"{user_code}:region_hazard"])
    assert code == 130
    out, err = capsys.readouterr()
    assert "recheck: no difference found" in out  # region_clean's report
    assert "region_hazard" not in out + err  # the run stopped
    assert "interrupted" in out.rstrip().splitlines()[-1]
    assert out.rstrip().splitlines()[-1].startswith("recheck: checked 1 region: 0 with findings")


def test_ctrl_c_in_json_output_still_prints_the_payload(user_code, capsys):
    code = run(["check", f"{user_code}:region_clean", f"{user_code}:region_interrupts", "--format", "json"])
    assert code == 130
    payload = json.loads(capsys.readouterr().out)
    assert [r["target"].rsplit(":", 1)[1] for r in payload["reports"]] == ["region_clean"]
    assert payload["summary"]["interrupted"] is True


def test_ctrl_c_in_a_step_prints_what_was_checked_so_far(user_code, capsys):
    code = run(["check", "--step", f"{user_code}:step_clean", "--step", f"{user_code}:step_interrupts",
                 "--step", f"{user_code}:step_hazard"])
    assert code == 130
    out, err = capsys.readouterr()
    assert f"step {user_code}:step_clean" in out
    assert "step_hazard" not in out + err
    assert "interrupted" in out.rstrip().splitlines()[-1]


@pytest.mark.parametrize("dotted", [False, True], ids=["file", "module"])
def test_a_target_that_exits_on_import_is_its_error(user_code, tmp_path, monkeypatch, capsys, dotted):
    (tmp_path / "exits_on_import.py").write_text("import sys\n\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    target = "exits_on_import:region_x" if dotted else str(tmp_path / "exits_on_import.py")
    assert run(["check", target, f"{user_code}:region_hazard"]) == 2
    out, err = capsys.readouterr()
    assert "failed: SystemExit (sys.exit(0))" in err
    assert "1 with findings" in out
