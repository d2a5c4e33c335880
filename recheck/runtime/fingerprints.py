"""Comparable views of Python values: fingerprints and their display.

:func:`fingerprint` turns any value into a comparable structure: numbers by bits,
tensors by :func:`~recheck.runtime.digests.tensor_digest`, containers by content and length;
:func:`show` displays a value in a finding.  The RNG streams are read and restored by
:mod:`recheck.runtime.rng`; both are re-exported by :mod:`recheck.runtime.snapshot`.
"""

from __future__ import annotations

import collections
import functools
import logging
import operator
from dataclasses import dataclass
from typing import Any

import torch

from recheck.findings import one_line
from recheck.runtime.bits import float_bits
from recheck.runtime.digests import tensor_digest
from recheck.runtime.holds import Hold

__all__ = ["AS_IS", "MISSING", "MODULE_INTERNALS", "Observed", "fingerprint", "hold_kept", "is_module_state",
           "kept_shallow", "release_kept", "same_objects", "shallow", "show", "show_printed"]

_MAX_ITEMS = 4096
_LOGGERS = (logging.Logger, logging.LoggerAdapter)
_MAX_DEPTH = 3


def show(value: Any, limit: int = 80) -> str:
    """``repr`` as one line of at most ``limit`` characters (:func:`recheck.findings.one_line`),
    tensors as ``float32[4] on cpu`` (also inside lists, tuples and dicts: a cache of tensors
    reads ``[float32[2, 8] on cpu, ...]``).  A ``repr`` that raises shows the type."""
    try:
        text = _brief(value, 3)
    except Exception:  # noqa: BLE001 - a user's __repr__
        text = f"<{type(value).__name__} object>"
    return one_line(text, limit)


#: texts :func:`show_printed` made, by (id, type, fingerprint) of the value, most recent last
_SHOWN: collections.OrderedDict[tuple[int, type, Any], str] = collections.OrderedDict()
_SHOWN_SIZE = 1024


def show_printed(value: Any, printed: Any) -> str:
    """:func:`show` of ``value`` whose :func:`fingerprint` is ``printed``, made once while the
    same object keeps the same fingerprint.  A snapshot observes the same state several times
    (at entry, after each run), and a ``repr`` can cost far more than the fingerprint (a
    transformers config prints itself as JSON)."""
    try:
        key = (id(value), type(value), printed)
        text = _SHOWN.get(key)
    except TypeError:  # an unhashable fingerprint
        return show(value)
    if text is None:
        text = _SHOWN[key] = show(value)
        if len(_SHOWN) > _SHOWN_SIZE:
            _SHOWN.popitem(last=False)
    return text


def _brief(value: Any, depth: int) -> str:
    if isinstance(value, torch.Tensor):
        from recheck.runtime.bits import describe_tensor

        return describe_tensor(value)
    if depth > 0 and type(value) in (list, tuple) and _holds_tensors(value):
        items = [_brief(v, depth - 1) for v in value[:8]] + (["..."] if len(value) > 8 else [])
        inner = ", ".join(items) + ("," if type(value) is tuple and len(value) == 1 else "")
        return f"[{inner}]" if type(value) is list else f"({inner})"
    if depth > 0 and type(value) is dict and _holds_tensors(value.values()):
        items = [f"{k!r}: {_brief(v, depth - 1)}" for k, v in list(value.items())[:8]]
        return "{" + ", ".join(items + (["..."] if len(value) > 8 else [])) + "}"
    return repr(value)


def _holds_tensors(items: Any) -> bool:
    return any(isinstance(v, (torch.Tensor, list, tuple, dict)) for v in list(items)[:8])


