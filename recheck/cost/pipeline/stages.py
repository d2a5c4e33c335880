"""Per-stage cost of a real pipeline step (``recheck cost --ranks N``): every rank traces one
``schedule.step`` per mode.

On each rank ``STEP()`` builds the rank's stage and returns its step (docs/cost.md).  The step
runs once untraced (a ``PipelineStage``'s first step infers shapes and allocates its recv
buffers), then traced as written and bypassed, with a
:class:`~recheck.cost.pipeline.bundles.BundleTracker` told of every chunk by
:mod:`recheck.intercept.pipelining`.  Every rank runs the same sequence of steps, so the
schedules' sends and receives pair up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from recheck.cost.pipeline.bundles import BundleTracker, StageBundles
from recheck.cost.ledger import storage_key
from recheck.cost.router import MODES, ROUTER_MODE
from recheck.cost.pipeline.schedules import (
    PeakModel,
    order_of_schedule,
    predict_retained_peak,
    schedule_kind,
    theoretical_bundles,
)

__all__ = ["NotAPipeline", "StageMode", "StageReport", "measure_rank", "rank_entry"]


class NotAPipeline(Exception):
    """The step does not run a ``torch.distributed.pipelining`` schedule."""


@dataclass
class StageMode:
    """One stage in one mode (bytes)."""

    bundles: StageBundles
    rank_retained_peak: int
    observed_peak: int
    predicted_retained_peak: int | None
    peak_breakdown: dict[str, int] = field(default_factory=dict)
    phase_peaks: dict[str, int] = field(default_factory=dict)

    @property
    def retained_peak(self) -> int:
        """Most bytes held at once for this stage's bundles and shared storages."""
        return self.bundles.retained_peak

    @property
    def bundle_bytes(self) -> int:
        """The largest bundle of the stage."""
        return max(self.bundles.bundle_bytes.values(), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.bundles.to_dict(),
            "rank_retained_peak": self.rank_retained_peak,
            "observed_peak": self.observed_peak,
            "predicted_retained_peak": self.predicted_retained_peak,
            "observed_peak_breakdown": dict(self.peak_breakdown),
            "observed_peak_by_phase": dict(self.phase_peaks),
        }


@dataclass
class StageReport:
    """One stage of a real pipeline step, as measured on its rank."""

    rank: int
    stage: int
    num_stages: int
    microbatches: int
    schedule: str
    theoretical_bundles: int | None
    comm_buffer_bytes: int
    stages_on_rank: int = 1
    modes: dict[str, StageMode] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "modes": {name: mode.to_dict() for name, mode in self.modes.items()}}


def _stages_of(schedule: Any) -> list[Any]:
    stages = getattr(schedule, "_stages", None)
    if isinstance(stages, (list, tuple)) and stages:
        return list(stages)
    stage = getattr(schedule, "_stage", None)
    return [stage] if stage is not None else []


def comm_buffers(stage: Any) -> list[Any]:
    """The stage's recv buffers: activations from the previous stage and gradients from the next."""
    import torch

    found: list[Any] = []
    for name in ("args_recv_info", "grad_recv_info"):
        table = getattr(stage, name, None)
        if not isinstance(table, dict):
            continue
        for infos in table.values():
            for info in infos if isinstance(infos, (list, tuple)) else ():
                buffer = getattr(info, "buffer", None)
                if isinstance(buffer, torch.Tensor) and buffer.device.type != "meta":
                    found.append(buffer)
    return found


def _buffer_bytes(buffers: list[Any]) -> int:
    storages = {storage_key(s): int(s.nbytes()) for s in (b.untyped_storage() for b in buffers)}
    return sum(storages.values())


