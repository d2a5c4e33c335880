"""What ``watch()`` costs, in the two figures a user can reason about.

* **Fixed cost per checkpoint invocation** (µs): a region of one tiny tensor, checkpointed
  ``--calls`` times in one step, watched against plain; the difference divided by the calls.
  It covers recording the forward, the recompute's comparison and the bookkeeping, with next
  to no bytes to digest.
* **Digest throughput** (GB/s of saved tensors, one core): ``print_tensor`` of a large CPU
  tensor, the work that grows with the activations.  Beside it, ``clone()`` of the same bytes
  (the cost of ``store="copy"``).
* **Cost per saved tensor** (µs): what each tensor autograd saves adds to an invocation besides
  its bytes (its print at the forward, its recompute's, the comparison), as the slope between a
  region of 4 and one of 60 ``sin`` ops on a 256-byte activation, each saving its input; beside
  it, what the same op costs checkpointed without ``watch()``.  An invocation costs about the
  fixed cost, plus this for each saved tensor, plus its bytes at the digest throughput (a
  transformers decoder layer saves about 40).
* **Cost of a block** (µs): what a ``watch()`` block costs besides its invocations, the price
  ``pytest --recheck`` pays once a test: ``--calls`` one-invocation steps each in a block of its
  own, less as many plain steps and as many times the fixed cost (its enter and exit, and what its
  first invocation of a region finds again: the region's reach and scope).  An empty block's
  enter and exit beside it.

    python benchmarks/watch_costs.py [--calls 400] [--mib 64] [--mean 40]

Targets (issue 15): fixed cost <= 50 µs on CPU; digests >= 5 GB/s per core on CPU.  Process
CPU time is used (``time.process_time``), best of ``--repeats``, so other processes' load
affects the figures less than wall time would.  A best-of figure leaves out the runs in which
the garbage collector's full collections ran; ``--mean N`` adds the fixed cost as the mean of
``N`` runs of each (in two stretches per mode, each after a collection), with the full
collections counted and timed in each, which is what a long watched loop pays on average.  Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any

from timing import best, interleaved

CPU = time.process_time  # this process's CPU time: other processes' load counts less


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mean", type=int, default=0, metavar="N",
                        help="also the mean of N runs of each, with the full collections in them")
    ns = parser.parse_args(argv)
    if ns.mean < 0 or ns.calls < 1 or ns.repeats < 1:
        parser.error("--calls and --repeats must be at least 1, --mean at least 0")
    import torch
    from torch.utils.checkpoint import checkpoint

    import recheck
    from recheck.runtime.digests import DIGEST_NAME, print_tensor

    torch.set_num_threads(1)
    x = torch.randn(1, requires_grad=True)

    def region(t):
        return t.sin()

    def step():
        total = x
        for _ in range(ns.calls):
            total = checkpoint(region, total, use_reentrant=False)
        total.sum().backward()

    def watched():
        with recheck.watch(raise_on_finding=False):
            step()

    step(), watched()
    plain, timed = best(step, ns.repeats, CPU), best(watched, ns.repeats, CPU)
    print(f"fixed cost per invocation: {(timed - plain) / ns.calls * 1e6:.1f} us "
          f"(plain {plain / ns.calls * 1e6:.1f} us, watched {timed / ns.calls * 1e6:.1f} us a call)")
    if ns.mean:
        runs = {"plain": step, "watched": watched}
        means = _means(runs, ns.mean)
        calls = ns.mean * ns.calls
        (plain_mean, plain_full, plain_gc), (watched_mean, watched_full, watched_gc) = means["plain"], means["watched"]
        print(f"fixed cost per invocation, mean of {ns.mean} runs: {(watched_mean - plain_mean) / ns.calls * 1e6:.1f} us "
              f"(full collections per 1,000 invocations: plain {plain_full / calls * 1e3:.2f}, "
              f"watched {watched_full / calls * 1e3:.2f}; their time per invocation: plain "
              f"{plain_gc / calls * 1e6:.1f} us, watched {watched_gc / calls * 1e6:.1f} us)")
    fixed = (timed - plain) / ns.calls
    block, empty = _per_block(region, ns.calls, ns.repeats, fixed)
    print(f"cost of a watch() block: {block * 1e6:.1f} us (an empty block's enter and exit: {empty * 1e6:.1f} us)")
    per_tensor, per_op = _per_saved_tensor(ns.repeats)
    print(f"cost per saved tensor: {per_tensor * 1e6:.2f} us (a 256-byte activation; "
          f"the op itself, checkpointed: {per_op * 1e6:.2f} us)")
    big = torch.randn(ns.mib * 1024 * 1024 // 4)
    print_tensor(big, "digest")
    digest = best(lambda: print_tensor(big, "digest"), ns.repeats, CPU)
    clone = best(lambda: big.clone(), ns.repeats, CPU)
    size = big.numel() * big.element_size() / 1e9
    print(f"digest throughput ({DIGEST_NAME}): {size / digest:.2f} GB/s; clone(): {size / clone:.2f} GB/s")
    return 0


def _per_block(region: Any, blocks: int, repeats: int, fixed: float) -> tuple[float, float]:
    """Seconds a ``watch()`` block adds besides its one invocation (``fixed`` a one), and an empty
    block's: ``blocks`` one-invocation steps, best of ``repeats``."""
    import torch
    from torch.utils.checkpoint import checkpoint

    import recheck

    x = torch.randn(1, requires_grad=True)

    def one() -> None:
        checkpoint(region, x, use_reentrant=False).sum().backward()

    def plain() -> None:
        for _ in range(blocks):
            one()

    def each() -> None:
        for _ in range(blocks):
            with recheck.watch(raise_on_finding=False):
                one()

    def empty() -> None:
        for _ in range(blocks):
            with recheck.watch(raise_on_finding=False):
                pass

    plain(), each(), empty()
    base, watched, bare = best(plain, repeats, CPU), best(each, repeats, CPU), best(empty, repeats, CPU)
    return (watched - base) / blocks - fixed, bare / blocks


