"""Render per-stage pipeline figures: the real run (``--ranks``), the plan (``--plan``), both side by side.

As in :mod:`recheck.cost.table`, every figure is printed with its definition beside it;
:data:`STAGE_DEFINITIONS` is the one place the terms are written down.
"""

from __future__ import annotations

from typing import Any

from recheck.cost.pipeline.plan import StagePrediction
from recheck.cost.router import MODES
from recheck.cost.pipeline.stages import StageReport
from recheck.cost.table import row
from recheck.cost.units import format_bytes

__all__ = ["STAGE_DEFINITIONS", "plan_error", "plan_to_dict", "render_comparison", "render_plan", "render_stages", "stages_to_dict"]

STAGE_DEFINITIONS: dict[str, str] = {
    "bundle": "a bundle is the saved state of one microbatch on one stage: storages autograd holds for its "
    "backward, saved during its forward chunk (the last stage's loss included)",
    "alive_at_peak": "bundles holding bytes when the stage's retained saved state peaked (which microbatches)",
    "theoretical_bundles": "most microbatches forwarded and not yet backpropagated at once in the schedule's "
    "order (GPipe: M; 1F1B: min(M, S - s))",
    "bundle_bytes": "bytes a bundle holds when its backward begins (largest over microbatches; storages shared "
    "with another microbatch excluded)",
    "backward_extra": "most bytes held for a microbatch above its bundle while its backward runs (what a "
    "checkpoint rebuilds)",
    "shared_bytes": "bytes held for several microbatches at once, counted once (the step's input batch: each "
    "microbatch is a view of it)",
    "second_holder_bytes": "bytes of a bundle that autograd released by the end of its backward but that stay "
    "allocated because something else holds them (recv buffers, the schedule's caches); per microbatch",
    "comm_buffer_bytes": "the stage's recv buffers for activations (from the previous stage) and gradients "
    "(from the next), all microbatches; they exist before the step and after it",
    "retained_peak": "most bytes autograd held at once for this stage's bundles and shared storages "
    "(deduplicated by storage, parameters excluded)",
    "rank_retained_peak": "the same for everything autograd held on the rank (all its stages, and state held "
    "outside any chunk); as in the single-process report",
    "predicted_retained_peak": "the peak the schedule's order predicts: bundles alive x bundle bytes + shared "
    "bytes + backward extra of the microbatch in backward, at the worst action",
    "observed_peak": "most bytes alive at once on the rank: every storage an operator created in the step plus "
    "parameters, gradients, optimizer state, data and recv buffers that existed before it",
    "plan_peak": "the retained-state peak recheck cost --plan predicts from one microbatch measured in one process",
    "plan_error": "(plan prediction - measured retained peak) / measured retained peak",
    "predicted_observed_peak": "the observed peak the plan predicts: before each action of the schedule's order, "
    "fixed state + gradients allocated so far + bundles alive x (bundle bytes not in recv buffers or data) + "
    "outputs the schedule holds x kept bytes + input gradients a send still holds x sent bytes; plus the action's "
    "rise; the most over the actions and the optimizer step",
    "observed_plan_error": "(plan prediction - measured observed peak) / measured observed peak",
    "fixed_state": "parameters + optimizer state + communication buffers + M x data",
    "data": "bytes per microbatch of storages the planning step made before the first stage and the stage reads "
    "(stage 0: its inputs; the last stage: the loss's targets); the stage holds M of them (the batch)",
    "kept": "bytes per microbatch a stage's forward leaves allocated and autograd does not hold (its output; on "
    "the last stage also the loss): GPipe and the last stage hold them until the step ends (send handles, "
    "output_chunks), 1F1B until the microbatch's backward (fwd_cache) plus one warm-up send",
    "sent_gradient": "bytes per microbatch of the gradient a stage sends back (the size of its received input), "
    "held by a send handle: GPipe until the step ends, 1F1B until the next backward",
    "forward_rise": "most bytes alive during the stage's forward (its loss included on the last stage) above "
    "those alive when it began, measured in the planning run",
    "first_backward_rise": "the same for the stage's backward in the planning run (gradients allocated by it)",
    "backward_rise": "the same with the stage's gradients already allocated (a later microbatch's weight "
    "gradients are added to them)",
    "optimizer_rise": "the same for the optimizer step of the planning run (all stages at once: an upper bound "
    "for one stage)",
    "peak_action": "the action of the schedule's order where the predicted observed peak falls",
    "parameters": "bytes of the parameters of the modules whose forward ran inside the stage's tag",
    "gradients": "bytes of the .grad the stage's parameters that require grad accumulate",
    "optimizer_state": "bytes of the optimizers' state for the stage's parameters after the step",
}


