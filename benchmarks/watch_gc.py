"""What ``watch()`` costs on average, the garbage collector's full collections included.

The other benchmarks take the best of a few runs: that leaves out the collector's full
collections, which walk every object the process holds (about 400,000 with transformers and
timm imported: 150 ms each) and which a user pays on average.  They run once enough objects
have outlived two younger collections since the last one, so what ``watch()`` keeps alive
across a step (its records, the prints of saved tensors, a block's revived reaches) decides
how often.  This runs ``--steps`` steps of each model plain and then each in its own
``watch()`` block (as ``pytest --recheck`` and ``watch_sweep.py`` watch), and prints the mean
step of each, their ratio, and the full collections and the time they took.

    python benchmarks/watch_gc.py [--models hf:Llama,timm:mobilenetv3_small_050] [--steps 150]

Needs the real-library environment (see ``watch_sweep.py``, whose tiny models it builds).
Process CPU time.  Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import warnings
from typing import Any, Callable

from watch_sweep import HF, hf_step, timm_step  # this folder's

CPU = time.process_time


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def checked(spec: str) -> str:
    """``spec`` itself where it names a model ``build`` can make, else ``SystemExit`` with the
    reason (every name is checked before any model runs)."""
    library, _, name = spec.partition(":")
    if library == "hf" and name not in dict(HF):
        raise SystemExit(f"unknown transformers architecture {name!r}; choose from {', '.join(dict(HF))}")
    if library not in ("hf", "timm") or not name:
        raise SystemExit(f"a model is hf:NAME or timm:NAME, got {spec!r}")
    return spec


def build(spec: str) -> Callable[[], Any]:
    """``hf:Llama`` (a transformers architecture of ``watch_sweep.HF``) or ``timm:NAME``."""
    library, _, name = checked(spec).partition(":")
    return hf_step(name, dict(HF)[name]) if library == "hf" else timm_step(name, {})


def measure(run: Callable[[], Any], steps: int) -> tuple[float, int, float]:
    """Mean CPU seconds of ``run()`` over ``steps`` runs, the full collections during them and
    the CPU seconds those took."""
    collections = [0, 0.0]
    started = [0.0]

    def seen(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = CPU()
        else:
            collections[0] += 1
            collections[1] += CPU() - started[0]

    gc.callbacks.append(seen)
    try:
        start = CPU()
        for _ in range(steps):
            run()
        total = CPU() - start
    finally:
        gc.callbacks.remove(seen)
    return total / steps, int(collections[0]), collections[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="hf:Llama,timm:mobilenetv3_small_050,timm:resnet18")
    parser.add_argument("--steps", type=_positive, default=150)
    ns = parser.parse_args(argv)
    specs = [checked(spec) for spec in ns.models.split(",")]
    import torch

    import recheck

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(f"{'model':<32} {'plain':>9} {'watch':>9} {'ratio':>6}  full collections (plain / watch, ms each)")
    for spec in specs:
        step = build(spec)

        def watched(step: Callable[[], Any] = step) -> None:
            with recheck.watch(raise_on_finding=False):
                step()

        for _ in range(3):  # warm-up: lazy imports, the allocator, the reaches kept between blocks
            step()
            watched()
        plain, plain_full, plain_gc = measure(step, ns.steps)
        timed, watch_full, watch_gc = measure(watched, ns.steps)
        each = [f"{seconds / count * 1e3:.0f}" if count else "-" for count, seconds in
                ((plain_full, plain_gc), (watch_full, watch_gc))]
        print(f"{spec:<32} {plain * 1e3:>7.2f}ms {timed * 1e3:>7.2f}ms {timed / plain:>5.2f}x  "
              f"{plain_full} / {watch_full} in {ns.steps} steps ({each[0]} / {each[1]} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
