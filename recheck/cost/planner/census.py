"""Runs of a step under a checkpointing configuration: traced once (windows, holds, work), timed N times.

A :class:`Config` says which units the plan wraps (``full`` or ``selective``) and which of the
step's own checkpoint calls stay (the others run directly, through
:mod:`~recheck.cost.planner.overlay`), or ``written``: the step as written.  Every run goes
through the same path (module wrappers, overlay, the census router).  The census measures the
*modes* a plan mixes: ``none``, ``full`` and ``selective`` (every unit so, the step's other
regions as written) and, when a region of the step runs units, ``written``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from recheck.collector import collector_paused
from recheck.cost.planner.attribution import CensusRouter, CensusTracer, Name, Window
from recheck.cost.planner.candidates import Candidates
from recheck.cost.planner.overlay import dropping
from recheck.cost.planner.plans import SELECTIVE_OPS
from recheck.cost.planner.wrapping import SelectiveContext, planned_module, wrap_modules
from recheck.cost.router import routing
from recheck.cost.trace import cuda_peak
from recheck.cost.work import Work
from recheck.runtime.naming import RegionKey
from recheck.runtime.steps import StepState

__all__ = ["CLOCKS", "MODES", "Config", "RunFigures", "config_of", "configured", "drop_unkept", "measure_config", "mode_config", "time_configs",
           "trace_config"]

#: The modes a plan mixes, in the order they are measured.
MODES = ("none", "full", "selective", "written")
#: How a run is timed: wall time, or the process's CPU time (steady on a shared CPU machine when
#: the step runs on one thread; it does not see time spent on a GPU).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class Config:
    """One way to checkpoint the step: unit wrappers and the step's own calls kept (None: as written)."""

    name: str
    wraps: tuple[tuple[int, str], ...] = ()
    kept: frozenset[RegionKey] | None = frozenset()

    @property
    def written(self) -> bool:
        return self.kept is None


def config_of(candidates: Candidates, variants: dict[int, str], name: str) -> Config:
    """The configuration of ``{candidate index: variant}``: its units wrapped, its regions named ``full`` kept."""
    wraps = tuple((c.index, variants[c.index]) for c in candidates.units
                  if variants.get(c.index, "none") in ("full", "selective"))
    kept = frozenset(c.key for c in candidates.regions if variants.get(c.index) == "full" and c.key is not None)
    return Config(name, wraps, kept)


def mode_config(mode: str, candidates: Candidates) -> Config:
    """The configuration that measures ``mode`` for every candidate at once (inner regions kept as written)."""
    if mode == "written":
        return Config("written", kept=None)
    return config_of(candidates, {} if mode == "none" else {c.index: mode if c.kind == "unit" else "full"
                                                          for c in candidates.items if c.kind != "outer"}, mode)


def drop_unkept(kept: frozenset[RegionKey]) -> Callable[[Any, RegionKey], bool]:
    """The overlay's ``drop`` for a plan: the step's own calls not in ``kept`` (never a call the plan adds)."""
    return lambda function, key: planned_module(function) is None and key not in kept


@dataclass
class RunFigures:
    """What the runs of one configuration measured."""

    config: Config
    observed_peak: int = 0
    windows: dict[tuple[str, int, int], Window] = field(default_factory=dict)
    order: list[tuple[str, int, int]] = field(default_factory=list)
    sizes: dict[Name, int] = field(default_factory=dict)
    holds_made: dict[int, set[Name]] = field(default_factory=dict)
    forward_work: dict[int, Work] = field(default_factory=dict)
    recompute_work: dict[int, Work] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    recompute_seconds: dict[int, float] = field(default_factory=dict)
    cuda: dict[str, Any] | None = None
    dropped: int = 0
    undroppable: int = 0
    traced_seconds: float = 0.0

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")


