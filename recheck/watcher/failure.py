"""Errors are evidence: what a watch saw of a recompute that failed, worded for the user.

A step that fails inside backward with torch's ``CheckpointError`` ("Recomputed values ...
have different metadata") or another error raised while a region recomputes has usually been
watched up to that point: the record of the failing invocation holds the saved tensor whose
recomputed print differed, and what differed in the context between its forward and its
recompute (grad mode, autocast, default dtype, the mode stacks, the hooks in force, flags:
``runtime.context``).  :func:`explain_failure` gathers that into a :class:`FailureExplanation`,
which ``watch()`` appends to the error it sees propagate (``add_note``) and ``check_step`` turns
into a finding once the twin without checkpoints has completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch.utils import checkpoint

from recheck.catalogue import hint
from recheck.findings import Finding, Invocation, error_line, one_line
from recheck.runtime.explaining import CAUSES
from recheck.watcher.records import InvocationRecord

#: the kinds of a failing record's findings the explanation reads: the saved tensors, the causes
_TOLD = ("recompute", *CAUSES)

__all__ = ["ONLY_WHEN_CHECKPOINTED", "FailureExplanation", "add_note", "error_line", "explain_failure",
           "is_checkpoint_error"]

#: the subject of the finding of a step that fails only when checkpointed
ONLY_WHEN_CHECKPOINTED = "the step fails only when checkpointed"


def is_checkpoint_error(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's ``CheckpointError`` (a recompute that differs from its forward)."""
    try:
        from torch.utils.checkpoint import CheckpointError
    except ImportError:  # pragma: no cover - an old torch
        return False
    return isinstance(exc, CheckpointError)


def add_note(error: BaseException, note: str) -> None:
    """``note`` appended to the user's ``error`` once (Python 3.11+; before, the error is left as it is)."""
    if hasattr(error, "add_note") and note not in getattr(error, "__notes__", ()):
        error.add_note(note)


@dataclass(frozen=True)
class FailureExplanation:
    """What recheck saw of a failed recompute: where, the error, the first differing saved
    tensor, and what differed in the context (``(subject, at forward, at recompute, why)``)."""

    error: str
    region: str | None = None
    invocation: Invocation | None = None
    saved: str | None = None
    causes: tuple[tuple[str, str, str, str], ...] = ()
    #: the rule of the first cause, where a finding of the watch named it (a global: RC101)
    code: str | None = None

    @staticmethod
    def _cause_text(cause: tuple[str, str, str, str]) -> str:
        subject, then, now, _ = cause
        if not now:  # grad mode, autocast, default dtype: worded whole already
            return then
        verb = "were" if subject.split(" of ")[0].endswith(("hooks", "modes", "backends", "flags")) else "was"
        return f"{subject} {verb} {then} at forward and {now} at recompute"

    @property
    def cause(self) -> str | None:
        """The first difference of the context, worded, or None where none was seen."""
        return self._cause_text(self.causes[0]) if self.causes else None

    @property
    def why(self) -> str | None:
        return self.causes[0][3] or None if self.causes else None

    def where(self) -> str:
        if self.region is None:
            return "a checkpointed region recheck did not see recomputed"
        return self.region + (f", {self.invocation}" if self.invocation is not None else "")

    def lines(self) -> list[str]:
        """The explanation, one line each: where, the cause, the first differing saved tensor."""
        lines = [f"in {self.where()}"]
        if self.causes:
            lines.append(f"cause: {self.cause}")
            lines += [f"also: {self._cause_text(c)}" for c in self.causes[1:4]]
            if len(self.causes) > 4:
                lines.append(f"also: {len(self.causes) - 4} more difference(s) of the context")
            if self.why:
                lines.append(f"why: {self.why}")
        else:
            lines.append("cause: nothing recheck reads of the context (modes, hooks, grad mode, autocast, default "
                         "dtype, flags) differed; a value the region reads at run time (a flag, a size) may have")
        if self.saved:
            lines.append(f"first differing saved tensor: {self.saved}")
        return lines

    def note(self) -> str:
        """The note ``watch()`` appends to the error (several lines, each bounded)."""
        return "\n".join(["recheck: the recompute of a checkpointed region differs from its forward",
                          *(f"  {line}" for line in self.lines())])

    def finding(self, step: str) -> Finding:
        """The ``recompute`` finding of a step that fails only when checkpointed (its twin ran)."""
        detail = "\n".join([*self.lines()[1:], "without checkpointing (every checkpoint bypassed) the step completes"])
        return Finding("recompute", f"{ONLY_WHEN_CHECKPOINTED}: {self.error}", region=self.region or f"step {step}",
                       invocation=self.invocation, subject=ONLY_WHEN_CHECKPOINTED, detail=detail, code=self.code,
                       hint=hint(self.code, self.why) if self.code else self.why)


