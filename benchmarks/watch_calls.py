"""What ``watch()`` adds to a training step, counted in calls: a figure that does not move between runs.

On a shared machine the same code times ±20% apart from one run to the next; the number of
Python and C function calls a step makes does not.  For each model of
``benchmarks/watch_overhead.py`` this counts, with ``sys.setprofile``, the calls of one plain
step and of the same step inside its own ``watch()`` block (as ``pytest --recheck`` watches
each test), after one warm-up of each, and prints the difference per step and per checkpoint
invocation, split into Python functions and C functions, with the recheck functions that add
the most.

    python benchmarks/watch_calls.py [--models mlp,llama,resnet,vit] [--top 8]

It is a proxy, not a time: a call to ``torch.equal`` over a large tensor counts one.  Use it to
compare two versions of recheck on the same model (``PYTHONPATH=other/checkout``).  Nothing
here is asserted.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import warnings
from typing import Any, Callable

from watch_overhead import MODELS, built  # this folder's, as timing.py is to the others


def count(run: Callable[[], Any]) -> collections.Counter[str]:
    """Calls made by ``run()``: ``"py"`` and ``"c"`` totals, and one entry per Python function."""
    counts: collections.Counter[str] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts["py"] += 1
            code = frame.f_code
            counts[f"{os.path.basename(code.co_filename)}:{code.co_name}"] += 1
        elif event == "c_call":
            counts["c"] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,llama,resnet,vit")
    parser.add_argument("--top", type=int, default=8)
    ns = parser.parse_args(argv)
    unknown = [name for name in ns.models.split(",") if name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    import torch

    import recheck

    torch.set_num_threads(1)
    print(f"recheck from {os.path.dirname(recheck.__file__)}")
    print(f"{'model':<8} {'plain calls':>12} {'added':>8} {'python':>8} {'C':>8} {'invocations':>12} {'per inv.':>9}")
    for name, step, why in built(ns.models):
        if step is None:
            print(f"{name:<8} skipped: {why}")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            blocks: list[Any] = []

            def watched() -> None:
                with recheck.watch(raise_on_finding=False) as block:
                    step()
                blocks.append(block)

            step()
            watched()  # warm-up: lazy imports, caches
            plain, inside = count(step), count(watched)
        invocations = blocks[-1].report.stats.get("invocations", 0) or 1
        added = {kind: inside[kind] - plain[kind] for kind in ("py", "c")}
        total = added["py"] + added["c"]
        print(f"{name:<8} {plain['py'] + plain['c']:>12,} {total:>+8,} {added['py']:>+8,} {added['c']:>+8,} "
              f"{invocations:>12} {total / invocations:>9,.0f}")
        ours = collections.Counter({k: v - plain.get(k, 0) for k, v in inside.items()
                                    if ":" in k and v > plain.get(k, 0)})
        print("         most added: " + ", ".join(f"{k} {v}" for k, v in ours.most_common(ns.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
