"""Capture of the side effects a region emits: logging calls, stdout/stderr writes, warnings.

:class:`EffectCapture` is a context manager; while it is active every call of a
``logging.Logger`` emitting method (``debug`` ... ``critical``, ``log``; ``exception`` goes through ``error``)
is recorded whether or not the logger's level lets it through, writes to
``sys.stdout`` / ``sys.stderr`` are recorded, and warnings are recorded with the
``always`` filter.  With ``passthrough=True`` the output still reaches the user
(the plain reference run); otherwise it is swallowed (the checkpointed runs).

Not seen: writes to file descriptors 1/2 from C code, ``print(file=sys.__stdout__)``,
and loggers whose class overrides the emitting methods.
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


class _Tee:
    """A text stream that records its writes in ``effects`` as ``channel`` and optionally
    forwards them (two are made per capture: no closure for each)."""

    __slots__ = ("_target", "_effects", "_channel", "_passthrough")

    def __init__(self, target: Any, effects: list[Effect], channel: str, passthrough: bool) -> None:
        self._target = target
        self._effects = effects
        self._channel = channel
        self._passthrough = passthrough

    def write(self, text: str) -> int:
        if text:
            self._effects.append(Effect(self._channel, text))
        if self._passthrough:
            return self._target.write(text)
        return len(text)

    def flush(self) -> None:
        if self._passthrough:
            self._target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def _render(msg: Any, args: tuple) -> str:
    try:
        return str(msg) % args if args else str(msg)
    except Exception:  # a broken format string is the user's, keep what we can
        return f"{msg!s} {args!r}"


class EffectCapture:
    """Record logging, stdout/stderr and warnings while active (not re-entrant).

    ``logging.Logger``'s emitting methods are patched while any capture is active, by
    functions made once (a capture is entered for every recompute ``watch()`` sees); a
    logging call made while several captures are active is recorded in each.
    """

    def __init__(self, passthrough: bool = False) -> None:
        self.passthrough = passthrough
        self.effects: list[Effect] = []
        self._saved: dict[str, Any] = {}
        self._warnings: Any = None
        self._caught: list[warnings.WarningMessage] = []

    def __enter__(self) -> EffectCapture:
        with _LOCK:
            if not _ACTIVE and not _HOLD.count:
                _install()
            _ACTIVE.append(self)
        self._saved["stdout"], self._saved["stderr"] = stdout, stderr = sys.stdout, sys.stderr
        sys.stdout = _Tee(stdout, self.effects, "stdout", self.passthrough)
        sys.stderr = _Tee(stderr, self.effects, "stderr", self.passthrough)
        self._warnings, self._caught = _recording_every_warning()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._warnings.__exit__(*exc)
        for message in self._caught:
            self.effects.append(Effect("warning", f"{message.category.__name__}: {message.message}"))
            if self.passthrough:
                warnings.warn_explicit(message.message, message.category,
                                       message.filename, message.lineno)
        sys.stdout, sys.stderr = self._saved["stdout"], self._saved["stderr"]
        with _LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            if not _ACTIVE and not _HOLD.count:
                _uninstall()


def _recording_every_warning() -> tuple[warnings.catch_warnings, list[warnings.WarningMessage]]:
    """A ``catch_warnings`` entered with the ``always`` filter on top, and the list it records
    into.  From Python 3.11 it takes the filter to set on entry: one call fewer for each capture
    than ``simplefilter`` after it, to the same effect."""
    if _ACTION_AT_ENTRY:
        caught = warnings.catch_warnings(record=True, action="always")
        return caught, caught.__enter__()
    caught = warnings.catch_warnings(record=True)
    log = caught.__enter__()
    warnings.simplefilter("always")
    return caught, log


_ACTION_AT_ENTRY = sys.version_info >= (3, 11)


#: the active captures, in the order they were entered
_ACTIVE: list[EffectCapture] = []
_LOCK = threading.Lock()
#: per patched method: what ``logging.Logger.__dict__`` held before (None: nothing) and the
#: method the patch calls on, both read when the first capture is entered
_SAVED: dict[str, Any] = {}
_CALLS: dict[str, Callable[..., Any]] = {}


def _emitter(name: str, level: int | None) -> Callable[..., Any]:
    def emit(logger: logging.Logger, *args: Any, **kwargs: Any) -> Any:
        if level is None:  # Logger.log(level, msg, *args)
            lvl, msg, rest = (args[0], args[1], args[2:]) if len(args) >= 2 else (0, "", ())
        else:
            lvl, msg, rest = level, (args[0] if args else ""), args[1:]
        effect = Effect("logging", f"{logging.getLevelName(lvl)}:{logger.name}:{_render(msg, rest)}")
        for capture in _ACTIVE.copy():  # a capture may end meanwhile (another thread)
            capture.effects.append(effect)
        return _CALLS[name](logger, *args, **kwargs)

    emit.__name__ = emit.__qualname__ = name
    return emit


_EMITTERS = {name: _emitter(name, level) for name, level in (*_LOG_METHODS.items(), ("log", None))}


def _install() -> None:
    logger_class = logging.Logger
    namespace = vars(logger_class)  # (a live view: one for the seven methods)
    for name, emit in _EMITTERS.items():
        _SAVED[name] = namespace.get(name)
        _CALLS[name] = emit.__wrapped__ = getattr(logger_class, name)  # type: ignore[attr-defined]
        setattr(logger_class, name, emit)


def _uninstall() -> None:
    logger_class = logging.Logger
    namespace = vars(logger_class)
    for name in _EMITTERS:
        original = _SAVED.pop(name, None)
        if original is not None:
            setattr(logger_class, name, original)
        elif name in namespace:
            delattr(logger_class, name)


def hold_logging() -> None:
    """Keep the logging patches installed between captures until :func:`release_logging`.

    A ``watch()`` block enters a capture for every recompute; patching ``logging.Logger``
    once for the block instead of once per recompute saves setting and restoring seven class
    attributes each time.  Between captures the patched methods record nothing and call the
    originals.
    """
    _HOLD.take()


def release_logging() -> None:
    """Undo one :func:`hold_logging`; the last one restores ``logging.Logger`` (when no capture is
    active).  Raises without a hold."""
    _HOLD.release()


def _install_unless_active() -> None:
    if not _ACTIVE:
        _install()


def _uninstall_unless_active() -> None:
    if not _ACTIVE:
        _uninstall()


#: the holders that keep the patches installed between captures (under the captures' lock:
#: a capture asks whether any holds them)
_HOLD = Hold("hold_logging", _install_unless_active, _uninstall_unless_active, _LOCK)
