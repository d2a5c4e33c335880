"""State a framework's hooks keep on a module is the framework's, not the region's.

DeepSpeed ZeRO-3 registers a forward hook on every module that applies an autograd Function
stored on the module; the Function's ``setup_context`` counts the pending backwards in a module
attribute (``applied_pre_backward_ref_cnt``) and its backward counts down.  A recompute runs the
hook again, so the count ends one higher than the forward left it: bookkeeping no code of the
region names, which ``watch()`` reported as state the recompute changed (24-44 false findings
per rank on a clean ZeRO-3 model).  A count the region's own code keeps is still a finding.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck


def count_pending_backwards(module: nn.Module) -> None:
    """ZeRO-3's shape: a forward hook applying a Function kept on the module, which counts."""

    class PreBackward(torch.autograd.Function):
        @staticmethod
        def forward(output):
            return output.detach()

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.module = module
            vars(module).setdefault("pending_backwards", 0)
            module.pending_backwards += 1

        @staticmethod
        def backward(ctx, grad):
            ctx.module.pending_backwards -= 1
            return grad

    module.pre_backward_fn = PreBackward
    module.register_forward_hook(lambda mod, args, output: mod.pre_backward_fn.apply(output))


class Block(nn.Module):
    def __init__(self, counts: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.counts, self.calls = counts, 0

    def region(self, x: torch.Tensor) -> torch.Tensor:
        if self.counts:
            self.calls += 1
        return torch.tanh(self.linear(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.region, x, use_reentrant=False)


def test_a_count_a_frameworks_forward_hook_keeps_on_a_module_is_not_the_regions():
    torch.manual_seed(0)
    block = Block()
    count_pending_backwards(block.linear)
    with recheck.watch(raise_on_finding=False) as w:
        block(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert w.report.ok, str(w.report)
    assert w.report.stats["verified"] == 1


def test_a_count_the_regions_own_code_keeps_beside_such_a_hook_is_still_found():
    torch.manual_seed(0)
    block = Block(counts=True)
    count_pending_backwards(block.linear)
    with recheck.watch(raise_on_finding=False) as w:
        block(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert [(f.kind, str(f.subject)) for f in w.report.findings] == [("state", "attribute `self.calls`")]
