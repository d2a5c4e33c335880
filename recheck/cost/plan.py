"""``recheck cost --plan``: predict each pipeline stage's peak from a one-process run.

The contract: ``STEP`` is a zero-argument step that runs **one microbatch** (of the size
the schedule will split the batch into) forward and backward through the stages in order,
each stage's forward inside ``recheck.tag(stage=s)`` (0-based), the loss after the last
stage's block.  It is traced once with its checkpoints as written
and once bypassed (state restored before each).  Per stage and mode the
:class:`~recheck.cost.bundles.BundleTracker` measures

* the bundle: bytes autograd holds for the microbatch when backward starts, split into
  the part made before any stage (the step's data: on a real pipeline each microbatch is
  a view of one input batch, held once for all microbatches), the part received from
  the previous stage (a real pipeline receives it into a per-microbatch recv buffer) and
  the rest;
* the backward extra: the most bytes held for the stage above its bundle while its
  backward runs (what a checkpoint rebuilds);
* the stage's parameters (of the modules whose forward ran inside its tag), their
  gradients and optimizer state.

:func:`predict` lays the bundles out along the schedule's order for each stage
(:mod:`recheck.cost.schedules`): ``bundles alive x bundle + shared input + backward extra``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recheck.cost.bundles import BundleTracker, StageBundles
from recheck.cost.schedules import (
    PeakModel,
    order_for,
    predict_retained_peak,
    theoretical_bundles,
)

__all__ = ["MODES", "NoStageTags", "PlanMeasurement", "PlanStage", "StagePrediction", "measure_plan", "predict"]

MODES = ("checkpointed", "bypassed")
_ROUTER_MODE = {"checkpointed": "checkpoint", "bypassed": "bypass"}


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

    def bundle_bytes(self, mode: str) -> int:
        """Bytes held for the one microbatch when backward starts."""
        return sum(self.bundles[mode].bundle_bytes.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "stage": self.stage,
            "modes": {mode: figures.to_dict() for mode, figures in self.bundles.items()},
            "parameter_bytes": self.parameter_bytes,
            "gradient_bytes": self.gradient_bytes,
            "optimizer_bytes": self.optimizer_bytes,
        }


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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _stage_parameters(modules_by_stage: dict[int, list[Any]], optimizers: list[Any]) -> dict[int, tuple[int, int, int]]:
    """(parameter, gradient, optimizer-state) bytes of each stage's modules; a parameter
    used by several stages counts for the first."""
    seen: set[int] = set()
    state_of = {id(p): st for opt in optimizers for p, st in opt.state.items()}
    figures: dict[int, tuple[int, int, int]] = {}
    for stage in sorted(modules_by_stage):
        params, grads, optim = 0, 0, 0
        for module in modules_by_stage[stage]:
            for p in module.parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                params += p.numel() * p.element_size()
                grads += p.numel() * p.element_size() if p.requires_grad else 0
                optim += sum(v.numel() * v.element_size() for v in state_of.get(id(p), {}).values()
                             if hasattr(v, "numel") and v.dim() > 0)
        figures[stage] = (params, grads, optim)
    return figures


def measure_plan(step: Callable[[], Any]) -> PlanMeasurement:
    """Trace ``step`` (one microbatch through every stage, each inside ``recheck.tag(stage=s)``)
    checkpointed and bypassed; state is restored before each run and after."""
    import torch

    from recheck.cost.router import Router, routing
    from recheck.cost.state import discover_state
    from recheck.cost.trace import Tracer
    from recheck.watcher.tags import current_tags

    state = discover_state(step)
    restore = state.snapshot()
    router = Router()
    figures: dict[str, BundleTracker] = {}
    modules_by_stage: dict[int, list[Any]] = {}

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
                router.reset(_ROUTER_MODE[mode])
                tracer = Tracer(state, router)
                tracker = BundleTracker("tags")
                tracker.attach(tracer)
                with tracer:
                    step()
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
        result.stages.append(PlanStage(stage, bundles, params, grads, optim))
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
            held = sum(figures.bundle_bytes.values())
            bundle[mode] = held - figures.input_bytes
            shared[mode] = microbatches * figures.input_bytes
            extra[mode] = figures.backward_extra
            peak[mode] = predict_retained_peak(order, PeakModel(bundle[mode], extra[mode], shared[mode]))
        received = plan_stage.bundles["bypassed"].received_bytes
        sent = measurement.stages[s + 1].bundles["bypassed"].received_bytes if s + 1 < stages else 0
        predictions.append(
            StagePrediction(
                stage=s,
                theoretical_bundles=theoretical_bundles(order),
                bundle_bytes=bundle,
                shared_bytes=shared,
                backward_extra=extra,
                retained_peak=peak,
                comm_buffer_bytes=microbatches * (received + sent),
                parameter_bytes=plan_stage.parameter_bytes,
                gradient_bytes=plan_stage.gradient_bytes,
                optimizer_bytes=plan_stage.optimizer_bytes,
            )
        )
    return predictions
