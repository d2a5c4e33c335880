"""Other checkpoint implementations go through the one Interceptor base, like torch's.

The imitations in ``fixtures/implementations/`` have DeepSpeed's, Megatron-core's and fairscale's
entry points and signatures; ``tests/imitations.py`` loads them under the real module names, so
recheck finds and patches them as it patches the real libraries (tests/libraries runs the same
checks on the real ones where they install).  Each is intercepted (forward, then recompute),
bypassed (the region called directly, bit-identical to no checkpoint at all, also where the
checkpoint itself computes something else), and put back ``is``-identically.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from pathlib import Path

import pytest
import torch
from imitations import imitation
from source_modules import load_file
from torch import nn

from recheck.intercept import implementations, patches
from recording import Recorder

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "fixtures" / "implementations" / "project_checkpointing.py"


@contextlib.contextmanager
def intercepted(interceptor, extra_functions=()):
    installation = patches.acquire(interceptor, extra_functions=extra_functions)
    try:
        yield installation
    finally:
        patches.release()


# The block and the calls that checkpoint it are written here, not taken from tests/imitations.py:
# the tests below check that a region is named by the file that defines and checkpoints it.
class block(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.fc2(self.drop(torch.nn.functional.gelu(self.fc1(x))))


def grads_of(run, autocast=None):
    """Gradients of a dropout model whose two blocks go through ``run(block, h)``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), block(), block())
    x = torch.randn(4, 8)
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
        h = model[0](x)
        for b in model[1:]:
            h = run(b, h.float())
    h.float().pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()], torch.get_rng_state()


def same(a, b):
    (ga, ra), (gb, rb) = a, b
    return all(torch.equal(x, y) for x, y in zip(ga, gb)) and torch.equal(ra, rb)


def direct(b, h):
    return b(h)


def without_output(mg):
    def run(b, h):
        ckpt = mg.CheckpointWithoutOutput(fp8=None)
        out = ckpt.checkpoint(b, h)
        y = out * 1.0
        ckpt.discard_output_and_register_recompute(y)
        return y
    return run


# library, how a block is checkpointed with it, the entry point's name
CASES = {
    "deepspeed": ("deepspeed", lambda ds: ds.checkpoint),
    "deepspeed-kwargs": ("deepspeed", lambda ds: lambda b, h: ds.checkpoint(lambda x, scale: b(x) * scale, h,
                                                                             scale=2.0)),
    "deepspeed-non-reentrant": ("deepspeed", lambda ds: ds.non_reentrant_checkpoint),
    "megatron": ("megatron", lambda mg: lambda b, h: mg.checkpoint(b, False, h)),
    "megatron-without-output": ("megatron", without_output),
    "fairscale": ("fairscale", lambda fs: lambda b, h: fs.checkpoint_wrapper(b)(h)),
}
ENTRY = {"deepspeed-kwargs": "deepspeed"}


@pytest.mark.parametrize("case", CASES)
def test_each_implementation_is_one_call_whose_first_run_is_its_forward(case):
    library, make = CASES[case]
    with imitation(library) as lib, intercepted(Recorder()) as installation:
        grads_of(make(lib))
    entry = ENTRY.get(case, case)
    assert entry in installation.implementations
    assert Recorder().events == []
    recorder = installation.hooks
    assert recorder.events == [(entry, "forward", 1), (entry, "forward", 1),
                               (entry, "recompute", 2), (entry, "recompute", 2)], recorder.events
    call = recorder.calls[0]
    assert call.implementation == library
    # the region is the user's callable (not DeepSpeed's function_with_kwargs closure), defined
    # and checkpointed here, not in the library; the user's lambda over the block is the block's
    here = ("tests/intercept/test_implementations.py", str(Path(__file__)))
    assert call.region.defined_at.startswith(here) and call.region.callsite.startswith(here), call.region
    assert call.region.qualname == "block.forward", call.region


