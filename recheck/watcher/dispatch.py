"""Routing intercepted checkpoint calls to records, and records to the active watch() blocks.

The patches (``recheck.intercept.patches``) call the :class:`Dispatcher`'s hooks.  For each
invocation it creates an :class:`~recheck.watcher.records.InvocationRecord` and hands torch
a :class:`WatchedFunction` wrapping the user's callable: torch calls that same object for
the forward and for every recompute (both variants), which is how a recompute finds its
own forward.  Non-reentrant calls also get a per-invocation ``determinism_check`` that
prints every saved tensor (torch's own shape/dtype/device check is kept).

Every active ``watch()`` receives every record made while it is active, so nested blocks
both see inner calls.  While any block is active the pipelining labels
(``recheck.intercept.pipelining``) are acquired, so calls made inside a pipeline chunk are
tagged with ``stage`` and ``microbatch``; in a torch.distributed process every record is
also tagged with ``rank``.  Bookkeeping errors never break the user's program: they become
report notes.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Callable, Iterator, Mapping, Protocol

import torch
import torch.utils.checkpoint as torch_checkpoint

from recheck.distributed.world import current_place, launched_place
from recheck.findings import could_not
from recheck.intercept import module_calls, patches, pipelining
from recheck.intercept.hooks import CheckpointCall, Interceptor, Phase, Run
from recheck.runtime.effects import EffectCapture, hold_logging, release_logging
from recheck.runtime.naming import hold_cwd, release_cwd
from recheck.runtime.reach import Reach, keep_reach, reach_of
from recheck.watcher.options import WatchOptions
from recheck.watcher.records import InvocationRecord

__all__ = ["DISPATCHER", "Dispatcher", "SessionLike"]

_METADATA_FNS = torch_checkpoint._allowed_determinism_checks_to_fns
_DEFAULT_METADATA = getattr(torch_checkpoint, "_default_meta_extractor", None)


class SessionLike(Protocol):
    """What the dispatcher needs of a ``watch()`` block."""

    options: WatchOptions

    def add_record(self, record: InvocationRecord) -> None: ...

    def add_note(self, note: str) -> None: ...

    def saw_compile(self) -> None: ...


class Dispatcher(Interceptor):
    """The interceptor of the active ``watch()`` blocks: one record per invocation."""

    def __init__(self) -> None:
        self.sessions: list[SessionLike] = []
        self.records: list[InvocationRecord] = []
        self.region_calls: dict[Any, int] = {}
        self._lock = threading.RLock()
        self._local = threading.local()
        #: stops the listening to module calls (``intercept.module_calls``), which lasts while
        #: some thread runs a region's forward, and how many threads do
        self._stop_listening: Callable[[], None] | None = None
        self._listeners = 0
        #: lets go of the patch ``module_calls`` keeps in place while any block is active
        self._let_go_of_calls: Callable[[], None] | None = None
        self._keys = itertools.count()
        #: the reaches of the regions run in the block (see ``reach_of``), dropped when it ends
        self._reach_cache: dict[Any, Any] = {}
        #: ``_record_options()`` of the blocks active now (None: to be worked out)
        self._options: dict[str, Any] | None = None
        #: what the launcher's variables say of this process's place, read when the first
        #: block starts (``distributed.world.launched_place``)
        self._launched: Any = None

    # -- sessions ------------------------------------------------------------------------

    def enter(self, session: SessionLike) -> None:
        """Start ``session``'s block: the patches, and for the first block the holds on the
        runtime.  Whatever was taken is given back when a later step raises (nothing stays patched)."""
        with self._lock, contextlib.ExitStack() as undo:
            names = session.options.checkpoint_functions
            installation = patches.acquire(self, extra_functions=names)
            undo.callback(patches.release)
            for name in names:
                how = installation.declared.get(name, "")
                if how not in ("code", "rebound"):
                    session.add_note(f"checkpoint-functions: {how}; its calls are not intercepted")
            pipelining.acquire()
            undo.callback(pipelining.release)
            if not self.sessions:
                hold_logging()  # for the block, not for each recompute's capture
                undo.callback(release_logging)
                hold_cwd()  # call sites are named relative to the working directory at the start
                undo.callback(release_cwd)
                let_go = module_calls.hold()  # in place for the block, not for each forward
                undo.callback(let_go)
                self._launched = launched_place()
                self._let_go_of_calls = let_go
            self.sessions.append(session)
            self._options = None
            undo.pop_all()

    def exit(self, session: SessionLike) -> None:
        with self._lock:
            self.sessions.remove(session)
            self._options = None
            if not self.sessions:
                for record in self.records:
                    record.closed = True
                self.records, self.region_calls, self._reach_cache = [], {}, {}
                if self._stop_listening is not None:  # a forward that never ended (its thread died)
                    self._stop_listening()
                    self._stop_listening, self._listeners = None, 0
                release_logging()
                release_cwd()
                if self._let_go_of_calls is not None:
                    self._let_go_of_calls()
                    self._let_go_of_calls = None
            pipelining.release()
            patches.release()

    @contextlib.contextmanager
    def taken_over(self, what: str) -> Iterator[None]:
        """The checkpoint interception to ``what`` (a check that installs its own) for the length
        of the ``with`` block; the ``watch()`` blocks active meanwhile take it back after.

        ``recheck.check_step()`` runs its step inside a ``watch()`` of its own and then with every
        checkpoint bypassed, which needs the patches to itself.  Called in a test that
        ``pytest --recheck`` watches, or in any ``watch()`` block, it sets the active blocks aside
        instead of refusing to run: their sessions and records are put away and their hold on the
        patches let go (every original object is back), and when it ends the patches are acquired
        again for the same blocks, which go on recording; each is told so in a note.  The holds a
        block keeps on the runtime (logging, the working directory, the module-call
        patch) stay taken meanwhile: the check's own block takes them again.

        Raises RuntimeError, leaving everything as it was, where the patches are installed for
        another user (``recheck.measure()``, a bypassed twin), while a checkpointed forward is running
        or in a recompute (the check would run inside it).
        """
        refusal = RuntimeError(f"{what} cannot run while checkpoint calls are already intercepted (inside "
                               "recheck.measure(), another check, or a checkpointed region's run); run it outside that")
        if patches.installed() is None:
            yield
            return
        with self._lock:
            if not self.sessions or self._listeners or self._capturing():  # (a forward anywhere, a recompute here)
                raise refusal
            sessions = self.sessions
            kept = (sessions, self.records, self.region_calls, self._reach_cache, self._options,
                    self._launched, self._let_go_of_calls)
            for _ in sessions:
                pipelining.release()
                patches.release()
            self.sessions, self.records, self.region_calls, self._reach_cache = [], [], {}, {}
            self._options, self._let_go_of_calls = None, None
        try:
            if patches.installed() is not None:  # another user holds them too
                raise refusal
            for session in sessions:
                session.add_note(f"{what} ran inside this block: the checkpoint calls of its step were "
                                 "verified by it, not recorded here")
            yield
        finally:
            with self._lock:
                if self._let_go_of_calls is not None:  # a block the check left open (it never does)
                    self._let_go_of_calls()
                (self.sessions, self.records, self.region_calls, self._reach_cache, self._options,
                 self._launched, self._let_go_of_calls) = kept
                for session in sessions:
                    patches.acquire(self, extra_functions=session.options.checkpoint_functions)
                    pipelining.acquire()

    def _record_options(self) -> dict[str, Any]:
        """What the active blocks together ask of a new record (nested blocks share records):
        copies if any keeps copies, a full replay if any asks, a tolerance only if all give one.
        Worked out once per set of blocks (a block's options are frozen)."""
        if self._options is None:
            self._options = self._combined_options()
        return self._options

    def _combined_options(self) -> dict[str, Any]:
        options = [s.options for s in self.sessions]
        forced: bool | None = next((o.early_stop for o in options if o.early_stop is False), None)
        if forced is None:
            forced = next((o.early_stop for o in options if o.early_stop is True), None)
        tolerances = [o.tolerance for o in options]
        return {"store": "copy" if any(o.store == "copy" for o in options) else "digest",
                "early_stop": forced,
                "tolerance": tolerances[0] if all(t is not None for t in tolerances) else None}

    def _internal_error(self, what: str, exc: BaseException, record: InvocationRecord | None = None) -> None:
        """recheck's own observation ``what`` failed: a note in every active block (of the record,
        where it is one call's), the check skipped; never raised into the program."""
        if record is not None:
            record.could_not(what, exc)
            return
        note = could_not(what, exc)
        for session in list(self.sessions):
            session.add_note(note)

    # -- the interceptor's decisions ---------------------------------------------------------

    def active(self) -> bool:
        return bool(self.sessions)

    def started(self, call: CheckpointCall) -> None:
        try:
            self._start(call)
        except Exception as exc:  # noqa: BLE001 - the call runs unwatched
            call.state = None
            self._internal_error(f"record a checkpoint call of {call.region}", exc)

    def _start(self, call: CheckpointCall) -> None:
        region = call.region
        with self._lock:
            index = self.region_calls.get(region, 0) + 1
            self.region_calls[region] = index
            record = InvocationRecord(region, index, _labels(call.tags, self._launched), entry=call.entry,
                                      function=call.function, implementation=call.implementation,
                                      reentrant=call.reentrant, needs_input_grad=call.needs_input_grad,
                                      grad_enabled=call.grad_enabled, preserve_rng_state=call.preserve_rng_state,
                                      replaced=call.replaced, during_backward=call.during_backward,
                                      intended_grad=bool(call.intended_grad), nested=call.outer is not None,
                                      **self._record_options())
            self.records.append(record)
            for session in self.sessions:
                session.add_record(record)
        call.state = record

    def compiled(self) -> None:
        for session in list(self.sessions):
            session.saw_compile()

    def refined(self, call: CheckpointCall) -> None:
        record: InvocationRecord | None = call.state
        if record is not None:  # (assignments only)
            record.entry, record.implementation = call.entry, call.implementation
            record.reentrant, record.needs_input_grad = bool(call.reentrant), bool(call.needs_input_grad)
            record.preserve_rng_state = call.preserve_rng_state

    def released(self, call: CheckpointCall) -> None:
        # torch drops the region function with the autograd graph: no recompute can come
        # after that, so the record can let go of its prints and copies (findings stay), and the
        # region's reach (kept for the block) of the modules the forward found by running.
        record: InvocationRecord | None = call.state
        if record is not None:
            try:
                forward = record.forward
                record.release()
                if forward is not None:
                    forward.reach.let_go_of_found()
            except Exception as exc:  # noqa: BLE001
                self._internal_error("let go of the forward's prints", exc, record)

    def configure_generator(self, call: CheckpointCall, arguments: dict[str, Any]) -> Callable[[], None] | None:
        given = dict(arguments)
        try:
            return self._configure(call, arguments)
        except Exception as exc:  # noqa: BLE001 - the call runs with its own arguments, unwatched
            arguments.clear()
            arguments.update(given)
            if isinstance(call.state, InvocationRecord):
                call.state.failed = True
            self._internal_error("configure the checkpoint call", exc, call.state)
            return None

    def _configure(self, call: CheckpointCall, arguments: dict[str, Any]) -> Callable[[], None] | None:
        record: InvocationRecord = call.state
        user_early_stop = torch_checkpoint._enable_checkpoint_early_stop
        record.early_stop = bool(arguments["early_stop"] if user_early_stop is None else user_early_stop)
        stop = None
        if record.forced_early_stop is not None:  # whatever the call or a set_checkpoint_early_stop block says
            arguments["early_stop"] = record.forced_early_stop
            if user_early_stop is not None:  # (a block in force beats the argument: overridden for the setup)
                stop = torch_checkpoint.set_checkpoint_early_stop(record.forced_early_stop)
                stop.__enter__()
        key = None
        base = _METADATA_FNS.get(arguments["determinism_check"])
        if base is not None:  # an unknown mode: let torch raise its own error
            key = f"recheck-{next(self._keys)}"
            # torch's default check is answered from the prints: the record's hook itself
            _METADATA_FNS[key] = record.saved_print if base is _DEFAULT_METADATA else _SavedPrinter(record, base)
            arguments["determinism_check"] = key

        def undo() -> None:
            try:
                if key is not None:
                    _METADATA_FNS.pop(key, None)
            finally:
                if stop is not None:
                    stop.__exit__(None, None, None)
        return undo

    @contextlib.contextmanager
    def region_run(self, call: CheckpointCall, phase: Phase, args: tuple | None = None,
                   kwargs: dict | None = None) -> Iterator[Run]:
        run = Run()
        record: InvocationRecord | None = call.state
        if record is None or record.closed or record.failed:
            yield run
        elif phase is Phase.FORWARD and (earlier := self._replayed(call)) is not None:
            # a call made again by another region's recompute: its run is also a recompute of
            # the call that region's forward made at the same place
            with contextlib.contextmanager(self._recompute)(earlier, run, call.intended_grad), \
                    contextlib.contextmanager(self._forward)(record, call, args, kwargs, run):
                record.replay_of = earlier
                yield run
        elif phase is Phase.FORWARD:
            yield from self._forward(record, call, args, kwargs, run)
        else:
            yield from self._recompute(record, run)

    @staticmethod
    def _replayed(call: CheckpointCall) -> InvocationRecord | None:
        """The record of the call ``call`` makes again, when its forward can be compared with."""
        earlier = call.replays
        record = earlier.state if earlier is not None else None
        if not isinstance(record, InvocationRecord) or record.closed or record.failed or not record.forward_done \
                or record.forward is None:
            return None
        return record

    def _forward(self, record: InvocationRecord, call: CheckpointCall, args: tuple | None, kwargs: dict | None,
                 run: Run) -> Iterator[Run]:
        """The forward bracket of one run: record what it sees, compare what it changed."""
        capture = self._open_forward(record, call, args, kwargs)
        try:
            yield run
        except BaseException:
            self._close_forward(record, capture, None, False, failed=True)
            raise
        self._close_forward(record, capture, run.output, run.has_output, failed=False)

    def _recompute(self, record: InvocationRecord, run: Run, grad_enabled: bool | None = None) -> Iterator[Run]:
        """The recompute bracket of one run: compare what it starts from, computes and changes."""
        opened = self._open_recompute(record, grad_enabled)
        if opened is None:
            yield run
            return
        try:
            yield run
        except BaseException as exc:
            self._recompute_failed(record, exc)
            raise
        finally:
            self._close_recompute(record, opened, run.output, run.has_output)

    # -- forward and recompute -------------------------------------------------------------

    def _collectors(self) -> list[InvocationRecord]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _module_called(self, module: torch.nn.Module) -> None:
        stack = getattr(self._local, "stack", None)
        if stack:
            for record in stack:
                try:
                    record.add_module(module)
                except Exception as exc:  # noqa: BLE001
                    record.could_not(f"observe the module {type(module).__name__} called by the forward", exc)

    def _pass_over(self, stack: list[InvocationRecord]) -> None:
        """Which module calls the listener need not hear (under the lock): those of the modules
        the one forward recording knows already (see ``InvocationRecord.add_module``).  While
        forwards nest, or run in several threads, every call is told: each record hears them all."""
        forward = stack[0].forward if len(stack) == 1 and self._listeners == 1 else None
        module_calls.pass_over(forward.told if forward is not None else None)

    def known_reach(self, function: Any, reach: Reach) -> None:
        """``function``'s static reach, walked already (``check()`` walks its region for its
        snapshot): the block takes it as its own instead of walking the region again."""
        keep_reach(function, reach, self._reach_cache)

    def _begin_forward(self, record: InvocationRecord, function: Any, args: tuple | None,
                       kwargs: dict | None) -> None:
        try:
            record.begin_forward(reach_of(function, self._reach_cache), args, kwargs)
        except Exception as exc:  # noqa: BLE001 - never break the user's forward
            record.abort_forward()
            self._internal_error("record the forward", exc, record)
        stack = self._collectors()
        stack.append(record)
        with self._lock:
            if len(stack) == 1:
                self._listeners += 1
                if self._stop_listening is None:
                    self._stop_listening = module_calls.listen(self._module_called)
            self._pass_over(stack)

    def _end_forward(self, record: InvocationRecord, output: Any, has_output: bool, *, failed: bool) -> None:
        stack = self._collectors()
        if stack and stack[-1] is record:
            stack.pop()
            with self._lock:
                if not stack:
                    self._listeners -= 1
                    if not self._listeners and self._stop_listening is not None:
                        self._stop_listening()
                        self._stop_listening = None
                if self._stop_listening is not None:
                    self._pass_over(stack)
        if failed:
            record.abort_forward()
            return
        try:
            record.end_forward(output, has_output)
        except Exception as exc:  # noqa: BLE001
            record.abort_forward()
            self._internal_error("record the forward", exc, record)

    def _capturing(self) -> bool:
        """Whether an outer run on this thread is capturing effects already (captures do not nest)."""
        return bool(getattr(self._local, "capturing", False))

    def _start_capture(self, effects: EffectCapture) -> None:
        effects.__enter__()
        self._local.capturing = True

    def _stop_capture(self, effects: EffectCapture) -> None:
        self._local.capturing = False
        effects.__exit__(None, None, None)

    def _open_forward(self, record: InvocationRecord, call: CheckpointCall, args: tuple | None,
                      kwargs: dict | None) -> EffectCapture | None:
        """Record what a forward starts from; the effect capture it runs in, if any."""
        self._begin_forward(record, call.function, args, kwargs)
        # a full replay tells latent effects apart by what the forward emitted before its
        # last saved tensor: the forward's effects are counted (and still reach the user)
        if not record.replay_fully or self._capturing():
            return None
        capture = EffectCapture(passthrough=True)
        try:
            self._start_capture(capture)
        except Exception as exc:  # noqa: BLE001 - the forward runs, its effects not counted
            self._internal_error("capture the forward's effects", exc, record)
            return None
        record.forward_effects = capture.effects
        return capture

    def _close_forward(self, record: InvocationRecord, capture: EffectCapture | None, output: Any,
                       has_output: bool, *, failed: bool) -> None:
        try:
            if capture is not None:
                self._stop_capture(capture)
        except Exception as exc:  # noqa: BLE001
            self._internal_error("end the capture of the forward's effects", exc, record)
        finally:
            self._end_forward(record, output, has_output, failed=failed)

    def _open_recompute(self, record: InvocationRecord, grad_enabled: bool | None = None,
                        ) -> tuple[Any, Any, EffectCapture | None] | None:
        """Compare what a recompute starts from with its forward: the entry snapshot and the
        effect capture it runs in (None: the bookkeeping failed, the run is not compared)."""
        try:
            rng_entry, state_entry = record.begin_recompute(grad_enabled)
        except Exception as exc:  # noqa: BLE001
            self._internal_error("compare the start of the recompute", exc, record)
            return None
        effects = None
        if not self._capturing():
            effects = EffectCapture(passthrough=True)
            try:
                self._start_capture(effects)
            except Exception as exc:  # noqa: BLE001 - the run is compared without its effects
                effects = None
                self._internal_error("capture the recompute's effects", exc, record)
        return rng_entry, state_entry, effects

    @staticmethod
    def _recompute_failed(record: InvocationRecord, exc: BaseException) -> None:
        """Called while the region's own exception propagates: noted, never replaced."""
        try:
            if not _ends_early(exc):  # torch's early stop ends a recompute by raising; anything else failed
                record.recompute_raised(exc)
        except Exception as failure:  # noqa: BLE001
            record.could_not("read the error of the recompute", failure)

    def _close_recompute(self, record: InvocationRecord, opened: tuple[Any, Any, EffectCapture | None],
                         output: Any, has_output: bool) -> None:
        rng_entry, state_entry, effects = opened
        try:
            if effects is not None:
                self._stop_capture(effects)
        except Exception as exc:  # noqa: BLE001
            self._internal_error("end the capture of the recompute's effects", exc, record)
        try:
            record.end_recompute(rng_entry, state_entry, output, has_output,
                                 effects.effects if effects is not None else [])
        except Exception as exc:  # noqa: BLE001
            self._internal_error("compare the recompute", exc, record)


class _SavedPrinter:
    """The ``determinism_check`` function of one invocation: torch's metadata of a saved
    tensor, and the record's print of it (one object where a lambda is three: torch keeps it
    for as long as the invocation's graph lives)."""

    __slots__ = ("base", "record")

    def __init__(self, record: InvocationRecord, base: Callable[[torch.Tensor], Any]) -> None:
        self.record, self.base = record, base

    def __call__(self, tensor: torch.Tensor) -> Any:
        base = self.base(tensor)  # torch's own check: its errors are torch's
        try:
            return self.record.saved_print(tensor, base)
        except Exception as exc:  # noqa: BLE001 - torch's check goes on without the print
            self.record.could_not("print a saved tensor", exc)
            return base


_STOP = getattr(torch_checkpoint, "_StopRecomputationError", None)


def _ends_early(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's own early stop of a recompute (not a failure)."""
    return _STOP is not None and isinstance(exc, _STOP)


def _labels(tags: Mapping[str, Any], launched: Any = None) -> Mapping[str, Any]:
    """The tags of a new record (which keeps a copy): ``rank`` first in a distributed process,
    then the user's and the pipeline's (``recheck.tag``); a user's own ``rank`` tag wins.
    ``launched``: what the launcher's variables said when the block started."""
    place = current_place(launched)
    if place is None or "rank" in tags:
        return tags
    return {"rank": place.rank, **tags}


#: The process-wide dispatcher: the patches are process-wide, so is what they report to.
DISPATCHER = Dispatcher()