def _microbatches(ids: list[int]) -> str:
    if not ids:
        return "0"
    if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"{len(ids)} ({ids[0]}-{ids[-1]})"
    return f"{len(ids)} ({','.join(map(str, ids))})"


def plan_error(predicted: int, measured: int) -> float | None:
    """Relative error of a prediction (None when nothing was measured)."""
    return None if measured == 0 else (predicted - measured) / measured


def render_stages(reports: list[StageReport], label: str) -> str:
    """The per-stage table of a real pipeline run (one block per stage)."""
    if not reports:
        return "recheck cost: no pipeline stage was measured"
    first = reports[0]
    ranks = len({r.rank for r in reports})
    title = (f"recheck cost: {label}: {first.schedule}, {first.num_stages} stage(s), {first.microbatches} "
             f"microbatches, measured on the real schedule ({ranks} rank(s))")
    lines = [title, f"  ({STAGE_DEFINITIONS['bundle']})"]
    for report in sorted(reports, key=lambda r: r.stage):
        c, b = report.modes["checkpointed"], report.modes["bypassed"]
        lines += ["", f"  stage {report.stage} (rank {report.rank})" + " " * 23 + f"{'checkpointed':>14}{'bypassed':>14}"]
        if report.stages_on_rank > 1:
            lines.append(f"  note: rank {report.rank} holds {report.stages_on_rank} stages; its peaks cover all of them")
        theoretical = "-" if report.theoretical_bundles is None else str(report.theoretical_bundles)
        rows = [
            ("bundles alive at the retained peak", [_microbatches(m.bundles.alive_at_peak) for m in (c, b)], "alive_at_peak"),
            ("theoretical bundle count", [theoretical, theoretical], "theoretical_bundles"),
            ("bytes per bundle", [format_bytes(m.bundle_bytes) for m in (c, b)], "bundle_bytes"),
            ("rebuilt in backward", [format_bytes(m.bundles.backward_extra) for m in (c, b)], "backward_extra"),
            ("shared by several bundles", [format_bytes(m.bundles.shared_bytes) for m in (c, b)], "shared_bytes"),
            ("kept by a second holder after backward",
             [format_bytes(max(m.bundles.second_holder_bytes.values(), default=0)) for m in (c, b)], "second_holder_bytes"),
            ("communication buffers", [format_bytes(report.comm_buffer_bytes)] * 2, "comm_buffer_bytes"),
            ("retained saved state, peak", [format_bytes(m.retained_peak) for m in (c, b)], "retained_peak"),
            ("  ... of the whole rank", [format_bytes(m.rank_retained_peak) for m in (c, b)], "rank_retained_peak"),
            ("  ... predicted from the bundle count",
             ["-" if m.predicted_retained_peak is None else format_bytes(m.predicted_retained_peak) for m in (c, b)],
             "predicted_retained_peak"),
            ("observed peak", [format_bytes(m.observed_peak) for m in (c, b)], "observed_peak"),
        ]
        lines += [row(text, values, STAGE_DEFINITIONS[term], 40) for text, values, term in rows]
        order = " ".join(c.bundles.order)
        if order:
            lines.append(f"  order run: {order}")
        for name in MODES:
            mode = report.modes[name]
            if mode.predicted_retained_peak not in (None, mode.retained_peak):
                lines.append(f"  mismatch: the {name} retained peak differs from the schedule's prediction by "
                             f"{mode.retained_peak - mode.predicted_retained_peak:+d} B")
    return "\n".join(lines)


