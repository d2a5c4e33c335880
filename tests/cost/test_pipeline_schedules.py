"""Schedule orders, theoretical bundle counts and the retained-peak model (no process group)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recheck.cost.schedules import (
    Action,
    PeakModel,
    order_for,
    order_of_schedule,
    predict_retained_peak,
    schedule_kind,
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
    I = 2  # torch's name for backward-input
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