def fingerprint(value: Any, depth: int = _MAX_DEPTH) -> Any:
    """A hashable, comparable summary of ``value`` that changes when its content does.

    Floats compare by bit pattern (``-0.0`` and NaN payloads count); tensors by metadata
    and :func:`~recheck.runtime.digests.tensor_digest`; tuples, lists, dicts and sets by
    length and content (up to ``_MAX_ITEMS`` items and three levels); objects of user classes by their
    class and ``__dict__`` (never their identity or repr: two objects with equal state are equal);
    modules, functions, generators (whose streams are compared as RNG state) and other objects by
    identity.

    A logger (transformers' modules all read theirs) is compared by what decides what a
    call emits: identity, level, ``disabled``, ``propagate`` and its handlers.  Its
    ``__dict__`` would reach its lookup cache (filled by the first call at each level) and
    the manager's registry of every logger in the process (grown by any import, torch's
    own during the first backward), which change without changing the region.
    """
    cls = type(value)  # not isinstance: see shallow()
    if value is None or issubclass(cls, (bool, int, str, bytes)):
        return (cls.__name__, value)
    if issubclass(cls, float):
        return ("float", float_bits(value))
    if issubclass(cls, complex):
        return ("complex", float_bits(value.real), float_bits(value.imag))
    if issubclass(cls, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), str(value.device),
                value.requires_grad, tensor_digest(value))
    if issubclass(cls, torch.Generator):
        return ("generator", id(value))  # its stream is compared as ``rng``
    if issubclass(cls, _LOGGERS):
        logger = value.logger if issubclass(cls, logging.LoggerAdapter) else value
        return ("logger", id(value), id(logger), logger.level, logger.disabled, logger.propagate,
                tuple(map(id, logger.handlers)))
    if depth <= 0 or issubclass(cls, (torch.nn.Module, type)) or callable(value):
        return ("id", type(value).__name__, id(value))
    # below, an item of an exact scalar type is printed in place, as fingerprint() prints it
    # (a transformers config holds a hundred of them, printed at every observation)
    if issubclass(cls, (list, tuple)):
        items = tuple((kind.__name__, v) if (kind := type(v)) in _SCALARS else fingerprint(v, depth - 1)
                      for v in value[:_MAX_ITEMS])
        return (type(value).__name__, len(value), items)
    if issubclass(cls, dict):
        items = tuple(((kind.__name__, k) if (kind := type(k)) in _SCALARS else fingerprint(k, 1),
                       (kind.__name__, v) if (kind := type(v)) in _SCALARS else fingerprint(v, depth - 1))
                      for k, v in list(dict.items(value))[:_MAX_ITEMS])
        return (type(value).__name__, len(value), items)
    if issubclass(cls, (set, frozenset)):
        members = frozenset(fingerprint(v, depth - 1) for v in list(value)[:_MAX_ITEMS])
        return (type(value).__name__, len(value), members)
    if type(value).__module__ == "numpy" and hasattr(value, "tobytes"):
        return ("ndarray", getattr(value, "shape", ()), str(getattr(value, "dtype", "")),
                value.tobytes())
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and type(value).__module__ not in ("builtins",):
        items = tuple((k, (kind.__name__, v) if (kind := type(v)) in _SCALARS else fingerprint(v, depth - 1))
                      for k, v in list(attrs.items())[:_MAX_ITEMS])
        return ("object", type(value).__qualname__, items)  # by state: an equal object is equal
    return ("id", type(value).__name__, id(value))


#: The attributes every ``nn.Module`` has for its own bookkeeping (``_parameters``, hooks, ...):
#: never a module's *state* in the sense a finding means (``training`` is, and stays).
MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) - {"training"}


@functools.lru_cache(maxsize=1 << 14)
def is_module_state(name: str) -> bool:
    """Whether a module attribute is state a region may change (not torch's bookkeeping).

    Left out: :data:`MODULE_INTERNALS`, and names that start with two underscores, where
    torch keeps per-module registries of its own (the composable APIs'
    ``__composable_api_state_key_<uuid>``).
    """
    return name not in MODULE_INTERNALS and not name.startswith("__")


#: types :func:`shallow` returns as they are (a container's items of these skip the call)
AS_IS = frozenset({int, str, bytes, type(None)})

#: exact types :func:`fingerprint` prints as ``(type name, value)``: a container's items of
#: these are printed in place
_SCALARS = AS_IS | {bool}


# what :func:`shallow` does with a value, by its type (an ``issubclass`` chain is a call per
# type tried; a state read at every invocation shallow-prints the same few types again)
_SCALAR, _BOOL, _FLOAT, _TENSOR, _IDENTITY, _SEQUENCE, _DICT, _SET, _LOGGER, _OBJECT = range(10)
_KINDS: dict[type, int] = {}
_KINDS_SIZE = 4096


