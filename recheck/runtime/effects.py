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
import warnings
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Effect", "EffectCapture"]

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
    """A text stream that records writes and optionally forwards them."""

    def __init__(self, target: Any, record: Callable[[str], None], passthrough: bool) -> None:
        self._target = target
        self._record = record
        self._passthrough = passthrough

    def write(self, text: str) -> int:
        if text:
            self._record(text)
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
    """Record logging, stdout/stderr and warnings while active (not re-entrant)."""

    def __init__(self, passthrough: bool = False) -> None:
        self.passthrough = passthrough
        self.effects: list[Effect] = []
        self._saved: dict[str, Any] = {}
        self._warnings: Any = None
        self._caught: list[warnings.WarningMessage] = []

    def _patched(self, name: str, level: int | None) -> Callable[..., Any]:
        original = getattr(logging.Logger, name)
        effects = self.effects

        def emit(logger: logging.Logger, *args: Any, **kwargs: Any) -> Any:
            if level is None:  # Logger.log(level, msg, *args)
                lvl, msg, rest = (args[0], args[1], args[2:]) if len(args) >= 2 else (0, "", ())
            else:
                lvl, msg, rest = level, (args[0] if args else ""), args[1:]
            name_ = logging.getLevelName(lvl)
            effects.append(Effect("logging", f"{name_}:{logger.name}:{_render(msg, rest)}"))
            return original(logger, *args, **kwargs)

        emit.__wrapped__ = original  # type: ignore[attr-defined]
        return emit

    def __enter__(self) -> EffectCapture:
        for name, level in _LOG_METHODS.items():
            self._saved[name] = logging.Logger.__dict__.get(name)
            setattr(logging.Logger, name, self._patched(name, level))
        self._saved["log"] = logging.Logger.__dict__.get("log")
        logging.Logger.log = self._patched("log", None)  # type: ignore[method-assign]
        self._saved["stdout"], self._saved["stderr"] = sys.stdout, sys.stderr
        sys.stdout = _Tee(sys.stdout, lambda t: self.effects.append(Effect("stdout", t)),
                          self.passthrough)
        sys.stderr = _Tee(sys.stderr, lambda t: self.effects.append(Effect("stderr", t)),
                          self.passthrough)
        self._warnings = warnings.catch_warnings(record=True)
        self._caught = self._warnings.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._warnings.__exit__(*exc)
        for message in self._caught:
            self.effects.append(Effect("warning", f"{message.category.__name__}: {message.message}"))
            if self.passthrough:
                warnings.warn_explicit(message.message, message.category,
                                       message.filename, message.lineno)
        sys.stdout, sys.stderr = self._saved["stdout"], self._saved["stderr"]
        for name in (*_LOG_METHODS, "log"):
            original = self._saved[name]
            if original is None:
                delattr(logging.Logger, name)
            else:
                setattr(logging.Logger, name, original)
