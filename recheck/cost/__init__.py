"""``recheck.measure`` and ``recheck cost``: what checkpointing saves and what it costs, measured.

Modules, bottom to top: ``units`` (byte sizes; no torch), ``work`` (FLOPs and bytes of one
operator), ``ledger`` (live storages by category), ``state`` (finding and restoring the
step's state), ``router`` (runs each checkpoint as written or bypassed, through
``recheck.intercept.patches``), ``trace`` (one traced run), ``peak`` (CUDA allocator peaks),
``results``/``budget`` (figures), ``compare`` (:func:`measure`), ``table``/``plot``
(rendering).  Pipelines (``torch.distributed.pipelining``): ``schedules`` (orders of
forward/backward per stage, theoretical bundle counts, the retained-peak model; no torch),
``bundles`` (saved state attributed to a stage and microbatch), ``stages`` (a real
schedule step traced on each rank: ``recheck cost --ranks``), ``plan`` (one microbatch in
one process, laid out along a schedule: ``recheck cost --plan``), ``stage_table``
(rendering).  Importing this package does not import torch; ``measure`` loads it.
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