def _kind(cls: type) -> int:
    """The :func:`shallow` kind of values of type ``cls`` (what ``issubclass`` says of it)."""
    if issubclass(cls, bool):
        kind = _BOOL
    elif issubclass(cls, (int, str, bytes)):
        kind = _SCALAR
    elif issubclass(cls, float):
        kind = _FLOAT
    elif issubclass(cls, torch.Tensor):
        kind = _TENSOR
    elif issubclass(cls, (torch.nn.Module, type, torch.Generator)):
        kind = _IDENTITY
    elif issubclass(cls, (list, tuple)):
        kind = _SEQUENCE
    elif issubclass(cls, dict):
        kind = _DICT
    elif issubclass(cls, (set, frozenset)):
        kind = _SET
    elif issubclass(cls, _LOGGERS):
        kind = _LOGGER
    else:
        kind = _OBJECT
    if len(_KINDS) >= _KINDS_SIZE:
        _KINDS.clear()
    _KINDS[cls] = kind
    return kind


_TRUE, _FALSE = ("bool", True), ("bool", False)


def _item(value: Any, depth: int) -> Any:
    """:func:`shallow` of an item inside a container: bools, floats and classes (a config holds
    many) without a second call."""
    cls = type(value)
    if cls in AS_IS:
        return value
    if cls is bool:
        return _TRUE if value else _FALSE
    if cls is float:
        return ("float", float_bits(value))
    if cls is type:  # a class (a config's maps of classes): its identity, at any depth
        return ("id", id(value))
    return shallow(value, depth)



def shallow(value: Any, depth: int = 2) -> Any:
    """A cheap, exact-enough comparable form of ``value`` for state read at every invocation.

    Unlike :func:`fingerprint` no tensor's bytes are read: a tensor is its identity, version
    counter and metadata, so rebinding it (``self.load = x``) or changing it in place
    (``self.load += x``, ``.add_()``, ``.copy_()``) shows, while a write through ``.data``
    (which bypasses the version counter) does not.  Containers compare by type, length and
    their items (``depth`` levels down, up to ``_MAX_ITEMS`` each); objects of user classes
    by identity and their ``__dict__``; numbers by bits.  Types are read with ``type()``, not
    ``isinstance``, which asks a value for its ``__class__``: a class with its own
    ``__getattribute__`` (a transformers config) answers that in Python.  What a type is (a number, a container
    ...) is looked up once per type (:func:`_kind`).
    """
    cls = type(value)
    if cls in AS_IS:
        return value
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _kind(cls)
    if kind == _SCALAR:
        return value
    if kind == _BOOL:
        return ("bool", value)
    if kind == _FLOAT:
        return ("float", float_bits(value))
    if kind == _TENSOR:
        return ("tensor", id(value), value._version, tuple(value.shape), value.dtype)
    if depth <= 0 or kind == _IDENTITY or callable(value):
        return ("id", id(value))
    below = depth - 1
    if kind == _SEQUENCE:
        # a list or tuple itself is read as it is; a subclass through its slicing, as ever
        items = value if (cls is list or cls is tuple) and len(value) <= _MAX_ITEMS else value[:_MAX_ITEMS]
        return (cls.__name__, len(value), tuple([v if type(v) in AS_IS else _item(v, below) for v in items]))
    if kind == _DICT:
        pairs = list(dict.items(value))[:_MAX_ITEMS]
        return ("dict", len(value), tuple([(k if isinstance(k, (str, int)) else id(k),
                                            v if type(v) in AS_IS else _item(v, below)) for k, v in pairs]))
    if kind == _SET:
        return (cls.__name__, len(value), frozenset([shallow(v, 0) for v in list(value)[:_MAX_ITEMS]]))
    if kind == _LOGGER:
        return fingerprint(value)
    attrs = _attributes(value)
    if isinstance(attrs, dict):
        pairs = list(attrs.items())[:_MAX_ITEMS]
        return ("object", id(value), tuple([(k, v if type(v) in AS_IS else _item(v, below)) for k, v in pairs]))
    return ("id", id(value))


