"""A counted hold on something process-wide that a ``watch()`` block keeps for its duration.

Several parts of the runtime keep work from one checkpoint invocation to the next while some
reader holds them: the logging patches (``effects``), the prints of large objects
(``fingerprints``), the working directory call sites are named against (``naming``).  Each is
set up when the first holder takes it and torn down when the last one lets go; holders nest
(a ``watch()`` block inside another, a recompute probe inside a block).  :class:`Hold` is that
count, in one place, so that every such hold behaves alike: a release without a hold raises,
and a hold is taken and let go under a lock.
"""

from __future__ import annotations

import threading
from typing import Callable

__all__ = ["Hold"]


def _nothing() -> None:
    return None


class Hold:
    """How many holders keep a thing; ``first`` runs when the first takes it, ``last`` when the
    last lets go, both under ``lock`` (the owner's own lock, where its other code reads what
    the hold guards under it; else a lock of the hold's own).

    ``count`` is read without the lock by the hot paths that only ask whether anything holds
    the thing (an int read is atomic); it moves only under the lock.
    """

    __slots__ = ("count", "first", "last", "lock", "name")

    def __init__(self, name: str, first: Callable[[], None] = _nothing, last: Callable[[], None] = _nothing,
                 lock: threading.Lock | threading.RLock | None = None) -> None:
        #: the name of the function that takes it (``hold_logging``): its release's says ``release_``
        self.name, self.first, self.last = name, first, last
        self.lock = threading.Lock() if lock is None else lock
        self.count = 0

    def take(self) -> None:
        """One more holder; the first one sets the thing up."""
        with self.lock:
            if not self.count:
                self.first()
            self.count += 1

    def release(self) -> None:
        """One holder less; the last one tears the thing down.  Raises where nothing holds it
        (a release without its hold is a bug in the caller, which a silent clamp would hide)."""
        with self.lock:
            if self.count <= 0:
                raise RuntimeError(f"recheck: {self.name.replace('hold_', 'release_', 1)}() without {self.name}()")
            self.count -= 1
            if not self.count:
                self.last()

    def __repr__(self) -> str:
        return f"Hold({self.name!r}, count={self.count})"