@contextlib.contextmanager
def configured(config: Config, candidates: Candidates, router: CensusRouter | None = None,
               ops: tuple[str, ...] = SELECTIVE_OPS) -> Iterator[Any]:
    """The step's checkpointing as ``config`` says, for the block (inside an installed interception).

    Yields the overlay's record of dropped calls (None for the step as written).
    """
    modules = candidates.unit_modules()
    handle = wrap_modules([(modules[i], variant) for i, variant in config.wraps], ops)
    try:
        if config.kept is None:
            yield None
            return
        with dropping(drop_unkept(config.kept), router.dropped if router is not None else None) as record:
            yield record
    finally:
        handle.remove()


def _module_hooks(router: CensusRouter) -> list[Any]:
    register = torch.nn.modules.module
    return [register.register_module_forward_pre_hook(router.module_pre),
            register.register_module_forward_hook(router.module_post)]


def trace_config(step: Callable[[], Any], state: StepState, restore: Callable[[], None],
                 candidates: Candidates, config: Config, ops: tuple[str, ...] = SELECTIVE_OPS) -> RunFigures:
    """One traced run of ``step`` under ``config``: windows, holds, work, the observed peak."""
    router = CensusRouter(candidates)
    figures = RunFigures(config)
    selective = SelectiveContext(ops).packets if any(v == "selective" for _, v in config.wraps) else frozenset()
    with routing(router):
        restore()
        handles = _module_hooks(router)
        started = time.perf_counter()
        try:
            with configured(config, candidates, router, ops) as record, \
                    CensusTracer(state, router, selective) as tracer, warnings.catch_warnings():
                # torch 2.14 warns that the tracer's own saved-tensor hooks are active around a
                # selective region (whose saved outputs bypass them): the census counts those itself
                warnings.filterwarnings("ignore", message="A saved_tensors_hooks context", category=FutureWarning)
                step()
        finally:
            for handle in handles:
                handle.remove()
            router.tracer = None
            restore()
    figures.traced_seconds = time.perf_counter() - started
    figures.observed_peak = tracer.trace.ledger.observed_peak
    figures.windows, figures.order = tracer.windows, tracer.order
    figures.sizes, figures.holds_made = tracer.sizes, tracer.holds_made
    figures.forward_work, figures.recompute_work = tracer.forward_work, tracer.recompute_work
    if record is not None:
        figures.dropped = sum(record.calls.values())
        figures.undroppable = record.undroppable
    return figures


def time_configs(step: Callable[[], Any], state: StepState, restore: Callable[[], None], candidates: Candidates,
                 runs: list[RunFigures], repeats: int, ops: tuple[str, ...] = SELECTIVE_OPS,
                 clock: str = "wall") -> None:
    """Time every configuration of ``runs`` ``repeats`` times, taking turns (so that a machine whose
    load drifts slows them alike) after one untimed round; fills ``seconds``, ``recompute_seconds``
    and ``cuda``."""
    now = CLOCKS[clock]
    router = CensusRouter(candidates, now)
    per_run: list[list[dict[int, float]]] = [[] for _ in runs]
    with routing(router):
        for index in range(-1, repeats):  # a first round untimed: allocator and caches warm up
            for figures, recomputes in zip(runs, per_run):
                restore()
                router.reset("checkpoint")
                with configured(figures.config, candidates, router, ops), cuda_peak(state) as peak, collector_paused(collect_first=True):
                    started = now()
                    step()
                    peak.synchronize()
                    elapsed = now() - started
                if index < 0:
                    continue
                figures.seconds.append(elapsed)
                if index == 0 and peak.result is not None:
                    figures.cuda = peak.result
                recomputes.append(dict(router.recompute_seconds))
        restore()
    for figures, recomputes in zip(runs, per_run):
        indices = {i for run in recomputes for i in run}
        figures.recompute_seconds = {i: statistics.median(run.get(i, 0.0) for run in recomputes) for i in indices}


def measure_config(step: Callable[[], Any], state: StepState, restore: Callable[[], None],
                   candidates: Candidates, config: Config, repeats: int,
                   ops: tuple[str, ...] = SELECTIVE_OPS, clock: str = "wall") -> RunFigures:
    """One traced run and ``repeats`` timed runs of ``step`` under ``config``."""
    figures = trace_config(step, state, restore, candidates, config, ops)
    time_configs(step, state, restore, candidates, [figures], repeats, ops, clock)
    return figures
