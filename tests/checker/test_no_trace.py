"""Property: a check leaves no trace, even when the region raises.

After ``recheck.check`` returns or raises, every parameter, buffer, gradient (None vs tensor),
``requires_grad`` flag, input tensor, module attribute (hooks included), what a module attribute
holds (a plain object's attributes, an RNG instance's state), the plain data of the modules'
classes, RNG state (torch CPU, Python ``random``, numpy, explicit generators) and module-level
global of the region's code equals its value before, bit for bit.  The state is gathered here
independently of the checker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from region_programs import programs

# The zoo's warning example warns in the plain reference run, which lets output through.
pytestmark = pytest.mark.filterwarnings("ignore:region. falling back:UserWarning")


class RegionFailure(Exception):
    """Raised by the test's wrapper on a chosen call of the region."""


def _bits(t: torch.Tensor) -> tuple:
    data = t.detach().contiguous().reshape(-1)
    raw = data.view(torch.uint8) if data.numel() else data
    return ("tensor", t.dtype, tuple(t.shape), t.requires_grad, bytes(raw.numpy().tobytes()))


def fingerprint(value: Any, depth: int = 4) -> Any:
    """A comparable, bit-exact picture of ``value`` (tensors by bytes, generators by state)."""
    if isinstance(value, torch.Tensor):
        grad = getattr(value, "grad", None) if value.is_leaf else None
        return (_bits(value), None if grad is None else _bits(grad))
    if isinstance(value, torch.Generator):
        return ("generator", _bits(value.get_state()))
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (int, float, str, bool, bytes, type(None))):
        return (type(value).__name__, repr(value))
    if depth <= 0:
        return ("object", id(value))
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), fingerprint(v, depth - 1)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(fingerprint(v, depth - 1) for v in value))
    if isinstance(value, random.Random):
        return ("random.Random", value.getstate())
    if isinstance(value, np.random.RandomState):
        return ("RandomState", fingerprint(list(value.get_state()), depth))
    if isinstance(value, np.random.Generator):
        return ("Generator", repr(value.bit_generator.state))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ("dataclass", fingerprint(vars(value), depth - 1))
    if isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, (type, torch.nn.Module)) \
            and not callable(value):  # a plain object a module holds (a counter, a tracker)
        return ("object", type(value).__name__, id(value), fingerprint(dict(vars(value)), depth - 1))
    return ("object", type(value).__name__, id(value))


def _class_data(cls: type) -> dict[str, Any]:
    """The plain data in the namespaces of ``cls`` and its bases outside torch."""
    found = {}
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith("torch"):
            continue
        for key, value in vars(klass).items():
            if not key.startswith("__") and not callable(value) and not hasattr(type(value), "__get__"):
                found[f"class {klass.__qualname__}@{id(klass)}.{key}"] = fingerprint(value)
    return found


