"""The wider context a failed recompute is explained by: modes, hooks and flags, read and compared."""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from recheck.runtime.context import wider_context, wider_differences


class Passing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class Nothing(TorchFunctionMode):
    pass


def _subjects(before, after):
    return [subject for subject, *_ in wider_differences(before, after)]


def test_the_same_context_has_no_difference():
    layer = nn.Linear(2, 2)
    assert wider_differences(wider_context([("layer", layer)]), wider_context([("layer", layer)])) == []


def test_mode_stacks_are_read_by_their_classes():
    plain = wider_context()
    with Nothing():
        function = wider_context()
    with Passing():
        dispatch = wider_context()
    assert wider_differences(function, plain) == [
        ("torch-function modes", "[Nothing]", "[]", wider_differences(function, plain)[0][3])]
    assert _subjects(dispatch, plain) == ["dispatch modes"]


def test_hooks_are_read_globally_and_on_the_given_modules():
    layer = nn.Linear(2, 2)
    modules = [("block.layer", layer)]
    plain = wider_context(modules)

    def tap(module, inputs, output):
        return output

    handle = layer.register_forward_pre_hook(lambda module, inputs: None)
    hooked = wider_context(modules)
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(tap)
    try:
        global_hooked = wider_context(modules)
    finally:
        handle.remove()
    assert _subjects(hooked, plain) == ["forward-pre hooks of `block.layer`"]
    assert wider_differences(global_hooked, plain)[0][:3] == (
        "global forward hooks", "[test_hooks_are_read_globally_and_on_the_given_modules.<locals>.tap]", "[]")


def test_flags_are_compared():
    plain = wider_context()
    torch.use_deterministic_algorithms(True)
    try:
        deterministic = wider_context()
    finally:
        torch.use_deterministic_algorithms(False)
    with torch.inference_mode():
        inference = wider_context()
    assert _subjects(deterministic, plain) == ["deterministic algorithms"]
    assert _subjects(inference, plain) == ["inference mode"]


def test_the_compiler_stance_is_compared():
    plain = wider_context()
    with torch.compiler.set_stance("force_eager"):
        eager = wider_context()
    assert wider_differences(plain, eager)[0][:3] == ("torch.compile stance", "default", "force_eager")


def test_selective_checkpointings_own_modes_are_no_difference():
    from torch.utils.checkpoint import _CachedTorchDispatchMode, _CachingTorchDispatchMode

    with _CachingTorchDispatchMode(lambda *a, **k: False, {}):
        forward = wider_context()
    with _CachedTorchDispatchMode(None, {}):
        recompute = wider_context()
    assert wider_differences(forward, recompute) == []
