"""Saved state by microbatch bundle: which stage and microbatch each retained storage belongs to.

A :class:`BundleTracker` listens to the ledger of a traced run and labels each held storage with
the ``(stage, microbatch)`` it was saved for: on a real pipeline (``labels="chunks"``) the chunk
the schedule runs (told by :mod:`recheck.intercept.pipelining`; the last stage's loss, run after
its chunk returns, belongs to the microbatch forwarded last); in a one-process planning run
(``labels="tags"``) the ``recheck.tag(stage=s)`` around each stage's forward, microbatch 0 (a
recompute carries its forward's tags; the loss belongs to the last stage tagged).

Within a stage, a storage held for several microbatches (each a view of the input batch) is
*shared*: counted once for the stage, not in the bundles.  A bundle's size is taken when its
backward begins.  Its *second-holder* bytes are what is still allocated when its backward has
ended though autograd is done with it (a recv buffer, a list the user's code appends to, a
recompute's rebuilt set still alive: torch's checkpoint frame, out of the ledger's sight, has
let go of it by then).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from recheck.cost.ledger import Ledger
from recheck.runtime.tags import current_tags

__all__ = ["Bundle", "BundleTracker", "StageBundles"]

_SHARED = -1


@dataclass
class Bundle:
    """The saved state of one microbatch on one stage."""

    stage: int
    microbatch: int
    live: int = 0
    at_backward: int | None = None
    backward_peak: int = 0
    in_backward: bool = False
    second_holders: int = 0
    inputs: int = 0
    received: int = 0
    keys: dict[int, Any] = field(default_factory=dict)


@dataclass
class StageBundles:
    """Per-stage figures of one traced run (bytes).

    ``retained_peak`` is the most bytes held at once for the stage's bundles and shared
    storages (a rank holding several stages has one such peak per stage);
    ``alive_at_peak`` the microbatches whose bundles held bytes at that moment.

    ``input_bytes`` and ``received_bytes`` (planning runs only) split a bundle's storages by
    where they were made: before any stage (the step's data) or in another stage (the
    activation a real pipeline receives into a recv buffer).
    """

    stage: int
    bundle_bytes: dict[int, int]
    backward_extra: int
    shared_bytes: int
    second_holder_bytes: dict[int, int]
    alive_at_peak: list[int]
    retained_peak: int
    input_bytes: int
    received_bytes: int
    order: list[str]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (microbatch keys as strings)."""
        return {f.name: {str(m): b for m, b in sorted(v.items())} if isinstance(v, dict) else v
                for f in fields(self) for v in [getattr(self, f.name)]}


def _kept_alive(entries: dict[int, Any], key: int, entry: Any) -> bool:
    """Still the same storage (not a new one at a reused address), allocated, and no longer held
    by autograd.  A recompute's rebuilt set is held for as long as it lives (the ledger cannot
    see torch's checkpoint frame let go of it), and that frame has let go by the end of the
    microbatch's backward: what of it is still allocated then is kept by a second holder."""
    if entry.ref() is None or (entry.holders and entry.kind != "recomputed"):
        return False
    return entries.get(key) is entry