#: per type whose ``__getattribute__`` is its own: whether an instance's ``__dict__`` is read
#: directly (a transformers config answers ``getattr(config, "__dict__")`` through its
#: ``__getattribute__``, a Python call, where the slot is read in C; a state read asks it of every layer)
_DIRECT_DICT: dict[type, bool] = {}
_OBJECT_GETATTRIBUTE = object.__getattribute__


def _attributes(value: Any) -> Any:
    """``getattr(value, "__dict__", None)``, read from the instance's slot where its type was
    seen to give the same dict that way (the first instance of each type is asked both ways: a
    proxy that answers with another object's ``__dict__`` is always asked its own way)."""
    cls = type(value)
    if cls.__getattribute__ is _OBJECT_GETATTRIBUTE:
        return getattr(value, "__dict__", None)
    direct = _DIRECT_DICT.get(cls)
    if direct is None:
        attrs = getattr(value, "__dict__", None)
        try:
            direct = attrs is not None and _OBJECT_GETATTRIBUTE(value, "__dict__") is attrs
        except AttributeError:
            direct = False
        if len(_DIRECT_DICT) >= _KINDS_SIZE:
            _DIRECT_DICT.clear()
        _DIRECT_DICT[cls] = direct
        return attrs
    return _OBJECT_GETATTRIBUTE(value, "__dict__") if direct else getattr(value, "__dict__", None)


#: exact types of a container's items whose print, one level down, is the same while the item
#: is the same object: immutable values, classes, and tuples without a tensor (checked when kept)
_STABLE = AS_IS | {bool, float, type}
#: what :func:`kept_shallow` keeps of an object: the object, its names, the objects it held, the
#: indices of those whose print is read again, their prints, its print
_Kept = tuple[Any, tuple, tuple, tuple[int, ...], tuple, Any]
#: id(value) -> what :func:`kept_shallow` answered last for it
_KEPT: dict[int, _Kept] = {}
_KEPT_SIZE = 256


def kept_shallow(value: Any) -> Any:
    """:func:`shallow` of ``value``, answered from its last print while the same object holds
    the same names and the very same objects (one C-level pass over each), only the prints of
    its mutable items (a list, a dict, an object, a tensor) made again.

    ``watch()`` reads the same large objects at every invocation, three or four times: a
    transformers config held by every layer (about 40 attributes), a module-level table a
    region reads (transformers' ``ACT2FN``, 24 classes and tuples).  Their prints are made of
    their items' identities and, one level down, of their mutable items' contents; an item that
    is the same immutable object prints the same, so only the mutable ones are read again.
    Exact as :func:`shallow` is: a name added, removed or rebound, or a mutable item changed
    within the depth :func:`shallow` reads, is a new print.  Prints are kept while some reader
    holds them (:func:`hold_kept`: a ``watch()`` block, a recompute probe) and dropped, with the
    objects they hold, when the last one lets go.  With no reader this is :func:`shallow`.
    """
    if not _KEPT_HOLD.count:
        return shallow(value)
    cls = type(value)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _kind(cls)
    if kind == _DICT:
        mapping = value
    elif kind == _OBJECT and not callable(value):
        mapping = _attributes(value)
        if not isinstance(mapping, dict):
            return shallow(value)
    else:
        return shallow(value)
    if len(mapping) > _MAX_ITEMS:
        return shallow(value)
    kept = _KEPT.get(id(value))
    # names by identity too: a key that is another object equal to the old one prints by its id
    # (the dict's views against the kept tuples, in C-level passes, no tuple made)
    if kept is not None and kept[0] is value and len(mapping) == len(kept[1]) \
            and not any(map(_IS_NOT, kept[1], dict.keys(mapping))) \
            and not any(map(_IS_NOT, kept[2], dict.values(mapping))):
        _, _, items, unstable, held, printed = kept
        if all(_same_item(items[index], before) for index, before in zip(unstable, held)):
            return printed
    names, items = tuple(dict.keys(mapping)), tuple(dict.values(mapping))
    printed = shallow(value)
    # an item of a type that is stable as such is passed over without a call (a config's ~40)
    unstable = tuple([index for index, (item, cls) in enumerate(zip(items, map(type, items)))
                      if cls not in _STABLE and not _stable(item)])
    if len(_KEPT) >= _KEPT_SIZE:
        _KEPT.clear()
    _KEPT[id(value)] = (value, names, items, unstable, tuple(_hold(items[index]) for index in unstable), printed)
    return printed


