"""The plan runs of a suggestion: a plan traced for its peak, timed, and verified with ``check_step``.

:class:`PlanRun` holds one plan's prediction and measurements; :func:`trace_plan` and
:func:`finish_runs` measure it through the census path
(:mod:`~recheck.cost.planner.census`), and :class:`PlannedStep` is the step ``check_step``
runs: the step with exactly the plan's checkpoints, in both of its twins.  The anchors (the
folklore plans every suggestion is measured beside) are made here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recheck.cost.planner.candidates import Candidate, Candidates
from recheck.cost.planner.census import Config, RunFigures, config_of, drop_unkept, time_configs, trace_config
from recheck.cost.planner.memory_model import Model
from recheck.cost.planner.overlay import dropping
from recheck.cost.planner.plans import SELECTIVE_OPS, Plan, RegionChoice
from recheck.cost.planner.wrapping import wrap_modules
from recheck.findings import Report
from recheck.runtime.naming import RegionKey
from recheck.runtime.steps import StepState

__all__ = ["ANCHORS", "CandidateFigures", "PendingRun", "PlanRun", "PlannedStep", "anchor_variants", "candidate_figures",
           "config_of", "finish_runs", "kept_bytes", "plan_of", "trace_plan"]

#: The folklore plans every suggestion is measured beside.
ANCHORS = ("no checkpointing", "every layer", "every other layer", "selective, every layer")


@dataclass
class PlanRun:
    """One plan: what the model predicts and what running it measured."""

    name: str
    plan: Plan | None
    variants: dict[int, str]
    predicted_peak: int | None
    predicted_seconds: float | None
    measured_peak: int = 0
    measured_seconds: float = float("nan")
    cuda: dict[str, Any] | None = None
    verdict: Report | None = None
    verdict_error: str | None = None
    batch_size: int | None = None
    #: every timed run's seconds
    samples: list[float] = field(default_factory=list)

    @property
    def samples_per_second(self) -> float:
        """Batch size over measured step time (0 without a batch size or a time)."""
        if not self.batch_size or not self.measured_seconds or self.measured_seconds != self.measured_seconds:
            return 0.0
        return self.batch_size / self.measured_seconds

    @property
    def timing_spread(self) -> float:
        """Interquartile range of the timed runs over their median (nan with fewer than 4 runs)."""
        import statistics

        if len(self.samples) < 4:
            return float("nan")
        q = statistics.quantiles(self.samples, n=4)
        return (q[2] - q[0]) / statistics.median(self.samples)

    @property
    def verified(self) -> bool:
        """check_step found nothing."""
        return self.verdict is not None and self.verdict.ok

    def fits(self, budget: int) -> bool:
        return self.measured_peak <= budget

    @property
    def peak_error(self) -> float | None:
        """Predicted / measured peak - 1."""
        if self.predicted_peak is None or not self.measured_peak:
            return None
        return self.predicted_peak / self.measured_peak - 1.0


@dataclass
class CandidateFigures:
    """What the census measured for one candidate (bytes and seconds)."""

    name: str
    kind: str
    written: bool
    kept_alive: int
    inputs_kept: int | None
    selective_kept: int | None
    shared: int
    recompute_seconds: dict[str, float]
    recompute_flops: dict[str, int]


def plan_of(candidates: Candidates, variants: dict[int, str], ops: tuple[str, ...] = SELECTIVE_OPS) -> Plan:
    """The user's plan for ``{candidate index: variant}`` (candidates not named: none)."""
    modules = tuple((c.name, variants[c.index]) for c in candidates.units
                    if variants.get(c.index, "none") in ("full", "selective"))
    regions = tuple(RegionChoice(c.name, variants.get(c.index, "none") == "full") for c in candidates.regions)
    return Plan(modules, regions, candidates.root_name, ops)


def anchor_variants(candidates: Candidates, name: str) -> dict[int, str]:
    """The variants of one of :data:`ANCHORS` (units only: the step's other regions dropped)."""
    units = candidates.units
    if name == "no checkpointing":
        return {}
    if name == "every layer":
        return {u.index: "full" for u in units}
    if name == "selective, every layer":  # full where selective keeps nothing more
        return {u.index: "selective" if u.selective else "full" for u in units}
    if name == "every other layer":
        position: dict[str | None, int] = {}
        chosen = {}
        for u in units:
            n = position.get(u.container, 0)
            position[u.container] = n + 1
            if n % 2 == 0:
                chosen[u.index] = "full"
        return chosen
    raise ValueError(f"unknown anchor {name!r}")


