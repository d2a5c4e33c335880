"""Capture of the side effects a region emits: logging calls, stdout/stderr writes, warnings.

:class:`EffectCapture` is a context manager; while it is active every call of a
``logging.Logger`` emitting method (``debug`` ... ``critical``, ``log``; ``exception`` goes through ``error``)
is recorded where the logger's level lets it make a record, writes to
``sys.stdout`` / ``sys.stderr`` are recorded, and so are the warnings the program's own filters
show.  With ``passthrough=True`` the output still reaches the user (the plain reference run);
otherwise it is swallowed (the checkpointed runs).

Note:
    A warning counts only where it is shown. Python shows a warning once per location and text
    under its default filters, so the recompute of a region that warns shows nothing again and
    repeats nothing; under an ``always`` filter it is shown again, and recorded. No filter is
    added: the user sees what they would see without recheck.

What a capture records is what its own thread emits: a ``watch()`` block sees recomputes run
in several threads at once, and each one's capture must neither record another thread's
output nor, by saving and restoring process-wide objects in an interleaved order, leave a
wrapped ``sys.stdout`` or a dead warnings hook behind.  So the process-wide hooks are
installed once, when the first capture starts (or a ``watch()`` block takes
:func:`hold_logging`), and removed once, when the last capture ends and no block holds them
(counted under one lock), and each hook routes by the calling thread's stack of active
captures (see :class:`_Router`, :func:`_show`).  Removing them puts back the very objects
found: ``sys.stdout`` and ``sys.stderr`` (unless the program replaced them meanwhile),
``warnings._showwarnmsg`` and ``logging.Logger``'s methods.

Not seen: writes to file descriptors 1/2 from C code, ``print(file=sys.__stdout__)``,
output of threads that run no capture, and loggers whose class overrides the emitting methods.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from recheck.runtime.holds import Hold

__all__ = ["Effect", "EffectCapture", "hold_logging", "release_logging"]

#: the warnings module, typed loosely: its display hooks ``_showwarnmsg`` and ``_showwarnmsg_impl``
#: and ``_filters_mutated`` are private (the stubs do not declare them), yet they are what every
#: warning is shown through
_WARNINGS: Any = warnings

_LOG_METHODS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


@dataclass(frozen=True)
class Effect:
    """One observed side effect: ``channel`` is logging, stdout, stderr or warning."""

    channel: str
    text: str

    def __str__(self) -> str:
        shown = self.text if len(self.text) <= 80 else self.text[:77] + "..."
        return f"{self.channel}: {shown!r}"


def _render(msg: Any, args: tuple) -> str:
    try:
        return str(msg) % args if args else str(msg)
    except Exception:  # a broken format string is the user's, keep what we can
        return f"{msg!s} {args!r}"


#: each thread's active captures, innermost last (``_LOCAL.stack``, made on a thread's first capture)
_LOCAL = threading.local()


def _stack() -> list[EffectCapture] | None:
    """The calling thread's active captures, innermost last (None or empty: it runs none)."""
    return getattr(_LOCAL, "stack", None)


def _captures() -> list[EffectCapture] | None:
    """The captures that record what the calling thread emits now: its active ones, unless it is
    importing a module.

    Note:
        What a module prints, logs or warns while it is imported happens once per process,
        in whichever call imports it first (a recompute, as often as a forward: torch imports
        parts of itself lazily). It is the import's, not the region's, and never a repetition,
        so it is not recorded; it reaches the streams as it would without recheck.
    """
    stack = getattr(_LOCAL, "stack", None)
    if stack:
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename.startswith("<frozen importlib"):
                return None
            frame = frame.f_back  # type: ignore[assignment]
    return stack


