"""recheck.runtime.snapshot, reach and effects: capture, exact restore, what a region reaches."""

from __future__ import annotations

import functools
import logging
import random
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from recheck.runtime.bits import bits_equal
from recheck.runtime.effects import EffectCapture
from recheck.runtime.reach import ModuleRecorder, code_globals, static_reach
from recheck.runtime.snapshot import (Observed, RngRecord, Snapshot, TensorRecord, ValueRecord, fingerprint,
                                   rng_states)

CACHE: list = []
SCALE = 2.0
GEN = torch.Generator().manual_seed(0)


def test_rng_record_restores_every_stream():
    gen = torch.Generator().manual_seed(1)
    record = RngRecord({"g": gen})
    before = rng_states({"g": gen})
    torch.rand(3)
    torch.rand(3, generator=gen)
    random.random()
    np.random.rand()
    assert fingerprint(rng_states({"g": gen})) != fingerprint(before)
    record.restore()
    assert fingerprint(rng_states({"g": gen})) == fingerprint(before)
    assert set(before) >= {"cpu RNG", "generator `g`", "Python random", "numpy global RNG"}
    if not torch.cuda.is_available():
        assert not any(name.startswith("cuda:") for name in before)


def test_tensor_record_restores_bytes_and_version():
    t = torch.arange(4.0)
    record = TensorRecord("buffer", "buffer `b`", t)
    t.add_(1)
    t.data.mul_(3)  # bypasses the version counter
    assert not record.unchanged()
    record.restore()
    assert torch.equal(t, torch.arange(4.0)) and t._version == record.version
    u = torch.arange(3.0)
    same = TensorRecord("buffer", "buffer `u`", u)
    u.data[0] = 7.0  # no version bump: found by bytes
    same.restore()
    assert u[0].item() == 0.0


@pytest.mark.parametrize("left, same", [
    (torch.tensor([1.0, 2.0, 3.0]), True),
    (torch.tensor([1.0, 2.0, 3.0]).neg().neg(), True),  # the same bytes by another road
    (torch.tensor([-0.0, 2.0, 3.0]), False),             # 0.0 and -0.0: one bit
    (torch.tensor([1.0, 2.0, float("nan")]), False),
    (torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), False),
])
def test_an_observe_keeps_another_runs_value_only_when_its_bytes_are_the_same(left, same):
    weight = torch.zeros(3)
    record = TensorRecord("state", "parameter `w`", weight)
    earlier = Observed("state", "parameter `w`", left)  # the parameter as another run left it
    with torch.no_grad():
        weight.copy_(torch.tensor([1.0, 2.0, 3.0]))  # this run's step moved it (and its version)

    (seen,) = record.observe(earlier)

    assert (seen is earlier) is same
    assert bits_equal(seen.value, weight) and seen.value is not weight
    record.restore()
    assert bits_equal(weight, torch.zeros(3))


def test_value_record_restores_bindings_and_container_content():
    namespace = {"items": [1, [2, 3]], "n": 1}
    inner = namespace["items"][1]
    items = namespace["items"]
    records = [ValueRecord("state", "x", namespace, key) for key in ("items", "n", "absent")]
    items.append(4)
    inner.append(5)
    namespace["n"] = 2
    namespace["absent"] = True
    for record in records:
        record.restore()
    assert namespace == {"items": [1, [2, 3]], "n": 1}
    assert namespace["items"] is items and items[1] is inner


@pytest.mark.parametrize("then, now, same", [
    (1, 1, True), (1, 2, False), (0.0, -0.0, False), (float("nan"), float("nan"), True), (True, 1, False),
    ("a", "a", True), (None, None, True), (None, 0, False), (torch.float32, torch.float64, False),
    ((3, 3), (3, 3), True), ((3, 3), (3, 4), False), ((1, 0.0), (1, -0.0), False)])
def test_value_record_compares_immutable_values_by_print_also_when_rebound(then, now, same):
    namespace = {"k": then}
    record = ValueRecord("state", "attribute `k`", namespace, "k")
    first = list(record.observe())[0]
    assert record.unchanged() and list(record.observe())[0].value == first.value  # the same object
    namespace["k"] = now  # another object (an equal int is another object past the small-int cache)
    assert record.unchanged() is same
    assert (list(record.observe())[0].value == first.value) is same
    record.restore()
    assert namespace["k"] is then


