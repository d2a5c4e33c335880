"""``recheck.watch()``: verify every checkpoint invocation an unmodified program makes.

::

    with recheck.watch(raise_on_finding=True, strict=False, store="digest") as w:
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
from recheck.findings import Finding, RecomputeMismatch, Report
from recheck.watcher.dispatch import DISPATCHER
from recheck.runtime.digests import STORES
from recheck.watcher.records import InvocationRecord

__all__ = ["COMPILE_NOTE", "Watch", "watch"]

COMPILE_NOTE = (
    "torch.compile compiled code in this block: compiled regions run no Python at run time and "
    'were not observed; run them eagerly with torch.compiler.set_stance("force_eager") to check them'
)
STRICT_NOTE = (
    "strict=True: non-reentrant recomputations were replayed fully (early stop off) to expose "
    "latent side effects; findings marked latent may not happen with early stop on"
)


class Watch:
    """A ``watch()`` block: its options, the records made while it was active, its report."""

    def __init__(self, *, raise_on_finding: bool = True, strict: bool = False, store: str = "digest") -> None:
        if store not in STORES:
            raise ValueError(f"recheck.watch: store must be one of {', '.join(map(repr, STORES))}, got {store!r}")
        if not isinstance(strict, bool) or not isinstance(raise_on_finding, bool):
            raise TypeError("recheck.watch: strict and raise_on_finding must be True or False")
        self.raise_on_finding, self.strict, self.store = raise_on_finding, strict, store
        self.records: list[InvocationRecord] = []
        self.notes: list[str] = []
        self.compiled_calls = 0
        self._lock = threading.Lock()
        self._report: Report | None = None
        self._active = False
        self._compilations_at_entry = 0
        #: this process's rank in a torch.distributed world (None for a single process)
        self.place: Place | None = None

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
        DISPATCHER.enter(self)
        self._active = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active = False
        DISPATCHER.exit(self)
        if self.place is None:  # the process group was set up inside the block
            self.place = current_place()
        report = self._report = self.build_report()
        if exc_type is None and self.raise_on_finding and not report.ok:
            raise RecomputeMismatch(report)

    @property
    def report(self) -> Report:
        """The report of the block (so far, while it is still running)."""
        return self._report if self._report is not None else self.build_report()

    def build_report(self) -> Report:
        """Findings of every record, the run's notes and its statistics."""
        with self._lock:
            records = list(self.records)
            notes = list(self.notes)
        ran = [r for r in records if r.forward is not None]
        calls: dict[Any, int] = {}
        for record in ran:
            calls[record.region] = max(calls.get(record.region, 0), record.index)
        findings: list[Finding] = []
        for record in ran:
            findings.extend(record.findings_of(calls[record.region]))
        with_grad = [r for r in ran if r.grad_enabled and not r.failed]
        recomputed = [r for r in with_grad if r.recomputes]
        never = len(with_grad) - len(recomputed)
        stats = {
            "regions": len(calls),
            "invocations": len(ran),
            "recomputations": sum(r.recomputes for r in ran),
            "verified": len(recomputed),
            "never_recomputed": never,
            "without_grad": sum(1 for r in ran if not r.grad_enabled),
            "compiled_calls": self.compiled_calls,
            "findings": len(findings),
        }
        place = self.place if self.place is not None else current_place()
        if place is not None:
            stats.update(rank=place.rank, world_size=place.world_size)
        if never:
            notes.append(f"{never} checkpointed forward(s) were never recomputed (no backward reached them); "
                         "counted, not checked")
        if self.compiled_calls or _dynamo_compilations() != self._compilations_at_entry:
            notes.append(COMPILE_NOTE)
        if self.strict:
            notes.append(STRICT_NOTE)
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


def watch(*, raise_on_finding: bool = True, strict: bool = False, store: str = "digest") -> Watch:
    """Verify every checkpoint invocation made inside the ``with`` block.

    ``store="digest"`` keeps exact 128-bit digests of each forward's outputs and saved
    tensors; ``store="copy"`` keeps full copies, so a mismatch reports its first differing
    element.  ``strict=True`` replays each non-reentrant recomputation fully (early stop
    off) to expose latent side effects; by default your configuration is left as it is.
    With findings and ``raise_on_finding=True``, leaving the block raises
    :class:`recheck.RecomputeMismatch`; the report is ``w.report`` either way.
    """
    return Watch(raise_on_finding=raise_on_finding, strict=strict, store=store)
