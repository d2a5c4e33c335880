"""What ``check()`` and ``check_step()`` add, in figures that do not move between runs.

On a shared machine ``check_cost.py`` and ``check_step_cost.py`` swing by more than the changes
they are meant to show.  This prints, for ``check()`` on the small stack of ``check_cost.py``
(against its floor: a plain step plus a checkpointed step) and for ``check_step()`` on each model
of ``watch_overhead.py`` (against one plain step), after a warm-up of each:

* the Python and C calls added (``sys.setprofile``; the same every run), with the Python
  functions that add the most; for ``check()`` also against the watched floor (its checkpointed
  step inside ``watch()``): what the check adds beyond what ``watch()`` adds;
* the minor page faults of one call (fresh memory the kernel had to map: memory kept alive
  longer than the step keeps it shows here) and the growth of the resident set over
  ``--repeats`` calls with the garbage collector left as the program has it.

Each row runs in a fresh process: what one row leaves in the allocator changes the next one's
faults.

    python benchmarks/check_calls.py [--models mlp,llama,resnet,vit] [--top 6] [--repeats 5]

It is a proxy, not a time: to compare two versions of recheck, run each checkout's own copy of
this script (it imports ``check_cost.py``, which puts its checkout first on ``sys.path``, so
``PYTHONPATH`` does not choose the version).  Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import warnings
from typing import Any, Callable

from check_cost import SIZES, build as build_stack, floor_step  # this folder's, as timing.py is
from timing import minor_faults
from watch_calls import count
from watch_overhead import MODELS, build


def _resident() -> int:
    """This process's resident set in bytes (Linux), or 0 where ``/proc`` does not tell."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _row(name: str, base: Callable[[], Any], checked: Callable[[], Any], repeats: int, top: int) -> None:
    base(), checked()  # warm-up: lazy imports, caches
    plain, inside = count(base), count(checked)
    added = {kind: inside[kind] - plain[kind] for kind in ("py", "c")}
    before = minor_faults()
    checked()
    faults = minor_faults() - before
    resident = _resident()
    for _ in range(repeats):
        checked()
    grown = (_resident() - resident) / 2**20
    print(f"{name:<14} {plain['py'] + plain['c']:>12,} {added['py'] + added['c']:>+9,} {added['py']:>+8,} "
          f"{added['c']:>+8,} {faults:>9,} {grown:>+10.1f}")
    ours = collections.Counter({k: v - plain.get(k, 0) for k, v in inside.items()
                                if ":" in k and v > plain.get(k, 0)})
    print("               most added: " + ", ".join(f"{k} {v}" for k, v in ours.most_common(top)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,llama,resnet,vit")
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5, help="calls over which the resident set is followed")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # one row, in this process
    ns = parser.parse_args(argv)
    unknown = [name for name in ns.models.split(",") if name and name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if ns.row is None:
        import recheck

        print(f"recheck from {os.path.dirname(recheck.__file__)}")
        print(f"{'check':<14} {'base calls':>12} {'added':>9} {'python':>8} {'C':>8} {'faults':>9} {'RSS MiB':>10}",
              flush=True)
        for row in ["stack", *filter(None, ns.models.split(","))]:
            subprocess.run([sys.executable, __file__, "--row", row, "--top", str(ns.top),
                            "--repeats", str(ns.repeats)], check=False)
        return 0
    import torch

    import recheck

    torch.set_num_threads(1)
    if ns.row == "stack":
        blocks, x = build_stack(**SIZES["small"])
        _row("check() small", lambda: floor_step(blocks, x), lambda: recheck.check(blocks, x), ns.repeats, ns.top)
        _row("  over watch()", lambda: floor_step(blocks, x, watched=True), lambda: recheck.check(blocks, x),
             ns.repeats, ns.top)
        return 0
    try:
        _, step = build(ns.row, "cpu")
    except ImportError as exc:
        print(f"{ns.row:<14} skipped: {exc}")
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _row(f"check_step {ns.row}", step, lambda: recheck.check_step(step), ns.repeats, ns.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
