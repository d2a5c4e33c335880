"""What a long ``watch()`` block keeps per invocation once each invocation's graph is freed.

A block keeps a record of every invocation until it ends, so a training loop watched for
10,000 steps keeps 10,000 times a step's records.  For each model of ``watch_overhead.py``
this runs ``--warmup`` steps in one block, then ``--steps`` more, and prints the Python heap
(``tracemalloc``, after a garbage collection) the later steps added, divided by their
invocations.  Tensors are not counted (tracemalloc sees Python's allocations); ``watch_overhead.py``
gives the peak resident set.

    python benchmarks/watch_memory.py [--models mlp,llama,resnet,vit] [--warmup 20] [--steps 200]

Nothing here is asserted (``tests/watch/test_dispatch.py`` holds a bound on a small model).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc

from watch_overhead import MODELS, print_rows  # this folder's, as timing.py is to the others


def kept_per_invocation(step, warmup: int, steps: int) -> tuple[float, int, int]:
    """Bytes of Python heap kept per invocation over ``steps`` steps, the invocations, the findings."""
    import recheck

    with recheck.watch(raise_on_finding=False) as watcher:
        for _ in range(warmup):
            step()
        invocations = watcher.report.stats["invocations"]  # a report of the block so far
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(steps):
                step()
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    added = watcher.report.stats["invocations"] - invocations
    return kept / max(added, 1), added, len(watcher.report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    ns = parser.parse_args(argv)
    if ns.warmup < 1 or ns.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    import torch

    torch.set_num_threads(1)
    print(f"{'model':8} {'bytes/invocation':>16} {'invocations':>11} {'findings':>8}")

    def row(step) -> str:
        per, added, findings = kept_per_invocation(step, ns.warmup, ns.steps)
        return f"{per:16,.0f} {added:11d} {findings:8d}"

    print_rows(ns.models, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
