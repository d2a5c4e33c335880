"""Comparable views of Python values: fingerprints and their display.

:func:`fingerprint` turns any value into a comparable structure: numbers by bits,
tensors by :func:`~recheck.runtime.digests.tensor_digest`, containers by content and length;
:func:`show` displays a value in a finding.  The RNG streams are read and restored by
:mod:`recheck.runtime.rng`; both are re-exported by :mod:`recheck.runtime.snapshot`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import logging
import operator
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from recheck.findings import one_line
from recheck.runtime.bits import bits_float, float_bits
from recheck.runtime.digests import tensor_digest

__all__ = ["AS_IS", "MISSING", "alike_but_identity", "by_identity", "is_library", "MODULE_INTERNALS", "Observed", "fingerprint", "is_module_state", "module_state_names",
           "instance_dict", "items_of", "same_objects", "shallow", "show", "show_printed", "show_shallow", "showing"]

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


#: texts :func:`show_printed` made, by (id, type, fingerprint) of the value, most recent last; kept
#: only while a check or a ``watch()`` block is open (:func:`showing`): an ``id()`` names an object
#: only while it lives
_SHOWN: collections.OrderedDict[tuple[int, type, Any], str] = collections.OrderedDict()
_SHOWN_SIZE = 1024
_OPEN = [0]


@contextlib.contextmanager
def showing() -> Iterator[None]:
    """Keep :func:`show_printed`'s texts for the extent of a check or a ``watch()`` block; the
    outermost one lets them go when it ends."""
    _OPEN[0] += 1
    try:
        yield
    finally:
        _OPEN[0] -= 1
        if not _OPEN[0]:
            _SHOWN.clear()


def show_printed(value: Any, printed: Any) -> str:
    """:func:`show` of ``value`` whose :func:`fingerprint` is ``printed``, made once while the
    same object keeps the same fingerprint inside one check or ``watch()`` block.  A snapshot
    observes the same state several times (at entry, after each run), and a ``repr`` can cost far
    more than the fingerprint (a transformers config prints itself as JSON)."""
    if not _OPEN[0]:
        return show(value)
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


_LIBRARY_PREFIXES = ("torch", "numpy", "functools", "logging", "random", "typing", "builtins",
                     "collections", "contextlib", "warnings", "abc", "enum", "dataclasses")

#: The standard library's top-level modules: their globals (``sys.modules``, ``os.environ``) are
#: the interpreter's, not state a region keeps.
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


def is_library(module_name: str | None) -> bool:
    """Whether ``module_name`` (a ``__module__``) is torch's, numpy's or the standard library's:
    code a region runs there keeps no state of the project's (its globals, its classes'
    attributes), and objects of its classes are no plain objects of the project's."""
    top = (module_name or "").split(".")[0]
    return top in _LIBRARY_PREFIXES or (top in _STDLIB and top != "__main__")


#: callables that are code, whatever they hold: compared by identity
_CODE = (type, types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)


def by_identity(value: Any, cls: type) -> bool:
    """Whether the callable ``value`` (of class ``cls``) is compared by identity: a function,
    method, class or ``partial``, a descriptor (a compiled function), an object of torch's,
    numpy's or Python's own classes, one without a ``__dict__``.  A callable object of the
    project's classes (a functor that counts its calls, a scaler with a running value) is state,
    compared by its attributes as any object is: the counter it bumps again in a recompute is a
    finding."""
    return callable(value) and (issubclass(cls, _CODE) or is_library(cls.__module__)
                                or getattr(cls, "__get__", None) is not None or instance_dict(value) is None)


def instance_dict(value: Any) -> dict | None:
    """``value``'s own ``__dict__``, read without its class's attribute hooks (a config's
    ``__getattribute__`` is a Python call at every read, a proxy's may raise), or None where it
    has none that can be read.  Observing a value should not run its code: what that code does is
    the program's.  Only an object with no ``__dict__`` of its own (``__slots__``) is asked for
    one, where a proxy answers with its target's.
    """
    try:
        attrs = object.__getattribute__(value, "__dict__")
    except AttributeError:
        try:
            attrs = getattr(value, "__dict__", None)
        except Exception:  # noqa: BLE001 - its lookup raised: nothing to read
            return None
    except Exception:  # noqa: BLE001 - a __dict__ property that raised
        return None
    return attrs if issubclass(type(attrs), dict) else None


def items_of(value: Any, cls: type, limit: int = _MAX_ITEMS) -> tuple[int, Sequence[Any]]:
    """The length and first ``limit`` items (a dict's ``(key, value)`` pairs) of a list, tuple,
    dict, set or frozenset ``value`` of class ``cls``, read through the built-in type's own
    methods: a subclass's overridden ``__len__``, ``__getitem__``, ``items`` or ``__iter__`` is
    the program's code, not what the container holds.  A list or tuple of those exact types is
    given as it is where it is within ``limit`` (most are short: no copy)."""
    if cls is list or cls is tuple:
        size = len(value)
        return size, value if size <= limit else value[:limit]
    if issubclass(cls, dict):
        return dict.__len__(value), list(itertools.islice(dict.items(value), limit))
    base = next(kind for kind in (list, tuple, set, frozenset) if issubclass(cls, kind))
    return base.__len__(value), list(itertools.islice(base.__iter__(value), limit))


