"""``recheck.measure(step)``: the same training step with checkpointing as written and bypassed.

Each mode runs once traced (:mod:`recheck.cost.trace`) and ``repeats`` times untraced for time
(and, on CUDA, the allocator's peaks).  All state the step touches is put back before every run
(:mod:`recheck.runtime.steps`), so both modes see the same model, data and random numbers.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from recheck.cost import budget as budget_fit
from recheck.cost.results import BudgetEstimate, Comparison, ModeResult, RegionResult, rank_regions
from recheck.cost.router import MODES, ROUTER_MODE, RegionStats, Router, routing
from recheck.runtime.steps import StepState, discover_state
from recheck.cost.trace import Tracer, cuda_peak
from recheck.cost.units import parse_bytes

__all__ = ["Comparison", "measure"]


def _traced_run(step: Callable[[], Any], state: StepState, router: Router, mode: str) -> tuple[ModeResult, dict]:
    router.reset(ROUTER_MODE[mode])
    started = time.perf_counter()
    with Tracer(state, router) as tracer:
        step()
    traced_seconds = time.perf_counter() - started
    trace, ledger = tracer.trace, tracer.trace.ledger
    result = ModeResult(
        mode, ledger.saved_peak, dict(ledger.saved_peak_split), trace.saved_at_end_of_forward, ledger.observed_peak,
        dict(ledger.peak_breakdown), trace.observed_at_end_of_forward, trace.work, [], list(ledger.timeline),
        trace.end_of_forward_index, phase_peaks=dict(ledger.phase_peaks),
        observed_at_start=ledger.timeline[0][0] if ledger.timeline else 0, traced_seconds=traced_seconds)
    return result, dict(router.regions)


def _timed_runs(
    step: Callable[[], Any], state: StepState, router: Router, mode: str, restore: Callable[[], None], repeats: int
) -> tuple[list[float], list[dict], dict | None]:
    seconds: list[float] = []
    region_runs: list[dict] = []
    cuda: dict | None = None
    for index in range(repeats):
        restore()
        router.reset(ROUTER_MODE[mode])
        with cuda_peak(state) as peak:  # entering waits for queued device work
            started = time.perf_counter()
            step()
            peak.synchronize()
            seconds.append(time.perf_counter() - started)
        if index == 0 and peak.result is not None:
            cuda = peak.result
        region_runs.append(dict(router.regions))
    return seconds, region_runs, cuda


def _regions(checkpointed: dict, bypassed: dict, timed: list[dict]) -> list[RegionResult]:
    results = []
    for key, stats in checkpointed.items():
        plain: RegionStats | None = bypassed.get(key)
        per_run = [run[key].recompute_seconds for run in timed if key in run]
        results.append(RegionResult(key.qualname, key.defined_at, key.callsite, stats.invocations,
                                    plain.saved_bytes if plain is not None else 0, stats.inputs_kept_bytes,
                                    stats.recompute, statistics.median(per_run) if per_run else None, stats.recomputes))
    return rank_regions(results)


def _measure_modes(
    step: Callable[[], Any], state: StepState, restore: Callable[[], None], repeats: int
) -> tuple[dict[str, ModeResult], list[RegionResult], list[str]]:
    router = Router()
    modes: dict[str, ModeResult] = {}
    region_stats: dict[str, dict] = {}
    timed_regions: list[dict] = []
    with routing(router):
        for mode in MODES:
            restore()
            modes[mode], region_stats[mode] = _traced_run(step, state, router, mode)
            seconds, region_runs, cuda = _timed_runs(step, state, router, mode, restore, repeats)
            modes[mode].seconds, modes[mode].cuda = seconds, cuda
            if mode == "checkpointed":
                timed_regions = region_runs
    regions = _regions(region_stats["checkpointed"], region_stats["bypassed"], timed_regions)
    return modes, regions, list(router.notes)


def _budget_peaks(result: ModeResult, reserve: int) -> dict[str, int]:
    """Observed peak per phase plus ``reserve`` (the CUDA allocator's reserve at the base size)."""
    return {phase: peak + reserve for phase, peak in result.phase_peaks.items()}


def _allocator_reserve(result: ModeResult) -> int:
    if not result.cuda:
        return 0
    return max(0, int(result.cuda["max_memory_reserved"]) - int(result.cuda["max_memory_allocated"]))


def measure(
    step: Callable[..., Any],
    repeats: int = 5,
    *,
    modules: Iterable[torch.nn.Module] = (),
    optimizers: Iterable[torch.optim.Optimizer] = (),
    budget: int | str | None = None,
) -> Comparison:
    """Run ``step`` (forward + backward, optionally the optimizer step) checkpointed and bypassed.

    ``step`` is called with no arguments.  The modules and optimizers it uses are found
    in its closure and globals; pass ``modules=``/``optimizers=`` when they are out of
    reach.  ``budget`` (bytes, or a size such as ``"40GiB"``) adds the largest microbatch that fits each mode: when
    ``step`` takes a ``batch_size`` argument it is also run at twice its default and the
    result is extrapolated linearly (and labelled so).
    """
    if not callable(step):
        raise TypeError(f"recheck.measure needs a callable step, got {type(step).__name__}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if isinstance(budget, str):
        budget = parse_bytes(budget)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        raise ValueError(f"budget must be a positive number of bytes, got {budget!r}")
    state = discover_state(step, modules, optimizers)
    notes: list[str] = []
    if not state.parameters():
        notes.append("no module or optimizer was found from the step; parameters count as saved activations")
    if any(not opt.state for opt in state.optimizers):
        notes.append(
            "an optimizer had no state yet: every run is its first step, which allocates that state "
            "(later steps reuse it); the optimizer-phase peak includes the allocation"
        )
    restore = state.snapshot()
    try:
        modes, regions, router_notes = _measure_modes(step, state, restore, repeats)
        notes += router_notes
        if not regions:
            notes.append("the step made no checkpoint call: both modes ran the same code")
        estimate = None
        if budget is not None:
            estimate = _estimate_budget(step, state, restore, repeats, budget, modes)
    finally:
        restore()
    return Comparison(modes=modes, regions=regions, repeats=repeats, notes=notes, budget=estimate)


def _estimate_budget(
    step: Callable[..., Any],
    state: StepState,
    restore: Callable[[], None],
    repeats: int,
    budget: int,
    modes: dict[str, ModeResult],
) -> BudgetEstimate:
    base = budget_fit.default_batch_size(step)
    reserve = {m: _allocator_reserve(r) for m, r in modes.items()}
    points = {m: [(base, _budget_peaks(r, reserve[m]), r.median_seconds)] for m, r in modes.items()}
    if base is not None:
        larger = functools.partial(step, batch_size=2 * base)
        more, _, _ = _measure_modes(larger, state, restore, repeats)
        for mode, result in more.items():
            points[mode].append((2 * base, _budget_peaks(result, reserve[mode]), result.median_seconds))
    return budget_fit.estimate(budget, points)
