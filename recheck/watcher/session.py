"""``recheck.watch()``: verify every checkpoint invocation an unmodified program makes.

::

    with recheck.watch(raise_on_finding=True, early_stop=None, store="digest") as w:
        train_step()
    w.report        # recheck.Report

The block installs the interception (``patches``), records every invocation
(``records``) and compares each recomputation with its own forward.  At exit the patched
objects are the originals again, the report is built, and with findings and
``raise_on_finding=True`` :class:`~recheck.findings.RecomputeMismatch` is raised (unless
the block is already raising).

In a torch.distributed process each rank's block verifies that rank's own invocations: its
records carry a ``rank`` tag, its report's statistics ``rank`` and ``world_size``, and its
title says which rank.  ``w.gather(dst=0)`` merges every rank's report on one rank
(``recheck.distributed.reports``).
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import Any

from recheck.distributed.world import Place, current_place
from recheck.findings import Finding, RecomputeMismatch, Report, could_not
from recheck.runtime.fingerprints import showing
from recheck.watcher.dispatch import DISPATCHER
from recheck.watcher.options import WatchOptions
from recheck.watcher.records import InvocationRecord

__all__ = ["COMPILE_NOTE", "REPLAY_NOTE", "Watch", "watch"]

COMPILE_NOTE = (
    "torch.compile compiled code in this block: compiled regions run no Python at run time and "
    'were not observed; run them eagerly with torch.compiler.set_stance("force_eager") to check them, '
    "or compare the compiled step with its eager twin: recheck.check_step"
)
REPLAY_NOTE = (
    "early_stop=False: non-reentrant recomputations were replayed fully to expose latent side "
    "effects; a finding marked latent happened only because of that replay: with the early stop "
    "its call asked for, it does not happen"
)


class Watch:
    """A ``watch()`` block: its options, the records made while it was active, its report."""

    def __init__(self, *, raise_on_finding: bool = True, early_stop: bool | None = None,
                 store: str | None = None, atol: float | None = None, rtol: float | None = None,
                 max_ulp: int | None = None, strict: bool | None = None,
                 checkpoint_functions: Any = None) -> None:
        if not isinstance(raise_on_finding, bool):
            raise TypeError("recheck.watch: raise_on_finding must be True or False")
        self.options = WatchOptions.of(early_stop=early_stop, store=store, atol=atol, rtol=rtol,
                                       max_ulp=max_ulp, strict=strict, checkpoint_functions=checkpoint_functions)
        self.raise_on_finding = raise_on_finding
        self.records: list[InvocationRecord] = []
        self.notes: list[str] = []
        self.compiled_calls = 0
        self._lock = threading.Lock()
        self._report: Report | None = None
        self._active = False
        self._compilations_at_entry = 0
        #: this process's rank in a torch.distributed world (None for a single process)
        self.place: Place | None = None

    @property
    def store(self) -> str:
        """``"digest"`` or ``"copy"``: what each forward keeps."""
        return self.options.store

    @property
    def strict(self) -> bool:
        """Deprecated name of ``options.replay_fully`` (``early_stop=False``)."""
        return self.options.replay_fully

    @property
    def compiled(self) -> bool:
        """Whether the block compiled code (Dynamo compiled, or traced a checkpoint call)."""
        return bool(self.compiled_calls) or _dynamo_compilations() != self._compilations_at_entry

    # -- called by the dispatcher -------------------------------------------------------

    def add_record(self, record: InvocationRecord) -> None:
        with self._lock:
            self.records.append(record)

    def add_note(self, note: str) -> None:
        with self._lock:
            if note not in self.notes:
                self.notes.append(note)

    def saw_compile(self) -> None:
        with self._lock:
            self.compiled_calls += 1

    # -- context manager ----------------------------------------------------------------

    def __enter__(self) -> Watch:
        if self._active or self._report is not None:
            raise RuntimeError("recheck.watch: a watch() block can be entered only once")
        self._compilations_at_entry = _dynamo_compilations()
        self.place = current_place()
        self._showing = showing()
        self._showing.__enter__()
        try:
            DISPATCHER.enter(self)
        except BaseException:  # a block that does not start keeps nothing open either
            self._showing.__exit__(None, None, None)
            raise
        self._active = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active = False
        try:
            DISPATCHER.exit(self)
        finally:
            self._showing.__exit__(None, None, None)
        if self.place is None:  # the process group was set up inside the block
            self.place = current_place()
        if exc is not None:
            self._explain(exc)
        report = self._report = self._built_report()
        if exc_type is None and self.raise_on_finding and not report.ok:
            raise RecomputeMismatch(report)

    def _explain(self, exc: BaseException) -> None:
        """Append what the block saw of a failed recompute to ``exc`` (torch's ``CheckpointError``,
        or an error a region raised while recomputing), and to the report's notes; the error
        itself propagates unchanged (recheck's own failure here is only a note)."""
        from recheck.watcher.failure import add_note, explain_failure, is_checkpoint_error

        try:
            with self._lock:
                records = list(self.records)
            if not (is_checkpoint_error(exc) or any(r.findings and any(
                    d.subject == "recompute" and d.kind == "recompute" for d in r.findings) for r in records)):
                return
            note = explain_failure(records, exc).note()
            add_note(exc, note)
            self.add_note(note.replace("\n  ", "; "))
        except Exception as failure:  # noqa: BLE001
            self.add_note(could_not("explain the error that ended the block", failure))

    @property
    def report(self) -> Report:
        """The report of the block (so far, while it is still running)."""
        return self._report if self._report is not None else self._built_report()

    def _built_report(self) -> Report:
        """:meth:`build_report`, or where recheck itself fails to build it, a report that says so
        (the block never raises recheck's own failure into the program it watches)."""
        try:
            return self.build_report()
        except Exception as exc:  # noqa: BLE001
            return Report(title="watch: the report could not be built",
                          notes=[*self.notes, could_not("build the report of the watch() block", exc)])

    def build_report(self) -> Report:
        """Findings of every record, the run's notes and its statistics."""
        with self._lock:
            records = list(self.records)
            notes = list(self.notes)
        # a call whose forward recheck failed to record still happened: counted, never verified
        counted = [r for r in records if r.forward is not None or r.failed]
        ran = [r for r in counted if r.forward is not None]
        calls: dict[Any, int] = {}
        for record in counted:
            calls[record.region] = max(calls.get(record.region, 0), record.index)
        findings: list[Finding] = []
        for record in ran:
            try:
                findings.extend(record.findings_of(calls[record.region]))
            except Exception as exc:  # noqa: BLE001 - recheck's own wording failed: the rest is reported
                record.could_not("report the findings", exc)
        for record in records:
            notes.extend(note for note in record.problems if note not in notes)
        # a call made inside a reentrant forward runs under its no_grad and is never recomputed
        # itself: the outer recompute makes it again, and that run is compared with it
        replaced = [r for r in ran if r.replaced]
        again = [r for r in ran if r.replay_of is not None]
        intended = [r for r in ran if (r.grad_enabled or r.replaced) and not r.failed]
        verified = [r for r in intended if r.recomputes or r.replay_of is not None]
        never = len(intended) - len(verified)
        stats = {
            "regions": len(calls),
            "invocations": len(counted),
            "recomputations": sum(r.recomputes for r in ran),
            "verified": len(verified),
            "never_recomputed": never,
            "without_grad": sum(1 for r in ran if not r.grad_enabled and not r.replaced),
            "replaced": len(replaced),
            "made_again": len(again),
            "compiled_calls": self.compiled_calls,
            "findings": len(findings),
        }
        place = self.place if self.place is not None else current_place()
        if place is not None:
            stats.update(rank=place.rank, world_size=place.world_size)
        if never:
            notes.append(f"{never} checkpointed forward(s) were never recomputed (no backward reached them); "
                         "counted, not checked")
        if replaced:
            checked = sum(1 for r in replaced if r.recomputes)
            notes.append(f"{len(replaced)} checkpoint call(s) were made inside a reentrant checkpoint's forward "
                         f"(under its no_grad) and made again by its recompute; {checked} verified against the "
                         "call made again")
        again = [r for r in again if r.replay_of is not None and not r.replay_of.replaced]  # those are the note above
        if again:
            notes.append(f"{len(again)} checkpoint call(s) made during another region's recompute were compared "
                         "with the call its forward made at the same place")
        if self.compiled:
            notes.append(COMPILE_NOTE)
        if self.options.replay_fully:
            notes.append(REPLAY_NOTE)
        return Report(findings, title=self._title(stats), notes=notes, stats=stats)

    def gather(self, dst: int = 0) -> Report | None:
        """Every rank's report merged on rank ``dst`` (None on the other ranks).

        A collective: every rank of the default process group must call it, after its
        block.  With ``raise_on_finding=True`` a rank with findings raises at the end of
        its block, so call it in a ``finally:`` (see ``recheck.distributed.reports``).
        """
        from recheck.distributed.reports import gather_report

        return gather_report(self.report, dst=dst)

    @staticmethod
    def _title(stats: dict[str, Any]) -> str:
        where = f" (rank {stats['rank']} of {stats['world_size']})" if "rank" in stats else ""
        return (f"watch{where}: {stats['invocations']} checkpoint invocation(s) of {stats['regions']} region(s), "
                f"{stats['verified']} verified against their recomputation")


def _dynamo_compilations() -> int:
    """How much Dynamo has compiled so far in this process (0 before it is imported).

    Checkpoint calls that Dynamo traces may never reach Python (torch 2.11 traces the
    region without calling ``checkpoint``), so the compile note also fires on this count.
    """
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return 0
    return int(sum(counters["stats"].values()))


def watch(*, raise_on_finding: bool = True, early_stop: bool | None = None, store: str | None = None,
          atol: float | None = None, rtol: float | None = None, max_ulp: int | None = None,
          strict: bool | None = None, checkpoint_functions: Any = None) -> Watch:
    """Verify every checkpoint invocation made inside the ``with`` block.

    Args:
        raise_on_finding: leaving the block with findings raises
            :class:`recheck.RecomputeMismatch` (the report is ``w.report`` either way).
        early_stop: ``None`` (default) keeps each call's own setting; ``False`` replays every
            non-reentrant recomputation fully to expose latent side effects (the same knob
            as ``recheck.check(early_stop=...)``); ``True`` forces early stop.
        store: ``"digest"`` keeps exact 128-bit digests of each forward's outputs and saved
            tensors; ``"copy"`` keeps full copies, so a mismatch reports its first differing
            element.  Default: ``"digest"``, or ``"copy"`` with a tolerance.
        atol, rtol: a tolerance for floating-point values, given together (as
            ``torch.testing.assert_close`` requires); integer state stays exact.
        max_ulp: a tolerance in units in the last place, instead of ``atol``/``rtol``.
        strict: deprecated; ``strict=True`` is ``early_stop=False``.
        checkpoint_functions: dotted names of the project's own functions that checkpoint
            their first argument (``checkpoint-functions`` in ``[tool.recheck]``); their calls
            are verified too when their module is imported.  A name that cannot be patched
            becomes a report note.

    Raises:
        TypeError, ValueError: for an option of the wrong type or value, before anything runs.

    Example:
        >>> with recheck.watch(raise_on_finding=False) as w:   # doctest: +SKIP
        ...     train_step()
        >>> print(w.report)                                    # doctest: +SKIP
    """
    return Watch(raise_on_finding=raise_on_finding, early_stop=early_stop, store=store, atol=atol,
                 rtol=rtol, max_ulp=max_ulp, strict=strict, checkpoint_functions=checkpoint_functions)