def fingerprint(value: Any, depth: int = _MAX_DEPTH) -> Any:
    """A hashable, comparable summary of ``value`` that changes when its content does.

    Floats compare by bit pattern (``-0.0`` and NaN payloads count); tensors by metadata
    and :func:`~recheck.runtime.digests.tensor_digest`; tuples, lists, dicts and sets by
    length and content (up to ``_MAX_ITEMS`` items and three levels, and a short list of plain
    scalars below that); objects of user classes, callable ones too, by their
    class and ``__dict__`` (never their identity or repr: two objects with equal state are equal);
    modules, code (:func:`by_identity`), generators (whose streams are compared as RNG state) and
    other objects by identity.

    A logger (transformers' modules all read theirs) is compared by what decides what a
    call emits: identity, level, ``disabled``, ``propagate`` and its handlers.  Its
    ``__dict__`` would reach its lookup cache (filled by the first call at each level) and
    the manager's registry of every logger in the process (grown by any import, torch's
    own during the first backward), which change without changing the region.
    """
    try:
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
        if depth <= 0 and not _plain_numbers(value):
            return ("id", type(value).__name__, id(value))
        if issubclass(cls, (torch.nn.Module, type)) or by_identity(value, cls):
            return ("id", type(value).__name__, id(value))
        # below, an item of an exact scalar type is printed in place, as fingerprint() prints it
        # (a transformers config holds a hundred of them, printed at every observation)
        if issubclass(cls, (list, tuple)):
            size, listed = items_of(value, cls)
            items = tuple((kind.__name__, v) if (kind := type(v)) in _SCALARS else fingerprint(v, depth - 1)
                          for v in listed)
            return (cls.__name__, size, items)
        if issubclass(cls, dict):
            size, pairs = items_of(value, cls)
            items = tuple(((kind.__name__, k) if (kind := type(k)) in _SCALARS else fingerprint(k, 1),
                           (kind.__name__, v) if (kind := type(v)) in _SCALARS else fingerprint(v, depth - 1))
                          for k, v in pairs)
            return (cls.__name__, size, items)
        if issubclass(cls, (set, frozenset)):
            size, listed = items_of(value, cls)
            return (cls.__name__, size, frozenset(fingerprint(v, depth - 1) for v in listed))
        if type(value).__module__ == "numpy" and hasattr(value, "tobytes"):
            return ("ndarray", getattr(value, "shape", ()), str(getattr(value, "dtype", "")),
                    value.tobytes())
        attrs = instance_dict(value)
        if attrs is not None and cls.__module__ not in ("builtins",):
            items = tuple((k, (kind.__name__, v) if (kind := type(v)) in _SCALARS else fingerprint(v, depth - 1))
                          for k, v in list(attrs.items())[:_MAX_ITEMS]
                          if not (k == "state" and issubclass(cls, torch.optim.Optimizer)))
            if issubclass(cls, torch.optim.Optimizer):  # its moments are compared one by one, as optimizer state
                items += (("state", ("parameters", len(value.state))),)
            return ("object", type(value).__qualname__, items)  # by state: an equal object is equal
        return ("id", type(value).__name__, id(value))
    except Exception:  # noqa: BLE001 - the value's own code raised (a __getattribute__, an overridden
        return ("id", type(value).__name__, id(value))  # container method): it is compared by identity


def _plain_numbers(value: Any) -> bool:
    """A short list or tuple of plain scalars (a scheduler's learning rates): printed by content
    even at the depth limit, where two runs that each build an equal one would differ by identity."""
    return type(value) in (list, tuple) and len(value) <= 64 and all(type(v) in _PLAIN for v in value)


#: The attributes every ``nn.Module`` has for its own bookkeeping (``_parameters``, hooks, ...):
#: never a module's *state* in the sense a finding means (``training`` is, and stays).
MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) - {"training"}


def is_module_state(name: str) -> bool:
    """Whether a module attribute is state a region may change (not torch's bookkeeping).

    Left out: :data:`MODULE_INTERNALS`, and names that start with two underscores, where
    torch keeps per-module registries of its own (the composable APIs'
    ``__composable_api_state_key_<uuid>``).
    """
    return name not in MODULE_INTERNALS and not name.startswith("__")


def module_state_names(module: torch.nn.Module) -> list[str]:
    """The names of ``module``'s attributes that :func:`is_module_state` accepts, in order: its
    ``__dict__`` passed over in C, as most of its names are torch's bookkeeping."""
    return [name for name in itertools.filterfalse(MODULE_INTERNALS.__contains__, vars(module))
            if not name.startswith("__")]


