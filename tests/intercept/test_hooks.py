"""The one Interceptor base: every entry point, one CheckpointCall, forward then recompute."""

from __future__ import annotations

import contextlib
import inspect

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.checkpoint import CheckpointFunction, checkpoint

from recheck.intercept import patches
from recheck.intercept.hooks import Phase
from recording import Recorder


def block(x):
    return torch.tanh(x).exp()


@contextlib.contextmanager
def intercepted(interceptor):
    patches.acquire(interceptor)
    try:
        yield interceptor
    finally:
        patches.release()


def _x():
    return torch.randn(3, requires_grad=True)


@pytest.mark.parametrize("entry, make", [
    ("checkpoint", lambda x: checkpoint(block, x, use_reentrant=False)),
    ("reentrant", lambda x: checkpoint(block, x, use_reentrant=True)),
    ("apply", lambda x: CheckpointFunction.apply(block, True, x)),
])
def test_each_entry_point_is_one_call_whose_first_run_is_its_forward(entry, make):
    with intercepted(Recorder()) as recorder:
        make(_x()).sum().backward()
    assert recorder.events == [(entry, "forward", 1), (entry, "recompute", 2)]


def test_the_composable_api_brackets_a_forward_it_never_calls():
    from torch.distributed._composable import checkpoint as composable

    module = composable(torch.nn.Linear(3, 3))
    with intercepted(Recorder()) as recorder:
        module(_x()).sum().backward()
    assert recorder.events == [("generator", "forward", 1), ("generator", "recompute", 2)]


class _Configuring(Recorder):
    """A Recorder that sets the generator's determinism check, as ``watch()`` does."""

    def __init__(self):
        super().__init__()
        self.configured = []

    def configure_generator(self, call, arguments):
        self.configured.append(dict(arguments))
        arguments["determinism_check"] = "none"
        return None


class _Bracketing(_Configuring):
    def around_machinery(self, call, run):
        return run()


@pytest.mark.parametrize("interceptor, at_call", [(_Configuring, True), (_Bracketing, False)],
                         ids=["configured-at-call", "at-the-generator"])
def test_checkpoint_options_are_configured_once_at_the_call_or_the_generator(interceptor, at_call):
    with intercepted(interceptor()) as recorder:
        checkpoint(block, _x(), use_reentrant=False, early_stop=False).sum().backward()
        with torch.utils.checkpoint.set_checkpoint_early_stop(True):  # a block in force: at the generator
            checkpoint(block, _x(), use_reentrant=False).sum().backward()
    assert [call.configured for call in recorder.calls] == [at_call, False]
    assert [c["early_stop"] for c in recorder.configured] == [False, True]
    assert [c["determinism_check"] for c in recorder.configured] == ["default", "default"]
    assert recorder.events == [("checkpoint", "forward", 1), ("checkpoint", "recompute", 2)] * 2
    assert [call.options["early_stop"] for call in recorder.calls] == [False, True]


def test_an_option_set_at_the_call_reaches_torchs_generator(monkeypatch):
    seen = []
    original = torch.utils.checkpoint._allowed_determinism_checks_to_fns

    class Checking(_Configuring):
        def configure_generator(self, call, arguments):
            arguments["determinism_check"] = "recheck-test"
            original["recheck-test"] = lambda tensor: seen.append(tuple(tensor.shape))
            return lambda: original.pop("recheck-test")

    with intercepted(Checking()) as recorder:
        checkpoint(block, _x(), use_reentrant=False).sum().backward()
    assert recorder.calls[0].configured and seen and "recheck-test" not in original


def test_bypass_calls_the_region_directly_with_its_own_keywords():
    seen = {}

    def region(x, *, scale):
        seen["grad"] = torch.is_grad_enabled()
        return x * scale

    with intercepted(Recorder(bypassing=True)) as recorder:
        y = checkpoint(region, _x(), use_reentrant=False, scale=2.0, preserve_rng_state=False)
        y.sum().backward()
    assert recorder.events == [("checkpoint", "bypass", 1)]
    assert seen == {"grad": True} and y.grad_fn is not None and "Checkpoint" not in type(y.grad_fn).__name__


