"""Routing intercepted checkpoint calls to records, and records to the active watch() blocks.

The patches (``recheck.watcher.patches``) call the :class:`Dispatcher`'s hooks.  For each
invocation it creates an :class:`~recheck.watcher.records.InvocationRecord` and hands torch
a :class:`WatchedFunction` wrapping the user's callable: torch calls that same object for
the forward and for every recompute (both variants), which is how a recompute finds its
own forward.  Non-reentrant calls also get a per-invocation ``determinism_check`` that
prints every saved tensor (torch's own shape/dtype/device check is kept).

Every active ``watch()`` receives every record made while it is active, so nested blocks
both see inner calls.  While any block is active the pipelining labels
(``recheck.watcher.pipelining``) are acquired, so calls made inside a pipeline chunk are
tagged with ``stage`` and ``microbatch``; in a torch.distributed process every record is
also tagged with ``rank``.  Bookkeeping errors never break the user's program: they become
report notes.
"""

from __future__ import annotations

import inspect
import itertools
import threading
import weakref
from typing import Any, Callable, Iterator, Protocol

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.nn.modules.module import register_module_forward_pre_hook

from recheck.checker.effects import EffectCapture
from recheck.distributed.world import current_place
from recheck.watcher import patches, pipelining
from recheck.watcher.capture import reach_of
from recheck.watcher.records import InvocationRecord
from recheck.watcher.regions import call_site, describe
from recheck.watcher.tags import current_tags

__all__ = ["DISPATCHER", "Dispatcher", "SessionLike", "WatchedFunction"]

_SIGNATURES: dict[Any, inspect.Signature] = {}
_METADATA_FNS = torch_checkpoint._allowed_determinism_checks_to_fns


class SessionLike(Protocol):
    """What the dispatcher needs of a ``watch()`` block."""

    store: str
    strict: bool

    def add_record(self, record: InvocationRecord) -> None: ...

    def add_note(self, note: str) -> None: ...

    def saw_compile(self) -> None: ...


class WatchedFunction:
    """The user's callable as torch sees it: first call is the forward, later ones recompute."""

    __slots__ = ("function", "record", "dispatcher", "__weakref__")

    def __init__(self, function: Callable[..., Any], record: InvocationRecord, dispatcher: Dispatcher) -> None:
        self.function, self.record, self.dispatcher = function, record, dispatcher
        # torch drops this object with the autograd graph: no recompute can come after
        # that, so the record can let go of its prints and copies (findings stay).
        weakref.finalize(self, record.release)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        record = self.record
        if record.closed or record.failed:
            return self.function(*args, **kwargs)
        if not record.forward_done:
            return self.dispatcher.run_forward(record, self.function, args, kwargs)
        return self.dispatcher.run_recompute(record, self.function, args, kwargs)

    def __repr__(self) -> str:
        return f"<recheck watched {self.function!r}>"