#: types :func:`shallow` returns as they are (a container's items of these skip the call)
AS_IS = frozenset({int, str, bytes, type(None)})

#: exact types :func:`fingerprint` prints as ``(type name, value)``: a container's items of
#: these are printed in place
_SCALARS = AS_IS | {bool}
_PLAIN = _SCALARS | {float}


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
    ``__getattribute__`` (a transformers config) answers that in Python.
    """
    try:
        cls = type(value)
        if cls in AS_IS:
            return value
        if issubclass(cls, bool):
            return ("bool", value)
        if issubclass(cls, (int, str, bytes)):
            return value
        if issubclass(cls, float):
            return ("float", float_bits(value))
        if issubclass(cls, torch.Tensor):
            return ("tensor", id(value), value._version, tuple(value.shape), value.dtype)
        if depth <= 0 or issubclass(cls, (torch.nn.Module, type, torch.Generator)) or by_identity(value, cls):
            return ("id", id(value))
        below = depth - 1
        if issubclass(cls, (list, tuple)):
            size, items = items_of(value, cls)
            return (cls.__name__, size, tuple([v if type(v) in AS_IS else _item(v, below) for v in items]))
        if issubclass(cls, dict):
            size, pairs = items_of(value, cls)
            return ("dict", size, tuple([(k if isinstance(k, (str, int)) else id(k),
                                          v if type(v) in AS_IS else _item(v, below)) for k, v in pairs]))
        if issubclass(cls, (set, frozenset)):
            size, members = items_of(value, cls)
            return (cls.__name__, size, frozenset([shallow(v, 0) for v in members]))
        if issubclass(cls, _LOGGERS):
            return fingerprint(value)
        attrs = instance_dict(value)
        if attrs is not None:
            pairs = list(attrs.items())[:_MAX_ITEMS]
            return ("object", id(value), tuple([(k, v if type(v) in AS_IS else _item(v, below)) for k, v in pairs]))
        return ("id", id(value))
    except Exception:  # noqa: BLE001 - the value's own code raised (a __getattribute__, an overridden
        return ("id", id(value))  # container method): it is compared by identity


def show_shallow(printed: Any) -> str:
    """A :func:`shallow` print as a finding shows a value that is gone (a field's value at forward,
    of an object changed in place since): plain values as they were, a tensor by its metadata and
    version, a short container of plain values as itself; anything printed by identity, or by
    content too large or deep to write out, is ``<another object>``, which is all a print tells."""
    text = _plain_text(printed)
    if text is not None:
        return one_line(text, 40)
    if type(printed) is tuple and len(printed) == 5 and printed[0] == "tensor":
        _, _, version, shape, dtype = printed
        return f"{str(dtype).removeprefix('torch.')}{list(shape)} (version {version})"
    if type(printed) is tuple and len(printed) == 3 and printed[0] in _BRACKETS and printed[1] == len(printed[2]) <= 8:
        opening, closing = _BRACKETS[printed[0]]
        if printed[0] == "dict":  # (keys of other types than str print as ints: maybe ids)
            texts = [f"{k!r}: {_plain_text(v)}" if type(k) is str and _plain_text(v) is not None else None
                     for k, v in printed[2]]
        else:
            texts = [_plain_text(v) for v in printed[2]]
        if None not in texts:
            comma = "," if len(texts) == 1 and printed[0] == "tuple" else ""
            return one_line(opening + ", ".join(map(str, texts)) + comma + closing, 40)
    return "<another object>"


#: the brackets a container of each printed kind is written with
_BRACKETS = {"dict": ("{", "}"), "list": ("[", "]"), "tuple": ("(", ")")}


def _plain_text(printed: Any) -> str | None:
    """The text of a print of a plain value (a number, a string, None, a bool), else None."""
    if type(printed) in AS_IS or isinstance(printed, (int, str, bytes)):  # (an enum's member prints as itself)
        return repr(printed)
    if type(printed) is tuple and len(printed) == 2 and printed[0] in ("bool", "float"):
        return repr(printed[1] if printed[0] == "bool" else bits_float(printed[1]))
    return None


def alike_but_identity(a: Any, b: Any) -> bool:
    """Whether two :func:`fingerprint` prints are equal but where each holds an object printed by
    identity (a callable, a module, an object without readable attributes or deeper than a print
    looks) of the same type: two such objects' state cannot be compared, so no difference between
    them can be told (a step that builds a fresh one each run); any other difference counts."""
    if a == b:
        return True
    if type(a) is not tuple or type(b) is not tuple or len(a) != len(b):
        return False
    if len(a) == 3 and a[0] == b[0] == "id" and a[1] == b[1]:  # (a scalar item prints as a pair)
        return True
    return all(map(alike_but_identity, a, b))


def same_objects(before: tuple | None, now: tuple | None) -> bool:
    """Whether two tuples hold the very same objects (None: not comparable)."""
    return before is not None and now is not None and len(before) == len(now) and all(map(operator.is_, before, now))


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