class EffectCapture:
    """Record the logging, stdout/stderr writes and warnings of the thread that enters it, while
    active (not re-entrant; captures nest on a thread, see below).

    A write to stdout/stderr, or a warning shown, is recorded by the thread's innermost capture
    and, while that one passes it through, by the one outside it, and so on; what every capture
    passes through reaches the stream.  A logging call is recorded by
    every capture of the thread.  The hooks are process-wide and installed while any
    capture is active or held (see :func:`hold_logging`); a capture only puts itself on its
    thread's stack.
    """

    def __init__(self, passthrough: bool = False) -> None:
        self.passthrough = passthrough
        self.effects: list[Effect] = []
        #: whether it kept a warning from the user: its "shown once" marks are then forgotten at exit
        self._swallowed = False
        #: the thread's stack this capture is on while active
        self._stack: list[EffectCapture] | None = None
        #: the warnings module's display functions at entry: a warning shown through others was
        #: caught inside the region (its own ``catch_warnings``), not by this capture
        self._showwarning: Any = None
        self._showwarnmsg_impl: Any = None

    def __enter__(self) -> EffectCapture:
        if self._stack is not None:
            raise RuntimeError("recheck: an EffectCapture cannot be entered while it is active")
        with _LOCK:
            _enter()
            self._showwarning, self._showwarnmsg_impl = warnings.showwarning, _WARNINGS._showwarnmsg_impl
        stack = _stack()
        if stack is None:
            stack = _LOCAL.stack = []
        stack.append(self)
        self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        for index in range(len(stack) - 1, -1, -1):  # (the innermost, unless captures ended out of order)
            if stack[index] is self:
                del stack[index]
                break
        try:
            if self._swallowed:  # what it kept from the user is shown by the next run that shows
                _WARNINGS._filters_mutated()  # output, as ``catch_warnings`` forgets on exit
        finally:
            with _LOCK:
                _leave()


class _Router:
    """``sys.stdout`` or ``sys.stderr`` while any capture is active: a write from a thread with
    active captures is recorded as :class:`EffectCapture` says, a write from any other thread goes
    straight to the stream found at installation (``target``)."""

    __slots__ = ("_target", "_channel")

    def __init__(self, target: Any, channel: str) -> None:
        self._target = target
        self._channel = channel

    def write(self, text: str) -> int:
        stack = _captures()
        if stack:
            for capture in reversed(stack):
                if text:
                    capture.effects.append(Effect(self._channel, text))
                if not capture.passthrough:
                    return len(text)
        return self._target.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def _show(message: warnings.WarningMessage) -> None:
    """``warnings._showwarnmsg`` while any capture is active (the warnings module, C and Python,
    shows every warning the program's filters let through with it): recorded by the calling
    thread's captures as a write is (:class:`_Router`), unless the region changed how warnings
    are shown since its innermost capture began; shown as before where every capture passes
    output through."""
    stack = _captures()
    if stack:
        innermost = stack[-1]
        if warnings.showwarning is innermost._showwarning and _WARNINGS._showwarnmsg_impl is innermost._showwarnmsg_impl:
            effect = Effect("warning", f"{message.category.__name__}: {message.message}")
            for capture in reversed(stack):
                capture.effects.append(effect)
                if not capture.passthrough:
                    capture._swallowed = True
                    return
    _FOUND["_showwarnmsg"](message)


#: the number of active captures, all threads together (under ``_LOCK``)
_ACTIVE = [0]
_LOCK = threading.Lock()
#: the routers installed, in order, with the name of the stream each stands for (a program that
#: replaces ``sys.stdout`` meanwhile gets its own stream routed at the next capture)
_ROUTERS: list[tuple[str, _Router]] = []
#: the warnings module's display function found at installation (kept after removal: a caller
#: holding ``_show`` still reaches it)
_FOUND: dict[str, Any] = {"_showwarnmsg": _WARNINGS._showwarnmsg}
#: per patched method: what ``logging.Logger.__dict__`` held before (None: nothing) and the
#: method the patch calls on, both read at installation
_SAVED: dict[str, Any] = {}
_CALLS: dict[str, Callable[..., Any]] = {}


def _installed() -> bool:
    return bool(_ACTIVE[0] or _HOLD.count)


def _enter() -> None:
    """One more active capture (under ``_LOCK``): the hooks are installed unless they are already
    (the first capture, or a hold), and put back in place where the program replaced them since.
    Whatever fails leaves nothing installed by it behind."""
    first = not _installed()
    try:
        _install() if first else _route()
    except BaseException:
        if first:
            _uninstall()
        raise
    _ACTIVE[0] += 1


def _leave() -> None:
    """One active capture less (under ``_LOCK``): the last, without a hold, removes the hooks."""
    _ACTIVE[0] -= 1
    if not _installed():
        _uninstall()


