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

Other checkpoint implementations (DeepSpeed, Megatron, fairscale, the functions a project
declares in ``checkpoint-functions``) reach the same base through :meth:`Interceptor.foreign`
with an :class:`Implementation` that says where their region function is and how to call it
directly (:mod:`recheck.intercept.implementations`); from there on a call is a call, whichever
library made it.  :func:`active_runs` tells what region runs are in progress on this thread
(the recompute probe leaves the recomputes recheck intercepts to the interceptor).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterator, Mapping, Protocol

import torch
import torch.utils.checkpoint as torch_checkpoint

from recheck.runtime.naming import RegionKey, call_site, describe
from recheck.runtime.tags import current_tags

__all__ = ["CHECKPOINT_OPTIONS", "ActiveRun", "CheckpointCall", "Implementation", "Interceptor", "Phase",
           "RegionFunction", "Run", "active_runs"]

#: Keyword arguments ``torch.utils.checkpoint.checkpoint`` consumes itself; the rest go to the region.
CHECKPOINT_OPTIONS = frozenset(
    {"use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug", "early_stop"}
)

class _Arguments:
    """The arguments of a call by parameter name, and the call they make again.

    What ``inspect.Signature.bind`` and ``apply_defaults`` give, for the non-reentrant
    generator's signatures, at a fraction of the cost (it runs for every checkpoint call):
    named parameters (positional or keyword, then keyword-only) in ``arguments``, the rest of
    ``*args`` and ``**kwargs`` kept aside.
    """

    __slots__ = ("layout", "arguments", "extra_args", "extra_kwargs")

    def __init__(self, layout: _Layout, args: tuple, kwargs: dict) -> None:
        positional, keyword_only, defaults, has_var, keyword_names, keyword_defaults, required = layout
        if len(args) > len(positional) and not has_var:
            raise TypeError(f"too many positional arguments ({len(args)})")
        named_keywords = not kwargs or kwargs.keys() <= keyword_names
        if len(args) >= len(positional) and (not required or required <= kwargs.keys()) and (
                named_keywords or kwargs.keys().isdisjoint(positional) and kwargs.keys().isdisjoint(keyword_names)):
            # every positional parameter given by position, and keywords either all for
            # keyword-only parameters or none (torch's ``checkpoint()`` calls its generator so at
            # every invocation: 2.13's options by position with the region's keywords spread,
            # 2.14's ``_impl`` the options by keyword): bound in C-level passes
            arguments = dict(zip(positional, args))
            if keyword_only:
                arguments.update(keyword_defaults)
            if named_keywords:
                arguments.update(kwargs)
                kwargs = {}
            self.layout, self.arguments = layout, arguments
            self.extra_args, self.extra_kwargs = args[len(positional):], dict(kwargs)
            return
        kwargs = dict(kwargs)
        arguments = {}
        given = min(len(args), len(positional))
        for index, name in enumerate(positional + keyword_only):
            if index < given:
                arguments[name] = args[index]
            elif name in kwargs:
                arguments[name] = kwargs.pop(name)
            elif name in defaults:
                arguments[name] = defaults[name]
            else:
                raise TypeError(f"missing argument {name!r}")
        self.layout, self.arguments = layout, arguments
        self.extra_args, self.extra_kwargs = tuple(args[len(positional):]), kwargs

    def call(self, function: Callable[..., Any]) -> Any:
        positional, keyword_only = self.layout[0], self.layout[1]
        get = self.arguments.__getitem__
        return function(*map(get, positional), *self.extra_args,
                        **dict(zip(keyword_only, map(get, keyword_only))), **self.extra_kwargs)


#: (positional names, keyword-only names, defaults, whether *args is taken, the keyword-only
#: names as a set, their defaults, and those of them without one)
_Layout = tuple[tuple[str, ...], tuple[str, ...], dict[str, Any], bool, frozenset[str], dict[str, Any],
                frozenset[str]]


def _layout(function: Any) -> _Layout:
    parameters = list(inspect.signature(function).parameters.values())
    kinds = inspect.Parameter
    keyword_only = tuple(p.name for p in parameters if p.kind is kinds.KEYWORD_ONLY)
    defaults = {p.name: p.default for p in parameters if p.default is not kinds.empty}
    return (tuple(p.name for p in parameters if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)),
            keyword_only, defaults, any(p.kind is kinds.VAR_POSITIONAL for p in parameters),
            frozenset(keyword_only), {name: defaults[name] for name in keyword_only if name in defaults},
            frozenset(name for name in keyword_only if name not in defaults))