@pytest.mark.parametrize("case", CASES)
def test_a_bypass_calls_the_region_directly(case):
    library, make = CASES[case]
    scale = 2.0 if case == "deepspeed-kwargs" else 1.0
    plain = grads_of(lambda b, h: b(h) * scale)
    with imitation(library) as lib:
        checkpointed = make(lib)
        # under CPU autocast the imitations (like the libraries) recompute in float32: the
        # checkpointed step differs from the plain one (or raises), the bypassed one must not
        try:
            amp = grads_of(checkpointed, torch.bfloat16)
        except RuntimeError as exc:
            assert "dtype" in str(exc)
        else:
            assert not same(amp, grads_of(lambda b, h: b(h) * scale, torch.bfloat16))
        with intercepted(Recorder(bypassing=True)) as installation:
            bypassed = grads_of(checkpointed)
            bypassed_amp = grads_of(checkpointed, torch.bfloat16)
    entry = ENTRY.get(case, case)
    assert installation.hooks.events == [(entry, "bypass", 1)] * 4
    assert same(bypassed, plain)
    assert same(bypassed_amp, grads_of(lambda b, h: b(h) * scale, torch.bfloat16))


def _targets(lib, library):
    if library == "deepspeed":
        return [(lib.CheckpointFunction, "apply"), (lib.non_reentrant_checkpoint, "__code__")]
    if library == "megatron":
        return [(lib.CheckpointFunction, "apply"), (lib.CheckpointWithoutOutput, "checkpoint"),
                (lib.CheckpointWithoutOutput, "discard_output_and_register_recompute")]
    return [(lib.CheckpointFunction, "apply")]


@pytest.mark.parametrize("library", ["deepspeed", "megatron", "fairscale"])
def test_every_patched_object_is_the_original_again(library):
    with imitation(library) as lib:
        before = [vars(owner).get(name, "absent") if name != "__code__" else owner.__code__
                  for owner, name in _targets(lib, library)]
        with intercepted(Recorder()):
            during = [vars(owner).get(name, "absent") if name != "__code__" else owner.__code__
                      for owner, name in _targets(lib, library)]
        after = [vars(owner).get(name, "absent") if name != "__code__" else owner.__code__
                 for owner, name in _targets(lib, library)]
    assert all(a is not b for a, b in zip(before, during))
    assert all(a is b for a, b in zip(before, after))
    assert not implementations._CODE_TARGETS


def test_a_library_not_imported_is_neither_imported_nor_patched():
    modules = set(sys.modules)
    with intercepted(Recorder()) as installation:
        assert installation.implementations == set()
    assert not any(name.split(".")[0] in ("deepspeed", "megatron", "fairscale") for name in set(sys.modules) - modules)


def test_a_library_imported_while_intercepting_is_patched_by_the_next_acquire():
    with intercepted(Recorder()) as outer:
        with imitation("megatron") as mg:
            with intercepted(Recorder()):
                assert {"megatron", "megatron-without-output"} <= outer.implementations
                grads_of(lambda b, h: mg.checkpoint(b, False, h))
    assert [e for e in outer.hooks.events if e[1] == "recompute"] == [("megatron", "recompute", 2)] * 2


# -- checkpoint-functions: functions a project declares ------------------------------------------


def project():
    return load_file(PROJECT, "project_checkpointing")


DECLARED = {
    "project_checkpointing.checkpoint_block": ("code", "checkpoint"),
    "project_checkpointing.checkpoint_without_rng": ("code", "project_checkpointing.checkpoint_without_rng"),
    "project_checkpointing.timed_checkpoint": ("code", "reentrant"),
    "project_checkpointing.Checkpointer.apply": ("code", "checkpoint"),
    "project_checkpointing.checkpoint_fn": ("rebound", "project_checkpointing.checkpoint_fn"),
}


def _declared_runner(name, bound_early):
    if name.endswith("Checkpointer.apply"):
        checkpointer = project().Checkpointer()
        return lambda b, h: checkpointer.apply(b, h)
    return lambda b, h: bound_early(b, h)


