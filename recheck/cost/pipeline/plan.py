"""``recheck cost --plan``: predict each pipeline stage's peaks from a one-process run.

``STEP`` runs **one microbatch** forward and backward through the stages in order, each stage's
forward inside ``recheck.tag(stage=s)`` (0-based), the loss after the last stage's block
(docs/cost.md).  It is traced with its checkpoints as written and bypassed; per stage and mode
the :class:`~recheck.cost.pipeline.bundles.BundleTracker` measures the bundle (split into the
step's data, made before any stage, which a real pipeline holds once for all microbatches; what
was received from the previous stage, which a real pipeline receives into a recv buffer; and
the rest) and the backward extra (what a checkpoint rebuilds), beside the stage's parameters,
gradients and optimizer state and its windows (:mod:`~recheck.cost.pipeline.windows`).
:func:`predict` lays them out along the schedule's order (:mod:`~recheck.cost.pipeline.schedules`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recheck.cost.pipeline.bundles import BundleTracker, StageBundles
from recheck.cost.router import MODES, ROUTER_MODE
from recheck.cost.pipeline.schedules import (
    ObservedModel,
    PeakModel,
    order_for,
    predict_observed_peak,
    predict_retained_peak,
    theoretical_bundles,
)
from recheck.cost.pipeline.windows import StageWindows, WindowFigures, supported

__all__ = ["NoStageTags", "PlanMeasurement", "PlanStage", "StagePrediction", "measure_plan", "predict"]


class NoStageTags(Exception):
    """The planning step saved nothing inside ``recheck.tag(stage=...)``."""


@dataclass
class PlanStage:
    """One stage of the planning run: bundle figures per mode and the stage's fixed state."""

    stage: int
    bundles: dict[str, StageBundles]
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    windows: dict[str, WindowFigures] = field(default_factory=dict)
    optimizer_rise: dict[str, int] = field(default_factory=dict)

    def bundle_bytes(self, mode: str) -> int:
        """Bytes held for the one microbatch when backward starts."""
        return sum(self.bundles[mode].bundle_bytes.values())


@dataclass
class PlanMeasurement:
    """What one-process planning run measured, per stage."""

    stages: list[PlanStage] = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        return len(self.stages)


@dataclass(frozen=True)
class StagePrediction:
    """The predicted figures of one stage under a schedule (bytes)."""

    stage: int
    theoretical_bundles: int
    bundle_bytes: dict[str, int]
    shared_bytes: dict[str, int]
    backward_extra: dict[str, int]
    retained_peak: dict[str, int]
    comm_buffer_bytes: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    observed_peak: dict[str, int | None] = field(default_factory=dict)
    observed_terms: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _parameters_by_stage(modules_by_stage: dict[int, list[Any]]) -> dict[int, list[Any]]:
    """Each stage's parameters; a parameter used by several stages counts for the first."""
    seen: set[int] = set()
    found: dict[int, list[Any]] = {}
    for stage in sorted(modules_by_stage):
        mine = found.setdefault(stage, [])
        for module in modules_by_stage[stage]:
            for p in module.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    mine.append(p)
    return found


def _stage_parameters(modules_by_stage: dict[int, list[Any]], optimizers: list[Any]) -> dict[int, tuple[int, int, int]]:
    """(parameter, gradient, optimizer-state) bytes of each stage's modules."""
    state_of = {id(p): st for opt in optimizers for p, st in opt.state.items()}
    figures: dict[int, tuple[int, int, int]] = {}
    for stage, params in _parameters_by_stage(modules_by_stage).items():
        figures[stage] = (
            sum(p.numel() * p.element_size() for p in params),
            sum(p.numel() * p.element_size() for p in params if p.requires_grad),
            sum(v.numel() * v.element_size() for p in params for v in state_of.get(id(p), {}).values()
                if hasattr(v, "numel") and v.dim() > 0),
        )
    return figures


