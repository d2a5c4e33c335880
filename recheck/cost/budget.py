"""``--budget``: the largest microbatch that fits a memory budget, per mode.

When the step accepts a ``batch_size`` argument, it is measured at two batch sizes and
each phase's peak memory is fitted as a straight line in the batch size (activations
grow linearly with the batch; parameters and optimizer state do not).  The fit is then
solved for the budget: the answer is an *extrapolation*, labelled as such.  Throughput
at that size assumes step time in proportion to the batch (a lower bound).
Without a ``batch_size`` argument only "fits / does not fit at the measured size" can be
said.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from recheck.cost.results import BudgetEstimate

__all__ = ["default_batch_size", "estimate"]


def default_batch_size(step: Callable[..., Any]) -> int | None:
    """The default of ``step``'s ``batch_size`` argument, if it has one that is an int."""
    try:
        parameter = inspect.signature(step).parameters.get("batch_size")
    except (TypeError, ValueError):
        return None
    if parameter is None or not isinstance(parameter.default, int) or isinstance(parameter.default, bool):
        return None
    return parameter.default


#: One measurement: (batch size or None, observed peak per phase in bytes, seconds per step).
Point = tuple[Any, dict[str, int], float]


def _solve(budget: int, points: list[Point]) -> dict[str, Any]:
    """Largest batch with every phase's fitted peak within ``budget``.

    The peak of a step is the largest of its phases' peaks (forward, backward, optimizer
    step), each a straight line in the batch size; fitting their maximum as one line
    would be wrong when the optimizer step (batch-independent) dominates at small sizes.
    """
    (b1, peaks1, _), (b2, peaks2, s2) = points[0], points[-1]
    limits: dict[str, int | None] = {}
    fits: dict[str, dict[str, float]] = {}
    for phase in sorted(set(peaks1) & set(peaks2)):
        slope = (peaks2[phase] - peaks1[phase]) / (b2 - b1)
        intercept = peaks1[phase] - slope * b1
        fits[phase] = {"fixed_bytes": intercept, "bytes_per_sample": slope}
        if slope > 0:
            limits[phase] = math.floor((budget - intercept) / slope)
        else:
            limits[phase] = None if intercept <= budget else 0
    bounded = [v for v in limits.values() if v is not None]
    result: dict[str, Any] = {
        "measured": [{"batch_size": b, "peak_bytes_by_phase": p} for b, p, _ in points],
        "fit_by_phase": fits,
    }
    if not bounded:
        result.update(largest_batch=None, samples_per_second=None, why="peak memory did not grow with the batch size")
        return result
    largest = min(bounded)
    if largest < 1:
        result.update(largest_batch=0, samples_per_second=None, why="the batch-independent part alone exceeds the budget")
        return result
    limiting = min((v, k) for k, v in limits.items() if v is not None)[1]
    # Step time in proportion to the batch from the larger measured size: a fitted slope of
    # two noisy timings, extrapolated a hundredfold, says more about the noise than the step;
    # a fixed per-step cost only makes the real throughput higher (this is a lower bound).
    seconds = s2 * largest / b2 if b2 else 0.0
    result.update(
        largest_batch=largest,
        limiting_phase=limiting,
        seconds_per_step=seconds if seconds > 0 else None,
        samples_per_second=largest / seconds if seconds > 0 else None,
    )
    return result


def estimate(budget: int, measurements: dict[str, list[Point]]) -> BudgetEstimate:
    """Solve per mode from ``{mode: [(batch_size, peak_by_phase, seconds), ...]}``.

    Two distinct batch sizes give an extrapolated largest batch; one batch size (or an
    unknown one) only says whether the measured size fits.
    """
    per_mode: dict[str, dict[str, Any]] = {}
    sizes = sorted({b for points in measurements.values() for b, _, _ in points if b is not None})
    extrapolated = len(sizes) >= 2
    for mode, points in measurements.items():
        if extrapolated:
            per_mode[mode] = _solve(budget, points)
        else:
            batch, peaks, seconds = points[0]
            peak = max(peaks.values(), default=0)
            per_mode[mode] = {
                "measured": [{"batch_size": batch, "peak_bytes_by_phase": peaks}],
                "fits_measured_size": peak <= budget,
                "samples_per_second": (batch / seconds) if batch and seconds > 0 else None,
            }
    if extrapolated:
        note = (
            f"extrapolated: each phase's peak memory fitted linearly from batch sizes "
            f"{sizes[0]} and {sizes[-1]}, then solved for the budget (on CUDA plus the allocator's reserve "
            f"at the smaller size); not measured at that size. Throughput assumes step time in proportion "
            f"to the batch from batch size {sizes[-1]} (a lower bound)"
        )
    else:
        note = "not extrapolated: the step takes no batch_size argument with a default, so only the measured size is judged"
    return BudgetEstimate(budget=budget, extrapolated=extrapolated, batch_sizes=tuple(sizes), per_mode=per_mode, note=note)
