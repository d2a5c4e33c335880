"""``recheck.tag(stage=..., microbatch=...)``: labels for the checkpoint calls made inside.

Tags live in a :class:`contextvars.ContextVar`, so they follow threads and asyncio tasks
the way the caller expects, and nested ``tag`` blocks merge (inner keys win).  A record
takes the tags active when its forward runs; the recompute, which autograd may run in
another thread, never needs them.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, Iterator, Mapping

__all__ = ["current_tags", "tag"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_tags: ContextVar[Mapping[str, Any]] = ContextVar("recheck_tags", default=_EMPTY)


@contextlib.contextmanager
def tag(**labels: Any) -> Iterator[Mapping[str, Any]]:
    """Label every checkpoint invocation made inside the block, e.g. ``tag(stage=1, microbatch=3)``.

    Labels are shown in findings (``call 2 of 8 (stage=1, microbatch=3)``) and kept in
    the JSON report.  Values should be short and printable; they are stored as given.
    Yields the merged labels now in force.
    """
    for key in labels:
        if not key.isidentifier():
            raise TypeError(f"recheck.tag: label names must be identifiers, got {key!r}")
    merged = MappingProxyType({**_tags.get(), **labels})
    token = _tags.set(merged)
    try:
        yield merged
    finally:
        _tags.reset(token)


def current_tags() -> Mapping[str, Any]:
    """The labels in force here (read-only; empty outside any ``tag`` block)."""
    return _tags.get()