class PlannedStep:
    """The step with exactly a plan's checkpoints: its own calls the plan does not keep run directly.

    The plan's modules are wrapped around it (:func:`~recheck.cost.planner.wrapping.wrap_modules`);
    this object is what ``check_step`` runs, so both its twins see the same plan.
    """

    def __init__(self, step: Callable[[], Any], kept: frozenset[RegionKey]) -> None:
        self.step, self.kept = step, kept

    def __call__(self) -> Any:
        with dropping(drop_unkept(self.kept)):
            return self.step()


def _verdict(step: Callable[[], Any], candidates: Candidates, config: Config, state: StepState,
             label: str, plan_text: str) -> tuple[Report | None, str | None]:
    """check_step on the step run as ``config`` says."""
    from recheck.checker import check_step

    modules = candidates.unit_modules()
    try:
        if config.written:
            report = check_step(step, modules=state.modules, optimizers=state.optimizers)
        else:
            with wrap_modules([(modules[i], v) for i, v in config.wraps]):
                report = check_step(PlannedStep(step, config.kept or frozenset()), modules=state.modules,
                                    optimizers=state.optimizers)
    except Exception as exc:  # noqa: BLE001 - the verdict is a figure of the table: say why it is missing
        return None, f"{type(exc).__name__}: {exc}"
    title = f"step           {label}\nplan           {plan_text}\n" + "\n".join((report.title or "").splitlines()[1:])
    return Report(report.findings, title=title, notes=report.notes, stats=report.stats), None


@dataclass
class PendingRun:
    """A plan traced, waiting for its timed runs and its check_step."""

    run: PlanRun
    config: Config
    figures: RunFigures


def trace_plan(step: Callable[[], Any], state: StepState, restore: Callable[[], None], candidates: Candidates,
                model: Model | None, name: str, variants: dict[int, str] | None,
                ops: tuple[str, ...]) -> PendingRun:
    """Trace one plan for its peak (``variants`` None: the step as written)."""
    if variants is None:
        config, plan, predicted = Config(name, kept=None), None, None
    else:
        config = config_of(candidates, variants, name)
        plan = plan_of(candidates, variants, ops)
        predicted = model.predict(variants) if model is not None else None
    figures = trace_config(step, state, restore, candidates, config, ops)
    run = PlanRun(name, plan, dict(variants or {}), predicted.peak if predicted else None,
                  predicted.seconds if predicted else None, figures.observed_peak)
    return PendingRun(run, config, figures)


def finish_runs(step: Callable[[], Any], state: StepState, restore: Callable[[], None], candidates: Candidates,
            pending: list[PendingRun], repeats: int, label: str, ops: tuple[str, ...],
            tell: Callable[[str], None], clock: str = "wall") -> None:
    """Time every traced plan (taking turns), then run check_step on each."""
    tell(f"timing {len(pending)} plan(s), {repeats} run(s) each")
    time_configs(step, state, restore, candidates, [p.figures for p in pending], repeats, ops, clock)
    for item in pending:
        item.run.measured_seconds, item.run.cuda = item.figures.median_seconds, item.figures.cuda
        item.run.samples = list(item.figures.seconds)
        tell(f"check_step: {item.run.name}")
        plan = item.run.plan.describe() if item.run.plan is not None else "as written"
        item.run.verdict, item.run.verdict_error = _verdict(step, candidates, item.config, state, label, plan)


def kept_bytes(run: RunFigures, c: Candidate) -> int:
    """Bytes of the storages ``c`` holds in ``run``."""
    return sum(run.sizes.get(n, 0) for n in run.holds_made.get(c.index, ()))


def candidate_figures(candidates: Candidates, runs: dict[str, RunFigures]) -> list[CandidateFigures]:
    def size(mode: str, c: Candidate) -> int | None:
        run = runs.get(mode)
        return None if run is None else kept_bytes(run, c)

    result = []
    for c in candidates.items:
        mine = set().union(*(r.holds_made.get(c.index, set()) for r in runs.values()))
        others = set().union(*(names for r in runs.values() for i, names in r.holds_made.items()
                               if i not in (c.index, -1)))
        shared = sum(runs["none"].sizes.get(n, 0) for n in mine & others)
        modes = [m for m in ("full", "selective", "written") if m in runs and (c.kind == "unit" or m != "selective")]
        result.append(CandidateFigures(
            c.name, c.kind, c.written, size("none", c) or 0,
            size("full", c) if c.kind != "outer" else size("written", c),
            size("selective", c) if c.kind == "unit" else None, shared,
            {m: runs[m].recompute_seconds.get(c.index, 0.0) for m in modes if c.index in runs[m].recompute_seconds},
            {m: runs[m].recompute_work[c.index].flops for m in modes if c.index in runs[m].recompute_work}))
    return result
