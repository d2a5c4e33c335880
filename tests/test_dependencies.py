"""Without torch the linter works and every dynamic face says how to install torch.

torch is hidden here by ``sys.modules["torch"] = None`` (``import torch`` then fails as it
does where torch is not installed); ``tests/test_wheel.py`` also runs the light install
for real, in a fresh virtual environment.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import recheck
from recheck.cli import main
from recheck.dependencies import TORCH_REQUIREMENT, MissingDependency, require_torch, torch_installed

ROOT = Path(__file__).resolve().parent.parent
ZOO = str(ROOT / "fixtures" / "models" / "zoo.py")
STEPS = str(ROOT / "fixtures" / "steps" / "train_steps.py")
COST = str(ROOT / "fixtures" / "models" / "cost_demo.py")


@pytest.fixture
def no_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    for name in recheck._LAZY:  # names the package already loaded
        monkeypatch.delitem(vars(recheck), name, raising=False)


def test_torch_is_found_here_without_being_imported():
    assert torch_installed()
    require_torch("anything")  # does not raise


def test_missing_torch_names_the_feature_and_both_ways_to_install(no_torch):
    assert not torch_installed()
    with pytest.raises(MissingDependency) as caught:
        require_torch("recheck check")
    message = str(caught.value)
    assert message.startswith(f"recheck check needs PyTorch ({TORCH_REQUIREMENT})")
    assert "pip install 'recheck[torch]'" in message
    assert "https://pytorch.org/get-started/locally/" in message
    assert "`recheck lint`" in message
    assert caught.value.name == "torch"
    assert isinstance(caught.value, ImportError)


@pytest.mark.parametrize("argv, feature", [
    (["check", ZOO], "recheck check"),
    (["check", "--step", f"{STEPS}:clean_step"], "recheck check"),
    (["cost", f"{COST}:step"], "recheck cost"),
    (["cost", "--ranks", "2", f"{COST}:step"], "recheck cost"),
])
def test_dynamic_commands_exit_2_with_the_install_message(no_torch, capsys, argv, feature):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"recheck: error: {feature} needs PyTorch")
    assert "Traceback" not in err


def test_usage_errors_still_come_first(no_torch, capsys):
    assert main(["check"]) == 2
    assert "nothing to check" in capsys.readouterr().err


def test_lint_works(no_torch, tmp_path, capsys):
    (tmp_path / "m.py").write_text(
        "from torch.utils.checkpoint import checkpoint\n\n"
        "def f(block, x):\n    return checkpoint(block, x)\n")
    assert main(["lint", "--no-cache", str(tmp_path)]) == 1
    assert "RC001" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["check", "watch", "measure", "assert_recompute_equal", "tag", "gather_report"])
def test_the_python_api_names_the_function(no_torch, name):
    with pytest.raises(MissingDependency, match=rf"recheck\.{name} needs PyTorch"):
        getattr(recheck, name)


def test_pytest_recheck_is_a_usage_error(no_torch, pytester):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess("--recheck")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "recheck: pytest --recheck needs PyTorch" in err and "pip install 'recheck[torch]'" in err
    # without --recheck the plugin stays out of the way
    assert pytester.runpytest_inprocess().ret == pytest.ExitCode.OK
