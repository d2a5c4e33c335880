"""The Function audit: ``recheck.check_function`` and ``check_step``'s audit of the Functions a step runs.

The Functions are written the way projects write them (a fused RMSNorm, a linear layer that
accumulates its weight gradient itself: ``fixtures/twins/hand_functions.py``, shared with
``benchmarks/check_step_fixtures.py``; a GELU with its closed-form derivative below); each hazard
has a fixed variant that must be clean.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import recheck
from recheck.checker.functions import FunctionCalls, audit_functions
from source_modules import load_file

_FIXTURE = load_file(Path(__file__).resolve().parents[2] / "fixtures" / "twins" / "hand_functions.py",
                     "hand_functions")
RMSNormReapplied, RMSNorm = _FIXTURE.RMSNormReapplied, _FIXTURE.RMSNorm
AccumulatingLinear, Linear = _FIXTURE.AccumulatingLinear, _FIXTURE.Linear


class GELU(torch.autograd.Function):
    """The exact GELU with its closed-form derivative: the same gradient by another formula."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        cdf = 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))
        pdf = torch.exp(-0.5 * x * x) * 0.3989422804014327
        return grad * (cdf + x * pdf)


class DropoutScale(torch.autograd.Function):
    """Draws a dropout mask in forward and keeps it: correct, and only checkable with the RNG put back."""

    @staticmethod
    def forward(ctx, x, p):
        mask = (torch.rand_like(x) > p).to(x.dtype) / (1 - p)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


class NumpyTanh(torch.autograd.Function):
    """Computes its forward in numpy: autograd has no path through it."""

    @staticmethod
    def forward(ctx, x):
        y = torch.from_numpy(np.tanh(x.detach().cpu().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


class InplaceReLU(torch.autograd.Function):
    """Writes into its input in place (``mark_dirty``)."""

    @staticmethod
    def forward(ctx, x):
        x.clamp_(min=0)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x > 0)


def _inputs(*shapes, requires_grad=True):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(*s, generator=generator) * 3).requires_grad_(requires_grad) for s in shapes]


def _names(region: str | None, function) -> bool:
    """Whether a finding's region names ``function``: its backward and that one's ``file:line``."""
    code = function.backward.__code__
    return str(region).startswith(f"{function.__qualname__}.backward (") and str(region).endswith(
        f"{Path(code.co_filename).name}:{code.co_firstlineno})")


def test_norm_reapplied_in_backward_is_a_gradient_finding_naming_its_backward():
    x, weight = _inputs((4, 8), (8,))
    report = recheck.check_function(RMSNormReapplied, x, weight, 1e-6)
    subjects = {f.subject for f in report.findings}
    assert "grad of `x`" in subjects
    assert {f.kind for f in report.findings} == {"gradient"}
    assert all(_names(f.region, RMSNormReapplied) for f in report.findings)


def test_fixed_norm_is_clean():
    x, weight = _inputs((4, 8), (8,))
    report = recheck.check_function(RMSNorm, x, weight, 1e-6)
    assert report.ok, report.format(verbose=True)


def test_backward_writing_grad_and_returning_it_is_a_finding_that_says_so():
    x, weight = _inputs((3, 4, 8), (5, 8))
    report = recheck.check_function(AccumulatingLinear, x, weight)
    [finding] = report.findings
    assert finding.subject == "grad of `weight`"
    assert "wrote `weight.grad` itself" in finding.detail
    assert "2 of" not in finding.message and "differs from autograd's" in finding.message


def test_linear_with_setup_context_and_gelu_are_clean():
    x, weight = _inputs((3, 4, 8), (5, 8))
    assert recheck.check_function(Linear, x, weight).ok
    (x,) = _inputs((64, 32))
    report = recheck.check_function(GELU, x)
    assert report.ok, report.format(verbose=True)


def test_gelu_rounding_is_a_note_with_its_size_not_a_finding():
    (x,) = _inputs((256, 64))
    report = recheck.check_function(GELU, x)
    assert report.ok
    [rounding] = [n for n in report.notes if "only by rounding" in n]
    assert "grad of `x`" in rounding and "ulp in float64" in rounding


class Float32GELU(GELU):
    """Computes in float32 whatever its input (an op that rejects float64, a cast on purpose)."""

    @staticmethod
    def forward(ctx, x):
        return GELU.forward(ctx, x.float())


def test_a_forward_that_cannot_run_in_float64_is_judged_by_size_with_the_op_named():
    (x,) = _inputs((256, 64))
    report = recheck.check_function(Float32GELU, x)
    assert report.ok, report.format(verbose=True)
    [note] = [n for n in report.notes if "only by rounding" in n]
    assert "grad of `x`" in note and "judged by size" in note, note
    assert "Tensor.float computes in float32 at" in note and "test_functions.py" in note, note