def test_torch_dropping_the_graph_releases_the_call():
    import gc

    with intercepted(Recorder()) as recorder:
        checkpoint(block, _x(), use_reentrant=False).sum().backward()
        gc.collect()
    assert recorder.released_calls == 1


def test_the_phases_are_the_three_it_names():
    assert {p.value for p in Phase} == {"forward", "recompute", "bypass"}


def test_a_replacement_is_made_once_and_holds_no_hooks_object():
    import gc
    import weakref

    import torch.utils.checkpoint as torch_checkpoint

    cell = patches.closure_cell(torch_checkpoint.checkpoint)
    layer, x = torch.nn.Linear(2, 2), torch.randn(1, 2, requires_grad=True)
    seen = []
    for _ in range(2):
        recorder = Recorder()
        patches.acquire(recorder)
        try:
            seen.append(cell.cell_contents)
            checkpoint(layer, x, use_reentrant=False).sum().backward()
        finally:
            patches.release()
        assert len(recorder.calls) == 1  # each installation's calls reach its own hooks
        gone = weakref.ref(recorder)
        del recorder
        gc.collect()
        assert gone() is None  # the patches keep no hooks object once released
    assert seen[0] is seen[1]  # the same replacement (torch's dynamo wrapper on it is made once)
    # a replacement called with nothing installed runs the original
    assert torch.equal(seen[0](layer, x, use_reentrant=False), layer(x))


def _generator_like(fn, preserve_rng_state=True, context_fn=None, determinism_check="default", debug=False,
                    early_stop=True, *args, **kwargs):
    """torch's non-reentrant generator's signature (its parameters, not its body)."""


def _impl_like(fn, args, kwargs, *, preserve_rng_state=True, context_fn=None, determinism_check="default",
               debug=False, early_stop=True, respect_saved_tensors_hooks=None):
    """torch 2.14's ``_checkpoint_without_reentrant_generator_impl``'s signature (the options by keyword)."""


def _keyword_only(fn, *args, flag=False, **kwargs):
    """A signature with a keyword-only parameter and ``**kwargs``."""


def _required_keyword(fn, *, mode, flag=False):
    """A keyword-only parameter without a default."""


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_arguments_bind_as_inspect_does_and_call_again_with_the_same_arguments(data):
    """``_Arguments`` is ``Signature.bind`` plus ``apply_defaults`` for the generator's
    signatures, on the paths where every positional parameter comes by position (as torch's
    ``checkpoint()`` calls it: 2.13's generator with everything by position, 2.14's ``_impl``
    with its options by keyword) and on the others."""
    from recheck.intercept.hooks import _Arguments, _layout

    function = data.draw(st.sampled_from([_generator_like, _impl_like, _keyword_only, _required_keyword]))
    names = ["fn", "args", "kwargs", "preserve_rng_state", "context_fn", "determinism_check", "debug", "early_stop",
             "respect_saved_tensors_hooks", "mode"]
    args = tuple(data.draw(st.lists(st.integers(), min_size=0, max_size=9), label="args"))
    keywords = data.draw(st.dictionaries(st.sampled_from([*names, "flag", "x", "y"]), st.integers(), max_size=4),
                         label="kwargs")
    try:
        expected = inspect.signature(function).bind(*args, **keywords)
    except TypeError:
        expected = None
    try:
        bound = _Arguments(_layout(function), args, keywords)
    except TypeError:
        bound = None
    if expected is None:  # what inspect refuses, the call itself would refuse
        if bound is not None:
            with pytest.raises(TypeError):
                bound.call(function)
        return
    assert bound is not None
    expected.apply_defaults()
    kinds = {p.name: p.kind for p in inspect.signature(function).parameters.values()}
    spread = {name for name, kind in kinds.items()
              if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
    named = {k: v for k, v in expected.arguments.items() if k not in spread}
    assert bound.arguments == named
    assert bound.extra_args == (expected.arguments.get("args", ()) if "args" in spread else ())
    assert bound.extra_kwargs == (expected.arguments.get("kwargs", {}) if "kwargs" in spread else {})
    seen = []
    bound.call(lambda *a, **k: seen.append((a, k)))
    again = [(expected.args, expected.kwargs)]
    assert seen == again