class Dispatcher:
    """Implements :class:`recheck.watcher.patches.Hooks` for the active ``watch()`` blocks."""

    def __init__(self) -> None:
        self.sessions: list[SessionLike] = []
        self.records: list[InvocationRecord] = []
        self.region_calls: dict[Any, int] = {}
        self._lock = threading.RLock()
        self._local = threading.local()
        self._hook_handle: Any = None
        self._keys = itertools.count()
        self._reach_cache: dict[Any, Any] = {}

    # -- sessions ------------------------------------------------------------------------

    def enter(self, session: SessionLike) -> None:
        with self._lock:
            patches.acquire(self)
            pipelining.acquire()
            if not self.sessions:
                self._hook_handle = register_module_forward_pre_hook(self._module_pre_hook)
            self.sessions.append(session)

    def exit(self, session: SessionLike) -> None:
        with self._lock:
            self.sessions.remove(session)
            if not self.sessions:
                for record in self.records:
                    record.closed = True
                self.records, self.region_calls, self._reach_cache = [], {}, {}
                if self._hook_handle is not None:
                    self._hook_handle.remove()
                    self._hook_handle = None
            pipelining.release()
            patches.release()

    def _option_store(self) -> str:
        return "copy" if any(s.store == "copy" for s in self.sessions) else "digest"

    def _new_record(self, function: Any, entry: str) -> InvocationRecord:
        region = describe(function, call_site(2))
        with self._lock:
            index = self.region_calls.get(region, 0) + 1
            self.region_calls[region] = index
            record = InvocationRecord(region, index, _labels(), entry=entry, store=self._option_store(),
                                      strict=any(s.strict for s in self.sessions), function=function)
            self.records.append(record)
            for session in self.sessions:
                session.add_record(record)
        return record

    def _internal_error(self, where: str, exc: BaseException) -> None:
        for session in list(self.sessions):
            session.add_note(f"internal error while {where} ({type(exc).__name__}: {exc}); that check was skipped")

    # -- hooks called by the patches -------------------------------------------------------

    def compiled(self) -> None:
        for session in list(self.sessions):
            session.saw_compile()

    def checkpoint(self, real: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if not self.sessions or not args:
            return real(*args, **kwargs)
        function, rest = args[0], args[1:]
        use_reentrant = kwargs.get("use_reentrant")
        entry = "reentrant" if use_reentrant is None or use_reentrant else "checkpoint"
        record = self._new_record(function, entry)
        record.grad_enabled = torch.is_grad_enabled()
        record.preserve_rng_state = bool(kwargs.get("preserve_rng_state", True))
        return real(WatchedFunction(function, record, self), *rest, **kwargs)

    def reentrant_forward(self, real: Callable[..., Any], ctx: Any, run_function: Any, preserve: bool, args: tuple) -> Any:
        if self.sessions and not isinstance(run_function, WatchedFunction):
            record = self._new_record(run_function, "reentrant")
            record.grad_enabled = any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
            record.preserve_rng_state = bool(preserve)
            run_function = WatchedFunction(run_function, record, self)
        return real(ctx, run_function, preserve, *args)

    def generator(self, original: Callable[..., Iterator[None]], args: tuple, kwargs: dict) -> Iterator[None]:
        signature = _SIGNATURES.get(original)
        if signature is None:
            signature = _SIGNATURES[original] = inspect.signature(original)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        function = arguments["fn"]
        if isinstance(function, WatchedFunction):
            record, brackets_forward = function.record, False
        elif self.sessions:
            # the composable API, or torch 2.14's curried checkpoint(...)(fn): the forward
            # runs between the generator's two steps, not through our function
            record = self._new_record(function, "generator")
            arguments["fn"] = WatchedFunction(function, record, self)
            brackets_forward = True
        else:
            return original(*args, **kwargs)
        record.grad_enabled = torch.is_grad_enabled()
        record.preserve_rng_state = bool(arguments.get("preserve_rng_state", True))
        user_early_stop = torch_checkpoint._enable_checkpoint_early_stop
        record.early_stop = bool(arguments["early_stop"] if user_early_stop is None else user_early_stop)
        key = None
        base = _METADATA_FNS.get(arguments["determinism_check"])
        if base is not None:  # an unknown mode: let torch raise its own error
            key = f"recheck-{next(self._keys)}"
            _METADATA_FNS[key] = lambda tensor: record.saved_print(tensor, base(tensor))
            arguments["determinism_check"] = key
        if record.strict:
            arguments["early_stop"] = False
        generator = original(*bound.args, **bound.kwargs)
        return self._drive(generator, record, key, brackets_forward)

    def _drive(self, generator: Iterator[None], record: InvocationRecord, key: str | None, brackets_forward: bool) -> Iterator[None]:
        """Run torch's generator, bracketing the forward (composable API, curried form)'s forward with the record."""
        try:
            if record.strict:
                with torch_checkpoint.set_checkpoint_early_stop(False):
                    next(generator)
            else:
                next(generator)
        finally:
            if key is not None:
                _METADATA_FNS.pop(key, None)
        if brackets_forward:
            self._begin_forward(record, record.function)
        try:
            yield
        except BaseException as exc:
            if brackets_forward:
                self._end_forward(record, None, False, failed=True)
            try:
                generator.throw(exc)
            except StopIteration:
                return
            raise RuntimeError("recheck: torch's checkpoint generator yielded more than twice") from exc
        if brackets_forward:
            self._end_forward(record, None, False, failed=False)
        try:
            next(generator)
        except StopIteration:
            return
        raise RuntimeError("recheck: torch's checkpoint generator yielded more than twice")

    # -- forward and recompute -------------------------------------------------------------

    def _collectors(self) -> list[InvocationRecord]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _module_pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        stack = getattr(self._local, "stack", None)
        if stack:
            for record in stack:
                record.add_module(module)

    def _begin_forward(self, record: InvocationRecord, function: Any) -> None:
        try:
            record.begin_forward(reach_of(function, self._reach_cache))
        except Exception as exc:  # noqa: BLE001 - never break the user's forward
            record.abort_forward()
            self._internal_error("recording a forward", exc)
        self._collectors().append(record)

    def _end_forward(self, record: InvocationRecord, output: Any, has_output: bool, *, failed: bool) -> None:
        stack = self._collectors()
        if stack and stack[-1] is record:
            stack.pop()
        if failed:
            record.abort_forward()
            return
        try:
            record.end_forward(output, has_output)
        except Exception as exc:  # noqa: BLE001
            record.abort_forward()
            self._internal_error("recording a forward", exc)

    def run_forward(self, record: InvocationRecord, function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        self._begin_forward(record, function)
        try:
            output = function(*args, **kwargs)
        except BaseException:
            self._end_forward(record, None, False, failed=True)
            raise
        self._end_forward(record, output, True, failed=False)
        return output

    def run_recompute(self, record: InvocationRecord, function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        try:
            rng_entry, state_entry = record.begin_recompute()
        except Exception as exc:  # noqa: BLE001
            self._internal_error("starting a recompute", exc)
            return function(*args, **kwargs)
        capturing = not getattr(self._local, "capturing", False)
        effects = EffectCapture(passthrough=True)
        output, has_output = None, False
        try:
            if capturing:
                self._local.capturing = True
                with effects:
                    output = function(*args, **kwargs)
            else:
                output = function(*args, **kwargs)
            has_output = True
        finally:
            if capturing:
                self._local.capturing = False
            try:
                record.end_recompute(rng_entry, state_entry, output, has_output, effects.effects)
            except Exception as exc:  # noqa: BLE001
                self._internal_error("comparing a recompute", exc)
        return output


def _labels() -> dict[str, Any]:
    """The tags of a new record: ``rank`` first in a distributed process, then the user's
    and the pipeline's (``recheck.tag``); a user's own ``rank`` tag wins."""
    tags = current_tags()
    place = current_place()
    if place is None or "rank" in tags:
        return dict(tags)
    return {"rank": place.rank, **tags}


#: The process-wide dispatcher: the patches are process-wide, so is what they report to.
DISPATCHER = Dispatcher()
