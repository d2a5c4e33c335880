"""What watch() compares after the overhead work: the modules a forward runs, loggers by identity."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck

LOG = logging.getLogger("recheck.tests.region")


class FunctionalNorm(nn.Module):
    """Updates a BatchNorm's buffers through F.batch_norm without calling the module."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        h = self.lin(x)
        return F.batch_norm(h, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias,
                            training=True)


class Logged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        # reads the module's logger without logging (a logging call itself is a side effect,
        # recorded whatever the level, like the linter's RC103)
        scale = 2.0 if LOG.isEnabledFor(logging.DEBUG) else 1.0
        return torch.tanh(self.lin(x) * scale)


def test_buffers_updated_without_calling_the_module_are_reported():
    torch.manual_seed(0)
    model = FunctionalNorm()
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(model, torch.randn(4, 8, requires_grad=True), use_reentrant=False).sum().backward()
    assert "buffer" in w.report.kinds, str(w.report)
    assert any("running_mean" in (f.subject or f.message) for f in w.report.findings)


def test_a_logger_created_between_forward_and_recompute_is_no_finding():
    torch.manual_seed(0)
    model = Logged()
    with recheck.watch(raise_on_finding=False) as w:
        out = checkpoint(model, torch.randn(4, 8, requires_grad=True), use_reentrant=False)
        logging.getLogger("recheck.tests.created.between")  # grows the logging registry
        LOG.isEnabledFor(logging.INFO)  # fills the logger's level cache
        out.sum().backward()
    assert w.report.ok, str(w.report)


def test_a_logger_whose_level_changes_between_forward_and_recompute_is_reported():
    torch.manual_seed(0)
    model = Logged()
    before = LOG.level
    try:
        with recheck.watch(raise_on_finding=False) as w:
            out = checkpoint(model, torch.randn(4, 8, requires_grad=True), use_reentrant=False)
            LOG.setLevel(logging.DEBUG)
            out.sum().backward()
    finally:
        LOG.setLevel(before)
    assert "global" in w.report.kinds, str(w.report)


def _apply(t: torch.Tensor, block: nn.Module) -> torch.Tensor:
    return block(t)


def test_partials_bound_to_other_keyword_modules_have_their_own_reach():
    # the reach cache is keyed by the code and what it is bound to: a partial's keyword
    # arguments count, or every block would share the first one's reach
    from functools import partial

    from recheck.runtime.reach import reach_of

    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    cache: dict = {}
    reach_first = reach_of(partial(_apply, block=first), cache)
    reach_second = reach_of(partial(_apply, block=second), cache)
    assert reach_first is not reach_second
    assert id(second) in reach_second.modules and id(second) not in reach_first.modules
    assert reach_of(partial(_apply, block=first), cache) is reach_first


# -- only state the region runs or touches ---------------------------------------------------------

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from source_modules import load_file  # noqa: E402

TWINS = Path(__file__).resolve().parents[2] / "fixtures" / "twins"


@pytest.mark.parametrize("kind", ["closure", "method", "partial"])
def test_a_batchnorm_that_runs_outside_the_region_is_no_finding(kind):
    # torchvision's DenseNet: the region is a closure / bound method / partial of the layer, and
    # the layer's norm2 runs after the checkpoint returned (9 false findings per step before)
    step, _ = load_file(TWINS / "batchnorm_outside.py", "recheck_twins_batchnorm_outside").make_step(kind)
    with recheck.watch(raise_on_finding=False) as w:
        step()
    assert w.report.ok, str(w.report)
    assert w.report.stats["verified"] == w.report.stats["invocations"] == 3


def test_a_batchnorm_inside_the_region_is_still_reported():
    step, _ = load_file(TWINS / "batchnorm_outside.py", "recheck_twins_batchnorm_outside").make_step("inside")
    with recheck.watch(raise_on_finding=False) as w:
        step()
    subjects = {f.subject for f in w.report}
    assert w.report.kinds == {"buffer"} and len(w.report.findings) == 9, str(w.report)
    assert subjects == {f"buffer `self.norm1.{b}`" for b in ("running_mean", "running_var", "num_batches_tracked")}
    assert all("updated again by the recompute" in f.message and f.code == "RC106" for f in w.report)


