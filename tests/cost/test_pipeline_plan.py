"""``recheck cost --plan`` in one process: attribution to stages for every checkpoint API, and errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck
from recheck.cost.pipeline.plan import NoStageTags, measure_plan, predict

WIDTH, HIDDEN, ROWS = 64, 256, 8
ACT, HID = ROWS * WIDTH * 4, ROWS * HIDDEN * 4


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH))


def composable(module: nn.Module) -> nn.Module:
    try:
        from torch.distributed._composable import checkpoint as composable_checkpoint
    except ImportError:  # pragma: no cover - builds without torch.distributed
        pytest.skip("torch.distributed._composable is not available")
    return composable_checkpoint(module)


def two_stage_step(api: str):
    torch.manual_seed(0)
    stages = [mlp(), mlp()]
    if api == "composable":
        stages = [composable(m) for m in stages]

    def run(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if api == "composable":
            return module(x)
        return checkpoint(module, x, use_reentrant=(api == "reentrant"))

    def step() -> None:
        x = torch.randn(ROWS, WIDTH, requires_grad=True)
        for index, module in enumerate(stages):
            with recheck.tag(stage=index):
                x = run(module, x)
        x.pow(2).mean().backward()  # the loss saves x: it belongs to the last stage

    return step


@pytest.mark.parametrize("api", ["non-reentrant", "reentrant", "composable"])
def test_each_checkpoint_api_attributes_saved_state_to_its_stage(api):
    plan = measure_plan(two_stage_step(api))
    first, last = (stage.bundles for stage in plan.stages)
    # bypassed: the stage input, Linear-up's output (for GELU), GELU's output (for Linear-down)
    assert first["bypassed"].bundle_bytes == {0: ACT + 2 * HID}
    assert first["bypassed"].input_bytes == ACT  # made before any stage: the step's data
    assert last["bypassed"].bundle_bytes == {0: ACT + 2 * HID + ACT}  # + the loss's saved output
    assert last["bypassed"].received_bytes == ACT  # made by stage 0
    # checkpointed: the kept input; in backward the recompute rebuilds the two hidden tensors
    assert first["checkpointed"].bundle_bytes == {0: ACT}
    assert first["checkpointed"].backward_extra == 2 * HID
    assert last["checkpointed"].bundle_bytes == {0: ACT + ACT}
    assert last["checkpointed"].backward_extra == 2 * HID - ACT  # the loss's tensor is freed first


@pytest.mark.parametrize("api", ["non-reentrant", "reentrant", "composable"])
def test_each_checkpoint_api_splits_the_observed_memory_by_stage(api):
    plan = measure_plan(two_stage_step(api))
    parameters = (WIDTH * HIDDEN * 2 + HIDDEN + WIDTH) * 4
    first, last = plan.stages
    for stage in plan.stages:
        for mode, windows in stage.windows.items():
            # each stage's backward allocates its own .grad while it frees its bundle (a reentrant
            # checkpoint's node is labelled by its recompute); a later one makes a weight gradient
            # before adding it to .grad
            assert windows.gradients_absent == parameters, (stage.stage, mode)
            assert windows.backward_rise >= parameters - stage.bundle_bytes(mode), (stage.stage, mode)
            assert WIDTH * HIDDEN * 4 <= windows.backward_rise_with_gradients < windows.backward_rise, (stage.stage, mode)
            assert windows.forward_rise >= (2 * HID if mode == "bypassed" else HID), (stage.stage, mode)
    for mode in ("checkpointed", "bypassed"):
        assert first.windows[mode].data == ACT and last.windows[mode].data == 0  # x, made before stage 0
        assert first.windows[mode].kept == ACT  # stage 0's output
        assert last.windows[mode].kept == 2 * 4  # the loss and its seed gradient (its output is saved by the loss)


def test_without_node_names_the_observed_peak_is_not_predicted(monkeypatch):
    import recheck.cost.pipeline.plan as plan_module
    from recheck.cost.pipeline.stage_table import render_plan

    monkeypatch.setattr(plan_module, "supported", lambda: False)
    predictions = predict(measure_plan(two_stage_step("non-reentrant")), "gpipe", 4)
    assert all(p.observed_peak == {"checkpointed": None, "bypassed": None} for p in predictions)
    assert "not predicted: the observed peak" in render_plan(predictions, "gpipe", 4, "step")
    assert all(p.retained_peak["bypassed"] > 0 for p in predictions)


def test_predict_lays_bundles_out_along_the_schedule():
    plan = measure_plan(two_stage_step("non-reentrant"))
    gpipe, one_f_one_b = predict(plan, "gpipe", 6), predict(plan, "1f1b", 6)
    assert [p.theoretical_bundles for p in gpipe] == [6, 6]
    assert [p.theoretical_bundles for p in one_f_one_b] == [2, 1]
    # stage 0 bypassed: 6 bundles without their input + 6 inputs held as one batch
    assert gpipe[0].retained_peak["bypassed"] == 6 * (2 * HID) + 6 * ACT
    assert one_f_one_b[0].retained_peak["bypassed"] == 2 * (2 * HID) + 6 * ACT
    assert one_f_one_b[1].retained_peak["checkpointed"] == 2 * ACT + 2 * HID - ACT
    assert gpipe[0].comm_buffer_bytes == gpipe[1].comm_buffer_bytes == 6 * ACT
    with pytest.raises(ValueError, match="--stages 3: the planning step ran 2 stage"):
        predict(plan, "gpipe", 4, num_stages=3)
    with pytest.raises(ValueError, match="microbatches must be a positive whole number"):
        predict(plan, "gpipe", 0)


def test_a_step_without_stage_tags_is_refused():
    module = mlp()

    def untagged() -> None:
        checkpoint(module, torch.randn(ROWS, WIDTH), use_reentrant=False).sum().backward()

    with pytest.raises(NoStageTags, match=r"recheck.tag\(stage=s\)"):
        measure_plan(untagged)


def test_stage_tags_with_a_gap_are_refused():
    module = mlp()

    def gap() -> None:
        with recheck.tag(stage=1):
            out = module(torch.randn(ROWS, WIDTH))
        out.sum().backward()

    with pytest.raises(NoStageTags, match=r"without gaps; the step used \[1\]"):
        measure_plan(gap)
