"""The first N steps of a training loop, each inside its own ``recheck.watch()`` block.

The framework callbacks (:mod:`.hf_trainer`, :mod:`.lightning_trainer`) call
:meth:`StepWindow.begin` when a step starts and :meth:`StepWindow.end` when it ends; the
window says what it found through the ``log`` function the framework gives it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from recheck.findings import RecomputeMismatch, Report, could_not

__all__ = ["StepWindow"]


class StepWindow:
    """Watch steps ``1..steps``; ``log(level, message)`` hears of each; ``fail_fast`` raises.

    ``watch_options`` go to ``recheck.watch()`` unchanged (``early_stop=``, ``store=``, ...),
    except ``raise_on_finding``, which is ``fail_fast`` here: the report is logged first.
    """

    def __init__(self, steps: int, fail_fast: bool, log: Callable[[int, str], None],
                 watch_options: dict[str, Any]) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"recheck: steps must be a whole number of at least 1, got {steps!r}")
        if not isinstance(fail_fast, bool):
            raise TypeError(f"recheck: fail_fast must be True or False, got {fail_fast!r}")
        if "raise_on_finding" in watch_options:
            raise TypeError("recheck: pass fail_fast=True instead of raise_on_finding (the report is "
                            "logged through the framework first)")
        from recheck.watcher import watch

        watch(raise_on_finding=False, **watch_options)  # bad options are refused now, not mid-training
        self.steps, self.fail_fast, self.log, self.watch_options = steps, fail_fast, log, dict(watch_options)
        self.reports: list[Report] = []
        self._watch: Any = None

    @property
    def watching(self) -> bool:
        return self._watch is not None

    @property
    def done(self) -> bool:
        return len(self.reports) >= self.steps

    @property
    def report(self) -> Report:
        """Every watched step's report, merged (empty before the first step ends)."""
        return Report.merge(self.reports)

    def begin(self) -> None:
        """A training step starts: watch it if it is one of the first ``steps``.

        Where the watch cannot start (recheck's own failure), the step runs unwatched and the
        log says why: the callbacks never stop the training for recheck's sake."""
        self.close()  # a step that never ended (the loop raised, or skipped its end hook)
        if self.done:
            return
        from recheck.watcher import watch

        watcher = watch(raise_on_finding=False, **self.watch_options)
        try:
            watcher.__enter__()
        except Exception as exc:  # noqa: BLE001
            return self._failed(f"watch training step {len(self.reports) + 1}", exc)
        self._watch = watcher

    def end(self) -> Report | None:
        """The step ends: its report (None when it was not watched), logged; raises if asked
        (``fail_fast``: the one exception the window raises on purpose)."""
        if self._watch is None:
            return None
        watcher, self._watch = self._watch, None
        try:
            watcher.__exit__(None, None, None)
            report = watcher.report
        except Exception as exc:  # noqa: BLE001 - recheck's own failure: the training goes on
            self._failed(f"report training step {len(self.reports) + 1}", exc)
            return None
        self.reports.append(report)
        try:
            self._log(report)
        except Exception as exc:  # noqa: BLE001
            self._failed(f"word the report of training step {len(self.reports)}", exc)
        if self.fail_fast and not report.ok:
            raise RecomputeMismatch(report)
        return report

    def _log(self, report: Report) -> None:
        """What one watched step found, through the framework's log."""
        number = len(self.reports)
        where = f"recheck: training step {number} of the {self.steps} watched"
        if not report.ok:
            self.log(logging.WARNING, f"{where}: {report.stats['findings']} finding(s)\n{report}")
        elif not report.stats.get("invocations"):
            self.log(logging.WARNING, f"{where}: no checkpoint call was made (is gradient checkpointing on?)")
        else:
            self.log(logging.INFO, f"{where}: {report.stats['verified']} checkpoint call(s) verified, "
                                   "recomputation identical")
        if self.done:
            merged = self.report
            self.log(logging.INFO if merged.ok else logging.WARNING,
                     f"recheck: watched the first {self.steps} training step(s): "
                     f"{merged.stats.get('invocations', 0)} checkpoint call(s), "
                     f"{merged.stats.get('verified', 0)} verified, {len(merged)} finding(s)")

    def close(self) -> None:
        """Leave an open watch block without reporting it (the step did not finish)."""
        if self._watch is not None:
            watcher, self._watch = self._watch, None
            try:
                watcher.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001
                self._failed("close the watch of an unfinished step", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        """recheck's own failure to ``what``: a warning in the framework's log, never raised."""
        self.log(logging.WARNING, "recheck: " + could_not(what, exc))
