"""The timing the benchmarks share: the best of several runs of a callable."""

from __future__ import annotations

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
