"""``recheck check --step file.py:fn``: run one zero-argument training step under ``watch()``."""

from __future__ import annotations

from typing import Any, Callable

from recheck.loading import TargetError, load_target
from recheck.findings import Report
from recheck.watcher.session import watch

__all__ = ["StepError", "load_step", "run_step"]


class StepError(ValueError):
    """The target cannot be loaded or is not a callable; ``user_traceback`` is the user's part."""

    def __init__(self, message: str, user_traceback: str = "") -> None:
        super().__init__(message)
        self.user_traceback = user_traceback


def load_step(target: str) -> Callable[[], Any]:
    """The callable named by ``path/to/file.py:function`` or ``pkg.module:function``.

    Files load through the same loader as ``recheck check``'s region targets
    (:func:`recheck.loading.load_target`), so imports and error messages agree.
    """
    location, sep, name = target.rpartition(":")
    if not sep or not location or not name:
        raise StepError(f"expected FILE.py:FUNCTION, got {target!r}")
    try:
        (found,) = load_target(target)
    except TargetError as exc:
        raise StepError(str(exc), exc.user_traceback) from None
    return found.factory


def run_step(target: str, **watch_options: Any) -> Report:
    """Load ``file.py:fn``, call it once inside ``watch(**watch_options)`` and return the report.

    ``raise_on_finding`` defaults to False here: the caller prints the report and
    chooses the exit code.  Exceptions raised by the step itself propagate.
    """
    step = load_step(target)
    watch_options.setdefault("raise_on_finding", False)
    with watch(**watch_options) as watcher:
        step()
    return watcher.report
