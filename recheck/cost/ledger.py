"""A ledger of live storages: what is allocated, what autograd holds, and in which category.

Two totals are kept, both deduplicated by storage (two views of one buffer count once):

* **observed** — every storage created by an operator during the traced step, plus the
  state that existed before it (parameters, buffers, gradients, optimizer state, loose
  tensors), until the storage is freed.  Its maximum is the observed peak; the split
  by category at that moment is the peak breakdown.
* **retained saved state** — storages autograd holds for backward: tensors saved by
  operators, inputs a checkpoint keeps, and (non-reentrant) the set a recompute
  rebuilt, until released.  Parameter and buffer storages are excluded: they are alive
  anyway and reported under parameters.

Storages are followed with weak references (a storage's Python object is preserved
while it lives), so the ledger never extends a lifetime.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CATEGORIES", "HOLD_KINDS", "Ledger", "storage_key"]

#: Categories of the observed peak breakdown, in display order.
CATEGORIES = ("parameters", "gradients", "optimizer_state", "saved_activations", "checkpoint_inputs", "temporary",
              "other")
#: Why autograd holds a storage: saved by an operator, kept by a checkpoint, rebuilt by a recompute.
HOLD_KINDS = ("saved", "input", "recomputed")
_HOLD_CATEGORY = {"saved": "saved_activations", "input": "checkpoint_inputs", "recomputed": "saved_activations"}
_FIXED = ("parameters", "gradients", "optimizer_state")


def storage_key(storage: Any) -> int:
    """A key unique to a live storage (its StorageImpl address)."""
    return int(storage._cdata)


@dataclass
class _Entry:
    nbytes: int
    base: str
    observed: bool
    ref: Any = None
    holders: int = 0
    kind: str | None = None
    category: str = "other"


@dataclass
class Ledger:
    """Live storages by category, with peaks and a timeline of both totals.

    ``phase`` is set by the tracer before each operator; ``phase_peaks`` keeps the observed
    peak of each phase (the memory budget fits each phase separately).
    """

    entries: dict[int, _Entry] = field(default_factory=dict)
    by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    by_hold: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HOLD_KINDS, 0))
    observed_total: int = 0
    observed_peak: int = 0
    peak_breakdown: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    saved_total: int = 0
    saved_peak: int = 0
    saved_peak_split: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HOLD_KINDS, 0))
    timeline: list[tuple[int, int]] = field(default_factory=list)
    phase: str = "forward"
    phase_peaks: dict[str, int] = field(default_factory=dict)
    #: told of every event, in order, through whichever of these methods each has: ``created(key)``
    #: (a new storage), ``held(key, entry, first)`` (every hold; ``first``: it was not held before),
    #: ``released(key, entry)`` (the last release) and ``read(args, kwargs)`` (the tracer's, after each
    #: operator, with its inputs); the totals already include a hold and still include a release
    listeners: list[Any] = field(default_factory=list)

    def tell(self, event: str, *args: Any) -> None:
        """Call ``event(*args)`` on every listener that has that method."""
        for listener in self.listeners:
            method = getattr(listener, event, None)
            if method is not None:
                method(*args)

    def track(self, storage: Any, base: str = "temporary", observed: bool = True) -> int:
        """Follow ``storage`` (no-op when already followed); returns its key."""
        key = storage_key(storage)
        entry = self.entries.get(key)
        if entry is not None:
            if observed and not entry.observed:
                entry.observed, entry.base = True, base
                self._categorise(entry)
                self._count(entry, +1)
            return key
        entry = _Entry(nbytes=int(storage.nbytes()), base=base, observed=observed)
        entry.ref = weakref.ref(storage, functools.partial(self._on_death, key))
        self.entries[key] = entry
        self._categorise(entry)
        if observed:
            self._count(entry, +1)
        self.tell("created", key)
        return key

    def set_base(self, storage: Any, base: str) -> None:
        """Reclassify a followed storage (a tensor that became a gradient or optimizer state)."""
        key = self.track(storage, base)
        entry = self.entries[key]
        if entry.base != base:
            self._count(entry, -1)
            entry.base = base
            self._categorise(entry)
            self._count(entry, +1)

    def hold(self, storage: Any, kind: str) -> int:
        """Autograd holds ``storage`` for ``kind`` (one of :data:`HOLD_KINDS`); returns its key."""
        key = self.track(storage, base="other", observed=False)
        entry = self.entries[key]
        entry.holders += 1
        if entry.holders == 1:
            entry.kind = kind
            self.saved_total += entry.nbytes
            self.by_hold[kind] += entry.nbytes
            self._recount(entry)
            self._sample()
        self.tell("held", key, entry, entry.holders == 1)
        return key

    def release(self, key: int) -> None:
        """One holder of ``key`` let go; the last one takes it out of the retained total."""
        entry = self.entries.get(key)
        if entry is None or entry.holders == 0:
            return
        entry.holders -= 1
        if entry.holders == 0:
            self.tell("released", key, entry)
            self.saved_total -= entry.nbytes
            self.by_hold[entry.kind or "saved"] -= entry.nbytes
            entry.kind = None
            self._recount(entry)
            if not entry.observed and entry.ref() is None:
                del self.entries[key]
            self._sample()

    def nbytes(self, key: int) -> int:
        """Size of the followed storage ``key`` (0 when not followed)."""
        entry = self.entries.get(key)
        return 0 if entry is None else entry.nbytes

    def _on_death(self, key: int, _ref: Any) -> None:
        self._died(key)

    def _died(self, key: int) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        if entry.holders:  # only a recomputed set is held by lifetime, never past it
            self.tell("released", key, entry)
            self.saved_total -= entry.nbytes
            self.by_hold[entry.kind or "saved"] -= entry.nbytes
            entry.holders = 0
        if entry.observed:
            self._count(entry, -1)
        self._sample()

    def _categorise(self, entry: _Entry) -> None:
        if entry.base in _FIXED or not entry.holders:
            entry.category = entry.base
        else:
            entry.category = _HOLD_CATEGORY[entry.kind or "saved"]

    def _recount(self, entry: _Entry) -> None:
        if entry.observed:
            self._count(entry, -1)
        self._categorise(entry)
        if entry.observed:
            self._count(entry, +1)

    def _count(self, entry: _Entry, sign: int) -> None:
        self.by_category[entry.category] += sign * entry.nbytes
        self.observed_total += sign * entry.nbytes
        if sign > 0:
            self._sample()

    def _sample(self) -> None:
        if self.observed_total > self.phase_peaks.get(self.phase, 0):
            self.phase_peaks[self.phase] = self.observed_total
        if self.observed_total > self.observed_peak:
            self.observed_peak = self.observed_total
            self.peak_breakdown = dict(self.by_category)
        if self.saved_total > self.saved_peak:
            self.saved_peak = self.saved_total
            self.saved_peak_split = dict(self.by_hold)

    def mark(self) -> None:
        """Append the current (observed, retained) totals to the timeline."""
        self.timeline.append((self.observed_total, self.saved_total))
