"""run_step: the engine of `recheck check --step file.py:fn`."""

from __future__ import annotations

import pytest

from recheck.watcher.step import StepError, run_step

STEP = """
import torch
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU())
clean = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.2), torch.nn.Tanh())

def bn_step():
    x = torch.randn(4, 8, requires_grad=True)
    checkpoint(model, x, use_reentrant=False).sum().backward()

def clean_step():
    x = torch.randn(4, 8, requires_grad=True)
    checkpoint(clean, x, use_reentrant=False).sum().backward()

NOT_CALLABLE = 3
"""


@pytest.fixture
def step_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(STEP)
    return path


def test_step_with_batchnorm_reports_buffer(step_file):
    report = run_step(f"{step_file}:bn_step")
    assert "buffer" in report.kinds
    assert report.stats["verified"] == 1


def test_clean_step_and_options(step_file):
    report = run_step(f"{step_file}:clean_step", early_stop=False, store="copy")
    assert report.ok, str(report)
    assert any("early_stop=False" in note for note in report.notes)


@pytest.mark.parametrize("target, message", [
    ("no-colon.py", "expected FILE.py:FUNCTION"),
    ("{dir}/missing.py:f", "no such file"),
    ("{file}:absent", "has no attribute 'absent'"),
    ("{file}:NOT_CALLABLE", "is not callable"),
])
def test_bad_targets_are_clear_errors(step_file, target, message):
    with pytest.raises(StepError, match=message):
        run_step(target.format(dir=step_file.parent, file=step_file))
