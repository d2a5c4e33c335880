"""The step's own checkpoint calls that a plan drops, run as direct calls under any interception.

A plan run is the step with *exactly* the plan's checkpoints: those the plan adds
(:mod:`~recheck.cost.planner.wrapping`) and the step's own calls it keeps; every other call
runs its region directly.  The same run is measured (under the cost router) and verified (under
``check_step``), so the dropping sits in front of whichever interceptor is installed (a
pass-through one when none is): inside ``with dropping(drop):`` its entry points ``checkpoint``,
``generator`` and ``foreign`` (another implementation's calls, through its own direct call)
first ask ``drop(function, key)``.  A direct ``CheckpointFunction.apply`` cannot be dropped; it
is counted in :attr:`Dropped.undroppable`.  The block affects every thread's calls.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from recheck.intercept import patches
from recheck.intercept.hooks import CHECKPOINT_OPTIONS, Interceptor, RegionFunction
from recheck.runtime.naming import RegionKey, call_site, describe

__all__ = ["Drop", "Dropped", "dropping"]

#: ``drop(function, key)``: whether the step's checkpoint call of ``function`` (region ``key``) runs directly.
Drop = Callable[[Any, RegionKey], bool]
#: ``around(function, key, args)``: a context manager around each direct call (the census opens a frame
#: in it); it yields a list, to which the call's output is appended when it returns.
Around = Callable[[Any, RegionKey, tuple], contextlib.AbstractContextManager[list]]

_ENTRY_POINTS = ("checkpoint", "generator", "reentrant_forward", "foreign")


@dataclass
class Dropped:
    """What a ``dropping`` block did: calls run directly, by region, and calls it could not drop."""

    calls: dict[RegionKey, int] = field(default_factory=dict)
    undroppable: int = 0

    def add(self, key: RegionKey) -> None:
        self.calls[key] = self.calls.get(key, 0) + 1


def _direct(frame: contextlib.AbstractContextManager[list]) -> Iterator[None]:
    with frame:
        yield  # the forward runs between the generator's two steps, uncheckpointed


def _nothing(_function: Any, _key: RegionKey, _args: tuple) -> contextlib.AbstractContextManager[list]:
    return contextlib.nullcontext([])


@contextlib.contextmanager
def dropping(drop: Drop, around: Around | None = None) -> Iterator[Dropped]:
    """Inside the block, every checkpoint call ``drop`` names runs its region directly
    (inside ``around(function, key, args)`` when given)."""
    around = around if around is not None else _nothing
    own = patches.installed() is None
    installation = patches.acquire(Interceptor()) if own else patches.installed()
    assert installation is not None
    hooks = installation.hooks
    previous = {name: hooks.__dict__.get(name) for name in _ENTRY_POINTS}
    originals = {name: getattr(hooks, name) for name in _ENTRY_POINTS}
    record = Dropped()

    def checkpoint(real: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if args and not isinstance(args[0], RegionFunction):
            function = args[0]
            key = describe(function, call_site(2))
            if drop(function, key):
                record.add(key)
                user_kwargs = {k: v for k, v in kwargs.items() if k not in CHECKPOINT_OPTIONS}
                with around(function, key, args[1:]) as outcome:
                    output = function(*args[1:], **user_kwargs)
                    outcome.append(output)
                return output
        return originals["checkpoint"](real, args, kwargs)

    def generator(original: Callable[..., Iterator[None]], args: tuple, kwargs: dict) -> Iterator[None]:
        function = inspect.signature(original).bind(*args, **kwargs).arguments.get("fn")
        if function is not None and not isinstance(function, RegionFunction):
            key = describe(function, call_site(2))
            if drop(function, key):
                record.add(key)
                return _direct(around(function, key, ()))
        return originals["generator"](original, args, kwargs)

    def reentrant_forward(real: Callable[..., Any], ctx: Any, run_function: Any, preserve: bool,
                          args: tuple) -> Any:
        if not isinstance(run_function, RegionFunction) and drop(run_function, describe(run_function, call_site(2))):
            record.undroppable += 1
        return originals["reentrant_forward"](real, ctx, run_function, preserve, args)

    def foreign(implementation: Any, real: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        function, named = implementation.region(args, kwargs)
        if callable(function) and not isinstance(function, RegionFunction):
            key = describe(named, call_site(2, implementation.skip_dirs))
            if drop(named, key):
                record.add(key)

                def run(region: Callable[..., Any], region_args: tuple, region_kwargs: dict) -> Any:
                    with around(named, key, region_args) as outcome:
                        output = region(*region_args, **region_kwargs)
                        outcome.append(output)
                    return output

                return implementation.direct(run, args, kwargs)
        return originals["foreign"](implementation, real, args, kwargs)

    for name, function in (("checkpoint", checkpoint), ("generator", generator),
                           ("reentrant_forward", reentrant_forward), ("foreign", foreign)):
        setattr(hooks, name, function)
    try:
        yield record
    finally:
        for name in _ENTRY_POINTS:
            if previous[name] is None:
                delattr(hooks, name)
            else:
                setattr(hooks, name, previous[name])
        if own:
            patches.release()