class FunctionalNormMethod(nn.Module):
    """A bound-method region that updates a BatchNorm's statistics through F.batch_norm, and a
    norm that runs outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.after = nn.BatchNorm1d(8)

    def normalized(self, x):
        return F.batch_norm(self.lin(x), self.bn.running_mean, self.bn.running_var, training=True)

    def forward(self, x):
        return self.after(checkpoint(self.normalized, x, use_reentrant=False))


def test_buffers_the_region_writes_without_running_their_module_are_compared():
    torch.manual_seed(0)
    model = FunctionalNormMethod()
    with recheck.watch(raise_on_finding=False) as w:
        model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert {f.subject for f in w.report} == {"buffer `bn.running_mean`", "buffer `bn.running_var`"}, str(w.report)


class CountsInBackward(nn.Module):
    """Updates a buffer only under grad: in a reentrant recompute alone (fairscale's patched BatchNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if torch.is_grad_enabled():
            self.updates += 1
        return self.lin(x)


def test_a_buffer_only_the_recompute_updates_is_updated_once():
    model = CountsInBackward()
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(model, torch.randn(4, 8, requires_grad=True), use_reentrant=True).sum().backward()
    assert w.report.ok, str(w.report)
    assert int(model.updates) == 1


class GrowsAttributes(nn.Module):
    """Sets an attribute only in the invocations after the first (the layout of its state
    keys, cached per module, must follow): a cache slot filled on recompute."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.runs = 0

    def forward(self, x):
        self.runs += 1
        if self.runs == 4:  # the second call's recompute
            self.seen = x.shape[0]
        return torch.tanh(self.lin(x))


def test_an_attribute_that_appears_in_a_later_recompute_is_reported():
    torch.manual_seed(0)
    model = GrowsAttributes()
    with recheck.watch(raise_on_finding=False) as w:
        for _ in range(2):
            checkpoint(model, torch.randn(4, 8, requires_grad=True), use_reentrant=False).sum().backward()
    subjects = {(f.subject, f.invocation.index) for f in w.report.by_kind("state")}
    assert ("attribute `self.seen`", 2) in subjects, str(w.report)  # call 2 of 2
    seen = next(f for f in w.report.by_kind("state") if f.subject == "attribute `self.seen`")
    assert "<absent> -> 4" in seen.message


def _segmented(blocks: nn.ModuleList, start: int, end: int):
    """timm's ``checkpoint_seq``: a closure over every block, running a few of them."""
    functions = list(blocks)

    def run(x):
        for j in range(start, end):
            x = functions[j](x)
        return x

    return run


def test_saved_parameters_of_the_blocks_that_ran_are_told_by_version_and_others_by_bytes():
    from recheck.watcher.records import Forward
    from recheck.runtime.reach import Reach

    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
    reach = Reach()
    reach.add_module("blocks", blocks)
    forward = Forward(reach, {}, {})
    forward.ran = {id(blocks[1]): blocks[1]}
    forward.scope()
    assert forward.parameter_of(blocks[1].weight.t().detach()) is blocks[1].weight
    # a block that did not run is none of the scope: its weight, if saved, is digested by its bytes
    assert forward.parameter_of(blocks[2].weight.t().detach()) is None
    forward.ran[id(blocks[2])] = blocks[2]
    forward.scope()  # a new scope: the pointers are read again
    assert forward.parameter_of(blocks[2].weight.t().detach()) is blocks[2].weight


@pytest.mark.parametrize("odd", ["none", "empty", "sparse"])
def test_a_scope_with_an_empty_none_or_sparse_parameter_still_tells_its_plain_ones(odd):
    """The usual scope (plain, non-empty parameters) is read in C-level passes; one odd
    parameter sends it down the per-parameter path, which leaves the odd one out."""
    from recheck.runtime.reach import Reach
    from recheck.watcher.records import Forward

    block = nn.Linear(4, 4)
    if odd == "none":
        block.register_parameter("extra", None)
    elif odd == "empty":
        block.extra = nn.Parameter(torch.empty(0))
    else:
        block.extra = nn.Parameter(torch.eye(3).to_sparse())
    reach = Reach()
    reach.add_module("block", block)
    forward = Forward(reach, {}, {})
    forward.ran = {id(block): block}
    forward.scope()
    assert forward.parameter_of(block.weight.t().detach()) is block.weight
    assert forward.parameter_of(block.bias) is block.bias
    assert len(forward.parameter_pointers) == 2


def _segment_with(change):
    """The report of a ``checkpoint_seq`` segment running blocks 1 and 2 of 4, with ``change``
    made to the blocks between its forward and its recompute."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
    x = torch.randn(2, 4, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        out = checkpoint(_segmented(blocks, 1, 3), x, use_reentrant=False)
        with torch.no_grad():
            change(blocks)
        out.sum().backward()
    return w.report


def test_a_segment_that_saves_a_weight_changed_in_place_is_reported_either_way():
    report = _segment_with(lambda blocks: blocks[2].weight.add_(1))
    assert any(f.kind == "param_version" for f in report.findings), str(report)


def test_a_parameter_of_a_block_the_segment_did_not_run_is_none_of_its_business():
    # blocks 0 and 3 are reached through the closure and never run by this segment
    report = _segment_with(lambda blocks: (blocks[0].weight.add_(1), blocks[3].bias.add_(1)))
    assert report.ok, str(report)
    report = _segment_with(lambda blocks: blocks[1].bias.add_(1))  # run by it
    found = [f for f in report.findings if f.kind == "param_version"]
    assert [f.subject for f in found] == ["parameter `functions[1].bias`"], str(report)


def _routed(routes: list[int], change) -> recheck.WatchReport:
    """A region that runs one of two experts, chosen per call (a mixture of experts' routing):
    its scope changes from one invocation to the next.  ``change(experts, route)`` runs between
    each invocation's forward and its recompute."""
    experts, router = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]), {"route": 0}

    def region(x):
        return torch.tanh(experts[router["route"]](x))

    with recheck.watch(raise_on_finding=False) as w:
        for route in routes:
            router["route"] = route
            out = checkpoint(region, torch.randn(2, 4, requires_grad=True), use_reentrant=False)
            change(experts, route)
            out.sum().backward()
    return w.report


