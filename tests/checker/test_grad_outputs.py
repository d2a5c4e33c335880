"""``check(grad_outputs=...)``: a gradient that does not fit the outputs is an error, never a skipped backward.

With a ``grad_outputs`` of the wrong shape the backward used to be left out silently, in every
checkpoint variant: nothing was recomputed, so a region with dropout and
``preserve_rng_state=False`` came out ``ok=True`` with no note.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recheck import check
from recheck.checker import RegionError

VARIANTS = pytest.mark.parametrize("use_reentrant, early_stop", [(True, True), (False, True), (False, False)],
                                   ids=["reentrant", "non-reentrant", "non-reentrant-no-early-stop"])


def _dropout():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)), torch.randn(4, 3, requires_grad=True)


@VARIANTS
def test_a_wrong_shape_is_a_value_error_naming_the_output_and_both_shapes(use_reentrant, early_stop):
    model, x = _dropout()
    weight = model[0].weight.detach().clone()
    rng = torch.get_rng_state()
    with pytest.raises(ValueError, match=r"grad_outputs\[0\] has shape \(2, 3\), but the output `output` "
                                         r"it is the gradient of has shape \(4, 3\)"):
        check(model, x, use_reentrant=use_reentrant, early_stop=early_stop, preserve_rng_state=False,
              grad_outputs=torch.ones(2, 3))
    assert torch.equal(model[0].weight, weight) and model[0].weight.grad is None
    assert torch.equal(torch.get_rng_state(), rng)  # the check left no trace


@VARIANTS
def test_the_right_shape_runs_the_backward_and_finds_the_hazard(use_reentrant, early_stop):
    model, x = _dropout()
    report = check(model, x, use_reentrant=use_reentrant, early_stop=early_stop, preserve_rng_state=False,
                   grad_outputs=torch.ones(4, 3))
    assert not report.ok and "rng" in report.kinds, str(report)


def test_the_output_is_named_among_several():
    def region(x):
        return x * 2, x.sum(dim=0)

    x = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(RegionError, match=r"grad_outputs\[1\] has shape \(4,\), but the output `output\[1\]` "
                                          r"it is the gradient of has shape \(3,\)"):
        check(region, x, grad_outputs=[torch.ones(4, 3), torch.ones(4)])
    assert check(region, x, grad_outputs=(torch.ones(4, 3), torch.ones(3))).ok


@pytest.mark.parametrize("given, message", [
    (3, r"grad_outputs must be a tensor or a sequence of tensors, got int"),
    ([torch.ones(4, 3), "ones"], r"grad_outputs\[1\] must be a tensor, got str"),
    ({"a": torch.ones(4, 3)}, r"grad_outputs must be a tensor or a sequence of tensors, got dict"),
])
def test_a_grad_outputs_that_is_not_tensors_is_a_type_error_before_the_region_runs(given, message):
    calls = []

    def region(x):
        calls.append(1)
        return x * 2

    with pytest.raises(TypeError, match=message):
        check(region, torch.randn(4, 3, requires_grad=True), grad_outputs=given)
    assert not calls
