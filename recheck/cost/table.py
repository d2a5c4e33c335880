"""Render a :class:`~recheck.cost.results.Comparison` as a text table or a JSON-ready dict.

Every figure is printed with its definition beside it: the terms are the contract of the
report, and :data:`DEFINITIONS` is the one place they are written down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recheck.cost.ledger import CATEGORIES
from recheck.cost.units import format_bytes, format_count, format_ms

if TYPE_CHECKING:  # pragma: no cover
    from recheck.cost.results import Comparison

__all__ = ["BLIND_SPOTS", "DEFINITIONS", "render_text", "row", "to_dict"]

DEFINITIONS: dict[str, str] = {
    "retained_peak": "most bytes autograd held for backward at once: saved tensors + checkpoint inputs kept "
    "+ (non-reentrant) the set a recompute rebuilt; deduplicated by storage, parameters excluded",
    "retained_end_of_forward": "the same, when backward starts",
    "observed_peak": "most bytes alive at once: every storage an operator created in the step plus the "
    "parameters, gradients, buffers and optimizer state that existed before it",
    "phase_forward": "the observed peak while the forward ran",
    "phase_backward": "the observed peak while backward ran (recomputes included)",
    "phase_optimizer": "the observed peak inside optimizer.step",
    "cuda_allocated": "torch.cuda.max_memory_allocated in an untraced run (allocator blocks in use; "
    "absolute: everything on the device before the step counts too)",
    "cuda_reserved": "torch.cuda.max_memory_reserved: adds the allocator's cached and fragmented blocks",
    "parameters": "parameters and buffers",
    "gradients": ".grad tensors (from when autograd accumulates them)",
    "optimizer_state": "tensors in optimizer.state",
    "saved_activations": "tensors autograd holds for backward (including a recompute's rebuilt set)",
    "checkpoint_inputs": "inputs a checkpoint keeps to replay its region",
    "temporary": "other tensors made during the step (workspace, outputs, incoming gradients; "
    "optimizer state counts here until its optimizer.step returns)",
    "other": "tensors reached from the step that existed before it (data, globals)",
    "forward_flops": "FLOPs of matmul-like operators in forward (torch's flop_counter formulas)",
    "backward_flops": "the same in backward, recompute included",
    "recompute_flops": "backward FLOPs checkpointed minus bypassed: the replay's matmul work",
    "bytes_moved": "bytes read + written by non-matmul operators (pointwise replay is not free)",
    "recompute_bytes": "backward bytes moved checkpointed minus bypassed: the replay's memory traffic",
    "median_seconds": "median wall time of the repeats",
    "region_saved": "bytes the region's operators save for backward when it is not checkpointed",
    "region_kept": "bytes of the inputs its checkpoint keeps instead",
    "region_net": "saved minus kept: what the checkpoint avoids",
    "region_rank": "net bytes per recompute FLOP-equivalent (FLOPs + 10 x bytes moved); higher is better",
}

#: What the figures cannot see; printed under every table.
BLIND_SPOTS = (
    (
        "allocations that never become tensors are not in the observed figures: BLAS/oneDNN scratch on CPU, "
        "cuBLAS/cuDNN workspaces on CUDA (max_memory_allocated sees those)"
    ),
    (
        "on CPU there is no caching allocator to ask: fragmentation and malloc's retained arenas are not measured; "
        "on CUDA the reserved figure covers the caching allocator only, not the CUDA context or NCCL buffers"
    ),
    "selective checkpointing (context_fn) caches are held inside torch and counted only as allocations",
    "wall times are noisy on a shared CPU; FLOPs and bytes moved are the stable figures",
)


def row(label: str, values: list[str], definition: str, width: int = 28) -> str:
    """A table row: the label, each value right-aligned, and the definition of the term."""
    return f"  {label:<{width}}" + "".join(f"{v:>14}" for v in values) + f"   {definition}"


def render_text(cmp: Comparison) -> str:
    """The comparison table, with the definition of every term beside its row."""
    c, b = cmp.checkpointed, cmp.bypassed

    def ratio(x: float | None, y: float | None) -> str:
        return f"{x / y:.2f}x" if x is not None and y else "-"

    lines = ["recheck cost: the step checkpointed as written vs with every checkpoint bypassed", ""]
    lines.append(f"  {'':<28}{'checkpointed':>14}{'bypassed':>14}{'ratio':>14}")
    mem = [
        ("retained saved state, peak", c.retained_peak, b.retained_peak, "retained_peak"),
        ("  ... at end of forward", c.retained_end_of_forward, b.retained_end_of_forward, "retained_end_of_forward"),
        ("observed peak", c.observed_peak, b.observed_peak, "observed_peak"),
    ]
    for label, x, y, term in mem:
        lines.append(row(label, [format_bytes(x), format_bytes(y), ratio(x, y)], DEFINITIONS[term]))
    for phase in ("forward", "backward", "optimizer"):
        in_phase = (c.phase_peaks.get(phase), b.phase_peaks.get(phase))
        if in_phase != (None, None):
            values = [format_bytes(v) if v is not None else "-" for v in in_phase]
            both = ratio(*in_phase) if in_phase[0] and in_phase[1] else ""
            lines.append(row(f"  ... during {phase}", [*values, both], DEFINITIONS[f"phase_{phase}"]))
    if c.cuda and b.cuda:
        for label, key, term in (
            ("cuda max allocated", "max_memory_allocated", "cuda_allocated"),
            ("cuda max reserved", "max_memory_reserved", "cuda_reserved"),
        ):
            x, y = c.cuda[key], b.cuda[key]
            lines.append(row(label, [format_bytes(x), format_bytes(y), ratio(x, y)], DEFINITIONS[term]))
    lines.append("  breakdown at the observed peak:")
    for category in CATEGORIES:
        x, y = c.peak_breakdown.get(category, 0), b.peak_breakdown.get(category, 0)
        lines.append(row("  " + category.replace("_", " "), [format_bytes(x), format_bytes(y), ""], DEFINITIONS[category]))
    if c.cuda and b.cuda:
        reserve = [cuda["max_memory_reserved"] - cuda["max_memory_allocated"] for cuda in (c.cuda, b.cuda)]
        lines.append(row("  allocator reserve", [format_bytes(v) for v in reserve] + [""], "reserved minus allocated at their peaks"))
    work = [
        ("forward FLOPs", c.work["forward"].flops, b.work["forward"].flops, "forward_flops", "FLOP"),
        ("backward FLOPs", c.work["backward"].flops, b.work["backward"].flops, "backward_flops", "FLOP"),
        ("forward bytes moved", c.work["forward"].bytes_moved, b.work["forward"].bytes_moved, "bytes_moved", "B"),
        ("backward bytes moved", c.work["backward"].bytes_moved, b.work["backward"].bytes_moved, "bytes_moved", "B"),
    ]
    for label, x, y, term, unit in work:
        lines.append(row(label, [format_count(x, unit), format_count(y, unit), ratio(x, y)], DEFINITIONS[term]))
    extra = cmp.recompute
    lines.append(row("recompute FLOPs", [format_count(extra.flops, "FLOP"), "", ""], DEFINITIONS["recompute_flops"]))
    lines.append(row("recompute bytes moved", [format_count(extra.bytes_moved, "B"), "", ""], DEFINITIONS["recompute_bytes"]))
    lines.append(
        row(
            "step time (median)",
            [format_ms(c.median_seconds), format_ms(b.median_seconds), f"{cmp.time_ratio:.2f}x"],
            DEFINITIONS["median_seconds"] + f" ({cmp.repeats} per mode)",
        )
    )
    lines += ["", *_region_lines(cmp)]
    if cmp.budget is not None:
        lines += ["", *_budget_lines(cmp)]
    if cmp.notes:
        lines += ["", "notes:", *(f"  - {note}" for note in cmp.notes)]
    lines += ["", "what these figures cannot see:", *(f"  - {text}" for text in BLIND_SPOTS)]
    return "\n".join(lines)


def _region_lines(cmp: Comparison) -> list[str]:
    if not cmp.regions:
        return ["regions: the step made no checkpoint call"]
    lines = [
        "regions, ranked by net bytes saved per unit of recompute (best first):",
        f"  saved = {DEFINITIONS['region_saved']}; kept = {DEFINITIONS['region_kept']};",
        f"  net = {DEFINITIONS['region_net']}; rank = {DEFINITIONS['region_rank']}",
        f"  {'#':>2} {'region':<34}{'calls':>6}{'saved':>12}{'kept':>12}{'net':>12}{'replay FLOPs':>14}{'replay bytes':>14}{'replay time':>12}  verdict",
    ]
    for index, r in enumerate(cmp.regions, 1):
        name = r.name if len(r.name) <= 33 else r.name[:30] + "..."
        lines.append(
            f"  {index:>2} {name:<34}{r.invocations:>6}{format_bytes(r.saved_bytes):>12}{format_bytes(r.inputs_kept_bytes):>12}"
            f"{format_bytes(r.net_bytes):>12}{format_count(r.recompute.flops, 'FLOP'):>14}"
            f"{format_count(r.recompute.bytes_moved, 'B'):>14}{format_ms(r.recompute_seconds):>12}  {r.verdict}"
        )
        if r.callsite:
            lines.append(f"     checkpointed at {r.callsite}")
    return lines


def _budget_lines(cmp: Comparison) -> list[str]:
    est = cmp.budget
    assert est is not None
    lines = [f"budget {format_bytes(est.budget)}: {est.note}"]
    for mode, info in est.per_mode.items():
        if est.extrapolated:
            largest = info.get("largest_batch")
            rate = info.get("samples_per_second")
            text = f"largest microbatch {largest}" if largest else f"no batch fits ({info.get('why', '')})"
            if largest and info.get("limiting_phase"):
                text += f" (limited by the {info['limiting_phase']} peak)"
            if rate:
                text += f", about {rate:.1f} samples/s"
        else:
            text = "fits at the measured size" if info["fits_measured_size"] else "does not fit at the measured size"
        lines.append(f"  {mode:<14}{text}")
    return lines


def to_dict(cmp: Comparison, timeline: bool = False) -> dict[str, Any]:
    """Every figure of the comparison, with :data:`DEFINITIONS` and :data:`BLIND_SPOTS`."""
    modes = {name: result.to_dict() for name, result in cmp.modes.items()}
    if timeline:
        for name, result in cmp.modes.items():
            modes[name]["timeline"] = {
                "observed_bytes": [o for o, _ in result.timeline],
                "retained_bytes": [s for _, s in result.timeline],
                "end_of_forward_index": result.end_of_forward_index,
            }
    return {"repeats": cmp.repeats, "modes": modes, "recompute": cmp.recompute.to_dict(), "time_ratio": cmp.time_ratio,
            "regions": [r.to_dict() for r in cmp.regions],
            "budget": None if cmp.budget is None else cmp.budget.to_dict(), "notes": cmp.notes,
            "definitions": DEFINITIONS, "blind_spots": list(BLIND_SPOTS)}
