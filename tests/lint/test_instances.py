"""Regions given as instances bound to a name: `block = Block()` then `checkpoint(block, x)`."""

from __future__ import annotations

from pathlib import Path

STEPS = Path(__file__).resolve().parents[2] / "fixtures" / "steps" / "train_steps.py"

SOURCE = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * 2

def make_block():
    return Block()

def train(x):
    block = Block()
    return checkpoint(block, x, use_reentrant=False)

def not_a_region(x):
    value = torch.relu(x)        # a call's result that is never checkpointed
    return value
'''


def test_module_level_instance_is_resolved_to_its_class(lint):
    result = lint(str(STEPS))
    assert result.code == 1
    (line,) = result.lines[:-1]
    assert ":22:" in line and "RC101" in line and "`Block.forward`" in line


def test_local_instance_is_resolved_to_its_class(lint, write):
    write("m.py", SOURCE)
    result = lint("m.py")
    assert result.code == 1
    assert [line.split(": ")[1].split()[0] for line in result.lines[:-1]] == ["RC104"]
    assert "m.py:12:9: RC104 `self.calls` is incremented inside checkpointed region `Block.forward`" in result.out
