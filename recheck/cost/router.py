"""Route every checkpoint call of a step: run it as written, or bypass it (call the region).

The interception itself is ``recheck.intercept.patches`` (it swaps the function that
``torch.utils.checkpoint.checkpoint``'s exported wrapper closes over, the non-reentrant
generator used by the composable API, and ``CheckpointFunction.forward``); this module
is the :class:`~recheck.intercept.patches.Hooks` object it calls.  In ``"checkpoint"`` mode
the real checkpoint runs with the region function wrapped, so the cost tracer can tell a
region's forward from its recompute; in ``"bypass"`` mode the region function is called
directly, exactly as if the checkpoint call were not there.

The router keeps a stack of what is running: a *machinery* frame while torch's
checkpoint code runs outside the region (tensors it saves then are the checkpoint's kept
inputs) and a *call* frame while the region function runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from recheck.cost.work import Work
from recheck.intercept import patches
from recheck.runtime.naming import RegionKey, call_site, describe
from recheck.runtime.tags import current_tags

__all__ = ["CHECKPOINT_OPTIONS", "MODES", "ROUTER_MODE", "RegionCall", "RegionStats", "Router", "routing"]

#: The two ways every cost figure is measured, and the router mode that runs each.
MODES = ("checkpointed", "bypassed")
ROUTER_MODE = {"checkpointed": "checkpoint", "bypassed": "bypass"}

#: Keyword arguments ``torch.utils.checkpoint.checkpoint`` consumes itself; the rest go to the region.
CHECKPOINT_OPTIONS = frozenset(
    {"use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug", "early_stop"}
)


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


class _RegionFunction:
    """The region function as handed to torch's checkpoint: marks forward and recompute."""

    def __init__(self, function: Callable[..., Any], stats: RegionStats, router: Router) -> None:
        self.function, self.stats, self.router = function, stats, router
        self.labels: dict[str, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        recompute = torch._C._current_graph_task_id() != -1
        if not recompute:
            self.labels = dict(current_tags())
        call = self.router.enter_call(self.stats, recompute, self.labels)
        try:
            return self.function(*args, **kwargs)
        finally:
            self.router.exit_call(call)


class Router:
    """The :class:`recheck.intercept.patches.Hooks` of a cost measurement."""

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

    def region(self, function: Any, callsite: str | None) -> RegionStats:
        """The per-region figures of ``function`` checkpointed at ``callsite``."""
        key = describe(function, callsite)
        if key not in self.regions:
            self.regions[key] = RegionStats(key)
        return self.regions[key]

    def calls(self) -> list[RegionCall]:
        """The region calls running now, outermost first."""
        return [frame for frame in self.stack if isinstance(frame, RegionCall)]

    def machinery(self) -> _Machinery | None:
        """The checkpoint code running now outside any region function, if any."""
        return self.stack[-1] if self.stack and isinstance(self.stack[-1], _Machinery) else None

    def enter_call(self, stats: RegionStats, recompute: bool, labels: dict[str, Any] | None = None) -> RegionCall:
        """Push a region call; the tracer attributes operators and saved tensors to it."""
        call = RegionCall(stats, recompute, started=time.perf_counter(), labels=dict(labels or {}))
        if not recompute:
            stats.invocations += 1
        self.stack.append(call)
        return call

    def exit_call(self, call: RegionCall) -> None:
        """Pop ``call`` (it may end by an exception: early stop ends a recompute that way)."""
        if call in self.stack:
            del self.stack[self.stack.index(call) :]
        if call.recompute:
            call.stats.recompute_seconds += time.perf_counter() - call.started
            call.stats.recomputes += 1
            if self.on_recompute_end is not None:
                self.on_recompute_end(call)
        else:
            call.stats.saved_bytes += sum(call.saved.values())

    def _run_machinery(self, stats: RegionStats, run: Callable[[], Any]) -> Any:
        frame = _Machinery(stats)
        self.stack.append(frame)
        try:
            return run()
        finally:
            if frame in self.stack:
                del self.stack[self.stack.index(frame) :]
            stats.inputs_kept_bytes += sum(frame.inputs.values())

    # -- the Hooks protocol --------------------------------------------------------------
    def checkpoint(self, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``torch.utils.checkpoint.checkpoint(function, *args, **kwargs)``."""
        if not args:
            return original(*args, **kwargs)
        function, region_args = args[0], args[1:]
        stats = self.region(function, call_site(3))
        if self.mode == "bypass":
            user_kwargs = {k: v for k, v in kwargs.items() if k not in CHECKPOINT_OPTIONS}
            call = self.enter_call(stats, recompute=False)
            try:
                return function(*region_args, **user_kwargs)
            finally:
                self.exit_call(call)
        wrapped = _RegionFunction(function, stats, self)
        return self._run_machinery(stats, lambda: original(wrapped, *region_args, **kwargs))

    def generator(self, original: Callable[..., Iterator[None]], args: tuple, kwargs: dict) -> Iterator[None]:
        """The composable API's ``_checkpoint_without_reentrant_generator(module, ...)``."""
        function = args[0]
        if isinstance(function, _RegionFunction):  # checkpoint() itself, already routed
            return original(*args, **kwargs)
        stats = self.region(function, call_site(3))
        if self.mode == "bypass":
            return self._bypassed_generator(stats)
        wrapped = _RegionFunction(function, stats, self)
        inner = original(wrapped, *args[1:], **kwargs)
        return self._checkpointed_generator(stats, inner, wrapped)

    def _bypassed_generator(self, stats: RegionStats) -> Iterator[None]:
        call = self.enter_call(stats, recompute=False)
        try:
            yield
        finally:
            self.exit_call(call)

    def _checkpointed_generator(self, stats: RegionStats, inner: Iterator[None], wrapped: _RegionFunction) -> Iterator[None]:
        self._run_machinery(stats, lambda: next(inner))
        wrapped.labels = dict(current_tags())  # the forward runs here, not through the wrapper
        call = self.enter_call(stats, recompute=False, labels=wrapped.labels)
        try:
            yield
        finally:
            self.exit_call(call)
        self._run_machinery(stats, lambda: next(inner, None))

    def reentrant_forward(self, original: Callable[..., Any], ctx: Any, run_function: Any, preserve: bool, args: tuple) -> Any:
        """``CheckpointFunction.forward``: reached from ``checkpoint()`` or a direct ``apply``."""
        if isinstance(run_function, _RegionFunction):
            return original(ctx, run_function, preserve, *args)
        if self.mode == "bypass":
            note = "CheckpointFunction.apply called directly cannot be bypassed; those regions stayed checkpointed"
            if note not in self.notes:
                self.notes.append(note)
        stats = self.region(run_function, call_site(3))
        wrapped = _RegionFunction(run_function, stats, self)
        return self._run_machinery(stats, lambda: original(ctx, wrapped, preserve, *args))

    def compiled(self) -> None:
        """A checkpoint call inside torch.compile tracing ran untouched."""
        note = "checkpoint calls traced by torch.compile were neither observed nor bypassed"
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
