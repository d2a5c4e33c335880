"""What each of ``watch()``'s module-level caches is worth, in instructions of a watched step.

A cache stays only where it is worth at least 10% of a user-visible figure (issue 41).  This
counts, with valgrind's callgrind, the instructions of the measured steps alone: a small C
helper (compiled here with ``cc`` against ``valgrind/callgrind.h``) switches callgrind's
instrumentation on just before them and off after, so torch's import and the warm-up cost
nothing and one run gives one figure (``watch_instructions.py`` needs two runs a figure, each
under callgrind from the start).  A cache is switched off by replacing its dict with one that
never stores: every lookup misses and computes afresh, which is what the code would do
without it.

Models: ``block`` (``watch_instructions.py``'s four checkpointed transformer blocks, two steps
in one ``watch()`` block), ``block-each`` (a block per step), ``mlp`` and ``llama``
(``watch_overhead.py``'s; ``llama`` needs transformers), and ``llama-check`` (a
``check_step`` of it, in place of the watched step).  Each row is a model, what was switched
off (``-`` for nothing) and its instructions a step; ``plain`` is the step unwatched.

``--reaches`` asks what keeping each region's reach across blocks would be worth (the reaches
live as long as their block): ``strong`` keeps them whole (the upper bound, which keeps the model
alive), ``copy`` gives each block a copy (what reviving a reach held weakly would give, before
the cost of reviving), ``layouts`` a copy that carries the layouts of ``recheck.watcher.capture``.

A ``functools.lru_cache`` function is switched off by its ``__wrapped__`` function, put in
place of it in every ``recheck`` module that holds it (``from x import f`` copies too).

    python benchmarks/watch_caches.py [--models block,block-each] [--off digests,globals] [--jobs 2]
                                      [--reaches block|strong|copy|layouts]

Needs ``valgrind`` and ``cc`` on ``PATH``.  Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
#: what can be switched off: (module, module-level dict or ``functools.lru_cache`` function) pairs
CACHES = {
    "digests": [("recheck.runtime.digests", name) for name in ("_PLANS", "_LIES_IN", "_HEADERS")],
    "shown": [("recheck.runtime.fingerprints", "_SHOWN")],
    "roots": [("recheck.runtime.naming", "_library_roots")],
    "globals": [("recheck.runtime.reach", "code_globals")],
    "attributes": [("recheck.runtime.reach", "code_module_attributes")],
}
_HELPER = """#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; CALLGRIND_TOGGLE_COLLECT; }
void stop(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS_AT("measured"); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def _child(model: str, mode: str, off: str, helper: str, reaches: str = "block") -> None:
    import collections
    import ctypes
    import gc
    import importlib

    import torch

    import recheck
    import recheck.watcher.session  # noqa: F401 - what watch() imports, before its dicts are replaced

    class NoStore(collections.OrderedDict):
        def __setitem__(self, key, value, *rest):  # noqa: ANN001, ANN002, ANN204
            pass

    for part in filter(None, off.split(",")):
        for module, name in CACHES[part]:
            cached = getattr(importlib.import_module(module), name)
            if not hasattr(cached, "cache_info"):
                setattr(importlib.import_module(module), name, NoStore())
                continue
            for held in [m for key, m in sys.modules.items() if key.startswith("recheck")]:
                for attr, value in list(vars(held).items()):  # and its ``from x import f`` copies
                    if value is cached:
                        setattr(held, attr, cached.__wrapped__)
    if reaches != "block":
        _keep_reaches(reaches)
    sys.path.insert(0, str(CHECKOUT / "benchmarks"))
    if model.startswith("block"):
        from torch.utils.checkpoint import checkpoint
        from watch_instructions import _make_block

        torch.manual_seed(0)
        blocks = torch.nn.ModuleList(_make_block()(32) for _ in range(4))
        optimizer, data = torch.optim.SGD(blocks.parameters(), lr=1e-3), torch.randn(2, 8, 32)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            x = data
            for block in blocks:
                x = checkpoint(block, x, use_reentrant=False)
            x.square().mean().backward()
            optimizer.step()
    else:
        from watch_overhead import build

        _, step = build(model.removesuffix("-check"), "cpu")
    torch.set_num_threads(1)
    each, check = model.endswith("-each"), model.endswith("-check")

    def steps(count: int) -> None:
        for _ in range(count):
            if mode == "watch" and check:
                recheck.check_step(step)
            elif mode == "watch" and each:
                with recheck.watch(raise_on_finding=False):
                    step()
            else:
                step()

    marks = ctypes.CDLL(helper)
    with recheck.watch(raise_on_finding=False) if mode == "watch" and not (each or check) else _nothing():
        steps(4)
        gc.collect()
        gc.disable()
        marks.start()
        steps(2)
        marks.stop()


def _keep_reaches(how: str) -> None:
    """Keep every region's reach across blocks (see ``--reaches``), in one process-wide dict."""
    from recheck.runtime import reach as reach_module
    from recheck.watcher import capture, dispatch

    lasting: dict = {}

    def reach_of(function, cache):  # noqa: ANN001, ANN202
        reach = reach_module.reach_of(function, lasting)
        if how == "strong":
            return reach
        key = reach_module._cache_key(function)[0]
        if key not in cache:  # the block's first call of the region
            cache[key] = (reach.copy(), ())
            if how == "layouts":
                cache[key][0].kept["layouts"] = reach.kept.setdefault("layouts", capture._ReachLayouts())
        return cache[key][0]

    dispatch.reach_of = reach_of


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _count(model: str, mode: str, off: str, helper: str, folder: str, reaches: str = "block") -> float:
    out = os.path.join(folder, f"{model}-{mode}-{off or 'none'}.out")
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(["setarch", platform.machine(), "-R", "valgrind", "--tool=callgrind",
                           "--instr-atstart=no", "--collect-atstart=no", f"--callgrind-out-file={out}",
                           sys.executable, __file__, "--child", model, mode, off, helper, reaches],
                          env=env, capture_output=True, text=True, check=False)
    for dump in glob.glob(out + "*"):
        text = Path(dump).read_text()
        found = re.search(r"^totals:\s*(\d+)", text, re.M)
        if "measured" in text and found:
            return int(found.group(1)) / 2
    raise RuntimeError(f"{model} {mode} {off}: callgrind run failed: {done.stderr.strip()[-300:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="block,block-each", help="of block, block-each, mlp, llama, llama-check")
    parser.add_argument("--off", default=",".join(CACHES), help=f"caches to switch off, one run each: {', '.join(CACHES)}")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--reaches", default="block", choices=["block", "strong", "copy", "layouts"],
                        help="how long each region's reach is kept (see the docstring)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        _child(*ns.child)
        return 0
    unknown = [part for part in ns.off.split(",") if part and part not in CACHES]
    if unknown:
        parser.error(f"unknown cache(s) {', '.join(unknown)}; choose from {', '.join(CACHES)}")
    with tempfile.TemporaryDirectory() as folder:
        helper = os.path.join(folder, "marks.so")
        source = os.path.join(folder, "marks.c")
        Path(source).write_text(_HELPER)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", helper, source], check=True)
        runs = [(model, mode, off) for model in ns.models.split(",")
                for mode, off in [("plain", ""), ("watch", ""), *[("watch", part) for part in ns.off.split(",") if part]]]
        with concurrent.futures.ThreadPoolExecutor(ns.jobs) as pool:
            counts = list(pool.map(lambda run: _count(*run, helper, folder, ns.reaches), runs))
    for (model, mode, off), count in zip(runs, counts):
        print(f"{model:<11} {mode:<6} {off or '-':<8} {count:>14,.0f} instructions a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
