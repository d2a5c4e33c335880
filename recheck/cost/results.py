"""The measured figures of a comparison: per mode, per region, and the budget estimate.

Plain data (no torch): :mod:`recheck.cost.measurement` fills it, :mod:`recheck.cost.table`
and :mod:`recheck.cost.plot` render it.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from recheck.cost.work import Work

__all__ = ["POOR_TRADE_FRACTION", "BudgetEstimate", "Comparison", "ModeResult", "RegionResult", "rank_regions"]

#: A region whose bytes saved per recompute FLOP-equivalent fall below this fraction of the
#: best region's is called out as a poor trade.
POOR_TRADE_FRACTION = 0.1
#: Bytes moved by non-matmul operators are weighed as this many FLOPs each when regions are
#: ranked (a machine balance: an H100 does ~300 FLOP per byte of HBM, a CPU core ~10).
FLOPS_PER_BYTE = 10


@dataclass
class ModeResult:
    """One mode (checkpointed or bypassed): a traced run and the timed repeats."""

    name: str
    retained_peak: int
    retained_peak_split: dict[str, int]
    retained_end_of_forward: int
    observed_peak: int
    peak_breakdown: dict[str, int]
    observed_end_of_forward: int
    work: dict[str, Work]
    seconds: list[float]
    timeline: list[tuple[int, int]] = field(default_factory=list)
    end_of_forward_index: int | None = None
    cuda: dict[str, Any] | None = None
    phase_peaks: dict[str, int] = field(default_factory=dict)
    observed_at_start: int = 0
    traced_seconds: float = 0.0

    @property
    def median_seconds(self) -> float:
        """Median wall time of the timed repeats."""
        return statistics.median(self.seconds)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the timeline is left out; see ``Comparison.to_dict``)."""
        return {
            "retained_saved_state": {"peak": self.retained_peak, "peak_split": self.retained_peak_split,
                                     "end_of_forward": self.retained_end_of_forward},
            "observed_peak": self.observed_peak, "observed_peak_by_phase": self.phase_peaks,
            "observed_at_start": self.observed_at_start, "observed_end_of_forward": self.observed_end_of_forward,
            "peak_breakdown": self.peak_breakdown, "cuda": self.cuda,
            "work": {phase: w.to_dict() for phase, w in self.work.items()}, "seconds": self.seconds,
            "median_seconds": self.median_seconds, "traced_run_seconds": self.traced_seconds,
        }


@dataclass
class RegionResult:
    """One checkpointed region: what its checkpoint avoids, keeps and costs to replay."""

    name: str
    defined_at: str | None
    callsite: str | None
    invocations: int
    saved_bytes: int
    inputs_kept_bytes: int
    recompute: Work
    recompute_seconds: float | None
    recomputes: int
    verdict: str = ""

    @property
    def net_bytes(self) -> int:
        """Saved set without the checkpoint minus the inputs the checkpoint keeps."""
        return self.saved_bytes - self.inputs_kept_bytes

    @property
    def recompute_cost(self) -> float:
        """Recompute work in FLOP-equivalents: FLOPs plus weighed bytes moved."""
        return self.recompute.flops + FLOPS_PER_BYTE * self.recompute.bytes_moved

    @property
    def bytes_per_cost(self) -> float:
        """Net bytes saved per recompute FLOP-equivalent (infinite when replay is free)."""
        cost = self.recompute_cost
        return float("inf") if cost <= 0 else self.net_bytes / cost

    def to_dict(self) -> dict[str, Any]:
        return {
            "region": self.name, "defined_at": self.defined_at, "callsite": self.callsite,
            "invocations": self.invocations, "saved_bytes_without_checkpoint": self.saved_bytes,
            "inputs_kept_bytes": self.inputs_kept_bytes, "net_bytes_saved": self.net_bytes,
            "recompute_flops": self.recompute.flops, "recompute_bytes_moved": self.recompute.bytes_moved,
            "recomputes": self.recomputes, "recompute_seconds_median": self.recompute_seconds,
            "net_bytes_per_recompute_flop_equivalent": None if self.recompute_cost <= 0 else self.bytes_per_cost,
            "verdict": self.verdict,
        }


def rank_regions(regions: list[RegionResult]) -> list[RegionResult]:
    """Sort by net bytes saved per unit of recompute, best first, and set each verdict."""
    ranked = sorted(regions, key=lambda r: (r.net_bytes > 0, r.bytes_per_cost), reverse=True)
    replayed = [r.bytes_per_cost for r in ranked if r.net_bytes > 0 and r.recomputes and r.recompute_cost > 0]
    best = max(replayed, default=float("inf"))
    for region in ranked:
        if region.net_bytes <= 0:
            region.verdict = "saves nothing: its checkpoint keeps at least as much as it drops"
        elif region.recomputes == 0:
            region.verdict = "never recomputed in this step (no backward through it)"
        elif region.bytes_per_cost < POOR_TRADE_FRACTION * best:
            region.verdict = (
                f"poor trade: under {POOR_TRADE_FRACTION:.0%} of the best region's bytes saved per unit of recompute"
            )
        else:
            region.verdict = "ok"
    return ranked


@dataclass
class BudgetEstimate:
    """The largest microbatch that fits a memory budget, per mode."""

    budget: int
    extrapolated: bool
    batch_sizes: tuple[int, ...]
    per_mode: dict[str, dict[str, Any]]
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget, "extrapolated": self.extrapolated,
                "measured_batch_sizes": list(self.batch_sizes), "per_mode": self.per_mode, "note": self.note}


@dataclass
class Comparison:
    """The measured trade of checkpointing for one step; ``str()`` is the table."""

    modes: dict[str, ModeResult]
    regions: list[RegionResult]
    repeats: int
    notes: list[str] = field(default_factory=list)
    budget: BudgetEstimate | None = None

    @property
    def checkpointed(self) -> ModeResult:
        """The step as written."""
        return self.modes["checkpointed"]

    @property
    def bypassed(self) -> ModeResult:
        """The step with every checkpoint call replaced by a direct call of its region."""
        return self.modes["bypassed"]

    @property
    def recompute(self) -> Work:
        """Backward work added by checkpointing: checkpointed minus bypassed backward."""
        return self.checkpointed.work["backward"].minus(self.bypassed.work["backward"])

    @property
    def time_ratio(self) -> float:
        """Median step time checkpointed / bypassed."""
        return self.checkpointed.median_seconds / self.bypassed.median_seconds

    def __str__(self) -> str:
        from recheck.cost.table import render_text

        return render_text(self)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        """A JSON-ready dict with every figure and the definitions of the terms."""
        from recheck.cost.table import to_dict

        return to_dict(self, timeline=timeline)

    def to_json(self, timeline: bool = False) -> str:
        """The comparison as JSON (``timeline=True`` adds the memory-over-the-step samples)."""
        return json.dumps(self.to_dict(timeline=timeline), indent=2)

    def plot(self, path: str) -> str:
        """Write a PNG of memory over the step for both modes (needs matplotlib); returns the path."""
        from recheck.cost.plot import plot_comparison

        return plot_comparison(self, path)
