"""The measures the benchmarks share: the best of several runs of a callable, minor page faults."""

from __future__ import annotations

import resource
import time
from typing import Any, Callable


def best(run: Callable[[], Any], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """The least time ``run()`` took over ``repeats`` runs, by ``clock`` (wall time by default;
    ``time.process_time`` for this process's CPU time, steadier on a loaded machine)."""
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        times.append(clock() - start)
    return min(times)


def interleaved(run: Callable[[str], float], modes: list[str], rounds: int) -> dict[str, float]:
    """Each mode's least time over ``rounds`` rounds that run every mode in turn, after a
    warm-up run of each (lazy imports, caches, the allocator); ``run(mode)`` times one run."""
    for mode in modes:
        run(mode)
    least = dict.fromkeys(modes, float("inf"))
    for _ in range(rounds):
        for mode in modes:
            least[mode] = min(least[mode], run(mode))
    return least


def minor_faults() -> int:
    """This process's minor page faults so far: fresh memory the kernel had to map."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
