"""The overlay: the step's own checkpoint calls a plan drops run directly, under any interception."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import recheck
from recheck.cost.planner.overlay import dropping
from recheck.intercept import patches


class counted(torch.nn.Module):
    """A layer that counts its forward runs (a recompute is a second run)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return torch.tanh(self.fc(x))


def layers() -> list[counted]:
    torch.manual_seed(0)
    return [counted() for _ in range(3)]


def train(stack: list[counted]) -> None:
    h = torch.randn(2, 4, requires_grad=True)
    for layer in stack:
        h = checkpoint(layer, h, use_reentrant=False)  # CALL SITE
    h.sum().backward()


def drop_first(stack):
    return lambda function, key: function is stack[0]


def test_a_dropped_call_runs_once_and_the_others_stay_checkpointed():
    stack = layers()
    with dropping(drop_first(stack)) as record:
        train(stack)
    assert [layer.runs for layer in stack] == [1, 2, 2]
    assert sum(record.calls.values()) == 1
    (key,) = record.calls
    line = next(i for i, text in enumerate(open(__file__), 1) if text.rstrip().endswith("# CALL SITE"))
    assert key.qualname == "counted.forward" and key.callsite.endswith(f"test_overlay.py:{line}")
    assert patches.installed() is None  # the pass-through interception it installed is gone


def test_under_watch_a_dropped_call_is_no_invocation_and_the_rest_are_verified():
    stack = layers()
    with recheck.watch(raise_on_finding=False) as w, dropping(drop_first(stack)):
        train(stack)
    assert w.report.stats["invocations"] == 2 and w.report.stats["verified"] == 2
    assert patches.installed() is None


def test_the_interceptors_entry_points_are_given_back_also_when_the_step_raises():
    stack = layers()
    with recheck.watch(raise_on_finding=False):
        hooks = patches.installed().hooks
        with pytest.raises(ZeroDivisionError), dropping(lambda f, k: True):
            assert "checkpoint" in vars(hooks)
            1 / 0
        assert not {"checkpoint", "generator", "reentrant_forward"} & set(vars(hooks))
        train(stack)


def test_a_composable_checkpoint_module_can_be_dropped():
    from torch.distributed._composable import checkpoint as composable

    stack = layers()
    composable(stack[1])

    def step():
        h = torch.randn(2, 4, requires_grad=True)
        for layer in stack:
            h = layer(h)
        h.sum().backward()

    with dropping(lambda function, key: True) as record:
        step()
    assert [layer.runs for layer in stack] == [1, 1, 1]
    assert sum(record.calls.values()) == 1
    step()
    assert stack[1].runs == 3  # outside the block it is checkpointed again: forward and recompute


def test_a_direct_checkpoint_function_apply_is_counted_as_not_droppable():
    stack = layers()
    x = torch.randn(2, 4, requires_grad=True)
    with dropping(lambda function, key: True) as record:
        torch.utils.checkpoint.CheckpointFunction.apply(stack[0], True, x).sum().backward()
    assert record.undroppable == 1
    assert stack[0].runs == 2


def test_another_implementations_call_is_dropped_through_its_own_direct_call():
    from imitations import imitation

    with imitation("deepspeed") as deepspeed:
        stack = layers()
        with recheck.watch(raise_on_finding=False) as w, dropping(drop_first(stack)) as record:
            h = torch.randn(2, 4, requires_grad=True)
            for layer in stack:
                h = deepspeed.checkpoint(layer, h)
            h.sum().backward()
    assert [layer.runs for layer in stack] == [1, 2, 2]
    assert sum(record.calls.values()) == 1
    assert w.report.stats["invocations"] == 2  # (the counters are a hazard watch() reports, by design)