@pytest.mark.parametrize("name", DECLARED)
def test_a_declared_function_is_one_call_however_it_was_bound(name):
    module = project()
    attribute = name.rsplit(".", 1)[-1]
    bound_early = functools.partial(getattr(module, attribute)) if hasattr(module, attribute) else None
    how, entry = DECLARED[name]
    with warnings.catch_warnings(), intercepted(Recorder(), extra_functions=[name]) as installation:
        warnings.simplefilter("ignore")  # the reentrant variant's no-grad-inputs warning
        assert installation.declared[name] == how
        runner = _declared_runner(name, bound_early)
        if how == "rebound":
            runner = lambda b, h: module.checkpoint_fn(b, h)  # noqa: E731 - only the module global is rebound
        grads_of(runner)
    events = installation.hooks.events
    assert events == [(entry, "forward", 1)] * 2 + [(entry, "recompute", 2)] * 2, events
    assert installation.hooks.calls[0].region.qualname == "block.forward"


@pytest.mark.parametrize("name", DECLARED)
def test_a_declared_function_is_bypassed(name):
    module = project()
    plain = grads_of(direct)
    with intercepted(Recorder(bypassing=True), extra_functions=[name]) as installation:
        runner = _declared_runner(name, getattr(module, name.rsplit(".", 1)[-1], None))
        bypassed = grads_of(runner)
    assert same(bypassed, plain)
    assert [phase for _, phase, _ in installation.hooks.events] == ["bypass", "bypass"]


def test_declared_functions_are_put_back():
    module = project()
    before = (module.checkpoint_block, module.checkpoint_block.__code__, module.timed_checkpoint.__wrapped__.__code__,
              module.Checkpointer.apply.__code__, module.checkpoint_fn)
    with intercepted(Recorder(), extra_functions=list(DECLARED)):
        assert module.checkpoint_block.__code__ is not before[1]
        assert module.checkpoint_fn is not before[4]
    after = (module.checkpoint_block, module.checkpoint_block.__code__, module.timed_checkpoint.__wrapped__.__code__,
             module.Checkpointer.apply.__code__, module.checkpoint_fn)
    assert all(a is b for a, b in zip(before, after))


def test_a_declared_name_that_cannot_be_patched_says_why():
    project()
    names = ["not_imported_package.ckpt", "project_checkpointing.missing", "project_checkpointing.TIMINGS"]
    with intercepted(Recorder(), extra_functions=names) as installation:
        declared = installation.declared
    assert "not imported" in declared["not_imported_package.ckpt"]
    assert "has no attribute 'missing'" in declared["project_checkpointing.missing"]
    assert "not callable" in declared["project_checkpointing.TIMINGS"]


def test_a_declared_wrapper_of_a_known_implementation_is_one_call():
    def project_ckpt(function, *args):  # what a project declares around DeepSpeed's checkpoint
        return sys.modules[implementations.ADAPTERS[0].module].checkpoint(function, *args)

    holder = load_file(PROJECT, "project_checkpointing")
    holder.project_ckpt = project_ckpt
    try:
        with imitation("deepspeed"), intercepted(Recorder(), extra_functions=["project_checkpointing.project_ckpt"]) \
                as installation:
            grads_of(lambda b, h: holder.project_ckpt(b, h))
    finally:
        del holder.project_ckpt
    entry = "project_checkpointing.project_ckpt"
    assert [(e, p) for e, p, _ in installation.hooks.events] == [(entry, "forward")] * 2 + [(entry, "recompute")] * 2


def test_rebinding_misses_references_made_before_and_the_code_swap_does_not():
    # measured: what each way of patching a declared function covers
    module = project()
    early_object = functools.partial(module.checkpoint_fn)      # a callable object: rebound
    early_function = functools.partial(module.checkpoint_block)  # a plain function: code swapped
    names = ["project_checkpointing.checkpoint_fn", "project_checkpointing.checkpoint_block"]
    with intercepted(Recorder(), extra_functions=names) as installation:
        grads_of(lambda b, h: early_object(b, h))
        missed = list(installation.hooks.events)
        grads_of(lambda b, h: early_function(b, h))
    assert installation.declared == dict(zip(names, ["rebound", "code"]))
    assert missed == []
    assert [phase for _, phase, _ in installation.hooks.events] == ["forward", "forward", "recompute", "recompute"]
