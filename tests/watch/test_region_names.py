"""Regions are named by the layer's class and its ``forward``'s file:line, however the layer
checkpoints itself (``partial(super().__call__, ...)`` as transformers 5.16 does, or ``self.forward``),
in watch() reports and in check_step reports."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import gradient_checkpointing_layers as layers
import recheck
from gradient_checkpointing_layers import Decoder, ForwardLayer, PartialCallLayer
from recheck.runtime.naming import describe, region_name, relative

LAYERS = pytest.mark.parametrize("layer_class", [PartialCallLayer, ForwardLayer], ids=["partial-call", "forward"])
VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])


def _forward_name(layer_class) -> str:
    code = layer_class.forward.__code__
    return f"{layer_class.__name__}.forward ({relative(code.co_filename)}:{code.co_firstlineno})"


def _flip_scale_between_forward_and_backward(decoder, x):
    """A hazard, so that the report names the region: a global the layers read changes."""
    out = decoder(x)
    layers.SCALE = 3.0
    try:
        out.sum().backward()
    finally:
        layers.SCALE = 1.0


@LAYERS
def test_a_module_call_is_named_by_the_module_s_forward(layer_class):
    layer = layer_class()
    expected = _forward_name(layer_class)
    assert region_name(partial(super(type(layer), layer).__call__, scale=2.0)) == expected
    assert region_name(partial(torch.nn.Module.__call__, layer)) == expected
    assert region_name(layer.__call__) == expected
    assert region_name(torch.nn.Module.__call__.__get__(layer)) == expected
    assert region_name(torch.nn.Module._call_impl.__get__(layer)) == expected
    assert region_name(layer.forward) == expected
    assert region_name(layer) == expected
    assert "_wrapped_call_impl" not in str(describe(partial(torch.nn.Module.__call__, layer), None))


@LAYERS
@VARIANTS
def test_watch_names_a_self_checkpointing_layer_by_its_forward(layer_class, reentrant):
    decoder = Decoder(layer_class, reentrant)
    x = torch.randn(4, 8, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        _flip_scale_between_forward_and_backward(decoder, x)
    assert w.report.stats["regions"] == 1 and w.report.stats["verified"] == 2, str(w.report)
    assert w.report.findings, str(w.report)
    assert {f.region for f in w.report} == {_forward_name(layer_class)}
    assert "_wrapped_call_impl" not in str(w.report) and "partial" not in str(w.report)


@LAYERS
def test_check_step_names_a_self_checkpointing_layer_by_its_forward(layer_class):
    decoder = Decoder(layer_class)
    x = torch.randn(4, 8, requires_grad=True)
    report = recheck.check_step(lambda: _flip_scale_between_forward_and_backward(decoder, x))
    watched = {f.region for f in report if f.invocation is not None}
    assert watched == {_forward_name(layer_class)}, str(report)
    assert "_wrapped_call_impl" not in str(report)

