"""The outcome of a suggestion, its report, and the census every suggestion starts from.

:class:`Suggestion` is what :func:`recheck.suggest` returns: ``str()`` is the text report
(:func:`render_suggestion`), ``to_dict()`` the JSON document (:func:`suggestion_to_dict`, with the
plan in the form :func:`recheck.apply_plan` reads).  :func:`census` finds the candidates, traces
and times every mode and builds the model, for either objective (:mod:`~recheck.cost.planner.suggest`,
:mod:`~recheck.cost.planner.throughput`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recheck.cost.planner.candidates import Candidates, find_candidates
from recheck.cost.planner.census import RunFigures, mode_config, time_configs, trace_config
from recheck.cost.planner.keeping import Change, change_for
from recheck.cost.planner.memory_model import Model
from recheck.cost.planner.plan_runs import ANCHORS, CandidateFigures, PendingRun, PlanRun, candidate_figures, kept_bytes
from recheck.cost.planner.plans import Plan
from recheck.cost.planner.solver import method_of
from recheck.cost.units import format_bytes, format_count, format_ms
from recheck.runtime.steps import StepState

__all__ = ["DEFINITIONS", "NothingFits", "Progress", "Suggestion", "Tell", "census", "nothing_fits", "outcome",
           "render_suggestion", "solver_name", "suggestion_to_dict"]

#: ``progress(what, done, total)``: told before each run.
Progress = Callable[[str, int, int], None]


class NothingFits(ValueError):
    """No plan's predicted peak is within the budget."""


@dataclass
class Suggestion:
    """The suggested plan, measured and verified, beside the anchors (``str()`` is the report)."""

    step: str
    budget: int
    objective: str
    plan: Plan
    suggested: PlanRun
    anchors: list[PlanRun]
    candidates: list[CandidateFigures]
    solver: str
    repeats: int
    attempts: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    throughput: dict[str, Any] | None = None
    clock: str = "wall"
    #: the line that keeps the plan in the user's code (None when the step checkpoints already)
    change: Change | None = None

    def best_anchor(self) -> PlanRun | None:
        """The fastest anchor measured within the budget (with the throughput objective: the one
        with the most samples per second, each at its own batch size)."""
        fitting = [a for a in self.anchors if a.name in ANCHORS and a.fits(self.budget)]
        if self.objective == "throughput":
            return max(fitting, key=lambda a: a.samples_per_second, default=None)
        return min(fitting, key=lambda a: a.measured_seconds, default=None)

    def __str__(self) -> str:
        return render_suggestion(self)

    def to_dict(self) -> dict[str, Any]:
        return suggestion_to_dict(self)


class Tell:
    """``tell(what)`` before each run: ``progress(what, done, total)``, the total kept ahead of ``done``."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what, self.done, max(self.total, self.done + 1))
        self.done += 1


def outcome(label: str, budget: int, objective: str, pending: list[PendingRun], candidates: Candidates,
            runs: dict[str, RunFigures], solver: str | None, repeats: int, attempts: list[dict[str, Any]],
            notes: list[str], clock: str, throughput: dict[str, Any] | None = None) -> Suggestion:
    """The :class:`Suggestion` of the finished plan runs ``pending``, the suggested plan's first."""
    suggested = pending[0].run
    plan = suggested.plan or Plan()
    return Suggestion(label, budget, objective, plan, suggested, [p.run for p in pending[1:]],
                      candidate_figures(candidates, runs), solver_name(solver, notes), repeats, attempts, notes,
                      throughput, clock, change_for(candidates, plan))


def census(step: Callable[[], Any], state: StepState, restore: Callable[[], None], repeats: int,
           tell: Callable[[str], None], clock: str = "wall") -> tuple[Candidates, dict[str, RunFigures], Model]:
    """Find the candidates, trace and time every mode, build the model."""
    tell("finding the candidates")
    candidates = find_candidates(step, state, restore)
    modes = ["none", "full", "selective"] + (["written"] if any(c.kind == "outer" for c in candidates.items) else [])
    runs = {}
    for mode in modes:
        tell(f"tracing every candidate: {mode}")
        runs[mode] = trace_config(step, state, restore, candidates, mode_config(mode, candidates))
    for c in candidates.units:  # a selective policy that saves no operator output is the full checkpoint
        c.selective = kept_bytes(runs["selective"], c) != kept_bytes(runs["full"], c)
    tell(f"timing the {len(modes)} modes, {repeats} run(s) each")
    time_configs(step, state, restore, candidates, list(runs.values()), repeats, clock=clock)
    return candidates, runs, Model(candidates, runs)


