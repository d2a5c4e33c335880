"""Methods behind a shared decorator are read for what they touch, each of them.

Libraries wrap many methods with one decorator (transformers' ``deprecate_kwarg``, the kernels
hub's ``use_kernel_forward_from_hub``): every wrapped method is then a function object of the
*same* code, the decorator's inner function, closing over a different original.  ``watch()``
must look through each of them to the original it closes over, not only through the first one
whose code it meets.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck

ATTENTION_SCALE = 1.0
MLP_SCALE = 1.0


def renamed_kwarg(old: str, new: str):
    """A keyword renamed in a release, in the style of ``transformers.utils.deprecation``."""
    def decorate(func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)
        return wrapped
    return decorate


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    @renamed_kwarg("past_key_value", "past_key_values")
    def forward(self, x, past_key_values=None):
        return self.proj(x) * ATTENTION_SCALE


class Mlp(nn.Module):
    def __init__(self, noisy: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.noisy = noisy

    @renamed_kwarg("hidden", "x")
    def forward(self, x):
        jitter = random.random() if self.noisy else 0.0
        return torch.tanh(self.fc(x)) * (MLP_SCALE + jitter)


class Layer(nn.Module):
    def __init__(self, noisy: bool = False) -> None:
        super().__init__()
        self.attention, self.mlp = Attention(), Mlp(noisy)

    def forward(self, x):
        return self.mlp(self.attention(x)).sin()


@pytest.mark.parametrize("name", ["ATTENTION_SCALE", "MLP_SCALE"])
def test_a_global_read_behind_either_decorated_forward_is_reported_by_name(name):
    layer = Layer()
    x = torch.randn(4, 8, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        y = checkpoint(layer, x, use_reentrant=False)
        globals()[name] = 3.0
        try:
            y.sum().backward()
        finally:
            globals()[name] = 1.0
    findings = w.report.by_kind("global")
    assert [f.subject for f in findings] == [f"global `{__name__}.{name}`"], str(w.report)


def test_python_random_behind_the_second_decorated_forward_is_an_rng_finding():
    layer = Layer(noisy=True)
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(layer, torch.randn(4, 8, requires_grad=True), use_reentrant=False).sum().backward()
    assert [f.subject for f in w.report.by_kind("rng")] == ["Python random"], str(w.report)


def test_the_same_layer_untouched_is_clean():
    layer = Layer()
    with recheck.watch() as w:
        for _ in range(2):
            checkpoint(layer, torch.randn(4, 8, requires_grad=True), use_reentrant=False).sum().backward()
    assert w.report.ok, str(w.report)
