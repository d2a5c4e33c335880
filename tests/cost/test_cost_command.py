"""``recheck cost``: the command module on its own (the lead wires it into ``recheck.cli``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recheck.cli import main

ROOT = Path(__file__).resolve().parents[2]

STEP_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def step(batch_size: int = 4):
        x = torch.randn(batch_size, 8, requires_grad=True)
        checkpoint(model, x, use_reentrant=False).pow(2).mean().backward()

    def broken():
        raise RuntimeError("the user's step is broken")

    NOT_CALLABLE = 3
    """
)


def run_command(*argv: str) -> int:
    return main(["cost", *argv])


@pytest.fixture
def step_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(STEP_FILE)
    return path


def test_prints_the_table_and_writes_the_plot(step_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "memory.png"
    assert run_command(f"{step_file}:step", "--repeats", "1", "--plot", str(plot)) == 0
    out, err = capsys.readouterr()
    assert "retained saved state, peak" in out and "Sequential.forward" in out
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert f"memory plot written to {plot}" in err


def test_json_output_and_budget(step_file, capsys):
    assert run_command(str(step_file), "--repeats", "1", "--format", "json", "--budget", "1GiB") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["regions"][0]["region"] == "Sequential.forward"
    assert data["budget"]["extrapolated"] is True and data["budget"]["measured_batch_sizes"] == [4, 8]


@pytest.mark.parametrize(
    "target, message",
    [
        ("{dir}/missing.py:step", "no such file"),
        ("{file}:nothing", "has no attribute 'nothing'"),
        ("{file}:NOT_CALLABLE", "is not callable"),
        ("{file}:broken", "RuntimeError: the user's step is broken"),
    ],
)
def test_bad_targets_exit_2_with_a_message(step_file, capsys, target, message):
    spec = target.format(dir=step_file.parent, file=step_file)
    assert run_command(spec, "--repeats", "1") == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["x.py", "--budget", "lots"], ["x.py", "--repeats", "0"], ["x.py", "--format", "xml"]])
def test_bad_options_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_command(*argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["x.py", "--budget", "-5GiB"], "argument --budget: a size must be positive, got '-5GiB'"),
    (["x.py", "--budget=-5GiB"], "argument --budget: a size must be positive, got '-5GiB'"),
    (["x.py", "--budget", "-.5"], "argument --budget: a size must be positive, got '-.5'"),
    (["x.py", "--ranks", "-2"], "argument --ranks: --ranks must be between 1 and 64, got -2"),
])
def test_a_negative_value_gets_its_options_own_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_command(*argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "expected one argument" not in err


def test_importing_the_command_does_not_import_torch():
    code = "import sys, recheck.commands.cost; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_reachable_through_the_recheck_command_line(step_file, capsys):
    from recheck.cli import main

    assert main(["cost", f"{step_file}:step", "--repeats", "1", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["modes"]["checkpointed"]["observed_peak"] > 0


def test_plot_without_matplotlib_exits_2_after_printing_the_table(step_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert run_command(f"{step_file}:step", "--repeats", "1", "--plot", str(tmp_path / "m.png")) == 2
    out, err = capsys.readouterr()
    assert "retained saved state, peak" in out
    assert "needs matplotlib" in err and not (tmp_path / "m.png").exists()