def test_value_record_of_a_tuple_holding_a_list_puts_the_list_content_back():
    inner = [1]
    namespace = {"t": (inner, 2)}
    record = ValueRecord("state", "attribute `t`", namespace, "t")
    inner.append(5)
    assert not record.unchanged()
    record.restore()
    assert namespace["t"][0] is inner and inner == [1]


def test_value_record_of_an_int_rebound_to_an_equal_one_is_unchanged():
    big = 10**30
    namespace = {"k": big}
    record = ValueRecord("state", "attribute `k`", namespace, "k")
    namespace["k"] = int(str(big))
    assert namespace["k"] is not big and record.unchanged()


def test_fingerprint_semantics():
    assert fingerprint(0.0) != fingerprint(-0.0)
    assert fingerprint([1, 2]) != fingerprint([1, 2, 3])
    assert fingerprint({"a": torch.ones(2)}) == fingerprint({"a": torch.ones(2)})
    assert fingerprint({"a": torch.ones(2)}) != fingerprint({"a": torch.zeros(2)})
    gen = torch.Generator()
    before = fingerprint(gen)
    torch.rand(2, generator=gen)
    assert fingerprint(gen) == before  # generator streams are compared as rng, not state


def test_snapshot_restores_module_state():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    model.extra = [1]
    snapshot = Snapshot(RngRecord({}))
    for name, buffer in model[1].named_buffers():
        snapshot.add(name, functools.partial(TensorRecord, "buffer", name, buffer))
    snapshot.add("extra", functools.partial(ValueRecord, "state", "extra", model.__dict__, "extra"))
    model(torch.randn(4, 2))
    model.extra.append(2)
    observed = snapshot.observe()
    assert ("buffer", "running_mean") in observed
    snapshot.restore()
    assert model[1].num_batches_tracked.item() == 0 and model.extra == [1]


def test_a_tracked_module_s_bindings_and_new_attributes_are_put_back_and_the_new_ones_observed():
    model = nn.Sequential(nn.Linear(2, 2))
    weight, buffers, layer = model[0].weight, dict(model[0]._buffers), model[0]
    snapshot = Snapshot(RngRecord({}))
    snapshot.track(static_reach(model, (), {}), param_kind="state")
    model[0].weight = nn.Parameter(torch.zeros(2, 2))
    model[0].register_buffer("scale", torch.ones(1))
    model.add_module("extra", nn.ReLU())
    model[0].calls = 1
    assert ("state", "attribute `0.calls`") in snapshot.observe()
    snapshot.restore()
    assert model[0].weight is weight and model[0]._buffers == buffers and list(model) == [layer]
    assert "calls" not in vars(model[0])


def test_what_an_observe_finds_changed_in_a_module_is_put_back_by_the_restore_that_trusts_it():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    weight, relu = model[0].weight, model[1]
    snapshot = Snapshot(RngRecord({}))
    snapshot.track(static_reach(model, (), {}), param_kind="state")
    first = snapshot.observe()
    model[0].weight = nn.Parameter(torch.zeros(2, 2))  # a binding only: no attribute appears
    model[1] = nn.Identity()
    model.train(False)
    seen = snapshot.observe()
    assert seen[("state", "attribute `0.training`")].value != first[("state", "attribute `0.training`")].value
    assert (first[("state", "attribute `0.training`")].shown, seen[("state", "attribute `0.training`")].shown) \
        == ("True", "False")
    snapshot.restore(trust_observed=True)  # only what the observe did not find as captured
    assert model[0].weight is weight and model[1] is relu and model.training and model[0].training
    again = snapshot.observe()
    assert all(again[key] is first[key] for key in first if key[1].endswith("training`"))


def _reads_and_writes(x):
    global SCALE
    SCALE = SCALE * 1.0
    CACHE.append(1)
    return _helper(x)


def _helper(x):
    return torch.rand(x.shape, generator=GEN) * x


def test_code_globals_and_same_module_calls():
    reads, writes = code_globals(_reads_and_writes.__code__)
    assert {"SCALE", "CACHE", "_helper"} <= reads and writes == {"SCALE"}
    reach = static_reach(_reads_and_writes, (torch.ones(2),), {})
    names = {ref.name for ref in reach.reads.values()}
    assert {"SCALE", "CACHE", "GEN"} <= names  # GEN through _helper
    assert {ref.name for ref in reach.writes.values()} == {"SCALE"}
    assert any(g is GEN for g in reach.generators.values())


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)
        self.gen = torch.Generator()

    def forward(self, x):
        return self.inner(x)


