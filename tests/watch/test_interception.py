"""Every entry point of torch.utils.checkpoint is caught by watch(), however it was bound.

Each test builds its model and binds its checkpoint function *before* watch() starts,
then checks that the forward and the recompute were both observed (``verified``) and
that every patched object is the original again afterwards.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn
from torch.utils.checkpoint import checkpoint as checkpoint_imported_early

import recheck
from recheck.intercept import patches

ORIGINAL_CHECKPOINT = torch_checkpoint.checkpoint
ORIGINAL_INNER = torch_checkpoint.checkpoint.__wrapped__
ORIGINAL_GENERATOR = torch_checkpoint._checkpoint_without_reentrant_generator
ORIGINAL_FORWARD = torch_checkpoint.CheckpointFunction.__dict__["forward"]


def assert_originals_restored() -> None:
    assert torch_checkpoint.checkpoint is ORIGINAL_CHECKPOINT
    assert patches.closure_cell(torch_checkpoint.checkpoint).cell_contents is ORIGINAL_INNER
    assert torch_checkpoint._checkpoint_without_reentrant_generator is ORIGINAL_GENERATOR
    assert torch_checkpoint.CheckpointFunction.__dict__["forward"] is ORIGINAL_FORWARD
    assert torch_checkpoint._allowed_determinism_checks_to_fns.keys() == {"default", "none"}
    assert patches.installed() is None


@pytest.fixture(autouse=True)
def _restored_after_each_test():
    yield
    assert_originals_restored()


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 6))


def run_watched(step, **options) -> recheck.Report:
    with recheck.watch(raise_on_finding=False, **options) as w:
        step()
    return w.report


def assert_verified(report: recheck.Report, invocations: int) -> None:
    assert report.ok, str(report)
    assert report.stats["invocations"] == invocations, report.stats
    assert report.stats["verified"] == invocations, report.stats


@pytest.mark.parametrize("reentrant", [False, True])
def test_module_attribute_call(reentrant):
    model, x = mlp(), torch.randn(3, 6, requires_grad=True)
    report = run_watched(lambda: torch_checkpoint.checkpoint(model, x, use_reentrant=reentrant).sum().backward())
    assert_verified(report, 1)


@pytest.mark.parametrize("reentrant", [False, True])
def test_name_imported_before_watch(reentrant):
    model, x = mlp(), torch.randn(3, 6, requires_grad=True)
    report = run_watched(lambda: checkpoint_imported_early(model, x, use_reentrant=reentrant).sum().backward())
    assert_verified(report, 1)


@pytest.mark.parametrize("reentrant", [False, True])
def test_partial_stored_before_watch(reentrant):
    stored = functools.partial(torch_checkpoint.checkpoint, use_reentrant=reentrant)
    model, x = mlp(), torch.randn(3, 6, requires_grad=True)
    report = run_watched(lambda: stored(model, x).sum().backward())
    assert_verified(report, 1)


def test_region_names_owner_and_call_site():
    model, x = mlp(), torch.randn(3, 6, requires_grad=True)
    stored = functools.partial(checkpoint_imported_early, use_reentrant=False)
    with recheck.watch() as w:
        stored(functools.partial(type(model).forward, model), x).sum().backward()
    (record,) = w.records
    assert record.region.qualname == "Sequential.forward"
    assert record.region.callsite.endswith(f"test_interception.py:{test_region_names_owner_and_call_site.__code__.co_firstlineno + 4}")


def test_checkpoint_sequential():
    model, x = mlp(), torch.randn(3, 6, requires_grad=True)
    report = run_watched(
        lambda: torch_checkpoint.checkpoint_sequential(model, 3, x, use_reentrant=False).sum().backward())
    assert_verified(report, 2)  # the last segment runs without checkpoint


@pytest.mark.parametrize("impl", ["NO_REENTRANT", "REENTRANT"])
def test_checkpoint_wrapper_built_before_watch(impl):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    wrapped = checkpoint_wrapper(mlp(), checkpoint_impl=getattr(CheckpointImpl, impl))
    x = torch.randn(3, 6, requires_grad=True)
    report = run_watched(lambda: wrapped(x).sum().backward())
    assert_verified(report, 1)


def test_composable_checkpoint_applied_before_watch():
    from torch.distributed._composable import checkpoint as composable_checkpoint

    model = mlp()
    composable_checkpoint(model[0])
    x = torch.randn(3, 6, requires_grad=True)
    report = run_watched(lambda: model(x).sum().backward())
    assert_verified(report, 1)
    assert report.stats["regions"] == 1


@pytest.mark.parametrize("preserve", [True, False])
def test_direct_checkpoint_function_apply(preserve):
    model, x = mlp(), torch.randn(3, 6, requires_grad=True)
    report = run_watched(lambda: torch_checkpoint.CheckpointFunction.apply(model, preserve, x).sum().backward())
    assert_verified(report, 1)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_called_during_a_recompute(reentrant):
    inner = mlp()

    def outer(x):
        return checkpoint_imported_early(inner, x.cos(), use_reentrant=reentrant).sin()

    x = torch.randn(3, 6, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reentrant: inner forward under no_grad warns
        report = run_watched(lambda: checkpoint_imported_early(outer, x, use_reentrant=reentrant).sum().backward())
    assert report.ok, str(report)
    # outer forward, inner forward, inner again during the outer recompute
    assert report.stats["invocations"] == 3
    assert report.stats["regions"] == 2
    assert report.stats["recomputations"] >= 2


def test_nested_watch_blocks_both_see_inner_calls_and_restore_once():
    model, x = mlp(), torch.randn(3, 6, requires_grad=True)
    with recheck.watch() as outer:
        checkpoint_imported_early(model, x, use_reentrant=False).sum().backward()
        with recheck.watch() as inner:
            checkpoint_imported_early(model, x, use_reentrant=False).sum().backward()
        assert patches.installed() is not None  # still watching in the outer block
        assert inner.report.stats["invocations"] == 1
    assert outer.report.stats["invocations"] == 2
    assert outer.report.stats["verified"] == 2


def test_exception_inside_block_restores_everything_and_propagates():
    model = mlp()
    with pytest.raises(ZeroDivisionError):
        with recheck.watch():
            checkpoint_imported_early(model, torch.randn(3, 6, requires_grad=True), use_reentrant=False)
            1 / 0


@pytest.mark.parametrize("reentrant", [False, True])
def test_exception_inside_region_propagates(reentrant):
    def broken(x):
        raise KeyError("inside the region")

    x = torch.randn(3, 6, requires_grad=True)
    with recheck.watch() as w:
        with pytest.raises(KeyError, match="inside the region"):
            checkpoint_imported_early(broken, x, use_reentrant=reentrant)
    assert w.report.ok
    assert w.report.stats["verified"] == 0


def test_recompute_after_the_block_ends_passes_through():
    model, x = mlp(), torch.randn(3, 6, requires_grad=True)
    with recheck.watch() as w:
        y = checkpoint_imported_early(model, x, use_reentrant=False)
    y.sum().backward()  # recompute outside: no comparison, no error
    assert x.grad is not None
    assert w.report.stats["never_recomputed"] == 1
    assert "never recomputed" in str(w.report)


def test_forward_without_grad_is_counted_not_flagged():
    model, x = mlp(), torch.randn(3, 6)
    with recheck.watch() as w, torch.no_grad():
        checkpoint_imported_early(model, x, use_reentrant=False)
    assert w.report.stats["without_grad"] == 1
    assert w.report.stats["never_recomputed"] == 0


@pytest.mark.slow
def test_torch_compile_passes_through_and_says_so():
    torch._dynamo.reset()
    model = mlp()

    def step(x):
        return torch_checkpoint.checkpoint(model, x, use_reentrant=False).sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    x = torch.randn(3, 6, requires_grad=True)
    with recheck.watch() as w:
        compiled(x).backward()
    reference = x.grad.clone()
    x.grad = None
    step(x).backward()
    assert torch.equal(reference, x.grad)
    assert 'torch.compiler.set_stance("force_eager")' in str(w.report)
    with recheck.watch() as eager:
        step(x).backward()
    assert "torch.compile" not in str(eager.report)
    torch._dynamo.reset()


@pytest.mark.slow
def test_a_compiled_submodule_in_a_watched_region_runs_one_graph_in_forward_and_recompute():
    """Module calls are told through ``_call_impl`` for the whole block: the region's forward and
    its recompute call the compiled submodule alike (with a global hook present in the forward
    only, dynamo traced two graphs that saved tensors in different orders, and torch's own
    check raised at the recompute)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    inner = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8)),
                          backend="aot_eager")
    outer = torch.nn.Linear(8, 8)

    def region(x):
        return inner(outer(x)).sin()

    x = torch.randn(4, 8, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        for _ in range(3):
            torch_checkpoint.checkpoint(region, x, use_reentrant=False).sum().backward()
            inner(x).sum().backward()  # and outside a region
    assert w.report.stats["invocations"] == 3
    assert not counters["recompiles"], dict(counters["recompiles"])
    torch._dynamo.reset()


def test_unexpected_layout_falls_back_with_a_warning(monkeypatch):
    real = torch_checkpoint.checkpoint

    def plain_checkpoint(function, *args, **kwargs):  # no closure cell: not the known layout
        return real(function, *args, **kwargs)

    monkeypatch.setattr(torch_checkpoint, "checkpoint", plain_checkpoint)
    model, x = mlp(), torch.randn(3, 6, requires_grad=True)
    with pytest.warns(patches.LayoutWarning, match="functools.partial objects made before watch"):
        with recheck.watch() as w:
            torch_checkpoint.checkpoint(model, x, use_reentrant=False).sum().backward()
    assert_verified(w.report, 1)
    assert torch_checkpoint.checkpoint is plain_checkpoint