def _reachable(value: Any, depth: int = 3) -> Iterator[Any]:
    """Modules, generators, tensors and functions reachable from a callable or argument."""
    if depth < 0:
        return
    yield value
    if isinstance(value, functools.partial):
        for item in (value.func, *value.args, *value.keywords.values()):
            yield from _reachable(item, depth - 1)
    elif isinstance(value, types.MethodType):
        yield from _reachable(value.__self__, depth - 1)
        yield from _reachable(value.__func__, depth - 1)
    elif isinstance(value, types.FunctionType):
        for cell in value.__closure__ or ():
            yield from _reachable(cell.cell_contents, depth - 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _reachable(item, depth - 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _reachable(item, depth - 1)


def snapshot(fn: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    """Everything a check must leave as it found it."""
    state: dict[str, Any] = {
        "torch cpu RNG": _bits(torch.get_rng_state()),
        "python random": random.getstate(),
        "numpy RNG": fingerprint(list(np.random.get_state())),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda RNG"] = [_bits(s) for s in torch.cuda.get_rng_state_all()]
    functions = []
    for index, item in enumerate(_reachable((fn, args, kwargs))):
        if isinstance(item, torch.nn.Module):
            for name, module in item.named_modules():
                for attr, value in vars(module).items():
                    state[f"{type(module).__name__}@{id(module)}.{attr}"] = fingerprint(value)
                state.update(_class_data(type(module)))
                forward = vars(type(module)).get("forward")
                if isinstance(forward, types.FunctionType):
                    functions.append(forward)
        elif isinstance(item, (torch.Tensor, torch.Generator)):
            state[f"reached[{index}] {type(item).__name__}@{id(item)}"] = fingerprint(item)
        elif isinstance(item, types.FunctionType):
            functions.append(item)
    for function in functions:
        namespace = function.__globals__
        if namespace.get("__name__", "").startswith("torch"):
            continue
        for name in function.__code__.co_names:
            value = namespace.get(name)
            if isinstance(value, (int, float, str, torch.Generator, dict, list)):
                state[f"global {namespace.get('__name__')}.{name}"] = fingerprint(value)
    return state


def _wrap_to_raise(fn: Callable[..., Any], on_call: int | None) -> Callable[..., Any]:
    if on_call is None:
        return fn
    calls = [0]

    def region(*args, **kwargs):
        calls[0] += 1
        if calls[0] == on_call:
            raise RegionFailure(f"region raised on call {on_call}")
        return fn(*args, **kwargs)

    return region


def _give_grads(fn: Callable[..., Any], args: tuple) -> None:
    """Pre-populate some ``.grad`` fields so a check must restore tensors, not just Nones."""
    for item in _reachable((fn, args)):
        if isinstance(item, torch.nn.Module):
            for parameter in list(item.parameters())[::2]:
                parameter.grad = torch.full_like(parameter, 0.25)
        elif isinstance(item, torch.Tensor) and item.is_leaf and item.requires_grad:
            item.grad = torch.full_like(item, -1.5)


def _raised_by_region(error: BaseException) -> bool:
    seen = error
    while seen is not None:
        if isinstance(seen, RegionFailure):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"state changed by the check: {changed}"


def _check_leaves_no_trace(check, fn, args, kwargs, options, raise_on, with_grads) -> str:
    """Run ``check`` on the region and assert it left no trace; returns what happened."""
    if with_grads:
        _give_grads(fn, args)
    random.seed(11)
    np.random.seed(11)
    before = snapshot(fn, args, kwargs)
    region = _wrap_to_raise(fn, raise_on)
    try:
        outcome = f"report kinds: {sorted(check(region, *args, kwargs=kwargs, **options).kinds)}"
    except Exception as error:  # noqa: BLE001 - the region's error must surface, nothing else
        assert raise_on is not None and _raised_by_region(error), f"check crashed: {error!r}"
        outcome = f"raised {error!r}"
    _assert_same(before, snapshot(fn, args, kwargs))
    return outcome


OPTIONS = st.fixed_dictionaries({"use_reentrant": st.booleans(),
                                 "preserve_rng_state": st.booleans(),
                                 "early_stop": st.booleans()})
RAISE_ON = st.one_of(st.none(), st.integers(1, 4))
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data(), options=OPTIONS, raise_on=RAISE_ON, with_grads=st.booleans())
def test_check_of_a_zoo_example_leaves_no_trace(data, options, raise_on, with_grads, check, zoo,
                                                 build_example) -> None:
    name = data.draw(st.sampled_from(zoo.example_names()), label="example")
    fn, args, kwargs = build_example(name)
    outcome = _check_leaves_no_trace(check, fn, args, kwargs, options, raise_on, with_grads)
    note(outcome)
    event(f"raise on call {raise_on}: {outcome.split()[0]}")


@settings(SETTINGS, max_examples=25)
@given(program=programs(hazards=True), options=OPTIONS, raise_on=RAISE_ON,
       with_grads=st.booleans())
def test_check_of_a_program_leaves_no_trace(program, options, raise_on, with_grads, check) -> None:
    fn, args, _ = program.build()
    outcome = _check_leaves_no_trace(check, fn, args, {}, options, raise_on, with_grads)
    note(outcome)
    event(f"raise on call {raise_on}: {outcome.split()[0]}")


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["nonreentrant", "reentrant"])
def test_check_of_every_zoo_example_leaves_no_trace(zoo_name, use_reentrant, check,
                                                    build_example, example_options) -> None:
    """Each example once per variant, with gradients already present (hypothesis samples more)."""
    fn, args, kwargs = build_example(zoo_name)
    options = example_options(zoo_name, use_reentrant=use_reentrant)
    _check_leaves_no_trace(check, fn, args, kwargs, options, None, with_grads=True)


def _plain_step(fn, *args, kwargs=None, use_reentrant=False, preserve_rng_state=True, early_stop=True):
    """A "checker" that leaves every trace: one plain forward and backward."""
    from recheck.findings import Report

    output = fn(*args, **(kwargs or {}))
    output.sum().backward()
    return Report()


@pytest.mark.parametrize("name", ["region_counter", "region_batchnorm_train", "region_mlp",
                                  "region_explicit_generator", "region_global_flipped_by_region",
                                  "region_python_random", "region_numpy_random",
                                  "region_input_mutation", "region_dropout_default_rng"])
def test_the_snapshot_sees_what_a_plain_step_changes(name, build_example) -> None:
    fn, args, kwargs = build_example(name)
    with pytest.raises(AssertionError, match="state changed by the check"):
        _check_leaves_no_trace(_plain_step, fn, args, kwargs, {}, None, with_grads=False)


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("fails", [False, True])
@pytest.mark.parametrize("which", ["check", "check_step"])
def test_the_garbage_collector_is_paused_during_a_check_and_as_before_after(which, fails, enabled) -> None:
    import gc

    import recheck

    lin = torch.nn.Linear(4, 4)

    def region(x):  # (what it would record, the check puts back: it tells by raising)
        if gc.isenabled():
            raise AssertionError("the garbage collector runs during the check")
        if fails:
            raise RegionFailure("planted")
        return lin(x)

    def step():
        torch.utils.checkpoint.checkpoint(region, torch.randn(2, 4), use_reentrant=False).sum().backward()

    before = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(RegionFailure) if fails else contextlib.nullcontext():
            if which == "check":
                report = recheck.check(region, torch.randn(2, 4, requires_grad=True))
            else:
                report = recheck.check_step(step)
        assert gc.isenabled() is enabled
        assert fails or report.stats["runs"] >= 2, report.stats  # the region ran, the gc off
    finally:
        (gc.enable if before else gc.disable)()


@pytest.mark.parametrize("options", [{}, {"early_stop": False}, {"use_reentrant": True}])
def test_a_check_leaves_no_reference_cycle_holding_tensors(options: dict) -> None:
    """What a check made is freed when it returns, not when the garbage collector next runs.

    torch's early stop ends a recompute by raising; a record that kept that exception kept its
    traceback, whose frames held the record: every activation and copy of the check stayed in
    memory until a collection (115 MiB a check of a small transformer stack).
    """
    import gc

    from recheck.checker import check

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    check(block, x, **options)  # warm-up: lazy imports, caches
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert check(block, x, **options).ok
        gc.collect()
        kept = [type(o).__qualname__ for o in gc.garbage if isinstance(o, (torch.Tensor, types.TracebackType))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert kept == []


def _held_blocks() -> list[type]:
    from test_no_trace_held import CASES

    return list(CASES)


@pytest.mark.parametrize("raise_on", [None, 1, 2], ids=["returns", "raises-plain", "raises-checkpointed"])
@pytest.mark.parametrize("block", _held_blocks(), ids=lambda c: c.__name__)
def test_check_of_a_module_holding_state_leaves_no_trace(block: type, raise_on: int | None, check) -> None:
    """A helper object, a class attribute, an RNG instance a module holds: as found, also when
    the region raises in the plain or the checkpointed run."""
    torch.manual_seed(0)
    module = block()
    x = torch.randn(2, 4, requires_grad=True)
    _check_leaves_no_trace(check, module, (x,), {}, {}, raise_on, with_grads=True)


@pytest.mark.parametrize("block", _held_blocks(), ids=lambda c: c.__name__)
def test_the_snapshot_sees_what_a_plain_step_changes_in_held_state(block: type) -> None:
    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="state changed by the check"):
        _check_leaves_no_trace(_plain_step, block(), (torch.randn(2, 4, requires_grad=True),), {}, {}, None,
                               with_grads=False)
