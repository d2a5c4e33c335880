"""What ``watch()`` adds to a training step, counted in calls or bytecodes: figures that do not move between runs.

On a shared machine the same code times ±20% apart from one run to the next; the number of
Python and C function calls a step makes does not, nor does the number of bytecodes the
interpreter runs (``--bytecodes``: every bytecode of every Python function, counted with
``sys.settrace``'s opcode events; what recheck's Python costs, function by function, without
the noise of a clock or the hours of callgrind).  For each model of
``benchmarks/watch_overhead.py`` this counts, with ``sys.setprofile``, the calls of one plain
step and of the same step inside its own ``watch()`` block (as ``pytest --recheck`` watches
each test), after one warm-up of each, and prints the difference per step and per checkpoint
invocation, split into Python functions and C functions, with the recheck functions that add
the most.

    python benchmarks/watch_calls.py [--models mlp,llama,resnet,vit] [--top 8] [--bytecodes]

It is a proxy, not a time: a call to ``torch.equal`` over a large tensor counts one, and a
bytecode that calls into C counts one whatever the C does; nor do bytecodes cost alike (Python
3.11 specializes a slot's read, not a tuple getter's: prints made as tuples ran 5% fewer
bytecodes and 2.6% more instructions).  Use it to find where the work is, and
``watch_instructions.py`` (callgrind) to tell whether a change made it cheaper; compare two
versions of recheck on the same model with ``PYTHONPATH=other/checkout``.  Nothing here is
asserted.
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


def count_bytecodes(run: Callable[[], Any]) -> collections.Counter[str]:
    """Bytecodes run by ``run()``'s Python functions: ``"py"`` (all of them), and one entry per
    function (its own bytecodes, not its callees')."""
    counts: collections.Counter[str] = collections.Counter()
    names: dict[Any, str] = {}

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        code = frame.f_code
        name = names.get(code)
        if name is None:
            name = names[code] = f"{os.path.basename(code.co_filename)}:{code.co_name}"

        def opcode(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[name] += 1
            return opcode

        return opcode

    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
    counts["py"] = sum(counts.values())
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,llama,resnet,vit")
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--bytecodes", action="store_true",
                        help="count the bytecodes Python functions run instead of calls")
    ns = parser.parse_args(argv)
    unknown = [name for name in ns.models.split(",") if name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    import torch

    import recheck

    torch.set_num_threads(1)
    print(f"recheck from {os.path.dirname(recheck.__file__)}")
    counted = count_bytecodes if ns.bytecodes else count
    what = "bytecodes" if ns.bytecodes else "calls"
    print(f"{'model':<8} {'plain ' + what:>16} {'added':>8} {'python':>8} {'C':>8} {'invocations':>12} {'per inv.':>9}")
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
            plain, inside = counted(step), counted(watched)
        invocations = blocks[-1].report.stats.get("invocations", 0) or 1
        added = {kind: inside[kind] - plain[kind] for kind in ("py", "c")}
        total = added["py"] + added["c"]
        c_added = "-" if ns.bytecodes else f"{added['c']:+,}"  # C functions run no bytecode
        print(f"{name:<8} {plain['py'] + plain['c']:>16,} {total:>+8,} {added['py']:>+8,} {c_added:>8} "
              f"{invocations:>12} {total / invocations:>9,.0f}")
        ours = collections.Counter({k: v - plain.get(k, 0) for k, v in inside.items()
                                    if ":" in k and v > plain.get(k, 0)})
        print("         most added per invocation: "
              + ", ".join(f"{k} {v / invocations:,.0f}" for k, v in ours.most_common(ns.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
