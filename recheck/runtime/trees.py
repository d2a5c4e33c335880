"""The one walk over nested values: outputs, inputs and arguments, with one path syntax.

A region's outputs and inputs nest tuples, lists, dicts (``OrderedDict``, transformers'
``ModelOutput``), namedtuples and dataclasses.  Every face names what it finds inside them the
same way, the way ``torch.testing.assert_close`` does::

    output[0]            a tuple or list item
    output['hidden']     a mapping's value (keys by ``repr``)
    output['h'].a        a namedtuple's field
    output.loss          a dataclass's field

Walking stops at :data:`MAX_DEPTH` levels and :data:`MAX_ITEMS` items of one container; what
lies beyond is one leaf (compared as a value, by fingerprint).  An empty container is a leaf
too, so ``()`` and ``[]`` outputs still compare by structure.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Mapping

import torch

__all__ = ["MAX_DEPTH", "MAX_ITEMS", "input_tensors", "leaves", "map_tensors", "tensors"]

#: Levels of nesting walked into.
MAX_DEPTH = 8
#: Items of one container walked into (the rest are not compared one by one).
MAX_ITEMS = 4096


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


#: leaves by type, told apart before the container tests (an ABC and a dataclass test per
#: leaf add up: every checkpoint invocation walks its arguments)
_ATOMS = frozenset({int, float, bool, str, bytes, type(None), complex})


def _children(value: Any, path: str) -> Iterator[tuple[str, Any]] | None:
    """The (path, child) pairs of a container, or None for a leaf."""
    kind = type(value)
    if kind in _ATOMS:
        return None
    if kind is tuple or kind is list:
        return ((f"{path}[{i}]", item) for i, item in enumerate(value[:MAX_ITEMS]))
    if _is_namedtuple(value):
        fields = type(value)._fields
        return ((f"{path}.{name}", item) for name, item in zip(fields[:MAX_ITEMS], value))
    if isinstance(value, (list, tuple)):
        return ((f"{path}[{i}]", item) for i, item in enumerate(value[:MAX_ITEMS]))
    if isinstance(value, Mapping):
        return ((f"{path}[{key!r}]", item) for key, item in list(value.items())[:MAX_ITEMS])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ((f"{path}.{spec.name}", getattr(value, spec.name))
                for spec in dataclasses.fields(value)[:MAX_ITEMS])
    return None


def leaves(value: Any, root: str = "output", depth: int = MAX_DEPTH) -> list[tuple[str, Any]]:
    """Every leaf under ``value`` with its path, in order (an empty container is one leaf)."""
    out: list[tuple[str, Any]] = []
    _collect(value, root, depth, out)
    return out


def _collect(value: Any, path: str, depth: int, out: list[tuple[str, Any]]) -> None:
    children = _children(value, path) if depth > 0 and not isinstance(value, torch.Tensor) else None
    if children is None:
        out.append((path, value))
        return
    before = len(out)
    for child_path, child in children:
        _collect(child, child_path, depth - 1, out)
    if len(out) == before:  # an empty container
        out.append((path, value))


def tensors(value: Any, root: str) -> list[tuple[str, torch.Tensor]]:
    """The tensors under ``value``, by path."""
    if isinstance(value, torch.Tensor):  # what most regions return
        return [(root, value)]
    if type(value) is tuple and len(value) <= MAX_ITEMS:  # what most regions are called with
        found = []
        for index, item in enumerate(value):
            if isinstance(item, torch.Tensor):
                found.append((f"{root}[{index}]", item))
            elif type(item) not in _ATOMS:
                break  # something nested: the walk below
        else:
            return found
    return [(path, leaf) for path, leaf in leaves(value, root) if isinstance(leaf, torch.Tensor)]


def input_tensors(args: tuple, kwargs: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The tensors a region is called with: ``args[0]``, ``kwargs['mask']``, ``args[1].a`` ..."""
    found = tensors(tuple(args), "args")
    return found + tensors(dict(kwargs), "kwargs") if kwargs else found


def map_tensors(function: Callable[[str, torch.Tensor], Any], value: Any, root: str,
                depth: int = MAX_DEPTH) -> Any:
    """``value`` rebuilt with every tensor replaced by ``function(path, tensor)``.

    Tuples, lists, namedtuples and dicts (of their own type where it can be rebuilt) are
    rebuilt; any other container, and anything past the walk's limits, is kept as it is.
    """
    if isinstance(value, torch.Tensor):
        return function(root, value)
    if depth <= 0:
        return value
    try:
        if _is_namedtuple(value):
            fields = type(value)._fields
            return type(value)._make(map_tensors(function, item, f"{root}.{name}", depth - 1)
                                     for name, item in zip(fields, value))
        if isinstance(value, (list, tuple)) and len(value) <= MAX_ITEMS:
            return type(value)(map_tensors(function, item, f"{root}[{i}]", depth - 1)
                               for i, item in enumerate(value))
        if isinstance(value, dict) and len(value) <= MAX_ITEMS:
            rebuilt = {key: map_tensors(function, item, f"{root}[{key!r}]", depth - 1)
                       for key, item in value.items()}
            return rebuilt if type(value) is dict else type(value)(rebuilt)
    except TypeError:  # a subclass whose constructor takes other arguments: keep it
        return value
    return value