def explain_failure(records: Sequence[InvocationRecord], exc: BaseException) -> FailureExplanation:
    """What the records of a watch say about ``exc``, raised while the watched code ran.

    The failing invocation is the last one recomputed whose recompute differed (a saved tensor,
    an error, its context), else the last one recomputed.  Never raises: what cannot be read
    is left out."""
    error = error_line(exc)
    recomputed = [r for r in records if r.recomputes and r.forward is not None]
    if not recomputed:
        return FailureExplanation(error)
    calls: dict[object, int] = {}
    for record in records:
        calls[record.region] = max(calls.get(record.region, 0), record.index)
    drafts: dict[int, list[Finding]] = {}
    for record in recomputed:
        try:
            drafts[id(record)] = [f for f in record.findings_of(calls[record.region]) if f.kind in _TOLD]
        except Exception:  # noqa: BLE001 - that record's wording failed: it explains nothing
            drafts[id(record)] = []
    differing = [r for r in recomputed if drafts[id(r)] or r.context_changes]
    record = (differing or recomputed)[-1]
    saved = next((one_line(f.detail.splitlines()[0], 200) for f in drafts[id(record)]
                  if f.kind == "recompute" and f.subject == "saved tensors" and f.detail), None)
    invocation = Invocation(record.index, calls[record.region], dict(record.tags), record.region.callsite)
    causes = [(one_line(s, 80), one_line(a, 120), one_line(b, 120), w) for s, a, b, w in record.context_changes]
    if _autocast_cache_miss(record, exc):
        causes.append(_AUTOCAST_CACHE)
    # then what else the watch found differing at this recompute's start (a global the region
    # reads, a parameter changed in place, an RNG stream ...), most specific kind first
    found = sorted((f for f in drafts[id(record)] if f.kind in CAUSES and f.kind != "context"),
                   key=lambda f: CAUSES.index(f.kind))
    code = found[0].code if found and not causes else None
    causes += [(str(f.subject), one_line(f.message, 160), "", _advice(f)) for f in found]
    return FailureExplanation(error, str(record.region), invocation, saved, tuple(causes), code)


#: the cause of a selective checkpoint that meets a cast at recompute its forward never dispatched
_AUTOCAST_CACHE = ("autocast's weight cache", "autocast's weight cache served a cast at forward that the recompute "
                   "dispatches again (the cache is emptied when the autocast block ends)", "",
                   "selective checkpointing replays the ops its forward dispatched: turn the cache off "
                   "(torch.autocast(..., cache_enabled=False))")


def _autocast_cache_miss(record: InvocationRecord, exc: BaseException) -> bool:
    """Whether ``exc`` is selective checkpointing's miss of a cast autocast's weight cache served at
    the forward, by what state says: the forward ran under autocast with its cache on, and the
    failing dispatch mode on the error's traceback (``_CachedTorchDispatchMode``) met a cast, to an
    enabled autocast's dtype, of a leaf tensor that requires grad (a weight: what the cache keeps)
    more often than its forward recorded one."""
    context = record.forward.context if record.forward is not None else None
    cached = getattr(checkpoint, "_CachedTorchDispatchMode", None)
    if context is None or not context.autocast_cache or cached is None:
        return False
    dtypes = {dtype for _, enabled, dtype in context.autocast if enabled}
    tb = exc.__traceback__
    while tb is not None and not isinstance(tb.tb_frame.f_locals.get("self"), cached):
        tb = tb.tb_next
    if tb is None:
        return False
    local = tb.tb_frame.f_locals  # (the parameters of the mode's __torch_dispatch__)
    mode, func, args, kwargs = local["self"], local.get("func"), local.get("args"), local.get("kwargs")
    weight = args[0] if isinstance(args, tuple) and args else None
    return (func is torch.ops.aten._to_copy.default and isinstance(weight, torch.Tensor) and weight.is_leaf
            and weight.requires_grad and isinstance(kwargs, dict) and kwargs.get("dtype") in dtypes
            and getattr(mode, "func_counter", {}).get(func, 0) > len(getattr(mode, "storage", {}).get(func, ())))


def _advice(finding: Finding) -> str:
    """The advice of a finding's hint, without the rule's pointer."""
    return (finding.hint or "").split(" (RC")[0]