class BundleTracker:
    """A ledger listener (and a pipelining chunk listener) that keeps :class:`Bundle` figures."""

    def __init__(self, labels: str = "chunks") -> None:
        if labels not in ("chunks", "tags"):
            raise ValueError(f"labels must be 'chunks' or 'tags', got {labels!r}")
        self.labels = labels
        self.ledger: Ledger | None = None
        self.tracer: Any = None
        self.bundles: dict[tuple[int, int], Bundle] = {}
        self.owners: dict[int, dict[int, int]] = {}
        self.shared: dict[int, int] = {}
        self.shared_peak: dict[int, int] = {}
        self.created_in: dict[int, int | None] = {}
        self.running: list[Any] = []
        self.last_forward: tuple[int, int] | None = None
        self.stage_live: dict[int, int] = {}
        self.stage_peak: dict[int, int] = {}
        self.alive_at_peak: dict[int, list[int]] = {}
        self.order: dict[int, list[str]] = {}
        self.backward_started = False

    def attach(self, tracer: Any) -> None:
        """Listen to ``tracer``'s ledger (call before entering the tracer)."""
        self.tracer, self.ledger = tracer, tracer.trace.ledger
        self.ledger.listeners.append(self)

    # -- labels -----------------------------------------------------------------------
    def _label(self) -> tuple[int, int] | None:
        if self.labels == "chunks":
            if self.running:
                action = self.running[-1]
                return action.stage, action.microbatch
            return self.last_forward if torch._C._current_graph_task_id() == -1 else None
        return self._tag_label()

    def _tag_label(self) -> tuple[int, int] | None:
        holding = getattr(self.tracer, "holding_for", None)
        calls = self.tracer.router.calls() if self.tracer is not None else []
        recompute = holding if holding is not None else calls[-1] if calls and calls[-1].recompute else None
        labels = recompute.labels if recompute is not None else current_tags()
        stage = labels.get("stage")
        if isinstance(stage, int):
            self.last_forward = (stage, 0)
            return stage, 0
        return self.last_forward if torch._C._current_graph_task_id() == -1 else None

    def _bundle(self, label: tuple[int, int]) -> Bundle:
        if label not in self.bundles:
            self.bundles[label] = Bundle(*label)
        return self.bundles[label]

    # -- the pipelining ChunkListener ------------------------------------------------------
    def chunk_begins(self, action: Any) -> None:
        self.running.append(action)
        self.order.setdefault(action.stage, []).append(f"{action.phase[0].upper()}{action.microbatch}")
        if action.phase == "forward":
            self.last_forward = (action.stage, action.microbatch)
        elif action.phase == "backward":
            bundle = self._bundle((action.stage, action.microbatch))
            bundle.at_backward, bundle.backward_peak, bundle.in_backward = bundle.live, bundle.live, True

    def chunk_ends(self, action: Any) -> None:
        if action in self.running:
            del self.running[len(self.running) - 1 - self.running[::-1].index(action)]
        if action.phase == "backward":
            bundle = self._bundle((action.stage, action.microbatch))
            bundle.in_backward = False
            bundle.second_holders = self._second_holders(bundle)

    def _second_holders(self, bundle: Bundle) -> int:
        entries: dict[int, Any] = self.ledger.entries if self.ledger is not None else {}
        return sum(int(entry.nbytes) for key, entry in bundle.keys.items() if _kept_alive(entries, key, entry))

    # -- the ledger's events ----------------------------------------------------------------
    def created(self, key: int) -> None:
        if self.labels == "tags":  # where a storage was made tells data and received activations apart
            label = self._label()
            self.created_in[key] = None if label is None else label[0]

    def held(self, key: int, entry: Any, first: bool) -> None:
        self._backward_begins()
        if first:
            self.owners.pop(key, None)
        label = self._label()
        if label is not None:
            stage, microbatch = label
            owners = self.owners.setdefault(key, {})
            owner = owners.get(stage)
            if owner is None:
                owners[stage] = microbatch
                bundle = self._bundle(label)
                bundle.keys[key] = entry
                if self.labels == "tags":
                    origin = self.created_in.get(key)
                    if origin is None:
                        bundle.inputs += entry.nbytes
                    elif origin != stage:
                        bundle.received += entry.nbytes
                self._add(bundle, entry.nbytes)
            elif owner not in (microbatch, _SHARED):
                owners[stage] = _SHARED
                self.bundles[(stage, owner)].live -= entry.nbytes
                self.shared[stage] = self.shared.get(stage, 0) + entry.nbytes
                self.shared_peak[stage] = max(self.shared_peak.get(stage, 0), self.shared[stage])

    def released(self, key: int, entry: Any) -> None:
        self._backward_begins()
        for stage, owner in self.owners.pop(key, {}).items():
            if owner == _SHARED:
                self.shared[stage] -= entry.nbytes
            else:
                self.bundles[(stage, owner)].live -= entry.nbytes
            self.stage_live[stage] -= entry.nbytes

    def _add(self, bundle: Bundle, nbytes: int) -> None:
        bundle.live += nbytes
        if bundle.in_backward:
            bundle.backward_peak = max(bundle.backward_peak, bundle.live)
        stage = bundle.stage
        self.stage_live[stage] = self.stage_live.get(stage, 0) + nbytes
        if self.stage_live[stage] > self.stage_peak.get(stage, 0):
            self.stage_peak[stage] = self.stage_live[stage]
            self.alive_at_peak[stage] = [m for (s, m), b in sorted(self.bundles.items()) if s == stage and b.live > 0]

    def _backward_begins(self) -> None:
        """Planning runs: the first event inside backward fixes every bundle's size."""
        if self.labels != "tags" or self.backward_started or torch._C._current_graph_task_id() == -1:
            return
        self.backward_started = True
        for bundle in self.bundles.values():
            bundle.at_backward, bundle.backward_peak, bundle.in_backward = bundle.live, bundle.live, True

    # -- results -------------------------------------------------------------------------
    def stages(self) -> list[int]:
        """The stages seen, in order."""
        return sorted({stage for stage, _ in self.bundles} | set(self.order))

    def figures(self, stage: int) -> StageBundles:
        """The figures of ``stage`` (bundle sizes, rebuilt set, shared and second-holder bytes)."""
        mine = {m: b for (s, m), b in sorted(self.bundles.items()) if s == stage}
        sizes = {m: (b.at_backward if b.at_backward is not None else b.live) for m, b in mine.items()}
        extra = max((b.backward_peak - sizes[m] for m, b in mine.items() if b.at_backward is not None), default=0)
        return StageBundles(stage, sizes, max(0, extra), self.shared_peak.get(stage, 0),
                            {m: b.second_holders for m, b in mine.items()}, list(self.alive_at_peak.get(stage, [])),
                            self.stage_peak.get(stage, 0), sum(b.inputs for b in mine.values()),
                            sum(b.received for b in mine.values()), list(self.order.get(stage, [])))
