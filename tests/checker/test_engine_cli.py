"""``recheck check``: targets, exit codes, text and JSON output, the user's traceback."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from recheck.loading import TargetError, build_region, load_target
from recheck.cli import main

REGIONS = textwrap.dedent('''
    import torch
    from torch import nn

    CHECK_OPTIONS = {"region_unpreserved": {"preserve_rng_state": False}}


    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return torch.tanh(self.lin(x))


    def region_clean():
        torch.manual_seed(0)
        return nn.Linear(3, 3), (torch.randn(2, 3),)


    def region_counter():
        return Counter(), (torch.randn(2, 3),), {}


    def region_unpreserved():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)), (torch.randn(4, 3),)


    def helper_not_a_region():
        raise AssertionError("never called")
''')


@pytest.fixture
def regions(tmp_path):
    path = tmp_path / "regions.py"
    path.write_text(REGIONS)
    return path


def test_load_target_forms(regions, tmp_path, monkeypatch):
    names = [t.label.rsplit(":", 1)[1] for t in load_target(str(regions))]
    assert names == ["region_clean", "region_counter", "region_unpreserved"]
    (target,) = load_target(f"{regions}:region_unpreserved")
    assert target.options == {"preserve_rng_state": False}
    region = build_region(target)
    assert callable(region.fn) and region.kwargs == {}
    monkeypatch.syspath_prepend(str(tmp_path))
    (target,) = load_target("regions:region_counter")
    assert build_region(target).fn.calls == 0
    for bad, message in [(f"{tmp_path}/missing.py", "no such file"),
                         (f"{regions}:nope", "no attribute 'nope'"),
                         ("regions", "expected file.py"),
                         ("no_such_module_xyz:f", "no module named")]:
        with pytest.raises(TargetError, match=message):
            load_target(bad)


def test_exit_codes_and_text_output(regions, capsys):
    assert main(["check", f"{regions}:region_clean"]) == 0
    out = capsys.readouterr().out
    assert "recheck: no difference found" in out
    assert out.rstrip().endswith("recheck: checked 1 region: 0 with findings (0 differences), 1 clean")
    assert main(["check", str(regions)]) == 1
    out = capsys.readouterr().out
    assert out.count("recheck: recomputation differs from the original forward") == 2
    assert "attribute `self.calls`" in out and "cpu RNG" in out
    assert "checked 3 regions: 2 with findings" in out


def test_json_output(regions, capsys):
    assert main(["check", str(regions), "--format", "json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    by_target = {r["target"].rsplit(":", 1)[1]: r for r in payload["reports"]}
    assert by_target["region_clean"]["ok"] is True
    assert {f["kind"] for f in by_target["region_counter"]["findings"]} == {"state"}
    assert "rng" in {f["kind"] for f in by_target["region_unpreserved"]["findings"]}
    assert payload["summary"]["regions"] == 3 and payload["summary"]["with_findings"] == 2


def test_command_line_options_override(regions, capsys):
    assert main(["check", f"{regions}:region_unpreserved", "--preserve-rng-state"]) == 0
    assert main(["check", f"{regions}:region_counter", "--use-reentrant"]) == 1
    assert "use_reentrant=True" in capsys.readouterr().out


def test_import_error_shows_the_users_traceback(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\n\ndef helper():\n    return 1 / 0\n\n\nVALUE = helper()\n")
    assert main(["check", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError" in err
    assert "broken.py" in err and "line 5, in helper" in err
    assert "recheck/checker" not in err and "importlib" not in err


def test_region_errors_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent('''
        import torch

        def _fails(x):
            raise RuntimeError("region failed")

        def region_raises():
            return _fails, (torch.ones(2, requires_grad=True),)

        def region_no_tensor():
            return (lambda x: "text"), (torch.ones(2, requires_grad=True),)

        def region_wrong_shape():
            return 3
    '''))
    assert main(["check", f"{bad}:region_raises"]) == 2
    err = capsys.readouterr().err
    assert "region failed" in err and "bad.py" in err and "in _fails" in err
    assert main(["check", f"{bad}:region_no_tensor"]) == 2
    assert "returned no tensor" in capsys.readouterr().err
    assert main(["check", f"{bad}:region_wrong_shape"]) == 2
    assert "must return (region, args)" in capsys.readouterr().err


def test_command_module_does_not_import_torch():
    import subprocess

    code = ("import sys, recheck.commands.check as c, argparse; p = argparse.ArgumentParser(); "
            "c.add_arguments(p); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


BROKEN_AMONG_GOOD = textwrap.dedent('''
    import torch
    from torch import nn

    from regions import Counter

    CHECK_OPTIONS = {"region_two_tolerances": {"atol": 1e-3, "max_ulp": 4}}


    def _fails(x):
        raise RuntimeError("region failed")


    def region_clean():
        torch.manual_seed(0)
        return nn.Linear(3, 3), (torch.randn(2, 3),)


    def region_raises():
        return _fails, (torch.ones(2, requires_grad=True),)


    def region_counter():
        return Counter(), (torch.randn(2, 3),)


    def region_wrong_shape():
        return 3


    def region_two_tolerances():
        return nn.Linear(3, 3), (torch.randn(2, 3),)
''')


@pytest.fixture
def mixed(regions, monkeypatch):
    monkeypatch.syspath_prepend(str(regions.parent))
    path = regions.parent / "mixed.py"
    path.write_text(BROKEN_AMONG_GOOD)
    return path


def test_a_broken_region_is_reported_and_the_others_still_run(mixed, capsys):
    assert main(["check", str(mixed)]) == 2
    out, err = capsys.readouterr()
    assert "attribute `self.calls`" in out  # region_counter, after the region that raised
    assert out.rstrip().splitlines()[-1] == (
        f"recheck: checked 2 regions: 1 with findings (1 difference), 1 clean; 3 errors "
        f"({mixed}:region_raises, {mixed}:region_wrong_shape, {mixed}:region_two_tolerances)")
    assert f"recheck check: error: {mixed}:region_raises: the region raised RuntimeError: region failed" in err
    assert "in _fails" in err  # with the user's traceback
    assert f"{mixed}:region_wrong_shape: {mixed}:region_wrong_shape must return (region, args)" in err
    assert f"{mixed}:region_two_tolerances: its CHECK_OPTIONS set both max_ulp and atol/rtol" in err


def test_json_lists_the_broken_regions_beside_the_reports(mixed, capsys):
    assert main(["check", str(mixed), "--format", "json"]) == 2
    payload = json.loads(capsys.readouterr().out)
    by_target = {r["target"].rsplit(":", 1)[1]: r for r in payload["reports"]}
    assert list(by_target) == ["region_clean", "region_raises", "region_counter", "region_wrong_shape",
                               "region_two_tolerances"]
    assert by_target["region_raises"]["error"] == "the region raised RuntimeError: region failed"
    assert "in _fails" in by_target["region_raises"]["traceback"]
    assert by_target["region_clean"]["ok"] is True
    assert payload["summary"]["errors"] == 3 and payload["summary"]["regions"] == 2


def test_a_target_that_cannot_be_imported_does_not_stop_the_others(regions, tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('planted')\n")
    assert main(["check", str(broken), f"{regions}:region_counter"]) == 2
    out, err = capsys.readouterr()
    assert f"recheck check: error: {broken}: importing {broken} failed: ImportError: planted" in err
    assert out.rstrip().endswith(f"checked 1 region: 1 with findings (1 difference), 0 clean; 1 error ({broken})")


RUNS_LEAVE_A_MARK = textwrap.dedent('''
    from pathlib import Path

    import torch
    from torch import nn


    def region_marks():
        Path(__file__).with_name("ran").touch()
        return nn.Linear(3, 3), (torch.randn(2, 3),)
''')


@pytest.mark.parametrize("flags, message", [
    (["--atol", "1e-3", "--max-ulp", "4"], "pass either --max-ulp or --atol/--rtol, not both"),
    (["--rtol", "0.1", "--max-ulp", "0"], "pass either --max-ulp or --atol/--rtol, not both"),
    (["--atol", "-1e-3", "--rtol", "0"], "argument --atol: atol must be a finite number of 0 or more, got -0.001"),
    (["--max-ulp", "-4"], "argument --max-ulp: max_ulp must be a whole number from 0 to 2**63 - 1, got -4"),
    (["--rtol", "nan", "--atol", "0"], "argument --rtol: rtol must be a finite number of 0 or more, got nan"),
    (["--max-ulp", "1.5"], "argument --max-ulp: not a whole number: '1.5'"),
    (["--atol", "1e-3"], "--atol and --rtol go together, as torch.testing.assert_close takes them"),
])
def test_bad_options_are_usage_errors_before_any_region_runs(tmp_path, capsys, flags, message):
    marks = tmp_path / "marks.py"
    marks.write_text(RUNS_LEAVE_A_MARK)
    try:
        code = main(["check", str(marks), *flags])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "the region raised" not in err
    assert not (tmp_path / "ran").exists()


def test_a_tool_recheck_with_both_tolerances_is_a_configuration_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "marks.py").write_text(RUNS_LEAVE_A_MARK)
    (tmp_path / "pyproject.toml").write_text("[tool.recheck]\natol = 1e-3\nmax-ulp = 4\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "marks.py"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'pyproject.toml'}: [tool.recheck] sets both max-ulp and atol/rtol" in err
    assert not (tmp_path / "ran").exists()


def test_a_tolerance_flag_replaces_the_files_tolerance(tmp_path, monkeypatch, capsys):
    (tmp_path / "marks.py").write_text(RUNS_LEAVE_A_MARK)
    (tmp_path / "pyproject.toml").write_text("[tool.recheck]\nmax-ulp = 4\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "marks.py", "--atol", "1e-3", "--rtol", "0"]) == 0
    assert "checked 1 region: 0 with findings" in capsys.readouterr().out


def test_step_options_with_region_targets_and_back_are_usage_errors(regions, capsys):
    assert main(["check", "--step", f"{regions}:region_clean", "--use-reentrant"]) == 2
    assert "a --step runs its checkpoints as written" in capsys.readouterr().err
    assert main(["check", "--step", f"{regions}:region_clean", "--strict", "--early-stop"]) == 2
    assert "--strict is the old name of --no-early-stop" in capsys.readouterr().err


def test_a_lone_atol_in_tool_recheck_is_a_configuration_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "marks.py").write_text(RUNS_LEAVE_A_MARK)
    (tmp_path / "pyproject.toml").write_text("[tool.recheck]\natol = 1e-3\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "marks.py"]) == 2
    assert "sets only one of atol and rtol" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()


def test_a_broken_step_does_not_stop_the_next(tmp_path, capsys):
    steps = tmp_path / "steps.py"
    steps.write_text(textwrap.dedent('''
        import torch
        from torch.utils.checkpoint import checkpoint


        def fails():
            raise RuntimeError("step failed")


        def clean():
            x = torch.randn(2, 3, requires_grad=True)
            checkpoint(torch.tanh, x, use_reentrant=False).sum().backward()
    '''))
    assert main(["check", "--step", f"{steps}:fails", "--step", f"{steps}:nope", "--step", f"{steps}:clean"]) == 2
    out, err = capsys.readouterr()
    assert f"recheck check: error: {steps}:fails: the step raised RuntimeError: step failed" in err
    assert f"{steps}:nope: {steps} has no attribute 'nope'" in err
    assert f"step {steps}:clean" in out
    assert out.rstrip().endswith("recheck: ran 3 steps: 0 with findings, 2 errors")


PACKAGE_FILES = {
    "mymodel/__init__.py": "",
    "mymodel/layers.py": textwrap.dedent('''
        import torch
        from torch import nn


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(3, 3)

            def forward(self, x):
                return torch.tanh(self.lin(x))
    '''),
    "mymodel/train.py": textwrap.dedent('''
        import torch
        from torch.utils.checkpoint import checkpoint

        from mymodel.layers import Block
        from . import layers

        assert layers.Block is Block


        def region_block():
            torch.manual_seed(0)
            return Block(), (torch.randn(2, 3, requires_grad=True),)


        def step():
            from mymodel.layers import Block  # a lazy import, after the file was loaded
            torch.manual_seed(0)
            x = torch.randn(2, 3, requires_grad=True)
            checkpoint(Block(), x, use_reentrant=False).sum().backward()
    '''),
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project root holding the package ``mymodel``; the test runs from the root."""
    for name, text in PACKAGE_FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name == "mymodel" or name.startswith("mymodel."):
            del sys.modules[name]


