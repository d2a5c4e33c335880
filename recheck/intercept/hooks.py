"""One base for everything that intercepts checkpoint calls: it decides forward vs recompute once.

The patches (:mod:`recheck.intercept.patches`) route every checkpoint entry point to a
:class:`Interceptor`: ``torch.utils.checkpoint.checkpoint()``, the non-reentrant generator
that the composable ``checkpoint(module)`` API and torch 2.14's curried form drive, and
``CheckpointFunction.forward`` (direct ``apply``).  Whatever the entry point, the base turns the
call into one :class:`CheckpointCall` (the region function, its name and call site, the
checkpoint options, the labels in force) and then either

* **bypasses** it, when the subclass says so: the region function runs directly, under
  grad, exactly as if the checkpoint call were not there (``recheck cost``'s second mode,
  ``check_step``'s uncheckpointed twin); or
* runs the real entry point with the region function wrapped in a :class:`RegionFunction`.
  torch calls that same object for the forward and for every recompute, so the first call of
  an invocation is its forward and every later one a recompute of *that* forward: this is how
  a recompute is matched to its own forward, by identity, never by shape.

Subclasses see each run of a region function through :meth:`Interceptor.region_run` with its
:class:`Phase`, and torch's own checkpoint code around it through
:meth:`Interceptor.around_machinery`.  ``watch()``'s dispatcher and the cost report's router
are the two subclasses.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch

from recheck.runtime.naming import RegionKey, call_site, describe
from recheck.runtime.tags import current_tags

__all__ = ["CHECKPOINT_OPTIONS", "CheckpointCall", "Interceptor", "Phase", "RegionFunction", "Run"]

#: Keyword arguments ``torch.utils.checkpoint.checkpoint`` consumes itself; the rest go to the region.
CHECKPOINT_OPTIONS = frozenset(
    {"use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug", "early_stop"}
)

_SIGNATURES: dict[Any, inspect.Signature] = {}


class Phase(enum.Enum):
    """Which run of a region function this is."""

    #: the invocation's first run: its forward
    FORWARD = "forward"
    #: a later run of the same invocation: a recomputation (in backward, or a full replay)
    RECOMPUTE = "recompute"
    #: the region called directly instead of checkpointed (bypass mode)
    BYPASS = "bypass"


@dataclass
class CheckpointCall:
    """One checkpoint invocation, whichever entry point made it.

    ``entry`` is ``"checkpoint"`` (non-reentrant ``checkpoint()``), ``"reentrant"``
    (``checkpoint(use_reentrant=True)``, or ``None``, which torch treats as reentrant),
    ``"generator"`` (the composable API, the curried form) or ``"apply"`` (a direct
    ``CheckpointFunction.apply``).  ``options`` holds what the call says of
    ``use_reentrant``, ``preserve_rng_state`` and ``early_stop``.  ``state`` is the
    subclass's own object for the invocation (a watch record, a cost region's figures).
    """

    function: Any
    entry: str
    region: RegionKey
    tags: Mapping[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    grad_enabled: bool = True
    runs: int = 0
    state: Any = None

    @property
    def reentrant(self) -> bool:
        return self.entry in ("reentrant", "apply")

    @property
    def preserve_rng_state(self) -> bool:
        return bool(self.options.get("preserve_rng_state", True))


@dataclass
class Run:
    """One run of a region function, as :meth:`Interceptor.region_run` sees it."""

    output: Any = None
    has_output: bool = False


class RegionFunction:
    """The user's callable as torch sees it: its first call is the forward, later ones recompute."""

    __slots__ = ("function", "call", "interceptor", "__weakref__")

    def __init__(self, function: Callable[..., Any], call: CheckpointCall, interceptor: Interceptor) -> None:
        self.function, self.call, self.interceptor = function, call, interceptor

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self.call
        call.runs += 1
        phase = Phase.FORWARD if call.runs == 1 else Phase.RECOMPUTE
        return self.interceptor.run_region(call, phase, self.function, args, kwargs)

    def __repr__(self) -> str:
        return f"<recheck region {self.function!r}>"


