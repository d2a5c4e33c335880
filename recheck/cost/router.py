"""Route every checkpoint call of a step: run it as written, or bypass it (call the region).

The :class:`Router` is the cost report's interceptor.  In ``"checkpoint"`` mode the real
checkpoint runs with the region function wrapped, so the tracer can tell a region's forward
from its recompute; in ``"bypass"`` mode the region function is called directly.  Its stack
holds a *machinery* frame while torch's checkpoint code runs outside the region (what it saves
then are the kept inputs) and a *call* frame while the region function runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from recheck.cost.work import Work
from recheck.intercept import patches
from recheck.intercept.hooks import CheckpointCall, Interceptor, Phase, Run
from recheck.runtime.naming import RegionKey

__all__ = ["MODES", "ROUTER_MODE", "RegionCall", "RegionStats", "Router", "routing"]

#: The two ways every cost figure is measured, and the router mode that runs each.
MODES = ("checkpointed", "bypassed")
ROUTER_MODE = {"checkpointed": "checkpoint", "bypassed": "bypass"}


@dataclass
class RegionStats:
    """What one region cost over one run of the step (summed over its invocations)."""

    key: RegionKey
    invocations: int = 0
    saved_bytes: int = 0
    inputs_kept_bytes: int = 0
    forward: Work = field(default_factory=Work)
    recompute: Work = field(default_factory=Work)
    recompute_seconds: float = 0.0
    recomputes: int = 0


@dataclass
class RegionCall:
    """One running call of a region function (its forward, or a recompute in backward)."""

    stats: RegionStats
    recompute: bool
    saved: dict[int, int] = field(default_factory=dict)
    created: list[Any] = field(default_factory=list)
    packs_seen: int = 0
    started: float = 0.0
    #: the ``recheck.tag`` labels of the region's forward (a recompute carries its forward's)
    labels: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Machinery:
    stats: RegionStats
    inputs: dict[int, int] = field(default_factory=dict)


class Router(Interceptor):
    """The interceptor of a cost measurement: every call checkpointed as written, or bypassed."""

    def __init__(self) -> None:
        self.mode = "checkpoint"
        self.stack: list[RegionCall | _Machinery] = []
        self.regions: dict[RegionKey, RegionStats] = {}
        self.notes: list[str] = []
        self.on_recompute_end: Callable[[RegionCall], None] | None = None

    # -- bookkeeping -------------------------------------------------------------------
    def reset(self, mode: str) -> None:
        """Start a new run in ``mode`` ("checkpoint" or "bypass"), with fresh per-region figures."""
        if mode not in ROUTER_MODE.values():
            raise ValueError(f"unknown mode {mode!r}")
        self.mode, self.stack, self.regions = mode, [], {}

    def calls(self) -> list[RegionCall]:
        """The region calls running now, outermost first."""
        return [frame for frame in self.stack if isinstance(frame, RegionCall)]

    def machinery(self) -> _Machinery | None:
        """The checkpoint code running now outside any region function, if any."""
        return self.stack[-1] if self.stack and isinstance(self.stack[-1], _Machinery) else None

    # -- the interceptor's decisions ---------------------------------------------------------
    def started(self, call: CheckpointCall) -> None:
        if call.region not in self.regions:
            self.regions[call.region] = RegionStats(call.region)
        call.state = self.regions[call.region]

    def bypass(self, call: CheckpointCall) -> bool:
        return self.mode == "bypass"

    @contextlib.contextmanager
    def region_run(self, call: CheckpointCall, phase: Phase, args: tuple | None = None,
                   kwargs: dict | None = None) -> Iterator[Run]:
        """A region call frame for the block: the tracer attributes operators and saved tensors to it."""
        # a region's first run during a backward is work of the recompute that made it (a
        # checkpoint nested inside a recomputed region), like the recompute itself
        recompute = phase is Phase.RECOMPUTE or (
            phase is Phase.FORWARD and torch._C._current_graph_task_id() != -1)
        stats: RegionStats = call.state
        frame = RegionCall(stats, recompute, started=time.perf_counter(), labels=dict(call.tags))
        if not recompute:
            stats.invocations += 1
        self.stack.append(frame)
        try:
            yield Run()
        finally:  # it may end by an exception: early stop ends a recompute that way
            if frame in self.stack:
                del self.stack[self.stack.index(frame) :]
            if recompute:
                stats.recompute_seconds += time.perf_counter() - frame.started
                stats.recomputes += 1
                if self.on_recompute_end is not None:
                    self.on_recompute_end(frame)
            else:
                stats.saved_bytes += sum(frame.saved.values())

    def around_machinery(self, call: CheckpointCall, run: Callable[[], Any]) -> Any:
        stats: RegionStats = call.state
        frame = _Machinery(stats)
        self.stack.append(frame)
        try:
            return run()
        finally:
            if frame in self.stack:
                del self.stack[self.stack.index(frame) :]
            stats.inputs_kept_bytes += sum(frame.inputs.values())

    def cannot_bypass(self, call: CheckpointCall) -> None:
        self._note("CheckpointFunction.apply called directly cannot be bypassed; those regions stayed checkpointed")

    def compiled(self) -> None:
        """A checkpoint call inside torch.compile tracing ran untouched."""
        self._note("checkpoint calls traced by torch.compile were neither observed nor bypassed")

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)


class routing:
    """``with routing(router):`` installs the interception for the block (nesting is refused).

    Every patched object is restored on exit (``is`` identity), by ``patches.release``.
    """

    def __init__(self, router: Router) -> None:
        self.router = router

    def __enter__(self) -> Router:
        if patches.installed() is not None:
            raise RuntimeError(
                "recheck.measure cannot run while checkpoint calls are already intercepted "
                "(inside recheck.watch() or another measure); run it outside that block"
            )
        patches.acquire(self.router)
        return self.router

    def __exit__(self, *exc: object) -> None:
        patches.release()