def _install() -> None:
    """Install every hook: ``logging.Logger``'s methods, the stream routers, the warnings display
    function."""
    logger_class = logging.Logger
    namespace = vars(logger_class)  # (a live view: one for the seven methods)
    for name, emit in _EMITTERS.items():
        _SAVED[name] = namespace.get(name)
        _CALLS[name] = emit.__wrapped__ = getattr(logger_class, name)  # type: ignore[attr-defined]
        setattr(logger_class, name, emit)
    _route()


def _route() -> None:
    """Route ``sys.stdout``, ``sys.stderr`` and the display of warnings through the hooks, where
    they are not already."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and type(stream) is not _Router:
            router = _Router(stream, name)
            _ROUTERS.append((name, router))
            setattr(sys, name, router)
    if _WARNINGS._showwarnmsg is not _show:
        _FOUND["_showwarnmsg"] = _WARNINGS._showwarnmsg
        _WARNINGS._showwarnmsg = _show


def _uninstall() -> None:
    """Put back what :func:`_install` and :func:`_route` replaced, where it is still theirs: a
    stream or function the program replaced meanwhile is left as the program set it."""
    try:
        for name, router in reversed(_ROUTERS):
            if getattr(sys, name) is router:
                setattr(sys, name, router._target)
        _ROUTERS.clear()
        if _WARNINGS._showwarnmsg is _show:
            _WARNINGS._showwarnmsg = _FOUND["_showwarnmsg"]
    finally:
        logger_class = logging.Logger
        namespace = vars(logger_class)
        for name in _EMITTERS:
            original = _SAVED.pop(name, None)
            if original is not None:
                setattr(logger_class, name, original)
            elif name in namespace:
                delattr(logger_class, name)


def _emits(logger: logging.Logger, level: Any) -> bool:
    """Whether a call at ``level`` makes a record: one the logger's level (or ``logging.disable``)
    drops emits nothing, at forward as at recompute, so it repeats nothing.  A level logging
    itself rejects is left to logging to say so."""
    try:
        return bool(logger.isEnabledFor(level))
    except Exception:  # noqa: BLE001 - the call raises in logging, as without recheck
        return False


def _emitter(name: str, level: int | None) -> Callable[..., Any]:
    def emit(logger: logging.Logger, *args: Any, **kwargs: Any) -> Any:
        stack = _captures()
        if stack:
            if level is None:  # Logger.log(level, msg, *args)
                lvl, msg, rest = (args[0], args[1], args[2:]) if len(args) >= 2 else (0, "", ())
            else:
                lvl, msg, rest = level, (args[0] if args else ""), args[1:]
            if _emits(logger, lvl):
                effect = Effect("logging", f"{logging.getLevelName(lvl)}:{logger.name}:{_render(msg, rest)}")
                for capture in stack:
                    capture.effects.append(effect)
        # this frame stands between the caller and logging: one level more, so the record
        # names the program's file and line, as it would without recheck
        level_up = kwargs.get("stacklevel", 1)
        if isinstance(level_up, int):
            kwargs["stacklevel"] = level_up + 1
        return _CALLS[name](logger, *args, **kwargs)

    emit.__name__ = emit.__qualname__ = name
    return emit


_EMITTERS = {name: _emitter(name, level) for name, level in (*_LOG_METHODS.items(), ("log", None))}


def hold_logging() -> None:
    """Keep the capture's hooks installed between captures until :func:`release_logging`.

    A ``watch()`` block enters a capture for every recompute, in any of its threads; holding
    the hooks for the block installs them once when it starts and removes them once when it
    ends (``logging.Logger``'s seven methods, the routers of ``sys.stdout`` and ``sys.stderr``,
    the warnings filter and display function), whatever order its threads' captures begin and
    end in.  Between captures, and in threads running none, the hooks record nothing and pass
    everything on as it was.  (Named for the logging patches, the first it held.)
    """
    _HOLD.take()


def release_logging() -> None:
    """Undo one :func:`hold_logging`; the last one removes the hooks (when no capture is
    active).  Raises without a hold."""
    _HOLD.release()


def _install_unless_active() -> None:
    if not _ACTIVE[0]:
        _install()


def _uninstall_unless_active() -> None:
    if not _ACTIVE[0]:
        _uninstall()


#: the holders that keep the hooks installed between captures (under the captures' lock:
#: a capture asks whether any holds them)
_HOLD = Hold("hold_logging", _install_unless_active, _uninstall_unless_active, _LOCK)
