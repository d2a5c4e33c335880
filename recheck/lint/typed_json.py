"""JSON for the linter's own data types, validated against their annotations on load.

The cache is read from the linted tree, which may be a stranger's: it must be data that
cannot carry code.  JSON holds only strings, numbers, booleans, null, lists and objects,
and :func:`decoder` turns it back into the dataclasses and named tuples of
:mod:`recheck.lint.facts` *only* if every value has the type its field declares (the
annotations are the schema, so a new field is validated without a second list to keep in
step).  Anything else raises :class:`InvalidData`; no constructor but the declared
classes' own is ever called, and nothing is looked up by a name found in the data.

Records are encoded as JSON arrays of their fields in declaration order (compact, and
a changed layout fails validation instead of being misread); a record with a
``stored_values()`` method gives its own (a deferred body's fields as their defaults).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Callable

__all__ = ["InvalidData", "decoder", "dumps"]

Decoder = Callable[[Any], Any]


class InvalidData(ValueError):
    """A JSON value that does not have the declared type."""


def _record_fields(cls: type) -> list[str] | None:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init]
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return list(cls._fields)  # a NamedTuple
    return None


def _default(value: object) -> object:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    fields = _record_fields(type(value))
    if fields is None or isinstance(value, tuple):
        raise TypeError(f"cannot store {type(value).__name__} in the cache")
    stored = getattr(type(value), "stored_values", None)
    if stored is not None:  # a record whose body may not be filled in yet: stored as its outline
        return stored(value)
    return [getattr(value, name) for name in fields]


def dumps(value: object) -> str:
    """``value`` (records, lists, dicts with string keys, scalars) as compact JSON."""
    return json.dumps(value, default=_default, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_CACHE: dict[object, Decoder] = {}


def decoder(tp: object) -> Decoder:
    """A function that checks a parsed JSON value against type ``tp`` and rebuilds it."""
    if tp not in _CACHE:
        _CACHE[tp] = _build(tp)
    return _CACHE[tp]


def _fail(expected: str, value: object) -> typing.NoReturn:
    shown = repr(value)
    raise InvalidData(f"expected {expected}, found {shown[:40] + '...' if len(shown) > 40 else shown}")


def _scalar(kind: type) -> Decoder:
    def check(value: Any) -> Any:
        if type(value) is not kind:
            _fail(kind.__name__, value)
        return value
    return check


def _build(tp: Any) -> Decoder:
    if tp in (str, int, bool):
        return _scalar(tp)
    if tp is float:
        def real(value: Any) -> float:
            if type(value) not in (int, float):
                _fail("a number", value)
            return float(value)
        return real
    if tp is type(None):
        return _scalar(type(None))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        optional = len(options) < len(args)
        if len(options) != 1:
            raise TypeError(f"the cache cannot store the union {tp}")
        inner = decoder(options[0])
        return lambda value: None if value is None and optional else inner(value)
    if origin is list:
        item = decoder(args[0])

        def as_list(value: Any) -> list:
            if type(value) is not list:
                _fail("a list", value)
            return [item(v) for v in value]
        return as_list
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            element = decoder(args[0])

            def as_tuple(value: Any) -> tuple:
                if type(value) is not list:
                    _fail("a list", value)
                return tuple(element(v) for v in value)
            return as_tuple
        return _fixed(tuple, [decoder(a) for a in args])
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"the cache stores only dicts with string keys, not {tp}")
        item = decoder(args[1])

        def as_dict(value: Any) -> dict:
            if type(value) is not dict:
                _fail("an object", value)
            return {k: item(v) for k, v in value.items()}
        return as_dict
    if origin in (set, frozenset):
        element = decoder(args[0])
        kind = origin

        def as_set(value: Any) -> Any:
            if type(value) is not list:
                _fail("a list", value)
            return kind(element(v) for v in value)
        return as_set
    if isinstance(tp, type):
        fields = _record_fields(tp)
        if fields is not None:
            hints = typing.get_type_hints(tp)
            return _fixed(tp, [decoder(hints[name]) for name in fields], tp.__name__)
    raise TypeError(f"the cache cannot store values of type {tp!r}")


def _fixed(build: Callable[..., Any], parts: list[Decoder], name: str = "tuple") -> Decoder:
    count = len(parts)
    star = build is tuple

    def record(value: Any) -> Any:
        if type(value) is not list or len(value) != count:
            _fail(f"a {name} of {count} fields", value)
        values = [part(v) for part, v in zip(parts, value)]
        return tuple(values) if star else build(*values)
    return record
