"""Schedule orders, theoretical bundle counts, the retained- and observed-peak models (no process group)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recheck.cost.pipeline.schedules import (
    Action,
    ObservedModel,
    PeakModel,
    cached_outputs,
    order_for,
    order_of_schedule,
    predict_observed_peak,
    predict_retained_peak,
    schedule_kind,
    sent_gradients,
    theoretical_bundles,
)


def names(order: list[Action]) -> list[str]:
    return [str(action) for action in order]


def test_orders_match_torch_for_two_stages_and_four_microbatches():
    # the orders torch 2.13's ScheduleGPipe and Schedule1F1B ran in a 2-rank gloo world
    assert names(order_for("gpipe", 2, 0, 4)) == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
    assert names(order_for("1f1b", 2, 0, 4)) == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert names(order_for("1f1b", 2, 1, 4)) == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


@given(stages=st.integers(1, 8), microbatches=st.integers(1, 12), data=st.data())
def test_theoretical_bundle_counts(stages, microbatches, data):
    stage = data.draw(st.integers(0, stages - 1))
    gpipe, one_f_one_b = (order_for(kind, stages, stage, microbatches) for kind in ("gpipe", "1f1b"))
    for order in (gpipe, one_f_one_b):  # every microbatch forwarded once, then backpropagated once
        assert sorted(names(order)) == sorted([f"F{m}" for m in range(microbatches)] + [f"B{m}" for m in range(microbatches)])
        assert all(order.index(Action("F", m)) < order.index(Action("B", m)) for m in range(microbatches))
    assert theoretical_bundles(gpipe) == microbatches
    assert theoretical_bundles(one_f_one_b) == min(microbatches, stages - stage)


def test_predicted_peak_adds_the_rebuilt_set_and_the_shared_input():
    order = order_for("1f1b", 2, 0, 4)  # two bundles alive at most
    assert predict_retained_peak(order, PeakModel(bundle=100)) == 200
    assert predict_retained_peak(order, PeakModel(bundle=100, backward_extra=50)) == 250
    assert predict_retained_peak(order, PeakModel(bundle=100, backward_extra=50, shared=7)) == 257
    # GPipe: the rebuilt set joins all four bundles at the first backward
    assert predict_retained_peak(order_for("gpipe", 2, 0, 4), PeakModel(100, 50, 7)) == 457


def test_unknown_schedules_and_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="unknown schedule 'zb'"):
        order_for("zb", 2, 0, 4)
    with pytest.raises(ValueError, match="stage 2 of 2"):
        order_for("gpipe", 2, 2, 4)
    with pytest.raises(ValueError, match="0 microbatches"):
        order_for("gpipe", 2, 0, 0)


class _Kind(enum.Enum):
    F = 1
    I = 2  # noqa: E741 - torch's name for backward-input
    W = 3


@dataclass
class _FakeAction:
    stage_index: int
    computation_type: _Kind
    microbatch_index: int


class _InterleavedLike:
    """A multi-stage schedule object as torch exposes it: ``pipeline_order`` by rank."""

    def __init__(self) -> None:
        a = _FakeAction
        self.pipeline_order = {
            0: [a(0, _Kind.F, 0), a(2, _Kind.F, 0), a(0, _Kind.F, 1), None, a(2, _Kind.I, 0), a(2, _Kind.W, 0),
                a(0, _Kind.I, 0), a(0, _Kind.W, 0), a(2, _Kind.F, 1), a(2, _Kind.I, 1), a(0, _Kind.I, 1)],
        }


def test_multi_stage_orders_come_from_pipeline_order():
    schedule = _InterleavedLike()
    assert schedule_kind(schedule) is None
    order = order_of_schedule(schedule, stage=0, num_stages=4, microbatches=2)
    assert names(order) == ["F0", "F1", "B0", "B1"]  # weight-only backward (W) frees no bundle
    assert theoretical_bundles(order) == 2
    assert names(order_of_schedule(schedule, stage=2, num_stages=4, microbatches=2)) == ["F0", "B0", "F1", "B1"]
    assert order_of_schedule(object(), stage=0, num_stages=2, microbatches=2) is None


def test_outputs_and_gradients_the_schedules_hold():
    # before each action (and after the last): GPipe holds every output forwarded until the step
    # ends; 1F1B holds each until its backward, plus F0 (its warm-up send handle) until the cool-down
    gpipe, one_f_one_b = order_for("gpipe", 2, 0, 4), order_for("1f1b", 2, 0, 4)
    assert [cached_outputs("gpipe", gpipe, done, 2, 0) for done in range(9)] == [0, 1, 2, 3, 4, 4, 4, 4, 4]
    assert [cached_outputs("1f1b", one_f_one_b, done, 2, 0) for done in range(9)] == [0, 1, 2, 2, 3, 2, 3, 1, 0]
    last = order_for("1f1b", 2, 1, 4)  # the last stage keeps output_chunks until the step ends
    assert [cached_outputs("1f1b", last, done, 2, 1) for done in range(9)] == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [sent_gradients("gpipe", n) for n in range(4)] == [0, 1, 2, 3]
    assert [sent_gradients("1f1b", n) for n in range(4)] == [0, 1, 1, 1]


def test_observed_peak_adds_the_rise_to_what_each_action_finds_alive():
    model = ObservedModel(fixed=1000, gradients=100, gradients_absent=100, bundle=10, kept=1, sent_gradient=0,
                          forward_rise=5, first_backward_rise=150, backward_rise=20, optimizer_rise=0)
    gpipe = order_for("gpipe", 2, 0, 4)
    # B0: 4 bundles, 4 outputs, no gradients yet, the first backward's rise (it allocates them)
    assert predict_observed_peak("gpipe", gpipe, model, 2, 0) == (1000 + 40 + 4 + 150, "B0")
    # gradients kept from an earlier step: B0 finds them too
    present = dataclasses.replace(model, gradients_absent=0)
    assert predict_observed_peak("gpipe", gpipe, present, 2, 0) == (1000 + 100 + 40 + 4 + 150, "B0")
    # a later backward that rises more than the first one moves the peak to B1 (3 bundles left)
    later = dataclasses.replace(model, first_backward_rise=0, backward_rise=200)
    assert predict_observed_peak("gpipe", gpipe, later, 2, 0) == (1000 + 100 + 30 + 4 + 200, "B1")
    # an optimizer step that rises most
    optimizer = dataclasses.replace(model, optimizer_rise=500)
    assert predict_observed_peak("gpipe", gpipe, optimizer, 2, 0) == (1000 + 100 + 4 + 500, "optimizer")
    # input gradients held by GPipe's send handles add up on a later stage
    sending = dataclasses.replace(later, sent_gradient=7)
    assert predict_observed_peak("gpipe", order_for("gpipe", 2, 1, 4), sending, 2, 1) == (1000 + 100 + 30 + 4 + 7 + 200, "B1")
