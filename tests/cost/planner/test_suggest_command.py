"""recheck cost --suggest: the report, JSON, --save-plan, exit codes and the errors of bad input."""

from __future__ import annotations

import json
import textwrap

import pytest
from source_modules import load_file

from recheck.cli import main
from recheck.cost.planner.plans import load_plan

STEP_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    CALLS = []

    class layer(nn.Module):
        def __init__(self, counted=False):
            super().__init__()
            self.fc1, self.fc2, self.counted = nn.Linear(16, 64), nn.Linear(64, 16), counted

        def forward(self, x):
            if self.counted:
                CALLS.append(1)  # a side effect: a recompute repeats it
            return x + self.fc2(torch.tanh(self.fc1(x)))

    layers = nn.ModuleList(layer() for _ in range(3))
    counted_layers = nn.ModuleList(layer(counted=True) for _ in range(3))

    def run(stack, batch_size=8):
        h = torch.randn(batch_size, 16, requires_grad=True)
        for block in stack:
            h = checkpoint(block, h, use_reentrant=False)
        h.pow(2).mean().backward()

    def step(batch_size: int = 8):
        run(layers, batch_size)

    def counted_step():
        run(counted_layers, 512)  # activations well above the parameters: checkpointing pays

    def plain():
        torch.nn.Linear(4, 4)(torch.randn(2, 4)).sum().backward()
    """
)


@pytest.fixture
def step_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(STEP_FILE)
    return path


def cost(*argv: str) -> int:
    return main(["cost", *argv])


@pytest.mark.slow
def test_the_report_the_json_and_the_saved_plan(step_file, tmp_path, capsys, peaks):
    module = load_file(step_file, "recheck_suggest_command_step")
    low, high = peaks(module.step)
    budget = str((low + high) // 2)
    assert cost("--suggest", "--budget", budget, f"{step_file}:step", "--repeats", "1") == 0
    out = capsys.readouterr().out
    assert "suggested plan" in out and "every other layer" in out and "as written" in out
    saved = tmp_path / "plan.json"
    assert cost("--suggest", "--budget", budget, f"{step_file}:step", "--repeats", "1", "--format", "json",
                "--save-plan", str(saved), "--clock", "cpu") == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["suggested"]["fits"] and document["suggested"]["check_step"]["ok"]
    assert document["clock"] == "cpu" and document["budget_bytes"] == int(budget)
    assert load_plan(saved) == load_plan(document["plan"])
    assert f"plan written to {saved}" in err


@pytest.mark.slow
def test_a_plan_whose_check_step_finds_a_difference_exits_1(step_file, capsys, peaks):
    module = load_file(step_file, "recheck_suggest_command_counted")
    low, _ = peaks(module.counted_step)
    assert cost("--suggest", "--budget", str(low), f"{step_file}:counted_step", "--repeats", "1") == 1
    out = capsys.readouterr().out
    assert "check_step of suggested:" in out and "CALLS" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--suggest"], "--suggest needs --budget SIZE"),
    (["--objective", "time"], "--objective needs --suggest"),
    (["--save-plan", "p.json"], "--save-plan needs --suggest"),
    (["--clock", "cpu"], "--clock needs --suggest"),
    (["--suggest", "--budget", "1GiB", "--ranks", "2"], "--ranks does not go with --suggest"),
    (["--suggest", "--budget", "1GiB", "--plot", "m.png"], "--plot does not go with --suggest"),
])
def test_usage_errors_exit_2_before_anything_runs(step_file, capsys, argv, message):
    assert cost(*argv, f"{step_file}:step") == 2
    assert message in capsys.readouterr().err


def test_a_step_without_a_checkpointed_loop_exits_2_saying_so(step_file, capsys):
    assert cost("--suggest", "--budget", "1GiB", f"{step_file}:plain", "--repeats", "1") == 2
    assert "makes no checkpoint call" in capsys.readouterr().err


@pytest.mark.slow
def test_a_budget_nothing_fits_exits_2_saying_the_least_any_plan_needs(step_file, capsys):
    assert cost("--suggest", "--budget", "1KiB", f"{step_file}:step", "--repeats", "1") == 2
    assert "no plan fits the budget of 1.00 KiB: the smallest predicted peak of any plan is" in capsys.readouterr().err


def test_an_unwritable_plan_path_exits_2(step_file, tmp_path, capsys, peaks):
    module = load_file(step_file, "recheck_suggest_command_unwritable")
    _, high = peaks(module.step)
    target = tmp_path / "missing-folder" / "plan.json"
    assert cost("--suggest", "--budget", str(high), f"{step_file}:step", "--repeats", "1",
                "--save-plan", str(target)) == 2
    assert "cannot write the plan to" in capsys.readouterr().err
