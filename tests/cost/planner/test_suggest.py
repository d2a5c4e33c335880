"""recheck.suggest end to end: a plan within the budget, measured to be, verified, beside the anchors."""

from __future__ import annotations

import json

import pytest
import torch

import recheck
from recheck.cost.planner.candidates import NoRepeatedUnit
from recheck.cost.planner.plan_runs import ANCHORS
from recheck.cost.planner.plans import load_plan
from recheck.cost.planner.suggest import suggest
from recheck.cost.planner.suggestion import NothingFits


def snapshot(model, optimizer):
    return ([p.detach().clone() for p in model.parameters()],
            [v.clone() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)])


@pytest.mark.slow
def test_the_suggested_plan_fits_is_verified_and_beats_every_anchor_the_model_says_fits(small_demo, peaks):
    step, model, optimizer = small_demo
    low, high = peaks(step)
    budget = (low + high) // 2
    before = snapshot(model, optimizer)
    seen = []
    s = suggest(step, budget=budget, repeats=1, progress=lambda what, done, total: seen.append((what, done, total)))
    run = s.suggested
    assert run.fits(budget) and run.verified, str(s)
    assert abs(run.peak_error) <= 0.05
    assert [a.name for a in s.anchors] == [*ANCHORS, "as written"]
    assert all(a.verified for a in s.anchors), str(s)
    for anchor in s.anchors[:-1]:  # the solver's optimum is at least as fast as any anchor it could have chosen
        if anchor.predicted_peak <= budget:
            assert run.predicted_seconds <= anchor.predicted_seconds * (1 + 1e-6), anchor.name
    assert s.plan.modules and s.plan.root == "ModuleDict"
    assert seen[0][0] == "finding the candidates" and seen[-1][0] == "check_step: as written"
    assert all(done < total for _, done, total in seen)
    after = snapshot(model, optimizer)  # the step's state is as it was
    assert all(torch.equal(a, b) for a, b in zip(before[0] + before[1], after[0] + after[1]))
    document = json.loads(json.dumps(s.to_dict()))
    assert load_plan(document["plan"]) == s.plan
    assert document["suggested"]["check_step"]["ok"] is True
    text = str(s)
    assert "suggested plan" in text and "check_step" in text and "remove this checkpoint call" in text


@pytest.mark.slow
def test_a_plan_the_user_applies_runs_at_the_peak_the_suggestion_measured(gpt, peaks):
    step, model, _ = gpt.make_step(layers=4, dim=32, context=32, vocab=64, strategy="loop")
    step()
    low, high = peaks(step)
    s = suggest(step, budget=(low + 2 * high) // 3, repeats=1, anchors=False)
    assert s.suggested.verified and s.suggested.fits(s.budget)
    model.gradient_checkpointing = False  # the user turns the model's own checkpointing off ...
    with recheck.apply_plan(model, s.plan):  # ... and applies the plan
        assert recheck.check_step(step).ok
        measured = recheck.measure(step, repeats=1)
    assert measured.checkpointed.observed_peak == s.suggested.measured_peak
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.slow
def test_a_budget_nothing_fits_says_the_least_any_plan_needs(small_demo):
    with pytest.raises(NothingFits, match=r"no plan fits the budget of 1.00 KiB: the smallest predicted peak of any "
                                          r"plan is [\d.]+ KiB; raise the budget"):
        suggest(small_demo[0], budget="1KiB", repeats=1)


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"budget": None}, ValueError, "needs a memory budget"),
    ({"budget": "lots"}, ValueError, "not a size"),
    ({"budget": -3}, ValueError, "positive number of bytes"),
    ({"budget": "1GiB", "objective": "cost"}, ValueError, "objective must be"),
    ({"budget": "1GiB", "repeats": 0}, ValueError, "repeats must be"),
    ({"budget": "1GiB", "clock": "sundial"}, ValueError, "clock must be"),
])
def test_bad_options_are_refused_before_anything_runs(options, error, message):
    ran = []
    with pytest.raises(error, match=message):
        suggest(lambda: ran.append(1), **options)
    assert ran == []


def test_a_step_must_be_callable():
    with pytest.raises(TypeError, match="needs a callable step"):
        suggest(3, budget="1GiB")  # type: ignore[arg-type]


def test_a_step_without_a_checkpointed_loop_has_nothing_to_plan():
    net = torch.nn.Linear(4, 4)
    with pytest.raises(NoRepeatedUnit, match="makes no checkpoint call"):
        suggest(lambda: net(torch.randn(2, 4)).sum().backward(), budget="1GiB", repeats=1)
