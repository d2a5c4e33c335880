"""Cost of ``recheck.check()`` relative to one plain forward+backward.

A stack of transformer encoder blocks is checked at two sizes; the script prints the
median wall time of a plain step (forward + backward), of ``check()`` on the same
stack, of the floor (a plain step plus a non-reentrant checkpointed step) and of the
watched floor (the same, its checkpointed step inside ``recheck.watch()``), as ratios to
the plain step.  ``check()`` runs the watched floor and its own snapshot, restore and
comparison: the target is the floor plus 0.2.

Run: ``python benchmarks/check_cost.py [--repeats N] [--json] [--clock cpu]``.
``--clock cpu`` times with the process's CPU clock instead of the wall clock: every step
runs on one thread, so on a shared, loaded machine it is the steadier measure.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recheck import watch  # noqa: E402
from recheck.checker import check  # noqa: E402

SIZES = {
    "small": {"width": 128, "heads": 4, "layers": 4, "batch": 8, "tokens": 64},
    "large": {"width": 384, "heads": 6, "layers": 6, "batch": 8, "tokens": 128},
}


def build(width: int, heads: int, layers: int, batch: int, tokens: int):
    torch.manual_seed(0)
    blocks = nn.Sequential(*[
        nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.1,
                                   batch_first=True) for _ in range(layers)])
    x = torch.randn(batch, tokens, width, requires_grad=True)
    return blocks, x


def plain_step(blocks: nn.Module, x: torch.Tensor) -> None:
    out = blocks(x)
    out.backward(torch.randn_like(out))
    blocks.zero_grad(set_to_none=True)
    x.grad = None


def floor_step(blocks: nn.Module, x: torch.Tensor, watched: bool = False) -> None:
    """What any check must run at least: a plain step and a checkpointed step (``watched``: that
    one inside ``recheck.watch()``, as ``check()`` runs it)."""
    from torch.utils.checkpoint import checkpoint

    plain_step(blocks, x)
    with watch(raise_on_finding=False) if watched else contextlib.nullcontext():
        out = checkpoint(blocks, x, use_reentrant=False)
        out.backward(torch.randn_like(out))
    blocks.zero_grad(set_to_none=True)
    x.grad = None


def interleaved_medians(fns: dict, repeats: int, clock=time.perf_counter) -> dict[str, float]:
    """Median time of each callable, measured round-robin so load noise is shared."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall clock (default) or this process's CPU time")
    ns = parser.parse_args()
    clock = time.perf_counter if ns.clock == "wall" else time.process_time
    torch.set_num_threads(ns.threads)
    variants = {"default": {}, "reentrant": {"use_reentrant": True},
                "no_early_stop": {"early_stop": False}}
    results = {}
    for name, size in SIZES.items():
        blocks, x = build(**size)
        reports = []
        fns = {"plain": lambda: plain_step(blocks, x), "floor": lambda: floor_step(blocks, x),
               "watched": lambda: floor_step(blocks, x, watched=True)}
        for label, options in variants.items():
            fns[label] = functools.partial(
                lambda opts: reports.append(check(blocks, x, **opts)), options)
        medians = interleaved_medians(fns, ns.repeats, clock)
        assert all(r.ok for r in reports), "the benchmark's stack must check clean"
        row = {"clock": ns.clock, "plain_s": medians["plain"],
               "runs_default": reports[0].stats["runs"]}  # 2: the full replay was not rerun
        row["ratio_floor"] = medians["floor"] / medians["plain"]
        row["ratio_watched_floor"] = medians["watched"] / medians["plain"]
        for label in variants:
            row[f"check_{label}_s"] = medians[label]
            row[f"ratio_{label}"] = medians[label] / medians["plain"]
        results[name] = {**size, **row}
        if not ns.json:
            print(f"{name:6s} {size}: plain {medians['plain'] * 1e3:8.1f} ms | "
                  f"floor {row['ratio_floor']:.2f}x | watched floor {row['ratio_watched_floor']:.2f}x | "
                  + " | ".join(f"{label} {row[f'ratio_{label}']:.2f}x" for label in variants),
                  flush=True)
    if ns.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