def test_reach_through_module_bound_method_partial_and_closure():
    model = Holder()
    assert "self.gen" in static_reach(model, (), {}).generators
    assert "inner" in {n for n, _ in static_reach(model.forward, (), {}).modules.values()}
    partial = functools.partial(Holder.forward, model)
    assert id(model.inner) in static_reach(partial, (), {}).modules
    closure = lambda x: model(x)  # noqa: E731
    assert id(model.inner) in static_reach(closure, (), {}).modules
    arg_gen = torch.Generator()
    assert "args[1]" in static_reach(lambda x, g: x, (torch.ones(1), arg_gen), {}).generators


def test_module_recorder_sees_executed_modules():
    seen = []
    hidden = nn.Linear(2, 2)

    def region(x):
        return hidden(x)

    with ModuleRecorder(seen.append):
        region(torch.ones(2))
    assert seen == [hidden]
    hidden(torch.ones(2))
    assert seen == [hidden]  # removed after the block


@pytest.fixture
def logger():
    """A logger that makes a record at every level (a call its level drops emits nothing, and is
    not recorded)."""
    logger = logging.getLogger("recheck.tests.effects")
    logger.setLevel(logging.DEBUG)
    yield logger
    logger.setLevel(logging.NOTSET)


def test_effect_capture_records_and_restores(logger):
    stdout = sys.stdout
    with EffectCapture() as capture:
        print("hello")
        logger.debug("quiet %d", 3)
        logger.log(logging.INFO, "explicit")
        sys.stderr.write("err")
        warnings.warn("careful")
    channels = [e.channel for e in capture.effects]
    assert channels.count("stdout") == 2 and "stderr" in channels and "warning" in channels
    texts = [e.text for e in capture.effects]
    assert "DEBUG:recheck.tests.effects:quiet 3" in texts and "INFO:recheck.tests.effects:explicit" in texts
    assert sys.stdout is stdout
    assert not hasattr(logging.Logger.debug, "__wrapped__")  # the patch is gone


def test_nested_captures_each_record_a_logging_call_and_the_outer_one_restores(logger):
    original = logging.Logger.__dict__["info"]
    with EffectCapture() as outer:
        with EffectCapture() as inner:
            logger.info("both")
        logger.info("outer only")
        assert logging.Logger.__dict__["info"] is not original
    assert [e.text for e in inner.effects if e.channel == "logging"] == ["INFO:recheck.tests.effects:both"]
    assert [e.text for e in outer.effects if e.channel == "logging"] == [
        "INFO:recheck.tests.effects:both", "INFO:recheck.tests.effects:outer only"]
    assert logging.Logger.__dict__["info"] is original


def test_held_patches_outlive_captures_record_nothing_between_them_and_go_with_the_last_release(logger):
    from recheck.runtime.effects import hold_logging, release_logging

    original = logging.Logger.__dict__["warning"]
    hold_logging()
    try:
        logger.info("between captures")  # reaches the original, recorded nowhere
        with EffectCapture() as capture:
            logger.info("inside")
        assert logging.Logger.__dict__["warning"] is not original  # still held
    finally:
        release_logging()
    assert [e.text for e in capture.effects if e.channel == "logging"] == ["INFO:recheck.tests.effects:inside"]
    assert logging.Logger.__dict__["warning"] is original
    with pytest.raises(RuntimeError, match="without hold_logging"):
        release_logging()


def test_a_watch_block_leaves_logging_as_it_found_it():
    import recheck
    from torch.utils.checkpoint import checkpoint

    before = {name: logging.Logger.__dict__.get(name) for name in ("debug", "info", "warning", "log")}
    x = torch.ones(2, requires_grad=True)
    with recheck.watch(raise_on_finding=False):
        checkpoint(torch.sin, x, use_reentrant=False).sum().backward()
    assert {name: logging.Logger.__dict__.get(name) for name in before} == before


def test_rng_comparison_sees_a_single_python_draw():
    random.seed(0)
    random.random()  # past the first twist: later draws only move the position
    record = RngRecord({})
    before = {o.subject: o.value for o in record.observe()}
    random.random()
    after = {o.subject: o.value for o in record.observe()}
    assert before["Python random"] != after["Python random"]
    assert before["cpu RNG"] == after["cpu RNG"]
    np.random.rand()
    assert {o.subject: o.value for o in record.observe()}["numpy global RNG"] != after["numpy global RNG"]