def test_a_parameter_changed_after_a_forward_whose_scope_was_not_predicted_is_still_reported():
    # the second invocation runs another expert than the first: its entry read the first's
    # scope.  A bias is not saved for backward (a weight is, and its print is its version)
    def bump(experts, route):
        if route == 1:
            with torch.no_grad():
                experts[1].bias.add_(1)

    report = _routed([0, 1], bump)
    found = [f for f in report.findings if f.kind == "param_version"]
    assert [f.subject for f in found] == ["parameter `experts.1.bias`"], str(report)
    assert found[0].invocation.index == 2
    assert _routed([0, 1, 1, 0], lambda experts, route: None).ok


def test_a_parameter_changed_in_place_by_the_forward_itself_is_reported_when_its_scope_was_predicted():
    class SelfNormalizing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            out = self.lin(x)
            with torch.no_grad():
                self.lin.bias.mul_(1.0)  # bumps the version inside the forward (a bias is not saved)
            return out.tanh()

    model = SelfNormalizing()
    with recheck.watch(raise_on_finding=False) as w:
        for _ in range(2):  # the second invocation's entry reads the first's scope
            checkpoint(model, torch.randn(2, 4, requires_grad=True), use_reentrant=False).sum().backward()
    calls = sorted({f.invocation.index for f in w.report.findings if f.kind == "param_version"})
    assert calls == [1, 2], str(w.report)


def test_a_block_per_step_tells_what_changed_between_forward_and_recompute_in_each():
    """A ``watch()`` block per step (``pytest --recheck``, a test per block), one region over
    some of the model's blocks: each block finds the change made in its own step, in the block
    the region ran, and nothing where the change was to a block it did not run."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
    segment = _segmented(blocks, 1, 3)  # one function for every block

    def step(change):
        with recheck.watch(raise_on_finding=False) as w:
            out = checkpoint(segment, torch.randn(2, 4, requires_grad=True), use_reentrant=False)
            with torch.no_grad():
                change()
            out.sum().backward()
        return w.report

    assert step(lambda: None).ok
    report = step(lambda: blocks[2].bias.add_(1))
    found = [f for f in report.findings if f.kind == "param_version"]
    assert [f.subject for f in found] == ["parameter `functions[2].bias`"], str(report)
    assert step(lambda: blocks[3].bias.add_(1)).ok


class Growing(nn.Module):
    """Adds a submodule in its first forward, and reads it without calling it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        if "gate" not in self._modules:
            self.gate = nn.Dropout(0.0)
        return self.fc(x) * (1 - self.gate.p)


def test_a_submodule_added_by_the_forward_is_compared_with_its_parent():
    block = Growing()
    with recheck.watch(raise_on_finding=False) as watcher:
        y = checkpoint(block, torch.randn(2, 8), use_reentrant=False)
        block.gate.p = 0.5  # by the training loop, between forward and recompute
        y.sum().backward()
    found = [f for f in watcher.report if f.kind == "state"]
    assert len(found) == 1 and found[0].subject.endswith(".p`"), str(watcher.report)  # (named as found: Dropout#1)
    assert "changed between forward and recompute: 0.0 -> 0.5" in found[0].message