class Interceptor:
    """The :class:`recheck.intercept.patches.Hooks` every recheck face builds on.

    Override :meth:`active`, :meth:`started`, :meth:`bypass`, :meth:`region_run`,
    :meth:`around_machinery`, :meth:`configure_generator`, :meth:`released`,
    :meth:`cannot_bypass` and :meth:`compiled` as needed; the defaults run everything as
    written.
    """

    # -- what subclasses decide ------------------------------------------------------------

    def active(self) -> bool:
        """Whether calls are intercepted now (False: they go straight to torch)."""
        return True

    def started(self, call: CheckpointCall) -> None:
        """A new invocation is about to run its forward (or be bypassed)."""

    def bypass(self, call: CheckpointCall) -> bool:
        """Whether to call the region directly instead of checkpointing it."""
        return False

    def region_run(self, call: CheckpointCall, phase: Phase, args: tuple | None = None,
                   kwargs: dict | None = None) -> contextlib.AbstractContextManager[Run]:
        """A context manager around one run of the region function, called with ``args``.

        It yields a :class:`Run`; when the run returns, ``run.output`` holds what the region
        returned.  A forward that runs between a generator's steps (the composable API) is
        seen from outside: its ``args`` are None and ``run.has_output`` stays False.  An
        exception raised by the region passes through the context manager.
        """
        return contextlib.nullcontext(Run())

    def run_region(self, call: CheckpointCall, phase: Phase, function: Callable[..., Any],
                   args: tuple, kwargs: dict) -> Any:
        """One run of the region function (its forward, a recompute, or the bypassed call)."""
        with self.region_run(call, phase, args, kwargs) as run:
            run.output = function(*args, **kwargs)
            run.has_output = True
        return run.output

    def around_machinery(self, call: CheckpointCall, run: Callable[[], Any]) -> Any:
        """torch's checkpoint code running outside the region function (saving its inputs)."""
        return run()

    def configure_generator(self, call: CheckpointCall, arguments: dict[str, Any]) -> Callable[[], None] | None:
        """Adjust the non-reentrant generator's bound arguments; return what undoes it, if anything."""
        return None

    def released(self, call: CheckpointCall) -> None:
        """torch dropped the region function (with its graph): no recompute can follow."""

    def cannot_bypass(self, call: CheckpointCall) -> None:
        """A direct ``CheckpointFunction.apply`` was asked to be bypassed; it stays checkpointed."""

    def compiled(self) -> None:
        """A checkpoint call was passed through untouched because torch.compile was tracing."""

    # -- plumbing ---------------------------------------------------------------------------

    def _new_call(self, function: Any, entry: str, options: dict[str, Any], grad_enabled: bool) -> CheckpointCall:
        call = CheckpointCall(function, entry, describe(function, call_site(3)), dict(current_tags()),
                              options, grad_enabled)
        self.started(call)
        return call

    def _wrap(self, function: Callable[..., Any], call: CheckpointCall) -> RegionFunction:
        wrapped = RegionFunction(function, call, self)
        weakref.finalize(wrapped, self.released, call)
        return wrapped

    # -- the Hooks protocol --------------------------------------------------------------

    def checkpoint(self, real: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``torch.utils.checkpoint.checkpoint(function, *args, **kwargs)``."""
        if not self.active() or not args:
            return real(*args, **kwargs)
        function, rest = args[0], args[1:]
        use_reentrant = kwargs.get("use_reentrant")
        entry = "reentrant" if use_reentrant is None or use_reentrant else "checkpoint"
        options = {k: kwargs[k] for k in ("use_reentrant", "preserve_rng_state", "early_stop") if k in kwargs}
        call = self._new_call(function, entry, options, torch.is_grad_enabled())
        if self.bypass(call):
            user_kwargs = {k: v for k, v in kwargs.items() if k not in CHECKPOINT_OPTIONS}
            call.runs += 1
            return self.run_region(call, Phase.BYPASS, function, rest, user_kwargs)
        wrapped = self._wrap(function, call)
        return self.around_machinery(call, lambda: real(wrapped, *rest, **kwargs))

    def reentrant_forward(self, real: Callable[..., Any], ctx: Any, run_function: Any, preserve: bool,
                          args: tuple) -> Any:
        """``CheckpointFunction.forward``: reached from ``checkpoint()`` or a direct ``apply``."""
        if isinstance(run_function, RegionFunction) or not self.active():
            return real(ctx, run_function, preserve, *args)
        grad = any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        call = self._new_call(run_function, "apply", {"use_reentrant": True, "preserve_rng_state": bool(preserve)},
                              grad)
        if self.bypass(call):
            self.cannot_bypass(call)
        wrapped = self._wrap(run_function, call)
        return self.around_machinery(call, lambda: real(ctx, wrapped, preserve, *args))

    def generator(self, original: Callable[..., Iterator[None]], args: tuple, kwargs: dict) -> Iterator[None]:
        """The non-reentrant generator: from ``checkpoint()`` (already wrapped), the composable
        API or the curried form (whose forward runs between the generator's two steps)."""
        signature = _SIGNATURES.get(original)
        if signature is None:
            signature = _SIGNATURES[original] = inspect.signature(original)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        function = arguments["fn"]
        if isinstance(function, RegionFunction):
            call, brackets = function.call, False
            call.options.setdefault("early_stop", arguments.get("early_stop"))
        elif self.active():
            options = {"use_reentrant": False, "preserve_rng_state": arguments.get("preserve_rng_state", True),
                       "early_stop": arguments.get("early_stop")}
            call = self._new_call(function, "generator", options, torch.is_grad_enabled())
            if self.bypass(call):
                return self._bypassed(call)
            arguments["fn"] = self._wrap(function, call)
            brackets = True
        else:
            return original(*args, **kwargs)
        undo = self.configure_generator(call, arguments)
        try:
            generator = original(*bound.args, **bound.kwargs)
        except BaseException:
            if undo is not None:
                undo()
            raise
        return self._drive(generator, call, undo, brackets)

    def _bypassed(self, call: CheckpointCall) -> Iterator[None]:
        call.runs += 1
        with self.region_run(call, Phase.BYPASS):
            yield

    def _drive(self, generator: Iterator[None], call: CheckpointCall, undo: Callable[[], None] | None,
               brackets: bool) -> Iterator[None]:
        """Run torch's generator; a forward that runs between its steps is bracketed as a run."""
        try:
            self.around_machinery(call, lambda: next(generator))
        finally:
            if undo is not None:
                undo()
        if brackets:
            call.runs += 1
            bracket = self.region_run(call, Phase.FORWARD)
            bracket.__enter__()
        try:
            yield
        except BaseException as exc:
            if brackets:
                bracket.__exit__(type(exc), exc, exc.__traceback__)
            try:
                generator.throw(exc)
            except StopIteration:
                return
            raise RuntimeError("recheck: torch's checkpoint generator yielded more than twice") from exc
        if brackets:
            bracket.__exit__(None, None, None)
        finished = self.around_machinery(call, lambda: next(generator, _DONE))
        if finished is not _DONE:
            raise RuntimeError("recheck: torch's checkpoint generator yielded more than twice")


_DONE = object()