@pytest.mark.parametrize("argv, code, expected", [
    (["check", "mymodel/train.py"], 0, "recheck: checked 1 region: 0 with findings"),
    (["check", "--step", "mymodel/train.py:step"], 0, "recheck: ran 1 step: 0 with findings"),
    (["cost", "mymodel/train.py:step", "--repeats", "1"], 0, "Block.forward"),
])
def test_a_file_inside_a_package_imports_from_the_project_root(project, capsys, argv, code, expected):
    assert main(argv) == code, capsys.readouterr().err
    assert expected in capsys.readouterr().out
    assert sys.modules["mymodel.train"].__file__ == str(project / "mymodel" / "train.py")


def test_a_package_file_is_named_by_its_dotted_name(project):
    (target,) = load_target("mymodel/train.py:region_block")
    assert target.factory.__module__ == "mymodel.train"


def test_a_folder_without_init_imports_from_the_current_folder(project, capsys):
    (project / "mymodel" / "__init__.py").unlink()  # a namespace folder, as many projects have
    train = project / "mymodel" / "train.py"
    train.write_text(train.read_text().replace("from . import layers\n", "import mymodel.layers as layers\n"))
    assert main(["cost", "mymodel/train.py:step", "--repeats", "1"]) == 0, capsys.readouterr().err