def _per_saved_tensor(repeats: int, calls: int = 100, fewer: int = 4, more: int = 60) -> tuple[float, float]:
    """Seconds each saved tensor adds to a watched invocation, and what its op costs
    checkpointed: the slope between regions of ``fewer`` and ``more`` ``sin`` ops (each saves
    its input), ``calls`` invocations a step; the four runs interleaved, ``2 * repeats`` rounds
    (a slope of four best times moves with the machine between them)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    import recheck

    x = torch.randn(4, 16, requires_grad=True)

    def region_of(ops: int) -> Any:
        def region(t: torch.Tensor) -> torch.Tensor:
            for _ in range(ops):
                t = t.sin()
            return t
        return region

    regions = {fewer: region_of(fewer), more: region_of(more)}

    def run(mode: str) -> float:
        watched, ops = mode.split(":")
        region = regions[int(ops)]
        start = CPU()
        with recheck.watch(raise_on_finding=False) if watched == "watched" else contextlib.nullcontext():
            total = x
            for _ in range(calls):
                total = checkpoint(region, total, use_reentrant=False)
            total.sum().backward()
        return CPU() - start

    least = interleaved(run, [f"{kind}:{ops}" for ops in (fewer, more) for kind in ("plain", "watched")],
                        2 * repeats)
    tensors = (more - fewer) * calls
    added = {ops: least[f"watched:{ops}"] - least[f"plain:{ops}"] for ops in (fewer, more)}
    return (added[more] - added[fewer]) / tensors, (least[f"plain:{more}"] - least[f"plain:{fewer}"]) / tensors


def _means(runs: dict, rounds: int) -> dict[str, tuple[float, int, float]]:
    """Per mode: the mean CPU time of a run over ``rounds`` runs, and the full collections in
    those runs and their wall time.  Each mode runs its rounds in two stretches, the modes in
    turn, each stretch after a collection of its own: a full collection falls due by what the
    runs before it left to the collector, so in runs interleaved one by one it would fall in
    whichever mode's run came next, not in the mode that made it due."""
    import gc

    full = {"count": 0, "time": 0.0, "start": 0.0}

    def count(phase: str, info: dict) -> None:
        if info["generation"] == 2:
            if phase == "start":
                full["start"] = time.perf_counter()
            else:
                full["count"] += 1
                full["time"] += time.perf_counter() - full["start"]

    totals = {mode: [0.0, 0, 0.0] for mode in runs}
    halves = (rounds - rounds // 2, rounds // 2)
    gc.callbacks.append(count)
    try:
        for stretch in halves:
            for mode, run in runs.items():
                gc.collect()
                before = (full["count"], full["time"])
                for _ in range(stretch):
                    start = CPU()
                    run()
                    totals[mode][0] += CPU() - start
                totals[mode][1] += full["count"] - before[0]
                totals[mode][2] += full["time"] - before[1]
    finally:
        gc.callbacks.remove(count)
    return {mode: (spent / rounds, collections, collected_time) for mode, (spent, collections, collected_time) in totals.items()}


if __name__ == "__main__":
    sys.exit(main())
