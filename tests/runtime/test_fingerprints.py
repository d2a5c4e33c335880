"""runtime/fingerprints.py: what a value's fingerprint and its text say, and when the text is made."""

from __future__ import annotations

import contextvars
import functools

import torch
from hypothesis import given
from hypothesis import strategies as st

from recheck.runtime.fingerprints import MISSING, fingerprint, show, show_printed, showing


class Config:
    """A value whose repr is costly (a transformers config prints itself as JSON)."""

    reprs: dict[int, int] = {}  # per instance, outside the instance (its state is fingerprinted)

    def __init__(self) -> None:
        self.width = 4

    def __repr__(self) -> str:
        Config.reprs[id(self)] = Config.reprs.get(id(self), 0) + 1
        return f"Config(width={self.width})"

    @property
    def shown(self) -> int:
        return Config.reprs.get(id(self), 0)


def test_a_text_is_made_once_while_the_object_keeps_its_fingerprint():
    config = Config()
    with showing():  # as a check or a watch() block holds it
        for _ in range(5):
            printed = fingerprint(config)
            assert show_printed(config, printed) == "Config(width=4)"
    assert config.shown == 1


def test_a_changed_value_gets_its_own_text():
    config = Config()
    assert show_printed(config, fingerprint(config)) == "Config(width=4)"
    config.width = 8
    assert show_printed(config, fingerprint(config)) == "Config(width=8)"


def test_another_object_with_the_same_fingerprint_is_shown_for_itself():
    a, b = Config(), Config()
    show_printed(a, fingerprint(a))
    show_printed(b, fingerprint(b))
    assert (a.shown, b.shown) == (1, 1)


def test_show_describes_tensors_and_truncates():
    assert show(torch.zeros(2, 3)) == "float32[2, 3] on cpu"
    assert show([torch.zeros(1)]) == "[float32[1] on cpu]"
    text = show("x" * 500)
    assert len(text) == 80 and text.endswith("... (502 chars)")


def test_show_is_one_line_however_the_value_prints_itself():
    class Config:
        def __repr__(self):
            return "Config {\n  \"hidden_size\": 16,\n  \"problem_type\": null\n}\n"

    assert show(Config()) == 'Config { "hidden_size": 16, "problem_type": null }'
    long = show({f"key{i}": "value\n" for i in range(100)})
    assert "\n" not in long and len(long) <= 80 and long.endswith(" chars)")


def test_an_unhashable_fingerprint_still_shows():
    assert show_printed([1, 2], [1, 2]) == "[1, 2]"
    assert fingerprint(MISSING) == fingerprint(MISSING)


class Costly:
    """A transformers config's shape: every attribute lookup goes through Python."""

    lookups = 0

    def __init__(self) -> None:
        self.width, self.flag, self.rate, self.names = 4, True, 0.5, {"a": 1}

    def __getattribute__(self, name: str):
        type(self).lookups += 1
        return object.__getattribute__(self, name)


def test_shallow_reads_a_values_type_without_asking_the_value():
    from recheck.runtime.fingerprints import shallow

    value = Costly()
    Costly.lookups = 0
    print_ = shallow(value)
    assert Costly.lookups == 0  # neither its __dict__ nor its __class__ asked of it: no code of its runs
    value.names["a"] = 2
    assert shallow(value) != print_
    value.names["a"], value.flag = 1, 1  # True -> 1 is a change, though True == 1
    assert shallow(value) != print_
    value.flag, value.rate = True, -0.0
    assert shallow(value) != print_
    value.rate = 0.5
    assert shallow(value) == print_


def test_shallow_tells_bools_ints_and_float_bits_apart_inside_containers():
    from recheck.runtime.fingerprints import shallow

    assert shallow([True]) != shallow([1]) and shallow({"k": False}) != shallow({"k": 0})
    assert shallow((0.0,)) != shallow((-0.0,))
    assert shallow([float("nan")]) == shallow([float("nan")])
    assert shallow(["a", None, b"x", 3]) == shallow(["a", None, b"x", 3])


class _Window(list):
    """A list subclass whose slicing is its own (a view over part of it)."""

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(reversed(list.__getitem__(self, index)))
        return list.__getitem__(self, index)


class _Ticker:
    def __init__(self) -> None:
        self.calls = 0


