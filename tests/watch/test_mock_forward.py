"""A checkpointed forward handed over as a ``unittest.mock.Mock`` is watched like any callable.

transformers' own ``test_training_gradient_checkpointing*`` tests wrap the first layer's forward in
``Mock(side_effect=forward)`` to count its runs.  A mock answers every attribute, so it must not be
taken for a ``functools.partial`` (its ``args`` is another mock): the call is then recorded and
verified, and a hazard behind the mock is found.
"""

from __future__ import annotations

import unittest.mock

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import recheck

VARIANTS = pytest.mark.parametrize("use_reentrant", [False, True], ids=["non-reentrant", "reentrant"])


def _run(forward, use_reentrant: bool, **kwargs):
    mock = unittest.mock.Mock(side_effect=forward)
    x = torch.randn(2, 8, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(mock, x, use_reentrant=use_reentrant, **kwargs).sum().backward()
    assert mock.call_count == 2
    return w.report


@VARIANTS
def test_a_mock_forward_is_verified(use_reentrant):
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8)
    report = _run(lambda x: torch.tanh(layer(x)), use_reentrant)
    assert report.ok and not report.notes, str(report)
    assert report.stats["invocations"] == report.stats["verified"] == 1, str(report)


@VARIANTS
def test_a_hazard_behind_a_mock_forward_is_found(use_reentrant):
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    report = _run(layer, use_reentrant, preserve_rng_state=False)
    assert not report.ok, str(report)
    assert report.stats["verified"] == 1, str(report)


def test_a_call_whose_forward_could_not_be_recorded_is_counted_not_verified(monkeypatch):
    """What made the mock's calls vanish from the counts: a forward recheck failed to record is
    an invocation of its region left unverified, never a call that did not happen."""
    from recheck.watcher import records

    def broken(*args, **kwargs):
        raise RuntimeError("recording broke")

    monkeypatch.setattr(records.InvocationRecord, "begin_forward", broken)
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(layer, x, use_reentrant=False).sum().backward()
    stats = w.report.stats
    assert (stats["invocations"], stats["verified"], stats["regions"]) == (1, 0, 1), str(w.report)
    assert any("recording broke" in note for note in w.report.notes), w.report.notes


def test_a_mock_forward_s_region_is_named_by_what_it_runs():
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    report = _run(layer, False, preserve_rng_state=False)
    regions = {str(finding.region) for finding in report.findings}
    assert regions and all(region.startswith("Sequential.forward (") for region in regions), regions