class Phase(enum.Enum):
    """Which run of a region function this is."""

    #: the invocation's first run: its forward
    FORWARD = "forward"
    #: a later run of the same invocation: a recomputation (in backward, or a full replay)
    RECOMPUTE = "recompute"
    #: the region called directly instead of checkpointed (bypass mode)
    BYPASS = "bypass"


@dataclass(init=False)
class CheckpointCall:
    """One checkpoint invocation, whichever entry point made it.

    ``entry`` is ``"checkpoint"`` (non-reentrant ``checkpoint()``), ``"reentrant"``
    (``checkpoint(use_reentrant=True)``, or ``None``, which torch treats as reentrant),
    ``"generator"`` (the composable API, the curried form) or ``"apply"`` (a direct
    ``CheckpointFunction.apply``); for another implementation it is that implementation's
    entry point (``"deepspeed"``, ``"fairscale"``, ...; see ``implementation``).
    ``options`` holds what the call says of ``use_reentrant``, ``preserve_rng_state`` and
    ``early_stop``.  ``state`` is the subclass's own object for the invocation (a watch
    record, a cost region's figures).

    ``reentrant``: the forward runs under ``no_grad`` and the recompute in backward (torch's
    reentrant variant and every ``autograd.Function``-style implementation).
    ``needs_input_grad``: the output requires grad only when an input tensor does (torch's
    reentrant variant, DeepSpeed, Megatron; not fairscale, which adds a dummy input that does).
    ``grad_enabled`` is the grad mode at the checkpoint call.

    Nested checkpoints (timm's MetaFormer checkpoints each stage's blocks and the stages):
    ``outer`` is the call whose region was running when this call was made, ``nested`` the
    calls made during this call's forward, in order.  ``replaced``: the call was made inside
    the forward of a reentrant call, under its ``no_grad``; it is never recomputed itself, the
    outer call's recompute makes it again.  ``replays``: the call was made during a recompute
    of ``outer``, at the place where its forward made ``replays`` (same region): it is that
    call made again, and its run can be compared with that call's forward.
    ``intended_grad`` is the grad mode the region is meant to compute in: the call's own, or
    for a replaced call its outer call's.  ``during_backward``: the call was made while
    autograd ran a backward.
    """

    function: Any
    entry: str
    region: RegionKey
    tags: Mapping[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    grad_enabled: bool = True
    runs: int = 0
    state: Any = None
    implementation: str = "torch"
    reentrant: bool | None = None
    needs_input_grad: bool | None = None
    replaced: bool = False
    during_backward: bool = False
    outer: CheckpointCall | None = field(default=None, repr=False)
    #: a list from the first nested call on (most calls make none)
    nested: list[CheckpointCall] | tuple[()] = field(default=(), repr=False)
    replays: CheckpointCall | None = field(default=None, repr=False)
    intended_grad: bool | None = None
    #: torch dropped the region function; ``released`` waits for the outer call's release
    dropped: bool = False
    released: bool = False
    #: the non-reentrant generator's options were set where ``checkpoint()`` was called, which
    #: passes them on: its generator runs as torch made it (see :meth:`Interceptor.generator`)
    configured: bool = False

    def __init__(self, function: Any, entry: str, region: RegionKey, tags: Mapping[str, Any],
                 options: dict[str, Any], grad_enabled: bool = True) -> None:
        # the fields given, and those worked out from them; every other field reads its
        # default from the class until the call sets it (one is made per invocation: the
        # dataclass's own ``__init__`` set all twenty)
        self.function, self.entry, self.region, self.tags = function, entry, region, tags
        self.options, self.grad_enabled = options, grad_enabled
        self.reentrant = reentrant = entry in ("reentrant", "apply")
        self.needs_input_grad = reentrant
        self.intended_grad = grad_enabled

    def __post_init__(self) -> None:
        """Work out the fields left None from the others (after an implementation set them)."""
        if self.reentrant is None:
            self.reentrant = self.entry in ("reentrant", "apply")
        if self.needs_input_grad is None:
            self.needs_input_grad = bool(self.reentrant)
        if self.intended_grad is None:
            self.intended_grad = self.grad_enabled

    @property
    def preserve_rng_state(self) -> bool | None:
        """Whether the recompute starts from the forward's RNG state (None: the implementation
        does not say, as for a declared checkpoint function)."""
        value = self.options.get("preserve_rng_state", True if self.implementation == "torch" else None)
        return None if value is None else bool(value)


@dataclass
class Run:
    """One run of a region function, as :meth:`Interceptor.region_run` sees it."""

    output: Any = None
    has_output: bool = False


@dataclass
class ActiveRun:
    """A run of a region function in progress on this thread (see :func:`active_runs`).

    ``graph_task`` is ``torch._C._current_graph_task_id()`` when the run started: -1 outside
    backward.  A backward started inside the run (a reentrant recompute's own
    ``torch.autograd.backward``) has another id.  ``made`` counts the checkpoint calls made
    inside the run so far.
    """

    call: CheckpointCall
    phase: Phase
    graph_task: int
    made: int = 0


_local = threading.local()


def active_runs() -> list[ActiveRun]:
    """The region runs in progress on this thread, outermost first (a list the caller must not change)."""
    runs = getattr(_local, "runs", None)
    if runs is None:
        runs = _local.runs = []
    return runs


class RegionFunction:
    """The user's callable as torch sees it: its first call is the forward, later ones recompute."""

    __slots__ = ("function", "call", "interceptor", "__weakref__")

    def __init__(self, function: Callable[..., Any], call: CheckpointCall, interceptor: Interceptor) -> None:
        self.function, self.call, self.interceptor = function, call, interceptor

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self.call
        call.runs += 1
        phase = Phase.FORWARD if call.runs == 1 else Phase.RECOMPUTE
        runs = active_runs()
        runs.append(ActiveRun(call, phase, torch._C._current_graph_task_id()))
        try:
            return self.interceptor.run_region(call, phase, self.function, args, kwargs)
        finally:
            runs.pop()

    def __repr__(self) -> str:
        return f"<recheck region {self.function!r}>"

    def __del__(self) -> None:
        """torch dropped the region function, with its graph: :meth:`Interceptor._dropped`.
        A finalizer, not a weak reference with a callback held in a set: one object fewer per
        invocation while its graph lives (each counts toward the collector's next collection).
        Nothing is told while the interpreter shuts down (what it would release goes with it)."""
        if not _FINALIZING():
            self.interceptor._dropped(self.call)


_FINALIZING = sys.is_finalizing


class Implementation(Protocol):
    """What :meth:`Interceptor.foreign` needs to know of a checkpoint implementation's entry point.

    One adapter per entry point lives in :mod:`recheck.intercept.implementations`.
    """

    #: the entry point's name in records and reports (``"deepspeed"``, ``"fairscale"`` ...)
    name: str
    #: the library's name (``"deepspeed"``), or ``"declared"`` for a ``checkpoint-functions`` entry
    library: str
    #: forward under ``no_grad``, recompute in backward (see :class:`CheckpointCall`)
    reentrant: bool | None
    #: the output requires grad only when an input does
    needs_input_grad: bool | None
    #: whether it restores the CPU (and accelerator) RNG around the recompute
    preserves_rng: bool | None
    #: folders whose frames are the implementation's own (passed over for the call site)
    skip_dirs: tuple[str, ...]

    def region(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        """``(function, named)``: the callable the implementation will run (and rerun), and the
        callable that names the region and whose reach is followed (often the same)."""

    def with_function(self, args: tuple, kwargs: dict, function: Any) -> tuple[tuple, dict]:
        """The entry point's arguments with the region function replaced by ``function``."""

    def direct(self, run: Callable[[Any, tuple, dict], Any], args: tuple, kwargs: dict) -> Any:
        """What the entry point returns, computed by calling the region directly:
        ``run(function, region_args, region_kwargs)`` runs it."""


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
        """Adjust the non-reentrant generator's options in ``arguments`` (its bound arguments, or
        for a ``checkpoint()`` call configured there, its ``determinism_check`` and
        ``early_stop``, which ``checkpoint()`` passes on); return what undoes it, if anything:
        called once the generator is set up, or once a configured call returns."""
        return None

    def released(self, call: CheckpointCall) -> None:
        """torch dropped the region function (with its graph): no recompute can follow."""

    def cannot_bypass(self, call: CheckpointCall) -> None:
        """A direct ``CheckpointFunction.apply`` was asked to be bypassed; it stays checkpointed."""

    def compiled(self) -> None:
        """A checkpoint call was passed through untouched because torch.compile was tracing."""

    def refined(self, call: CheckpointCall) -> None:
        """A declared checkpoint function turned out to call torch's checkpoint: ``call.entry``,
        ``reentrant`` and ``options`` now say how (called before its forward runs)."""

    # -- plumbing ---------------------------------------------------------------------------

    def _new_call(self, function: Any, entry: str, options: dict[str, Any], grad_enabled: bool,
                  implementation: Implementation | None = None) -> CheckpointCall:
        skip = implementation.skip_dirs if implementation is not None else ()
        call = CheckpointCall(function, entry, describe(function, call_site(3, skip)), current_tags(),  # (read-only)
                              options, grad_enabled)
        if implementation is not None:
            call.implementation = implementation.library
            call.reentrant = implementation.reentrant
            call.needs_input_grad = implementation.needs_input_grad
            call.__post_init__()
        runs = active_runs()
        if runs:
            self._nest(call, runs[-1])
        call.during_backward = torch._C._current_graph_task_id() != -1
        self.started(call)
        return call

    @staticmethod
    def _nest(call: CheckpointCall, outer_run: ActiveRun) -> None:
        """Place a call made inside another region's run: made by its forward, or again by a
        recompute at the place its forward made the same region's call."""
        outer, position = outer_run.call, outer_run.made
        outer_run.made += 1
        call.outer = outer
        if outer_run.phase is Phase.FORWARD:
            if not outer.nested:
                outer.nested = []
            outer.nested.append(call)
            if outer.reentrant:
                call.replaced = True
                call.intended_grad = outer.intended_grad
        elif outer_run.phase is Phase.RECOMPUTE and position < len(outer.nested):
            earlier = outer.nested[position]
            if earlier.region == call.region and _same_callable(earlier.function, call.function):
                call.replays = earlier

    def _wrap(self, function: Callable[..., Any], call: CheckpointCall) -> RegionFunction:
        return RegionFunction(function, call, self)

    def _dropped(self, call: CheckpointCall) -> None:
        """torch dropped a region function.  A call made inside another region's forward is
        released with that region (whose recompute makes it again, to be compared with it)."""
        call.dropped = True
        if call.outer is not None and not call.outer.released:
            return
        self._release(call)

    def _release(self, call: CheckpointCall) -> None:
        call.released = True
        self.released(call)
        nested, call.nested = call.nested, ()
        for inner in nested:
            if inner.dropped and not inner.released:
                self._release(inner)

    # -- the Hooks protocol --------------------------------------------------------------

    def checkpoint(self, real: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``torch.utils.checkpoint.checkpoint(function, *args, **kwargs)``."""
        if not self.active() or not args:
            return real(*args, **kwargs)
        function, rest = args[0], args[1:]
        use_reentrant = kwargs.get("use_reentrant")
        entry = "reentrant" if use_reentrant is None or use_reentrant else "checkpoint"
        options = {k: kwargs[k] for k in ("use_reentrant", "preserve_rng_state", "early_stop") if k in kwargs}
        if isinstance(function, RegionFunction):  # a declared checkpoint function calling torch's
            call = function.call
            if call.runs == 0 and call.implementation == "declared":
                call.entry, call.implementation = entry, "torch"
                call.reentrant = call.needs_input_grad = entry == "reentrant"
                call.options.update(options)
                self.refined(call)
            return self.around_machinery(call, lambda: real(*args, **kwargs))
        call = self._new_call(function, entry, options, torch.is_grad_enabled())
        if self.bypass(call):
            user_kwargs = {k: v for k, v in kwargs.items() if k not in CHECKPOINT_OPTIONS}
            call.runs += 1
            return self.run_region(call, Phase.BYPASS, function, rest, user_kwargs)
        wrapped = self._wrap(function, call)
        if entry == "checkpoint" and self._configures_at_call(real):
            return self._configured(call, real, wrapped, rest, kwargs)
        return self.around_machinery(call, lambda: real(wrapped, *rest, **kwargs))

    def _configures_at_call(self, real: Callable[..., Any]) -> bool:
        """Whether a non-reentrant ``checkpoint()`` call's generator options are set at the call
        (:meth:`_configured`) rather than at its generator: where nothing is done around torch's
        machinery (so the generator's steps need no bracket of their own), no
        ``set_checkpoint_early_stop`` block is in force (its override is scoped to the generator's
        setup) and ``checkpoint()`` takes the options by keyword."""
        if torch_checkpoint._enable_checkpoint_early_stop is not None:
            return False
        return type(self).around_machinery is Interceptor.around_machinery and _passes_options(real)

    def _configured(self, call: CheckpointCall, real: Callable[..., Any], wrapped: RegionFunction, rest: tuple,
                    kwargs: dict) -> Any:
        """``checkpoint()``, non-reentrant, with its generator's options configured here: the
        common call, whose generator then runs as torch made it, driven by torch's ``checkpoint()``
        (one frame, not the generator of :meth:`_drive` and its bound arguments)."""
        settings = {"determinism_check": kwargs.get("determinism_check", _DEFAULT_DETERMINISM),
                    "early_stop": kwargs.get("early_stop", True)}
        call.options.setdefault("early_stop", settings["early_stop"])
        undo = self.configure_generator(call, settings)
        call.configured = True
        try:
            return real(wrapped, *rest, **{**kwargs, **settings})
        finally:
            if undo is not None:
                undo()

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

    def foreign(self, implementation: Implementation, real: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """An entry point of another checkpoint implementation, ``real(*args, **kwargs)``.

        Bypassed, the region runs directly (:meth:`Implementation.direct`, phase
        :attr:`Phase.BYPASS`); otherwise the implementation runs with its region function
        wrapped, so its forward and its recomputes are runs like torch's.  A region function
        that is already wrapped (a declared function that calls a known one) passes through:
        one invocation is one call.
        """
        if not self.active():
            return real(*args, **kwargs)
        function, named = implementation.region(args, kwargs)
        if isinstance(function, RegionFunction) or not callable(function):
            return real(*args, **kwargs)
        options = {"preserve_rng_state": implementation.preserves_rng} if implementation.preserves_rng is not None \
            else {}
        call = self._new_call(named, implementation.name, options, torch.is_grad_enabled(), implementation)
        if self.bypass(call):
            call.runs += 1
            return implementation.direct(lambda f, a, k: self.run_region(call, Phase.BYPASS, f, a, k), args, kwargs)
        wrapped = self._wrap(function, call)
        new_args, new_kwargs = implementation.with_function(args, kwargs, wrapped)
        return self.around_machinery(call, lambda: real(*new_args, **new_kwargs))

    def generator(self, original: Callable[..., Generator[None, None, None]], args: tuple, kwargs: dict) -> Iterator[None]:
        """The non-reentrant generator: from ``checkpoint()`` (already wrapped; where its options
        were configured at the call, it runs untouched), the composable API or the curried form
        (whose forward runs between the generator's two steps)."""
        first = args[0] if args else kwargs.get("fn")
        if type(first) is RegionFunction and first.call.configured:
            return original(*args, **kwargs)  # configured where ``checkpoint()`` was called
        bound = _Arguments(_layout(original), args, kwargs)
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
            generator = bound.call(original)
        except BaseException:
            if undo is not None:
                undo()
            raise
        return self._drive(generator, call, undo, brackets)

    def _bypassed(self, call: CheckpointCall) -> Iterator[None]:
        call.runs += 1
        with self.region_run(call, Phase.BYPASS):
            yield

    def _drive(self, generator: Generator[None, None, None], call: CheckpointCall, undo: Callable[[], None] | None,
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
_DEFAULT_DETERMINISM = getattr(torch_checkpoint, "_DEFAULT_DETERMINISM_MODE", "default")


def _passes_options(real: Callable[..., Any]) -> bool:
    """Whether ``real`` (torch's ``checkpoint()``) takes ``determinism_check`` and ``early_stop``
    by keyword and passes them to its non-reentrant generator.  Read from its code's keyword-only
    names, not ``inspect.signature``: asked at every checkpoint call, a signature costs more than
    the rest of the call's dispatch."""
    try:
        code = inspect.unwrap(real).__code__
    except (AttributeError, ValueError):  # not a Python function, or a ``__wrapped__`` cycle
        return False
    keyword_only = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    return "determinism_check" in keyword_only and "early_stop" in keyword_only


def _same_callable(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether two region callables run the same code on the same objects: the same object, or
    closures made anew by the same code over the same cells' contents (timm's ``checkpoint_seq``
    makes a closure per segment and call), bound methods and partials of such."""
    if a is b:
        return True
    if depth > 4 or type(a) is not type(b):
        return False
    if isinstance(a, functools.partial):
        return (_same_callable(a.func, b.func, depth + 1) and len(a.args) == len(b.args)
                and all(x is y for x, y in zip(a.args, b.args)) and a.keywords.keys() == b.keywords.keys()
                and all(a.keywords[k] is b.keywords[k] for k in a.keywords))
    if inspect.ismethod(a):
        return a.__self__ is b.__self__ and _same_callable(a.__func__, b.__func__, depth + 1)
    if inspect.isfunction(a):
        if a.__code__ is not b.__code__:
            return False
        cells = zip(a.__closure__ or (), b.__closure__ or ())
        try:
            return all(x.cell_contents is y.cell_contents or _same_contents(x.cell_contents, y.cell_contents)
                       for x, y in cells)
        except ValueError:  # an empty cell
            return False
    return False


def _same_contents(a: Any, b: Any) -> bool:
    """Lists or tuples of the same objects (the module list a closure holds), or equal numbers."""
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return type(a) in (int, float, bool, str) and type(a) is type(b) and a == b