def stages_to_dict(reports: list[StageReport], label: str) -> dict[str, Any]:
    """The real run's figures as a JSON-ready dict, with the definitions."""
    return {
        "target": label,
        "stages": [r.to_dict() for r in sorted(reports, key=lambda r: r.stage)],
        "definitions": STAGE_DEFINITIONS,
    }


def render_plan(predictions: list[StagePrediction], kind: str, microbatches: int, label: str) -> str:
    """The per-stage prediction of ``recheck cost --plan``."""
    title = (f"recheck cost --plan: {label}: predicted for {kind}, {len(predictions)} stage(s), {microbatches} "
             "microbatches (from one microbatch measured in one process; nothing launched)")
    lines = [title]
    for p in predictions:
        lines += ["", f"  stage {p.stage}" + " " * 34 + f"{'checkpointed':>14}{'bypassed':>14}"]
        rows = [
            ("theoretical bundle count", [str(p.theoretical_bundles)] * 2, "theoretical_bundles"),
            ("bytes per bundle", [format_bytes(p.bundle_bytes[m]) for m in MODES], "bundle_bytes"),
            ("rebuilt in backward", [format_bytes(p.backward_extra[m]) for m in MODES], "backward_extra"),
            ("shared by all bundles", [format_bytes(p.shared_bytes[m]) for m in MODES], "shared_bytes"),
            ("communication buffers", [format_bytes(p.comm_buffer_bytes)] * 2, "comm_buffer_bytes"),
            ("retained saved state, peak (predicted)", [format_bytes(p.retained_peak[m]) for m in MODES],
             "predicted_retained_peak"),
            ("parameters", [format_bytes(p.parameter_bytes)] * 2, "parameters"),
            ("gradients", [format_bytes(p.gradient_bytes)] * 2, "gradients"),
            ("optimizer state", [format_bytes(p.optimizer_bytes)] * 2, "optimizer_state"),
        ]
        if all(p.observed_terms.get(m) for m in MODES):
            terms = [p.observed_terms[m] for m in MODES]
            rows += [
                ("fixed state", [format_bytes(t["fixed"]) for t in terms], "fixed_state"),
                ("  ... data per microbatch", [format_bytes(t["data_per_microbatch"]) for t in terms], "data"),
                ("kept per microbatch forwarded", [format_bytes(t["kept"]) for t in terms], "kept"),
                ("gradient sent per microbatch", [format_bytes(t["sent_gradient"]) for t in terms], "sent_gradient"),
                ("rise in forward", [format_bytes(t["forward_rise"]) for t in terms], "forward_rise"),
                ("rise in the first backward", [format_bytes(t["first_backward_rise"]) for t in terms], "first_backward_rise"),
                ("rise in a later backward", [format_bytes(t["backward_rise"]) for t in terms], "backward_rise"),
                ("rise in the optimizer step", [format_bytes(t["optimizer_rise"]) for t in terms], "optimizer_rise"),
                ("observed peak (predicted)", [format_bytes(p.observed_peak[m] or 0) for m in MODES],
                 "predicted_observed_peak"),
                ("  ... at action", [t["peak_action"] for t in terms], "peak_action"),
            ]
        lines += [row(text, values, STAGE_DEFINITIONS[term], 40) for text, values, term in rows]
    if not all(p.observed_terms for p in predictions):
        unpredicted = ("  not predicted: the observed peak (this torch cannot name the autograd node running "
                       "an operator: torch 2.1 or later needed)")
        lines += ["", unpredicted]
    return "\n".join(lines)


