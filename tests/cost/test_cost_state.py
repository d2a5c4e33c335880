"""measure() restores everything: model state between and after runs, RNG, and torch's checkpoint."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

from recheck.cost import measure
from recheck.cost.router import Router, routing
from recheck.runtime.steps import discover_state
from recheck.intercept import patches


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().contiguous().view(torch.int32)


def _checkpoint_objects():
    exported = torch_checkpoint.checkpoint
    cell = patches.closure_cell(exported)
    return (
        exported,
        None if cell is None else cell.cell_contents,
        torch_checkpoint._checkpoint_without_reentrant_generator,
        torch_checkpoint.CheckpointFunction.__dict__["forward"],
    )


def _model_state(model: nn.Module, opt: torch.optim.Optimizer):
    params = [_bits(p) for p in model.parameters()]
    grads = [None if p.grad is None else _bits(p.grad) for p in model.parameters()]
    return params, grads, {k: dict(v) for k, v in opt.state_dict()["state"].items()}


def test_state_and_rng_are_as_found_after_measuring(demo):
    step, model, opt = demo.make_step(seq=4, dim=8, heads=2, hidden=16, blocks=1, mlp_layers=1, default_batch=2)
    step()  # a trained state: Adam state present
    model["embed"](torch.randn(2, 4, 8)).sum().backward()  # and some gradients
    torch.manual_seed(1234)
    before_rng = torch.get_rng_state()
    params, grads, opt_state = _model_state(model, opt)
    before_objects = _checkpoint_objects()
    measure(step, repeats=2)
    after_params, after_grads, after_opt_state = _model_state(model, opt)
    assert all(torch.equal(a, b) for a, b in zip(params, after_params))
    assert [g is None for g in grads] == [g is None for g in after_grads]
    assert any(g is not None for g in grads)
    assert all(a is None or torch.equal(a, b) for a, b in zip(grads, after_grads))
    for key, value in opt_state.items():
        for name, tensor in value.items():
            assert torch.equal(_bits(tensor), _bits(after_opt_state[key][name]))
    assert torch.equal(torch.get_rng_state(), before_rng)
    assert all(a is b for a, b in zip(before_objects, _checkpoint_objects()))
    assert patches.installed() is None


def test_every_run_sees_the_same_model_data_and_random_numbers():
    layer = nn.Linear(4, 4)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def step() -> None:
        x = torch.rand(3, 4)
        seen.append((_bits(x), _bits(layer.weight)))
        torch_checkpoint.checkpoint(layer, x.requires_grad_(), use_reentrant=False).sum().backward()
        opt.step()

    measure(step, repeats=2)
    assert len(seen) == 6  # traced + 2 timed, per mode
    assert all(torch.equal(x, seen[0][0]) and torch.equal(w, seen[0][1]) for x, w in seen)


def test_patches_are_restored_when_the_step_raises():
    before = _checkpoint_objects()

    def step() -> None:
        torch_checkpoint.checkpoint(torch.sin, torch.ones(2, requires_grad=True), use_reentrant=False)
        raise ZeroDivisionError("user bug")

    with pytest.raises(ZeroDivisionError, match="user bug"):
        measure(step, repeats=1)
    assert all(a is b for a, b in zip(before, _checkpoint_objects()))
    assert patches.installed() is None


def test_measuring_inside_another_interception_is_refused():
    with routing(Router()), pytest.raises(RuntimeError, match="already intercepted"):
        measure(lambda: None, repeats=1)
    assert patches.installed() is None


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_repeats_are_a_clear_error(bad):
    with pytest.raises(ValueError, match="repeats must be a positive integer"):
        measure(lambda: None, repeats=bad)


def test_a_non_callable_step_is_a_clear_error():
    with pytest.raises(TypeError, match="needs a callable step"):
        measure(42)  # type: ignore[arg-type]


class _Trainer:
    def __init__(self) -> None:
        self.model = nn.Linear(2, 2)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self) -> None:
        self.model(torch.ones(1, 2)).sum().backward()


_GLOBAL_MODEL = nn.Linear(3, 3)


def _global_step() -> None:
    _GLOBAL_MODEL(torch.ones(1, 3)).sum().backward()


def _partial_step(model: nn.Module) -> None:
    model(torch.ones(1, 5)).sum().backward()


def test_state_is_found_in_closures_globals_bound_objects_and_partials():
    trainer = _Trainer()
    found = discover_state(trainer.step)
    assert found.modules == [trainer.model] and found.optimizers == [trainer.opt]
    assert discover_state(_global_step).modules == [_GLOBAL_MODEL]
    model = nn.Linear(5, 5)
    assert discover_state(functools.partial(_partial_step, model)).modules == [model]
    inner = nn.Linear(1, 1)
    assert discover_state(lambda: inner(torch.ones(1))).modules == [inner]


def test_checkpoint_sequential_and_composable_regions_are_bypassed():
    from torch.distributed._composable import checkpoint as composable_checkpoint

    chain = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh())
    tail = composable_checkpoint(nn.Sequential(nn.Linear(8, 8), nn.Tanh()))

    def step() -> None:
        x = torch.randn(4, 8, requires_grad=True)
        h = torch_checkpoint.checkpoint_sequential(chain, 2, x, use_reentrant=False)
        tail(h).sum().backward()

    cmp = measure(step, repeats=1)
    # checkpoint_sequential checkpoints every segment but the last, which it runs directly
    names = sorted(r.name for r in cmp.regions)
    assert names == ["Sequential.forward", "checkpoint_sequential.<locals>.run_function.<locals>.forward"]
    assert all(r.invocations == 1 and r.recomputes == 1 for r in cmp.regions)
    assert cmp.recompute.flops > 0
    # bypassed: no checkpoint input is kept, so every input is a plain saved tensor
    assert cmp.bypassed.retained_peak_split["input"] == 0
    assert cmp.checkpointed.retained_peak_split["input"] > 0


_LOOSE_WEIGHT = torch.ones(3, 3, requires_grad=True)


def _loose_step() -> None:
    x = torch.ones(2, 3, requires_grad=True)
    torch_checkpoint.checkpoint(lambda t: (t @ _LOOSE_WEIGHT).sin(), x, use_reentrant=False).sum().backward()


def test_loose_leaf_tensors_count_as_parameters_and_their_grads_are_restored():
    found = discover_state(_loose_step)
    assert [id(t) for t in found.parameters()] == [id(_LOOSE_WEIGHT)] and not found.tensors
    assert _LOOSE_WEIGHT.grad is None
    cmp = measure(_loose_step, repeats=2)
    assert _LOOSE_WEIGHT.grad is None  # accumulated in each run, put back each time
    assert cmp.checkpointed.peak_breakdown["parameters"] == 3 * 3 * 4


def test_explicit_generators_are_restored_between_runs():
    generator = torch.Generator().manual_seed(7)
    layer = nn.Linear(2, 2)
    draws: list[torch.Tensor] = []

    def step() -> None:
        x = torch.rand(1, 2, generator=generator)
        draws.append(x)
        torch_checkpoint.checkpoint(layer, x, use_reentrant=False).sum().backward()

    measure(step, repeats=1)
    assert len(draws) == 4 and all(torch.equal(d, draws[0]) for d in draws)


def test_schedulers_are_restored_between_runs():
    layer = nn.Linear(2, 2)
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    rates: list[float] = []

    def step() -> None:
        rates.append(opt.param_groups[0]["lr"])
        torch_checkpoint.checkpoint(layer, torch.ones(1, 2), use_reentrant=False).sum().backward()
        opt.step()
        scheduler.step()

    measure(step, repeats=1)
    assert rates == [1.0] * 4
    assert scheduler.last_epoch == 0 and opt.param_groups[0]["lr"] == 1.0


@pytest.mark.parametrize("bad", [0, -5, "lots", True])
def test_bad_budgets_are_a_clear_error(bad):
    with pytest.raises(ValueError, match="size|budget"):
        measure(lambda: None, repeats=1, budget=bad)