def test_from_elsewhere_the_error_says_where_to_run_and_the_module_name(project, tmp_path, monkeypatch, capsys):
    (project / "mymodel" / "__init__.py").unlink()
    (project / "mymodel" / "train.py").write_text("from mymodel.layers import Block\n\n\ndef step():\n    pass\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["cost", "../mymodel/train.py:step"]) == 2
    err = capsys.readouterr().err
    assert "No module named 'mymodel'" in err
    assert (f"(`mymodel` is the folder {project / 'mymodel'}: run recheck from {project}, where `import "
            "mymodel` finds it, and name the target mymodel.train:NAME, or install the project") in err


def test_another_package_of_the_same_name_first_on_the_path_is_named(project, tmp_path, monkeypatch):
    other = tmp_path / "site" / "mymodel"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "train.py").write_text("")
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.import_module("mymodel.train")  # the installed one is imported first
    with pytest.raises(TargetError, match=r"mymodel/train.py is the module mymodel.train .*but `import "
                                          r"mymodel.train` finds .*site/mymodel/train.py"):
        load_target("mymodel/train.py:step")


def test_user_frames_keep_files_beside_the_recheck_package():
    # The user's code may live next to recheck's package (a checkout with fixtures/, or
    # site-packages beside an installed recheck): only recheck's own frames are dropped.
    from pathlib import Path

    import recheck
    from recheck.loading import user_frames

    beside = Path(recheck.__file__).resolve().parent.parent / "fixtures" / "models" / "user_code.py"
    code = compile("def helper():\n    raise ValueError('planted')\n\nhelper()\n", str(beside), "exec")
    try:
        exec(code, {})
    except ValueError as exc:
        text = user_frames(exc)
    assert f'File "{beside}", line 2, in helper' in text
    assert "ValueError: planted" in text
