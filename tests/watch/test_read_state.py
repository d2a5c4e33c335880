"""A state difference between a forward and its recompute is a finding only where it matters:
where the region reads the part that changed, or where the recompute leaves the state other
than its forward left it.  The models are in ``read_state.py``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import recheck
from classification_head import build
from read_state import (CarrierAttention, KVCarrier, LitModel, MoEGate, ReadingLayer, ReadingLitModel, gate_step,
                        lightning_step)


def _state(report) -> list[str]:
    return [f.message for f in report if f.kind in ("state", "global")]


def test_a_context_fn_that_restores_the_forwards_state_is_clean():
    torch.manual_seed(0)
    gate = MoEGate()
    with recheck.watch(raise_on_finding=False) as w:
        for _ in range(2):
            gate_step(gate, restore=True)
    assert gate.step == 2
    assert w.report.ok, str(w.report)


def test_a_counter_the_recompute_bumps_again_stays_a_finding():
    torch.manual_seed(0)
    gate = MoEGate()
    with recheck.watch(raise_on_finding=False) as w:
        gate_step(gate, restore=False)
    assert gate.step == 2
    assert _state(w.report) == ["attribute `self.step` updated again by the recompute: 1 -> 2"], str(w.report)


def test_a_config_field_no_region_reads_is_no_finding():
    model, inputs, labels = build()
    with recheck.watch(raise_on_finding=False) as w:
        loss, _ = model(inputs, labels)
        loss.backward()
    assert model.config.problem_type == "single_label_classification"
    assert w.report.ok, str(w.report)


def test_a_config_field_the_region_reads_stays_a_finding():
    model, inputs, labels = build()
    for layer in model.model.layers:
        layer.__class__ = ReadingLayer
    with recheck.watch(raise_on_finding=False) as w:
        loss, _ = model(inputs, labels)
        loss.backward()
    assert set(_state(w.report)) == {"attribute `self.config` changed between forward and recompute: "
                                     "Config with .problem_type = None -> .problem_type = 'single_label_classification'"}, \
        str(w.report)


def test_state_a_trainer_sets_between_forward_and_backward_is_clean_where_the_region_does_not_read_it():
    torch.manual_seed(0)
    model = LitModel()
    with recheck.watch(raise_on_finding=False) as w:
        lightning_step(model)
    assert model.logged and model._current_fx_name == "backward"
    assert w.report.ok, str(w.report)


def test_a_hook_name_the_region_reads_stays_a_finding():
    torch.manual_seed(0)
    model = ReadingLitModel()
    with recheck.watch(raise_on_finding=False) as w:
        lightning_step(model)
    assert _state(w.report) == ["attribute `self._current_fx_name` changed between forward and recompute: "
                                "'training_step' -> 'backward'"], str(w.report)


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_recompute_that_writes_the_same_bytes_into_a_holder_again_is_clean(use_reentrant):
    torch.manual_seed(0)
    layer = CarrierAttention(KVCarrier())
    x = torch.randn(4, 8, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(layer, x, use_reentrant=use_reentrant).sum().backward()
    assert layer.carrier.key is not None
    assert w.report.ok, str(w.report)


def test_a_recompute_that_writes_other_bytes_into_a_holder_stays_a_finding():
    torch.manual_seed(0)
    layer = CarrierAttention(KVCarrier(accumulate=True))
    x = torch.randn(4, 8, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        for _ in range(2):
            checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert any(m.startswith("attribute `self.carrier` updated again by the recompute") for m in _state(w.report)), \
        str(w.report)
