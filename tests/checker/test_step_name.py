"""A step is named by its own function, never by the one model it closes over.

``def step(): optimizer.zero_grad(); model(x).sum().backward(); optimizer.step()`` written
inside a function closes over one module, as ``create_custom_forward(module)`` does around a
layer; the region rule that names such a closure by the layer's ``forward`` named the whole
step ``Net.forward (...)`` in the report's title and in every end-state finding, sending the
reader to the model's code rather than to the step that did the work.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

import recheck
from recheck.runtime.naming import relative


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1  # a counter: the recompute runs it again, so the end state differs
        return self.layer(x).relu()


def test_a_step_closing_over_one_model_is_named_by_itself() -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    report = recheck.check_step(step)
    name = f"test_a_step_closing_over_one_model_is_named_by_itself.<locals>.step ({relative(__file__)}:"
    assert report.title.splitlines()[0].split(None, 1)[1].startswith(name), report.title
    ends = [f for f in report if "uncheckpointed step" in f.message]
    assert ends and all(f.region.startswith(f"step {name}") for f in ends), str(report)