def test_shallow_sorts_each_type_once_and_keeps_per_value_tests_per_value():
    import enum

    from recheck.runtime.fingerprints import shallow

    class Level(enum.IntEnum):
        LOW = 1

    # subclasses sort as their bases did with an issubclass chain: an IntEnum is an int
    assert shallow(Level.LOW) is Level.LOW and shallow([Level.LOW]) == ("list", 1, (Level.LOW,))
    # a list subclass is read through list's own methods: its overridden slicing is its code
    assert shallow(_Window([1, 2])) == ("_Window", 2, (1, 2))
    # a callable object of the project's class is state, printed by its attributes (its counter
    # shows), also once its class gains __call__; a function is code, printed by identity
    ticker = _Ticker()
    before = shallow(ticker)
    assert before[0] == "object"
    _Ticker.__call__ = lambda self: None  # a class that gains __call__ later
    try:
        assert shallow(ticker) == before
        ticker.calls += 1
        assert shallow(ticker) != before
    finally:
        del _Ticker.__call__
    function = lambda: None  # noqa: E731
    assert shallow(function) == ("id", id(function)) and shallow(functools.partial(function))[0] == "id"


def test_items_are_printed_inside_containers_as_on_their_own():
    import math
    import struct

    from recheck.runtime.fingerprints import shallow

    payload = struct.unpack("<d", struct.pack("<q", 0x7FF8_0000_0000_0123))[0]
    values = [True, False, 0.0, -0.0, math.inf, float("nan"), payload, 1e-300, 3, "s", None, [1.5], {"k": True},
              int, torch.nn.Linear]
    for value in values:
        for container in ([value], (value,), {"k": value}):
            inner = shallow(container)[2]
            got = inner[0][1] if isinstance(container, dict) else inner[0]
            assert got == shallow(value, 1), (container, got)
    assert shallow([payload]) != shallow([float("nan")])  # a NaN's payload counts


_SCALAR_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4), st.binary(max_size=4),
                           st.floats(allow_nan=True))
_NESTED = st.recursive(_SCALAR_VALUES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.one_of(st.integers(), st.text(max_size=3)), inner, max_size=4)), max_leaves=12)


def _reference(value, depth=3):
    """The print item by item, every item through fingerprint() itself (no scalar fast path)."""
    if type(value) in (list, tuple):
        return (type(value).__name__, len(value), tuple(fingerprint(v, depth - 1) for v in value))
    if type(value) is dict:
        return ("dict", len(value), tuple((fingerprint(k, 1), fingerprint(v, depth - 1)) for k, v in value.items()))
    return fingerprint(value, depth)


@given(_NESTED)
def test_containers_print_their_items_as_fingerprint_prints_each(value) -> None:
    assert fingerprint(value) == _reference(value)


class _Config:
    def __init__(self, **values):
        self.__dict__.update(values)


@given(st.dictionaries(st.sampled_from(["a", "b", "hidden_size", "name"]), _NESTED, max_size=4))
def test_objects_print_their_attributes_as_fingerprint_prints_each(attributes) -> None:
    config = _Config(**attributes)
    kind, qualname, items = fingerprint(config)
    assert (kind, qualname) == ("object", "_Config")
    assert items == tuple((k, fingerprint(v, 2)) for k, v in attributes.items())
    assert fingerprint(_Config(**attributes)) == fingerprint(config)  # by state, never by identity


def test_objects_with_other_state_or_class_print_otherwise() -> None:
    class Other:
        def __init__(self) -> None:
            self.a = 1

    assert fingerprint(_Config(a=1)) != fingerprint(_Config(a=2))
    assert fingerprint(_Config(a=1)) != fingerprint(Other())


def test_scalar_items_keep_their_type_in_the_print() -> None:
    assert fingerprint([1]) != fingerprint([True]) != fingerprint([1.0])
    assert fingerprint((0.0,)) != fingerprint((-0.0,))
    assert fingerprint({"k": None}) != fingerprint({"k": "None"})


# -- shallow: an object read through its own ``__dict__`` -----------------------------------

from recheck.runtime.fingerprints import shallow  # noqa: E402


class _KeptConfig:
    """A config-like object: scalars, small dicts and lists, a nested object, a tensor."""

    def __init__(self) -> None:
        self.hidden = 32
        self.flag = True
        self.eps = 1e-6
        self.labels = {0: "a", 1: "b"}
        self.sizes = [1, 2]
        self.pair = (int, {"k": 1})
        self.inner = type("Inner", (), {})()
        self.inner.depth = 1
        self.weights = torch.zeros(2)
        self.act = len  # objects printed by their identity: a builtin, a ContextVar, a callable
        self.var = contextvars.ContextVar("var")
        self.hook = _Hook()