def _hold(item: Any) -> tuple[bool, Any]:
    """What tells whether a mutable item prints the same one level down: the objects its print is
    made of (``(True, objects)``, see :func:`_held`), else its print (``(False, print)``)."""
    objects = _held(item)
    return (True, objects) if objects is not None else (False, _item(item, 1))


def _same_item(item: Any, before: tuple[bool, Any]) -> bool:
    held, kept = before
    # the same objects as when kept, which were checked then to hold no tensor
    return same_objects(kept, _objects(item)) if held else _item(item, 1) == kept


def same_objects(before: tuple | None, now: tuple | None) -> bool:
    """Whether two tuples hold the very same objects (None: not comparable)."""
    return before is not None and now is not None and len(before) == len(now) and all(map(_IS, before, now))


def _objects(item: Any) -> tuple | None:
    """The objects a list's, a tuple's or a dict's print one level down is made of (a dict's
    names and values), or None for anything else."""
    cls = type(item)
    if cls is list or cls is tuple:
        return tuple(item) if len(item) <= _MAX_ITEMS else None
    if cls is not dict:
        kind = _KINDS.get(cls)
        if (_kind(cls) if kind is None else kind) != _DICT:
            return None
    return (*dict.keys(item), _SEPARATOR, *dict.values(item)) if len(item) <= _MAX_ITEMS else None


def _held(item: Any) -> tuple | None:
    """The objects a mutable item's print one level down is made of (:func:`_objects`), or None
    where it is read again at every print: a container holding a tensor (printed by its
    version), a set, anything else.  One level down an item's own items print by their identity
    or, for numbers, by value, so the same objects make the same print."""
    objects = _objects(item)
    return None if objects is None or _holds_tensor(objects) else objects


#: between a dict's keys and its values in what :func:`_held` keeps (one key moved to the values
#: is another tuple)
_SEPARATOR = object()


def _stable(item: Any) -> bool:
    """Whether ``item``, of a type not in ``_STABLE`` (:func:`kept_shallow` passes those over),
    prints the same one level down (``_item(item, 1)``) while it is the same object: a tuple
    without a tensor (its items print by identity, a tensor by its version), or an object of an
    immutable type printed by its identity alone (a function, a ``partial``, a ``ContextVar``:
    such a type cannot be changed, nor assigned to an object as its ``__class__``)."""
    if type(item) is tuple:
        return not _holds_tensor(item[:_MAX_ITEMS])
    return bool(type(item).__flags__ & _IMMUTABLE_TYPE) and _item(item, 1) == ("id", id(item))


#: ``Py_TPFLAGS_IMMUTABLETYPE`` (Python 3.10): the built-in types, and those C extensions declare so
_IMMUTABLE_TYPE = 1 << 8


def _holds_tensor(objects: tuple) -> bool:
    """Whether any of ``objects`` is a tensor, by its type's kind (``isinstance(x, Tensor)`` asks
    torch's metaclass): a few types a container."""
    for item_type in set(map(type, objects)):
        item_kind = _KINDS.get(item_type)
        if (_kind(item_type) if item_kind is None else item_kind) == _TENSOR:
            return True
    return False


_IS = operator.is_
_IS_NOT = operator.is_not
#: the readers that keep the kept prints (see :func:`hold_kept`); the last to let go puts them
#: to sleep
_KEPT_HOLD = Hold("hold_kept", last=_KEPT.clear)


def hold_kept() -> None:
    """Keep :func:`kept_shallow`'s prints until as many :func:`release_kept` calls."""
    _KEPT_HOLD.take()


def release_kept() -> None:
    """Let go of one hold; with the last, the kept prints are dropped.  Raises without a hold."""
    _KEPT_HOLD.release()


@dataclass
class Observed:
    """One piece of state as seen after a run: ``value`` is a tensor copy or a fingerprint."""

    kind: str
    subject: str
    value: Any
    shown: str = ""


class _Missing:
    def __repr__(self) -> str:
        return "<absent>"


#: Stands for a key that a namespace does not hold.
MISSING = _Missing()
