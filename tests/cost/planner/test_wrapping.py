"""apply_plan: exactly the plan's modules checkpointed, the same gradients, a clean undo."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import recheck
from recheck.cost.planner.plans import Plan, PlanError
from recheck.cost.planner.wrapping import PlannedForward, apply_plan, planned_module


class layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def stack() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"layers": torch.nn.ModuleList(layer() for _ in range(3))})


def run(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    h = x
    for block in model["layers"]:
        h = block(h)
    h.pow(2).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


class Count(TorchDispatchMode):
    """Counts the addmm calls made during backward."""

    def __init__(self) -> None:
        super().__init__()
        self.in_backward = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.addmm.default and torch._C._current_graph_task_id() != -1:
            self.in_backward += 1
        return func(*args, **(kwargs or {}))


PLAN = Plan((("layers.0", "full"), ("layers.2", "selective")))


def test_exactly_the_plans_modules_get_a_checkpointed_forward_and_remove_gives_them_back():
    model = stack()
    keys = list(model.state_dict())
    handle = recheck.apply_plan(model, PLAN)
    layers = model["layers"]
    assert isinstance(layers[0].__dict__["forward"], PlannedForward)
    assert "forward" not in layers[1].__dict__
    assert layers[2].forward.variant == "selective"
    assert list(model.state_dict()) == keys  # paths and keys do not change
    assert planned_module(layers[0].forward.region) is layers[0]
    handle.remove()
    assert all("forward" not in module.__dict__ for module in layers)


def test_the_gradients_are_those_of_the_model_without_the_plan():
    x = torch.randn(4, 8)
    model = stack()
    plain = run(model, x)
    with apply_plan(model, PLAN):
        planned = run(model, x)
    assert plain.keys() == planned.keys()
    assert all(torch.equal(plain[k], planned[k]) for k in plain)


# A Linear's backward uses mm, never addmm: an addmm in backward is a recomputed forward.  The full
# recompute stops early after the last tensor it must rebuild (fc2's input), so it runs fc1's
# addmm and not fc2's; the selective one takes fc1's output from what it kept.
@pytest.mark.parametrize(("variant", "recomputed"), [("full", 1), ("selective", 0)])
def test_full_recomputes_the_matrix_products_and_selective_keeps_them(variant, recomputed):
    model = stack()
    with apply_plan(model, Plan((("layers.1", variant),))), Count() as count:
        run(model, torch.randn(4, 8))
    assert count.in_backward == recomputed


def test_a_module_that_already_had_an_instance_forward_gets_it_back():
    model = stack()
    own = model["layers"][1].forward  # a bound method stored on the instance, as accelerate's hooks do
    model["layers"][1].forward = own
    with apply_plan(model, Plan((("layers.1", "full"),))):
        assert model["layers"][1].forward.previous is own
        run(model, torch.randn(4, 8))
    assert model["layers"][1].__dict__["forward"] is own


def test_without_grad_the_module_runs_as_it_was(monkeypatch):
    model = stack()
    called = []
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: called.append(a))
    with apply_plan(model, PLAN), torch.no_grad():
        model["layers"][0](torch.randn(2, 8))
    assert called == []


@pytest.mark.parametrize(("plan", "message"), [
    (Plan((("layers.7", "full"),), root="transformer"), "'layers.7' is not a module of ModuleDict .the plan was made for transformer"),
    (Plan((("layers.0", "selective"),), selective_ops=("aten.not_an_op",)), "'aten.not_an_op' is not an operator"),
])
def test_a_plan_that_does_not_fit_the_model_changes_nothing(plan, message):
    model = stack()
    with pytest.raises(PlanError, match=message):
        apply_plan(model, plan)
    assert all("forward" not in module.__dict__ for module in model["layers"])


def test_a_module_carries_one_plan_at_a_time():
    model = stack()
    with apply_plan(model, PLAN):
        with pytest.raises(PlanError, match="already carries a plan"):
            apply_plan(model, PLAN)
    with apply_plan(model, PLAN):  # after the undo it can be applied again
        pass


def test_apply_plan_needs_a_module():
    with pytest.raises(TypeError, match="needs the model"):
        apply_plan(PLAN, PLAN)  # type: ignore[arg-type]


def test_a_forward_replaced_after_the_plan_is_left_and_said():
    model = stack()
    handle = apply_plan(model, Plan((("layers.0", "full"),)))
    replacement = model["layers"][0].__dict__["forward"].region
    model["layers"][0].forward = replacement
    with pytest.warns(RuntimeWarning, match="replaced after the plan was applied"):
        handle.remove()
    assert model["layers"][0].__dict__["forward"] is replacement


def test_a_planned_step_checks_clean_against_its_uncheckpointed_twin():
    model = stack()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)

    def step():
        run(model, x)
        optimizer.step()

    with apply_plan(model, PLAN):
        report = recheck.check_step(step)
    assert report.ok, str(report)
    assert report.stats["watch"]["verified"] == 2
