"""``recheck.watch()`` and ``recheck.tag()``: verify every checkpoint call a real program makes.

Modules, bottom to top: ``options`` (a block's options), ``capture`` (snapshots of module
state), ``records`` (one record per invocation, compared at recompute), ``probe`` (recomputes
of hand-written checkpoints, seen as module forwards during backward), ``dispatch`` (routes
intercepted calls to records), ``session`` (the ``watch()`` block), ``step`` (``recheck check
--step file.py:fn``), ``program`` (``recheck run``).  Labels, region names and tensor prints
are :mod:`recheck.runtime`'s ``tags``, ``naming`` and ``digests``; torch's entry points are
intercepted by :mod:`recheck.intercept`.

The names below load on first use, so ``recheck.intercept.patches`` (used by the cost
report to bypass checkpoint) can be imported without the session machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Watch", "tag", "watch"]

_WHERE = {"Watch": "recheck.watcher.session", "watch": "recheck.watcher.session", "tag": "recheck.runtime.tags"}

if TYPE_CHECKING:  # pragma: no cover
    from recheck.watcher.session import Watch, watch
    from recheck.runtime.tags import tag


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'recheck.watcher' has no attribute {name!r}")