def measure_plan(step: Callable[[], Any]) -> PlanMeasurement:
    """Trace ``step`` (one microbatch through every stage, each inside ``recheck.tag(stage=s)``)
    checkpointed and bypassed; state is restored before each run and after."""
    import torch

    from recheck.cost.router import Router, routing
    from recheck.runtime.steps import discover_state
    from recheck.cost.trace import Tracer
    from recheck.runtime.tags import current_tags

    state = discover_state(step)
    restore = state.snapshot()
    router = Router()
    figures: dict[str, BundleTracker] = {}
    windows: dict[str, StageWindows] = {}
    modules_by_stage: dict[int, list[Any]] = {}
    parameters: dict[int, list[Any]] = {}

    def parameters_of(stage: int) -> list[Any]:  # asked in backward, once every stage's forward ran
        if not parameters:
            parameters.update(_parameters_by_stage(modules_by_stage))
        return parameters.get(stage, [])

    def note_module(module: Any, _args: Any) -> None:
        stage = current_tags().get("stage")
        if not isinstance(stage, int) or torch._C._current_graph_task_id() != -1:
            return
        seen = modules_by_stage.setdefault(stage, [])
        if all(m is not module for m in seen):
            seen.append(module)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(note_module)
    try:
        with routing(router):
            for mode in MODES:
                restore()
                router.reset(ROUTER_MODE[mode])
                tracer = Tracer(state, router)
                tracker = BundleTracker("tags")
                tracker.attach(tracer)
                if supported():
                    windows[mode] = StageWindows(parameters_of)
                    windows[mode].attach(tracer)
                    windows[mode].install()
                try:
                    with tracer:
                        step()
                finally:
                    if mode in windows:
                        windows[mode].remove()
                        windows[mode].finish()
                figures[mode] = tracker
        fixed = _stage_parameters(modules_by_stage, state.optimizers)
    finally:
        handle.remove()
        restore()
    stages = sorted(set(figures["checkpointed"].stages()) | set(figures["bypassed"].stages()))
    if not stages:
        raise NoStageTags("the step held nothing inside recheck.tag(stage=...): run each stage's forward "
                          "inside `with recheck.tag(stage=s):` (s = 0, 1, ...)")
    if stages != list(range(len(stages))):
        raise NoStageTags(f"stage tags must be 0, 1, ... without gaps; the step used {stages}")
    result = PlanMeasurement()
    for stage in stages:
        params, grads, optim = fixed.get(stage, (0, 0, 0))
        bundles = {mode: tracker.figures(stage) for mode, tracker in figures.items()}
        stage_windows = {mode: found.stage_figures(stage) for mode, found in windows.items()}
        rises = {mode: found.optimizer_rise for mode, found in windows.items()}
        result.stages.append(PlanStage(stage, bundles, params, grads, optim, stage_windows, rises))
    return result


def predict(measurement: PlanMeasurement, kind: str, microbatches: int, num_stages: int | None = None) -> list[StagePrediction]:
    """Each stage's figures under schedule ``kind`` with ``microbatches`` microbatches.

    ``num_stages`` must be the number of stages the planning run measured (default).
    """
    stages = measurement.num_stages
    if num_stages is not None and num_stages != stages:
        raise ValueError(f"--stages {num_stages}: the planning step ran {stages} stage(s); "
                         "the prediction needs a measured bundle for every stage")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be a positive whole number, got {microbatches!r}")
    predictions = []
    for plan_stage in measurement.stages:
        s = plan_stage.stage
        order = order_for(kind, stages, s, microbatches)
        bundle, shared, extra, peak = {}, {}, {}, {}
        for mode, figures in plan_stage.bundles.items():
            bundle[mode] = plan_stage.bundle_bytes(mode) - figures.input_bytes
            shared[mode] = microbatches * figures.input_bytes
            extra[mode] = figures.backward_extra
            peak[mode] = predict_retained_peak(order, PeakModel(bundle[mode], extra[mode], shared[mode]))
        received = plan_stage.bundles["bypassed"].received_bytes
        sent = measurement.stages[s + 1].bundles["bypassed"].received_bytes if s + 1 < stages else 0
        comm = microbatches * (received + sent)
        observed: dict[str, int | None] = dict.fromkeys(plan_stage.bundles)
        terms: dict[str, dict[str, Any]] = {}
        for mode, windows in plan_stage.windows.items():
            figures = plan_stage.bundles[mode]
            model = ObservedModel(
                fixed=plan_stage.parameter_bytes + plan_stage.optimizer_bytes + comm + microbatches * windows.data,
                gradients=plan_stage.gradient_bytes,
                gradients_absent=windows.gradients_absent,
                bundle=bundle[mode] - figures.received_bytes,
                kept=windows.kept,
                sent_gradient=0 if s == 0 else received,
                forward_rise=windows.forward_rise,
                first_backward_rise=windows.backward_rise,
                backward_rise=windows.backward_rise_with_gradients,
                optimizer_rise=plan_stage.optimizer_rise.get(mode, 0),
            )
            observed[mode], action = predict_observed_peak(kind, order, model, stages, s)
            terms[mode] = {**model.to_dict(), "data_per_microbatch": windows.data, "peak_action": action}
        predictions.append(StagePrediction(
            s, theoretical_bundles(order), bundle, shared, extra, peak, comm, plan_stage.parameter_bytes,
            plan_stage.gradient_bytes, plan_stage.optimizer_bytes, observed, terms))
    return predictions