def solver_name(solver: str | None, notes: list[str]) -> str:
    """The solver used (a note says when the fallback ran because scipy is missing)."""
    method = method_of(solver)
    if method == "branch-and-bound" and solver is None:
        notes.append("solved exactly by branch and bound (scipy is not installed; pip install 'recheck[plan]' "
                     "for scipy.optimize.milp)")
    return method


def nothing_fits(budget: int, smallest: int) -> str:
    """The message of :class:`NothingFits`."""
    return (f"no plan fits the budget of {format_bytes(budget)}: the smallest predicted peak of any plan is "
            f"{format_bytes(smallest)}; raise the budget or make the step smaller (batch size, sequence length)")


# -- the report ---------------------------------------------------------------------------------

DEFINITIONS = {
    "predicted peak": "the model's observed peak for the plan: the largest window of the step, each window's "
                      "memory built from the runs of every candidate's variant",
    "measured peak": "the observed peak of a traced run of the step with exactly that plan (every live storage; "
                     "on CUDA also max_memory_allocated of the timed runs)",
    "step time": "median time of the timed runs, by the clock named above the candidates (predicted: the run "
                 "without checkpoints plus each checkpointed candidate's recompute time)",
    "check_step": "recheck.check_step on the step with that plan against the uncheckpointed step, bit for bit",
    "kept if not checkpointed": "bytes of the storages the candidate's operators save for backward",
    "inputs kept if checkpointed": "bytes its checkpoint keeps (its inputs; for an outer region as written, "
                                   "what it keeps as written)",
    "selective keeps": "bytes the selective variant keeps: its inputs and the outputs of the matrix products "
                       "and attention",
    "shared": "bytes of those storages another candidate holds too (one storage, counted once)",
    "recompute": "time and FLOPs of the candidate's recomputation in backward (full / selective)",
}


def _verdict(run: PlanRun) -> str:
    if run.verdict_error is not None:
        return f"not checked ({run.verdict_error})"
    if run.verdict is None:
        return "-"
    if run.verdict.ok:
        return "ok"
    first = run.verdict.findings[0]
    return f"{len(run.verdict.findings)} finding(s): {first.subject or first.kind}"


def _row(run: PlanRun, budget: int) -> list[str]:
    error = run.peak_error
    predicted = format_bytes(run.predicted_peak) if run.predicted_peak is not None else "-"
    measured = format_bytes(run.measured_peak)
    if run.cuda:
        measured += f" (cuda {format_bytes(run.cuda['max_memory_allocated'])})"
    return [run.name + (f" @ batch {run.batch_size}" if run.batch_size else ""), predicted, measured,
            f"{error:+.1%}" if error is not None else "-",
            f"{format_ms(run.predicted_seconds)} / {format_ms(run.measured_seconds)}",
            "yes" if run.fits(budget) else "no", _verdict(run)]


def _table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines


def render_suggestion(s: Suggestion) -> str:
    """The text report."""
    goal = "most samples per second" if s.objective == "throughput" else "least step time"
    lines = [f"recheck cost --suggest: {s.step}, budget {format_bytes(s.budget)}, objective: {goal}", ""]
    lines.append("suggested plan (apply it with recheck.apply_plan(model, plan); --format json writes it):")
    if s.plan.modules:
        lines += _table(["module", "checkpoint"], [[p, v] for p, v in s.plan.modules])
    else:
        lines.append("  checkpoint no module")
    for region in s.plan.regions:
        if region.keep:
            action = "keep this checkpoint call as written"
        elif "site-packages" in region.region or "dist-packages" in region.region:
            action = "drop this checkpoint call (it is an installed library's: turn that library's checkpointing off)"
        else:
            action = "remove this checkpoint call"
        lines.append(f"  {region.region}: {action}")
    if s.suggested.batch_size:
        lines.append(f"  at batch size {s.suggested.batch_size}")
    if s.change is not None:
        change = s.change
        rows = [[change.where, change.before or ""], ["becomes", change.code]] if change.where else \
            [["call", change.code]] if change.code else []
        lines += ["", f"keep it in your code: {change.how}",
                  *_table(["", ""], rows + ([["import", change.imports]] if change.imports else []))[1:]]
    lines.append("")
    runs = [s.suggested, *s.anchors]
    lines += _table(["plan", "predicted peak", "measured peak", "error", "step time (predicted / measured)",
                     "fits", "check_step"], [_row(r, s.budget) for r in runs])
    best = s.best_anchor()
    if best is None:
        lines += ["", "no anchor plan fits the budget"]
    elif s.objective == "throughput":
        rate, theirs = s.suggested.samples_per_second, best.samples_per_second
        lines += ["", f"suggested against the anchor with the most samples per second within the budget "
                      f"({best.name} at batch size {best.batch_size}): {rate:.1f} against {theirs:.1f} samples/s "
                      f"({rate / theirs if theirs else math.nan:.2f}x)"]
    elif s.suggested.fits(s.budget):
        ratio = best.measured_seconds / s.suggested.measured_seconds if s.suggested.measured_seconds else math.nan
        lines += ["", f"suggested against the fastest anchor within the budget ({best.name}): "
                      f"{format_ms(s.suggested.measured_seconds)} against {format_ms(best.measured_seconds)} ({ratio:.2f}x)"]
    if s.throughput:
        lines += [f"throughput: {s.throughput['samples_per_second']:.1f} samples/s predicted at batch size "
                  f"{s.throughput['batch_size']}, {s.suggested.samples_per_second:.1f} measured; "
                  f"{s.throughput['note']}"]
    clock = "CPU time of the process" if s.clock == "cpu" else "wall time"
    lines += ["", f"candidates (one traced run per mode, {s.repeats} timed run(s) each, {clock}):"]
    rows = []
    for c in s.candidates:
        recompute = " / ".join(f"{format_ms(c.recompute_seconds.get(m))}, {format_count(c.recompute_flops.get(m, 0), 'FLOP')}"
                               for m in ("full", "selective", "written") if m in c.recompute_seconds)
        rows.append([c.name, c.kind, "yes" if c.written else "no", format_bytes(c.kept_alive),
                     format_bytes(c.inputs_kept) if c.inputs_kept is not None else "-",
                     format_bytes(c.selective_kept) if c.selective_kept is not None else "-",
                     format_bytes(c.shared), recompute or "-"])
    lines += _table(["candidate", "kind", "checkpointed as written", "kept if not checkpointed",
                     "inputs kept if checkpointed", "selective keeps", "shared", "recompute"], rows)
    for run in runs:
        if run.verdict is not None and not run.verdict.ok:
            lines += ["", f"check_step of {run.name}:", str(run.verdict)]
    notes = list(s.notes)
    if s.attempts and len(s.attempts) > 1:
        notes.append("the first plan measured above the budget; the solver's budget was lowered by the "
                     "difference: " + "; ".join(f"{format_bytes(a['solver_budget'])} -> measured "
                                                  f"{format_bytes(a['measured_peak'])}" for a in s.attempts))
    if notes:
        lines += ["", "notes:", *(f"  - {n}" for n in notes)]
    lines += ["", "definitions:", *(f"  {k}: {v}" for k, v in DEFINITIONS.items())]
    return "\n".join(lines)


def _run_dict(run: PlanRun, budget: int) -> dict[str, Any]:
    return {
        "name": run.name, "plan": run.plan.to_dict() if run.plan is not None else None, "batch_size": run.batch_size,
        "predicted_peak_bytes": run.predicted_peak, "measured_peak_bytes": run.measured_peak,
        "peak_error": run.peak_error, "predicted_seconds": run.predicted_seconds,
        "measured_seconds": None if math.isnan(run.measured_seconds) else run.measured_seconds,
        "timed_seconds": run.samples, "samples_per_second": run.samples_per_second or None, "cuda": run.cuda,
        "fits": run.fits(budget),
        "check_step": None if run.verdict is None else {"ok": run.verdict.ok, "report": run.verdict.to_dict()},
        "check_step_error": run.verdict_error,
    }


def suggestion_to_dict(s: Suggestion) -> dict[str, Any]:
    """The JSON document: the plan (``recheck.apply_plan`` reads it), every run, every candidate."""
    best = s.best_anchor()
    return {
        "step": s.step, "budget_bytes": s.budget, "objective": s.objective, "solver": s.solver,
        "repeats": s.repeats, "clock": s.clock, "plan": s.plan.to_dict(),
        "suggested": _run_dict(s.suggested, s.budget), "anchors": [_run_dict(a, s.budget) for a in s.anchors],
        "fastest_anchor_within_budget": best.name if best is not None else None, "attempts": s.attempts,
        "throughput": s.throughput, "change": s.change.to_dict() if s.change is not None else None,
        "candidates": [{
            "name": c.name, "kind": c.kind, "checkpointed_as_written": c.written,
            "kept_if_not_checkpointed_bytes": c.kept_alive, "inputs_kept_if_checkpointed_bytes": c.inputs_kept,
            "selective_keeps_bytes": c.selective_kept, "shared_bytes": c.shared,
            "recompute_seconds": c.recompute_seconds, "recompute_flops": c.recompute_flops,
        } for c in s.candidates],
        "notes": s.notes, "definitions": DEFINITIONS,
    }