class _Hook:
    """A callable of a class statement's type: printed by its identity while it is callable."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


class _MappedConfig(_KeptConfig):
    """A transformers-style config: its ``__getattribute__`` maps some names to others."""

    attribute_map = {"size": "hidden"}

    def __getattribute__(self, name):
        if name != "attribute_map" and name in type(self).attribute_map:
            name = type(self).attribute_map[name]
        return super().__getattribute__(name)


class _Proxy:
    """An object that answers ``__dict__`` (and everything) with another object's."""

    def __init__(self, target) -> None:
        object.__setattr__(self, "_target", target)

    def __getattribute__(self, name):
        return getattr(object.__getattribute__(self, "_target"), name)


class _SlotProxy:
    """A proxy with no ``__dict__`` of its own: its target in a slot, every lookup forwarded."""

    __slots__ = ("_target",)

    def __init__(self, target) -> None:
        object.__setattr__(self, "_target", target)

    def __getattribute__(self, name):
        return getattr(object.__getattribute__(self, "_target"), name)


def test_an_object_is_printed_by_its_own_dict_without_running_its_getattribute():
    """A config whose ``__getattribute__`` is its own is read through the instance's own dict,
    its code not run; so is a proxy that has one (its target inside it, whose changes show); a
    proxy without one (``__slots__``) is asked, and prints its target's."""
    config = _MappedConfig()
    assert config.size == 32
    assert shallow(config) == ("object", id(config), shallow(vars(config))[2])
    target = _KeptConfig()
    proxy = _Proxy(target)
    before = shallow(proxy)
    assert before[2][0][0] == "_target"
    target.hidden = 64
    assert shallow(proxy) != before
    slotted = _SlotProxy(target)
    assert shallow(slotted)[2] == shallow(target)[2]


def test_a_short_list_of_numbers_at_the_depth_limit_prints_by_content() -> None:
    """Two runs that each build an equal list of learning rates deep in an object print alike;
    other values there still differ, and other containers there print by identity."""
    assert fingerprint([1e-3, 2e-3], 0) == fingerprint([1e-3, 2e-3], 0)
    assert fingerprint([1e-3, 2e-3], 0) != fingerprint([1e-3, 3e-3], 0)
    assert fingerprint((1, "a", None, True), 0) == fingerprint((1, "a", None, True), 0)
    assert fingerprint([[1.0]], 0) != fingerprint([[1.0]], 0)


def test_a_printed_text_is_made_once_per_check_and_let_go_when_it_ends():
    class Printed:
        calls = 0

        def __repr__(self) -> str:
            Printed.calls += 1
            return "Printed()"

    value = Printed()
    printed = fingerprint(value)
    show_printed(value, printed)  # outside any check: made each time
    once = Printed.calls
    with showing():
        with showing():  # a watch() block inside a check
            assert show_printed(value, printed) == "Printed()"
        show_printed(value, printed)
    assert Printed.calls == 2 * once
    with showing():  # the next check makes it again
        show_printed(value, printed)
    assert Printed.calls == 3 * once


# -- show_shallow: a value that is gone, shown from its print -----------------------------------

import enum  # noqa: E402

import pytest  # noqa: E402

from recheck.runtime.fingerprints import show_shallow  # noqa: E402


class _Level(enum.IntEnum):
    LOW = 1


@pytest.mark.parametrize("value, shown", [
    (1.5, "1.5"), (-0.0, "-0.0"), (float("nan"), "nan"), (True, "True"), (None, "None"), ("x", "'x'"),
    (_Level.LOW, "<_Level.LOW: 1>"),
    ((4, 8), "(4, 8)"), ((3,), "(3,)"), ([], "[]"), ({"a": 1.5, "b": None}, "{'a': 1.5, 'b': None}"),
    (torch.ones(2, dtype=torch.bfloat16), "bfloat16[2] (version 0)"),
    # what a print keeps only by identity or cannot write out: no guess
    ({0: "x"}, "<another object>"),  # an int key may be an object's id in a print
    ([1] * 9, "<another object>"), ([[1]], "<another object>"), (object(), "<another object>"),
])
def test_show_shallow_writes_out_what_a_print_keeps_and_no_more(value, shown):
    assert show_shallow(shallow(value, 1)) == shown


def test_show_shallow_keeps_the_bits_of_a_float():
    assert show_shallow(shallow(-0.0)) != show_shallow(shallow(0.0))