def plan_to_dict(predictions: list[StagePrediction], kind: str, microbatches: int, label: str) -> dict[str, Any]:
    """The plan as a JSON-ready dict, with the definitions."""
    return {
        "target": label,
        "schedule": kind,
        "microbatches": microbatches,
        "stages": [p.to_dict() for p in predictions],
        "definitions": STAGE_DEFINITIONS,
    }


def render_comparison(real: dict[str, list[StageReport]], plans: dict[str, list[StagePrediction]]) -> str:
    """One line per schedule, stage and mode: the real run beside the schedule's and the plan's predictions."""
    header = (f"  {'schedule':<9}{'stage':>6}  {'mode':<13}{'alive':>12}{'theory':>7}{'bundle':>11}{'rebuilt':>11}"
              f"{'shared':>10}{'2nd holder':>11}{'comm buf':>10}{'retained':>11}{'by count':>11}{'plan':>11}"
              f"{'plan err':>9}{'observed':>11}{'obs plan':>11}{'obs err':>9}")
    lines = ["per-stage saved state, real pipeline run vs predictions", header]
    worst = worst_observed = 0.0
    for kind, reports in real.items():
        predictions = {p.stage: p for p in plans.get(kind, [])}
        for report in sorted(reports, key=lambda r: r.stage):
            for mode in MODES:
                m = report.modes[mode]
                plan = predictions.get(report.stage)
                planned = None if plan is None else plan.retained_peak[mode]
                error = None if planned is None else plan_error(planned, m.retained_peak)
                worst = max(worst, abs(error or 0.0))
                observed = None if plan is None else plan.observed_peak.get(mode)
                observed_error = None if observed is None else plan_error(observed, m.observed_peak)
                worst_observed = max(worst_observed, abs(observed_error or 0.0))
                lines.append(
                    f"  {kind:<9}{report.stage:>6}  {mode:<13}{_microbatches(m.bundles.alive_at_peak):>12}"
                    f"{report.theoretical_bundles if report.theoretical_bundles is not None else '-':>7}"
                    f"{format_bytes(m.bundle_bytes):>11}{format_bytes(m.bundles.backward_extra):>11}"
                    f"{format_bytes(m.bundles.shared_bytes):>10}"
                    f"{format_bytes(max(m.bundles.second_holder_bytes.values(), default=0)):>11}"
                    f"{format_bytes(report.comm_buffer_bytes):>10}{format_bytes(m.retained_peak):>11}"
                    f"{'-' if m.predicted_retained_peak is None else format_bytes(m.predicted_retained_peak):>11}"
                    f"{'-' if planned is None else format_bytes(planned):>11}"
                    f"{'-' if error is None else f'{100 * error:+.1f}%':>9}{format_bytes(m.observed_peak):>11}"
                    f"{'-' if observed is None else format_bytes(observed):>11}"
                    f"{'-' if observed_error is None else f'{100 * observed_error:+.2f}%':>9}"
                )
    lines.append(f"  largest plan error on the retained peak: {100 * worst:.1f}%")
    lines.append(f"  largest plan error on the observed peak: {100 * worst_observed:.2f}%")
    terms = [("alive", "alive_at_peak"), ("theory", "theoretical_bundles"), ("bundle", "bundle_bytes"),
             ("rebuilt", "backward_extra"), ("shared", "shared_bytes"), ("2nd holder", "second_holder_bytes"),
             ("comm buf", "comm_buffer_bytes"), ("retained", "retained_peak"), ("by count", "predicted_retained_peak"),
             ("plan", "plan_peak"), ("plan err", "plan_error"), ("observed", "observed_peak"),
             ("obs plan", "predicted_observed_peak"), ("obs err", "observed_plan_error")]
    lines += ["", "terms:", f"  {STAGE_DEFINITIONS['bundle']}", *(f"  {name}: {STAGE_DEFINITIONS[term]}" for name, term in terms)]
    return "\n".join(lines)
