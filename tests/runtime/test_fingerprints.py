"""runtime/fingerprints.py: what a value's fingerprint and its text say, and when the text is made."""

from __future__ import annotations

import contextvars

import torch
from hypothesis import given
from hypothesis import strategies as st

from recheck.runtime.fingerprints import MISSING, fingerprint, show, show_printed


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
    assert Costly.lookups == 1  # its __dict__, once; no isinstance asking for __class__
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
    # a list subclass is read through its own slicing, as before the table
    assert shallow(_Window([1, 2])) == ("_Window", 2, (2, 1))
    # callable() is asked of each value, not cached with its type
    ticker = _Ticker()
    before = shallow(ticker)
    assert before[0] == "object"
    _Ticker.__call__ = lambda self: None  # a class that gains __call__ later
    try:
        assert shallow(ticker) == ("id", id(ticker))
    finally:
        del _Ticker.__call__
    assert shallow(ticker) == before


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
    kind, qualname, ident, items = fingerprint(config)
    assert (kind, ident) == ("object", id(config))
    assert items == tuple((k, fingerprint(v, 2)) for k, v in attributes.items())


def test_scalar_items_keep_their_type_in_the_print() -> None:
    assert fingerprint([1]) != fingerprint([True]) != fingerprint([1.0])
    assert fingerprint((0.0,)) != fingerprint((-0.0,))
    assert fingerprint({"k": None}) != fingerprint({"k": "None"})


# -- kept_shallow: the last print of an object, while what it is made of stays ------------------

from hypothesis import settings  # noqa: E402

from recheck.runtime.fingerprints import hold_kept, kept_shallow, release_kept, shallow  # noqa: E402


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


class _Counter:
    """The same object's class reassigned from :class:`_Hook`: no longer callable, printed by its attributes."""

    def __init__(self) -> None:
        self.calls = 0


class _TensorFreeConfig(_KeptConfig):
    """The same without a tensor or a nested object (a map in its place, and no callable object
    of its own class): what is kept of it sleeps between readers."""

    def __init__(self) -> None:
        super().__init__()
        del self.weights, self.hook
        self.inner = {"depth": 1}


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


_KEY = object()

_MUTATIONS = [
    lambda c: setattr(c, "hidden", 33),
    lambda c: setattr(c, "flag", 1),                      # a bool rebound to an equal int
    lambda c: setattr(c, "eps", -0.0),
    lambda c: setattr(c, "eps", 0.0),                     # equal to -0.0 by ==, other bits
    lambda c: c.labels.__setitem__(2, "c"),               # a dict item grown in place
    lambda c: c.labels.__setitem__(0, "z"),               # a dict item changed in place
    lambda c: c.sizes.append(3),
    lambda c: c.sizes.__setitem__(0, 1.5),
    lambda c: c.pair[1].__setitem__("k", 2),              # two levels down: past shallow's depth
    lambda c: c.inner.__setitem__("depth", 2) if type(c.inner) is dict else setattr(c.inner, "depth", 2),
    lambda c: c.weights.add_(1) if hasattr(c, "weights") else None,  # a tensor's version
    lambda c: setattr(c, "weights", torch.zeros(2)),
    lambda c: setattr(c, "extra", [1]),                   # a name added
    lambda c: c.__dict__.pop("extra", None),              # and removed
    lambda c: setattr(c, "labels", {0: "a", 1: "b"}),     # rebound to an equal dict
    lambda c: c.labels.__setitem__(_KEY, 1),              # a key that prints by its identity
    lambda c: (c.labels.pop(_KEY, None), c.labels.__setitem__(object(), 1)),
    lambda c: c.__dict__.__setitem__("hidden2", c.__dict__.pop("hidden", 0)),  # a name replaced: as many
    lambda c: setattr(c, "act", abs),                     # another builtin
    lambda c: setattr(c, "var", contextvars.ContextVar("var")),  # another ContextVar of the same name
    lambda c: c.hook() if callable(getattr(c, "hook", None)) else None,  # a callable's own state: not in its print
    lambda c: setattr(c.hook, "__class__", _Counter if type(c.hook) is _Hook else _Hook)  # its class reassigned
    if hasattr(c, "hook") else None,
    lambda c: None,                                       # nothing changed: the kept print
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_MUTATIONS) - 1), st.booleans()), max_size=12), st.booleans(),
       st.sampled_from([_KeptConfig, _MappedConfig, _TensorFreeConfig]))
def test_kept_shallow_is_shallow_after_any_changes(steps, as_dict, config_class):
    """Changed while held, or while no reader held it (``asleep``: its kept print slept)."""
    hold_kept()
    config = config_class()
    value = vars(config) if as_dict else config  # a dict is kept the same way as an object
    assert kept_shallow(value) == shallow(value)
    for step, asleep in steps:
        if asleep:
            release_kept()
        _MUTATIONS[step](config)
        if asleep:
            hold_kept()
        assert kept_shallow(value) == shallow(value)
    release_kept()


def test_a_change_made_while_no_one_reads_is_seen_by_the_next_reader_and_nothing_is_kept_alive():
    """Between ``watch()`` blocks nothing is kept: the next block's first read is exact whatever
    changed meanwhile, and the objects read are freed as soon as their user drops them."""
    import gc
    import weakref

    config, tensors, plain = _TensorFreeConfig(), _KeptConfig(), {"sizes": [1, 2]}
    hold_kept()
    before = kept_shallow(config), kept_shallow(tensors), kept_shallow(plain)
    release_kept()
    config.labels[0] = "changed while no one read it"
    tensors.weights.add_(1)
    plain["sizes"].append(3)
    hold_kept()
    after = kept_shallow(config), kept_shallow(tensors), kept_shallow(plain)
    assert after == (shallow(config), shallow(tensors), shallow(plain))
    assert all(a != b for a, b in zip(after, before))
    release_kept()
    refs = weakref.ref(config), weakref.ref(tensors)
    del config, tensors
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


def test_kept_shallow_answers_an_unchanged_object_from_what_it_kept_and_forgets_it():
    import gc
    import weakref

    hold_kept()
    config = _KeptConfig()
    first = kept_shallow(config)
    assert kept_shallow(config) is first  # the same print object: nothing was printed again
    config.labels[0] = "changed"
    assert kept_shallow(config) is not first and kept_shallow(config) == shallow(config)
    release_kept()
    alive = weakref.ref(config)
    kept_shallow(config)  # with no reader holding them, nothing is kept
    assert kept_shallow(config) is not kept_shallow(config)  # printed afresh at every read
    del config
    gc.collect()
    assert alive() is None  # released: what was kept does not hold the object


def test_an_object_is_printed_by_the_dict_getattr_gives_whatever_its_getattribute():
    """A config whose ``__getattribute__`` is its own is read through the instance's slot (the
    same dict); a proxy's ``__dict__`` is the target's, asked its own way at every print."""
    hold_kept()
    try:
        config = _MappedConfig()
        assert config.size == 32
        for _ in range(2):  # the type is seen, then its instances read directly
            assert kept_shallow(config) == shallow(config) == ("object", id(config), shallow(vars(config))[2])
        target = _KeptConfig()
        proxy = _Proxy(target)
        for _ in range(2):
            assert shallow(proxy)[2] == shallow(target)[2]
            assert kept_shallow(proxy)[2] == shallow(target)[2]
        target.hidden = 64
        assert kept_shallow(proxy)[2] == shallow(target)[2]
    finally:
        release_kept()
