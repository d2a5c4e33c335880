"""Per-stage figures of a real 2-rank pipeline step, against shapes and against ``--plan``.

One gloo world of two spawned ranks (``recheck.distributed.launch.run_world``, killed after
120 s) measures the fixture's GPipe step, its 1F1B step and a step without a schedule;
the planning run of the same stage modules is measured in this process.  Expected bytes
are worked out from the fixture's shapes (float32, see ``fixtures/pipeline/pipeline_steps.py``).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from source_modules import load_file

from recheck.cost.pipeline.plan import measure_plan, predict
from recheck.cost.pipeline.schedules import Action, order_for, theoretical_bundles
from recheck.cost.pipeline.stage_table import plan_error, render_comparison, render_stages
from recheck.cost.pipeline.stages import StageReport, rank_entry
from recheck.distributed.launch import run_world

#: real pipeline worlds on spawned ranks
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "pipeline" / "pipeline_steps.py"
KINDS = {"gpipe": f"{FIXTURE}:gpipe_step", "1f1b": f"{FIXTURE}:one_f_one_b_step"}
PLAIN = f"{FIXTURE}:plain_step"
INTERLEAVED = f"{FIXTURE}:interleaved_step"
KEEPING = f"{FIXTURE}:keeping_step"

steps = load_file(FIXTURE, "recheck_pipeline_steps")
M, S, BLOCKS = steps.MICROBATCHES, steps.NUM_STAGES, steps.BLOCKS_PER_STAGE
ACT = steps.ROWS * steps.WIDTH * 4  # one microbatch activation [ROWS, WIDTH]
HID = steps.ROWS * steps.HIDDEN * 4  # one microbatch hidden [ROWS, HIDDEN]
#: what each stage holds per microbatch (bytes), worked out from the shapes
BUNDLE = {
    # stage 0 bypassed: per block Linear-up output (for GELU) + GELU output (for Linear-down), plus
    # each later block's input; the first block's input is a view of the batch (shared)
    (0, "bypassed"): BLOCKS * 2 * HID + (BLOCKS - 1) * ACT,
    # checkpointed: each later block's checkpoint keeps its input
    (0, "checkpointed"): (BLOCKS - 1) * ACT,
    # stage 1 also holds its recv buffer (first block's input) and the loss's (out - target)
    (1, "bypassed"): ACT + BLOCKS * 2 * HID + (BLOCKS - 1) * ACT + ACT,
    (1, "checkpointed"): ACT + (BLOCKS - 1) * ACT + ACT,
}
#: what a checkpoint rebuilds during a microbatch's backward, above its bundle: one block's
#: saved set; on the last stage the loss's saved tensor is freed before it
EXTRA = {(0, "checkpointed"): 2 * HID, (1, "checkpointed"): 2 * HID - ACT, (0, "bypassed"): 0, (1, "bypassed"): 0}
SHARED = {0: M * ACT, 1: 0}  # the input batch, of which each microbatch is a view


def theoretical(kind: str, stage: int) -> int:
    return M if kind == "gpipe" else min(M, S - stage)


@pytest.fixture(scope="module")
def world() -> dict[str, list[StageReport] | str]:
    per_rank = run_world(rank_entry, S, args=([*KINDS.values(), INTERLEAVED, KEEPING, PLAIN],), timeout=120)
    assert not multiprocessing.active_children()
    merged: dict[str, list[StageReport] | str] = {}
    for results in per_rank:
        for spec, outcome in results.items():
            merged[spec] = outcome if isinstance(outcome, str) else [*merged.get(spec, []), *outcome]
    return merged


@pytest.fixture(scope="module")
def plan():
    return measure_plan(steps.plan_step)


def report(world, kind: str, stage: int) -> StageReport:
    (found,) = [r for r in world[KINDS[kind]] if r.stage == stage]
    return found


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("stage", range(S))
def test_bundles_match_the_shapes(world, kind, stage):
    measured = report(world, kind, stage)
    assert (measured.rank, measured.num_stages, measured.microbatches, measured.schedule) == (stage, S, M, kind)
    assert measured.theoretical_bundles == theoretical(kind, stage)
    assert measured.comm_buffer_bytes == M * ACT  # stage 0: grad recv buffers; stage 1: activation recv buffers
    for mode in ("checkpointed", "bypassed"):
        figures = measured.modes[mode].bundles
        assert figures.bundle_bytes == dict.fromkeys(range(M), BUNDLE[(stage, mode)]), mode
        assert figures.backward_extra == EXTRA[(stage, mode)], mode
        assert figures.shared_bytes == SHARED[stage], mode
        # the last stage's recv buffer outlives each microbatch's backward; stage 0 keeps nothing
        assert figures.second_holder_bytes == dict.fromkeys(range(M), ACT if stage == 1 else 0), mode
        assert figures.order == [str(a) for a in order_for(kind, S, stage, M)]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("stage", range(S))
def test_bundles_alive_at_the_peak_are_the_schedules_count(world, kind, stage):
    measured = report(world, kind, stage)
    count = theoretical(kind, stage)
    for mode in ("checkpointed", "bypassed"):
        result = measured.modes[mode]
        assert len(result.bundles.alive_at_peak) == count, mode
        expected_peak = count * BUNDLE[(stage, mode)] + SHARED[stage] + EXTRA[(stage, mode)]
        assert result.retained_peak == expected_peak, mode
        assert result.rank_retained_peak == result.retained_peak, mode  # one stage per rank, nothing outside chunks
        assert result.predicted_retained_peak == result.retained_peak, mode
        assert result.observed_peak > result.retained_peak


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_checkpointing_shrinks_bundles_not_their_count(world, kind):
    for stage in range(S):
        c, b = (report(world, kind, stage).modes[m] for m in ("checkpointed", "bypassed"))
        assert c.bundle_bytes < b.bundle_bytes / 5
        assert len(c.bundles.alive_at_peak) == len(b.bundles.alive_at_peak)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("mode", ["checkpointed", "bypassed"])
def test_the_plan_predicts_the_retained_peak_within_5_percent(world, plan, kind, mode):
    predictions = predict(plan, kind, M)
    for prediction in predictions:
        measured = report(world, kind, prediction.stage)
        error = plan_error(prediction.retained_peak[mode], measured.modes[mode].retained_peak)
        assert error is not None and abs(error) <= 0.05, (prediction.stage, error)
        assert prediction.theoretical_bundles == measured.theoretical_bundles
        assert prediction.comm_buffer_bytes == measured.comm_buffer_bytes


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("mode", ["checkpointed", "bypassed"])
def test_the_plan_predicts_the_observed_peak_within_5_percent(world, plan, kind, mode):
    for prediction in predict(plan, kind, M):
        measured = report(world, kind, prediction.stage).modes[mode]
        predicted = prediction.observed_peak[mode]
        assert predicted is not None
        error = plan_error(predicted, measured.observed_peak)
        assert error is not None and abs(error) <= 0.05, (prediction.stage, predicted, measured.observed_peak, error)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_observed_terms_match_the_shapes(plan, kind):
    parameters = BLOCKS * 4 * (steps.WIDTH * steps.HIDDEN * 2 + steps.HIDDEN + steps.WIDTH)
    largest_weight_gradient = steps.WIDTH * steps.HIDDEN * 4
    for prediction in predict(plan, kind, M):
        last = prediction.stage == S - 1
        for mode in ("checkpointed", "bypassed"):
            terms = prediction.observed_terms[mode]
            # parameters (SGD keeps no state) + M recv buffers + M microbatches of data (inputs; targets)
            assert terms["fixed"] == parameters + M * ACT + M * ACT, mode
            assert terms["data_per_microbatch"] == ACT, mode
            assert terms["gradients"] == terms["gradients_absent"] == parameters, mode  # set to None each step
            # the recv buffer a bundle saves is counted with the buffers
            assert terms["bundle"] == BUNDLE[(prediction.stage, mode)] - (ACT if prediction.stage > 0 else 0), mode
            # the stage's output; on the last stage also its loss and the loss's seed gradient (made by
            # torch.autograd.backward before the graph task starts, so the planning run sees it in forward)
            assert terms["kept"] == ACT + (2 * 4 if last else 0), mode
            assert terms["sent_gradient"] == (ACT if prediction.stage > 0 else 0), mode
            # the first backward allocates every .grad while it frees the microbatch's bundle
            assert terms["first_backward_rise"] >= parameters - BUNDLE[(prediction.stage, mode)], mode
            assert terms["backward_rise"] >= largest_weight_gradient, mode  # made, then added to .grad
            assert terms["optimizer_rise"] == 0, mode  # SGD without momentum updates in place


def test_the_plan_measures_each_stage_once(plan):
    assert [s.stage for s in plan.stages] == list(range(S))
    per_stage_parameters = BLOCKS * 4 * (steps.WIDTH * steps.HIDDEN * 2 + steps.HIDDEN + steps.WIDTH)
    for stage in plan.stages:
        assert stage.parameter_bytes == stage.gradient_bytes == per_stage_parameters
        assert stage.bundle_bytes("bypassed") == BUNDLE[(stage.stage, "bypassed")] + (ACT if stage.stage == 0 else 0)


def test_interleaved_stages_follow_the_schedules_order(world):
    # two stages per rank: each stage's figures are its own, the rank's peak covers both
    reports = sorted(world[INTERLEAVED], key=lambda r: r.stage)
    assert [(r.stage, r.rank, r.num_stages, r.stages_on_rank) for r in reports] == [(s, s % 2, 4, 2) for s in range(4)]
    for report in reports:
        for mode in ("checkpointed", "bypassed"):
            result = report.modes[mode]
            ran = [Action(name[0], int(name[1:])) for name in result.bundles.order if name[0] in "FB"]
            assert theoretical_bundles(ran) == report.theoretical_bundles  # pipeline_order read as torch ran it
            assert len(result.bundles.alive_at_peak) == report.theoretical_bundles
            assert result.retained_peak == result.predicted_retained_peak
            assert result.rank_retained_peak >= result.retained_peak
    assert [r.theoretical_bundles for r in reports] == [4, 3, 2, 1]


def test_a_second_holder_is_measured_and_breaks_the_prediction(world):
    # KeepingBlock appends its GELU output to a list: after each microbatch's backward the list
    # still holds it (and, for a recomputed output, the rebuilt graph behind it)
    for report in sorted(world[KEEPING], key=lambda r: r.stage):
        recv = ACT if report.stage == 1 else 0
        bypassed, checkpointed = report.modes["bypassed"], report.modes["checkpointed"]
        assert bypassed.bundles.second_holder_bytes == dict.fromkeys(range(M), BLOCKS * HID + recv)
        assert bypassed.retained_peak == bypassed.predicted_retained_peak  # autograd holds what it did before
        # checkpointed: each block's rebuilt set (Linear-up and GELU outputs) and the later blocks' inputs stay
        rebuilt = BLOCKS * 2 * HID + (BLOCKS - 1) * ACT + recv
        assert checkpointed.bundles.second_holder_bytes == dict.fromkeys(range(M), rebuilt)
        assert checkpointed.bundles.bundle_bytes == dict.fromkeys(range(M), BUNDLE[(report.stage, "checkpointed")])
        assert checkpointed.retained_peak > checkpointed.predicted_retained_peak  # rebuilt sets pile up
    assert "mismatch: the checkpointed retained peak differs" in render_stages(world[KEEPING], "keeping")


def test_a_step_without_a_schedule_is_named(world):
    assert world[PLAIN].startswith("rank ")
    assert "runs no torch.distributed.pipelining schedule" in world[PLAIN]


def test_tables_define_their_terms(world, plan):
    text = render_stages(world[KINDS["1f1b"]], "fixture")
    assert "bundles alive at the retained peak" in text and "2 (0,1)" in text and "1 (0)" in text
    assert "mismatch" not in text
    comparison = render_comparison({k: world[spec] for k, spec in KINDS.items()}, {k: predict(plan, k, M) for k in KINDS})
    assert "largest plan error on the retained peak: 0.0%" in comparison
    assert "largest plan error on the observed peak: " in comparison
    assert "obs err: (plan prediction - measured observed peak) / measured observed peak" in comparison
    assert "plan err: (plan prediction - measured retained peak)" in comparison