def measure_rank(step: Callable[[], Any], rank: int) -> list[StageReport]:
    """Trace this rank's step in both modes; one report per stage the rank holds."""
    from recheck.cost.router import Router, routing
    from recheck.runtime.steps import discover_state
    from recheck.cost.trace import Tracer
    from recheck.intercept import pipelining

    router = Router()
    with routing(router):
        router.reset("checkpoint")
        step()  # warm-up: shape inference and recv buffers
        for found in discover_state(step).schedules:
            for stage in _stages_of(found):
                clear = getattr(stage, "clear_runtime_states", None)
                if callable(clear):  # what the next step does first: the warm-up's output chunks go
                    clear()
        state = discover_state(step)  # again: the cleared chunks are not state to restore
        if not state.schedules:
            raise NotAPipeline("the step runs no torch.distributed.pipelining schedule reachable from it "
                               "(its closure, globals or bound objects)")
        schedule = state.schedules[0]
        stages = _stages_of(schedule)
        buffers = {stage.stage_index: comm_buffers(stage) for stage in stages}
        known = {id(t) for t in state.tensors}
        state.tensors += [b for found in buffers.values() for b in found if id(b) not in known]
        restore = state.snapshot()
        reports, orders = {}, {}
        for stage in stages:
            index = stage.stage_index
            reports[index], orders[index] = _report(schedule, stage, rank, len(stages), _buffer_bytes(buffers[index]))
        try:
            for mode in MODES:
                restore()
                router.reset(ROUTER_MODE[mode])
                tracer = Tracer(state, router)
                tracker = BundleTracker("chunks")
                tracker.attach(tracer)
                pipelining.acquire(tracker)
                try:
                    with tracer:
                        step()
                finally:
                    pipelining.release(tracker)
                ledger = tracer.trace.ledger
                for index, report in reports.items():
                    report.modes[mode] = _stage_mode(orders[index], tracker.figures(index), ledger)
        finally:
            restore()
    return list(reports.values())


def _report(schedule: Any, stage: Any, rank: int, stages_on_rank: int,
            comm_bytes: int) -> tuple[StageReport, list[Any] | None]:
    """The stage's report (figures per mode still to come) and its order of actions."""
    num_stages, microbatches = int(getattr(stage, "num_stages", 1)), int(getattr(schedule, "_n_microbatches", 0))
    order = order_of_schedule(schedule, stage.stage_index, num_stages, microbatches)
    return StageReport(rank, stage.stage_index, num_stages, microbatches,
                       schedule_kind(schedule) or type(schedule).__name__,
                       theoretical_bundles(order) if order else None, comm_bytes, stages_on_rank), order


def _stage_mode(order: list[Any] | None, bundles: StageBundles, ledger: Any) -> StageMode:
    predicted = None
    if order:
        model = PeakModel(max(bundles.bundle_bytes.values(), default=0), bundles.backward_extra, bundles.shared_bytes)
        predicted = predict_retained_peak(order, model)
    return StageMode(bundles, ledger.saved_peak, ledger.observed_peak, predicted,
                     dict(ledger.peak_breakdown), dict(ledger.phase_peaks))


def rank_entry(rank: int, world_size: int, specs: list[str]) -> dict[str, list[StageReport] | str]:
    """What each rank of ``recheck cost --ranks`` runs: for each ``FILE.py:STEP`` in ``specs``
    (in order; several share one world), load STEP, build this rank's step, and measure.

    A usage error (STEP missing, not a factory, a factory that returns no step, no schedule)
    comes back as a one-line string naming the rank, ``rank 1 of 2: ...``; anything the
    user's code raises propagates with its traceback.  The ranks agree on whether every one
    of them built its step before any runs it, so a rank whose STEP returned no step does
    not leave the others waiting in the schedule's first send or receive.
    """
    import torch.distributed as dist

    from recheck.loading import TargetError, load_target

    results: dict[str, list[StageReport] | str] = {}
    for spec in specs:
        step, problem = None, None
        try:
            (target,) = load_target(spec)
            step = target.factory()
            if not callable(step):
                problem = f"STEP must return the zero-argument step to run on this rank, got {type(step).__name__}"
        except TargetError as exc:
            problem = str(exc)
        problems: list[str | None] = [None] * world_size
        dist.all_gather_object(problems, problem)
        failed = [(other, text) for other, text in enumerate(problems) if text is not None]
        if failed:
            other, text = failed[0]
            results[spec] = f"rank {other} of {world_size}: {text}"
            continue
        assert step is not None  # every rank built its step (problems were agreed on above)
        try:
            results[spec] = measure_rank(step, rank)
        except NotAPipeline as exc:
            results[spec] = f"rank {rank} of {world_size}: {exc}"
    return results
