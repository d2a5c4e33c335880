"""The model's peak of a plan is the peak measured when the plan runs; its terms count a shared storage once."""

from __future__ import annotations

import random

from recheck.cost.planner.census import Config, measure_config, mode_config, trace_config
from recheck.cost.planner.memory_model import Model, mode_of
from recheck.cost.planner.plan_runs import config_of
from recheck.cost.planner.suggestion import census
from recheck.runtime.steps import discover_state


def built(step):
    state = discover_state(step)
    restore = state.snapshot()
    candidates, runs, model = census(step, state, restore, 1, lambda what: None)
    return state, restore, candidates, runs, model


def measured_peak(step, state, restore, candidates, variants):
    return trace_config(step, state, restore, candidates, config_of(candidates, variants, "plan")).observed_peak


def test_each_mode_is_predicted_as_it_was_measured(small_demo):
    step = small_demo[0]
    state, restore, candidates, runs, model = built(step)
    for mode in ("none", "full", "selective"):
        variants = {c.index: mode if c.kind == "unit" else ("none" if mode == "none" else "full")
                    for c in candidates.items}
        assert model.predict(variants).peak == runs[mode].observed_peak, mode


def test_mixed_plans_are_predicted_as_they_run(small_demo):
    step = small_demo[0]
    state, restore, candidates, runs, model = built(step)
    draw = random.Random(7)
    problem = model.problem()
    for _ in range(5):
        variants = {c.index: draw.choice(c.variants) for c in candidates.items}
        predicted = model.predict(variants, problem).peak
        assert predicted == measured_peak(step, state, restore, candidates, variants), variants


def test_the_tanh_output_held_by_the_region_and_by_the_next_layer_is_one_storage(small_demo):
    step = small_demo[0]
    state, restore, candidates, runs, model = built(step)
    tanh = next(c for c in candidates.regions)
    mlp0 = next(c for c in candidates.units if c.name == "mlp.0")
    problem = model.problem()
    group = {tuple(sorted(g)) for g in problem.groups}
    # tanh saves its result, mlp.0's Linear saves its input: the same storage
    assert any({c for c, _ in g} == {tanh.index, mlp0.index} for g in group)
    for variants in ({tanh.index: "none"}, {tanh.index: "none", mlp0.index: "full"},
                     {tanh.index: "full", mlp0.index: "none"}):
        assert model.predict(variants, problem).peak == measured_peak(step, state, restore, candidates, variants)


def test_an_outer_region_kept_as_written_puts_its_layers_inside(gpt):
    step, _, _ = gpt.make_step(layers=6, dim=16, context=16, vocab=32, strategy="segments", segments=3)
    state, restore, candidates, runs, model = built(step)
    assert "written" in runs
    outer = candidates.items[0]
    kept = {outer.index: "full", **{u.index: "inside" for u in outer.inner}}
    assert model.predict(kept).peak == runs["written"].observed_peak
    problem = model.problem()
    assert len(problem.tied) == len(outer.inner)
    mixed = {outer.index: "none", outer.inner[1].index: "selective", candidates.items[-1].index: "full"}
    assert model.predict(mixed, problem).peak == measured_peak(step, state, restore, candidates, mixed)


def test_a_candidate_costs_at_least_its_measured_recompute(small_demo):
    step = small_demo[0]
    state, restore, candidates, _, _ = built(step)
    runs = {mode: measure_config(step, state, restore, candidates, mode_config(mode, candidates), 2)
            for mode in ("none", "full", "selective")}
    model = Model(candidates, runs)
    for c in candidates.items:
        for variant in c.variants:
            if variant != "none":
                recompute = runs[mode_of(c, variant)].recompute_seconds.get(c.index, 0.0)
                assert model.seconds[(c.index, variant)] >= recompute
    assert all(model.seconds[(c.index, "none")] == 0.0 for c in candidates.items)


def test_a_written_config_runs_the_step_as_written_and_the_others_drop_the_units_own_calls(small_demo):
    step = small_demo[0]
    state, restore, candidates, _, _ = built(step)
    assert trace_config(step, state, restore, candidates, Config("written", kept=None)).dropped == 0
    every = trace_config(step, state, restore, candidates, mode_config("full", candidates))
    assert every.dropped == 5  # the units' own calls (three blocks, two MLP layers); tanh is kept
    assert trace_config(step, state, restore, candidates, mode_config("none", candidates)).dropped == 6
