"""``recheck.measure`` and ``recheck cost``: what checkpointing saves and what it costs, measured.

Modules, bottom to top: ``units`` (byte sizes; no torch), ``work`` (FLOPs and bytes of one
operator), ``ledger`` (live storages by category), ``router`` (runs each checkpoint as written or bypassed, through
``recheck.intercept.patches``), ``trace`` (one traced run), ``peak`` (CUDA allocator peaks),
``results``/``budget`` (figures), ``compare`` (:func:`measure`), ``table``/``plot``
(rendering).  The step's state is found and restored by :mod:`recheck.runtime.steps`.  Pipelines (``torch.distributed.pipelining``) are the subpackage ``pipeline``:
the schedule model, per-stage bundles, ``recheck cost --ranks`` and ``--plan``.  Importing this package does not import torch; ``measure`` loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Comparison", "measure"]

if TYPE_CHECKING:  # pragma: no cover
    from recheck.cost.compare import Comparison, measure


def __getattr__(name: str) -> Any:
    if name in __all__:
        from recheck.cost import compare

        return getattr(compare, name)
    raise AttributeError(f"module 'recheck.cost' has no attribute {name!r}")
