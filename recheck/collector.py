"""Python's cyclic garbage collector paused around a block (torch-free: the linter uses it)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused(collect_first: bool = False) -> Iterator[None]:
    """No cyclic collection during the block; the collector is on again after it only if it
    was on before (a caller that turned it off keeps it off).

    ``collect_first`` collects once before the block, as ``timeit`` does before it times:
    garbage left by earlier work is not collected inside the block, nor counted in it.
    """
    if collect_first:
        gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