class Float32RMSNormReapplied(RMSNormReapplied):
    """The hazard of :class:`RMSNormReapplied` in a forward that casts to float32 on purpose."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        return RMSNormReapplied.forward(ctx, x.float(), weight, eps)


def test_a_hazard_in_a_forward_that_cannot_run_in_float64_stays_a_finding():
    x, weight = _inputs((4, 8), (8,))
    report = recheck.check_function(Float32RMSNormReapplied, x, weight, 1e-6)
    assert [f.subject for f in report.findings] == ["grad of `x`"]
    [note] = report.notes
    assert "could not be rerun in float64" in note and "Tensor.float computes in float32" in note, note


def test_forward_drawing_random_numbers_is_compared_on_the_same_draw():
    (x,) = _inputs((16, 16))
    report = recheck.check_function(DropoutScale, x, 0.5)
    assert report.ok, report.format(verbose=True)


@pytest.mark.parametrize("function, reason", [(NumpyTanh, "no autograd path"),
                                              (InplaceReLU, "in-place")])
def test_forward_autograd_cannot_differentiate_is_not_audited_with_the_reason(function, reason):
    (x,) = _inputs((4, 4), requires_grad=False)
    report = recheck.check_function(function, x)
    assert report.ok
    [note] = report.notes
    assert "not audited" in note and reason in note and function.__qualname__ in note


def test_forward_failing_with_a_stand_in_ctx_is_not_audited():
    class NeedsAttribute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * ctx.scale_from_elsewhere

        @staticmethod
        def backward(ctx, grad):
            return grad

    (x,) = _inputs((2, 2))
    report = recheck.check_function(NeedsAttribute, x)
    assert report.ok and "not audited" in report.notes[0] and "AttributeError" in report.notes[0]


def test_check_function_leaves_no_trace():
    x, weight = _inputs((3, 4, 8), (5, 8))
    weight.grad = torch.ones(5, 8)
    before = weight.grad.clone()
    random.seed(3)
    cpu, py = torch.get_rng_state(), random.getstate()
    recheck.check_function(AccumulatingLinear, x, weight)
    recheck.check_function(DropoutScale, *_inputs((4, 4)), 0.25)
    assert x.grad is None and torch.equal(weight.grad, before)
    assert torch.equal(torch.get_rng_state(), cpu) and random.getstate() == py
    assert torch.get_default_dtype() == torch.float32


def test_check_function_refuses_what_is_not_a_function():
    with pytest.raises(TypeError, match="autograd.Function subclass"):
        recheck.check_function(nn.Linear, torch.ones(1))


FORWARD = vars(RMSNormReapplied)["forward"]


@pytest.mark.parametrize("fixed", [False, True])
def test_check_step_audits_the_functions_the_step_runs(fixed):
    step, block = _FIXTURE.make_step(fixed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = recheck.check_step(step)
    audited = [f for f in report.findings if "RMSNorm" in (f.region or "")]
    if fixed:
        assert report.ok, report.format(verbose=True)
    else:
        assert audited and all(_names(f.region, RMSNormReapplied) for f in audited)
    assert vars(RMSNormReapplied)["forward"] is FORWARD
    assert block.weight.grad is None


class Recomputed(torch.autograd.Function):
    """A project's own checkpoint: runs its function without a graph, again in backward."""

    @staticmethod
    def forward(ctx, run_function, x):
        ctx.run_function = run_function
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run_function(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_()
        with torch.enable_grad():
            out = ctx.run_function(x)
        torch.autograd.backward(out, grad)
        return None, x.grad


def test_check_step_lists_a_function_it_cannot_audit_and_leaves_checkpoints_to_the_twin():
    layer = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)

    def step():
        h = Recomputed.apply(layer, x)
        NumpyTanh.apply(h).sum().backward()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = recheck.check_step(step)
    audited = [n for n in report.notes if "not audited" in n]
    assert len(audited) == 1 and "NumpyTanh.backward" in audited[0], report.format(verbose=True)
    assert not [f for f in report.findings if "NumpyTanh" in str(f.region) or "Recomputed" in str(f.region)]


def test_observed_calls_are_audited_and_forward_put_back():
    x, weight = _inputs((3, 4, 8), (5, 8))
    linear, original = AccumulatingLinear.apply, vars(AccumulatingLinear)["forward"]
    with FunctionCalls() as calls:
        linear(x, weight).sum().backward()
        linear(x * 2, weight)
        GELU.apply(x)
    assert [c.function for c in calls] == [AccumulatingLinear, GELU]
    assert vars(AccumulatingLinear)["forward"] is original
    report = audit_functions(calls)
    assert [f.subject for f in report.findings] == ["grad of `weight`"]
