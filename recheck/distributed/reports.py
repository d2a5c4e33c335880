"""Reports of several ranks: merged on one rank, or written one file per rank.

``watch()`` in a torch.distributed process verifies that process's own invocations; its
report carries ``rank`` and ``world_size`` in its statistics and every finding carries a
``rank`` tag.  To read one report for the whole world::

    w = recheck.watch()
    try:
        with w:
            train_step()
    finally:
        merged = w.gather(dst=0)        # a collective: every rank calls it
    if merged is not None:              # rank 0 only
        print(merged)

(with ``raise_on_finding=True`` a rank with findings raises at the end of its block; the
``finally:`` lets it take part in the gather first, so no rank waits forever.)
:func:`gather_report` is the same for any :class:`~recheck.findings.Report`.

Backends: reports travel as JSON text through ``torch.distributed.gather_object``.  With
gloo that is plain CPU tensors.  With NCCL, ``gather_object`` moves the pickled objects to
``torch.cuda.current_device()``: each rank must have called ``torch.cuda.set_device`` with
its own GPU before gathering, and :func:`gather_report` refuses an NCCL group when CUDA
is not available.  :func:`rank_report_path` names per-rank report files
(``report.json`` -> ``report.rank1.json``); ``pytest --recheck-report`` uses it.

torch is imported only when :func:`gather_report` runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recheck.findings import Report

__all__ = ["DistributedReportError", "gather_report", "rank_report_path"]


class DistributedReportError(RuntimeError):
    """The reports cannot be gathered: no process group, a bad ``dst``, or NCCL without CUDA."""


def rank_report_path(path: str | Path, rank: int) -> Path:
    """``path`` with ``.rank<N>`` before its last suffix: ``out/report.json`` -> ``out/report.rank1.json``.

    A path without a suffix gets ``.rank<N>`` appended.
    """
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError(f"rank must be a whole number >= 0, got {rank!r}")
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}" if path.suffix else f"{path.name}.rank{rank}")


def gather_report(report: Report, dst: int = 0, group: Any = None) -> Report | None:
    """Every rank's ``report`` merged (:meth:`Report.merge`) on global rank ``dst``; None elsewhere.

    A collective over ``group`` (default: the default process group): every rank of it
    must call this.  Outside an initialised process group the report is returned merged
    with itself alone (so single-process code needs no special case).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return Report.merge([report])
    world_size = dist.get_world_size(group)
    if not isinstance(dst, int) or isinstance(dst, bool) or not 0 <= dst < dist.get_world_size():
        raise DistributedReportError(f"dst must be a rank of the world (0 to {dist.get_world_size() - 1}), got {dst!r}")
    backend = str(dist.get_backend(group))
    if backend == "nccl":
        _check_cuda_for_nccl()
    text = report.to_json(indent=None)
    received: list[Any] | None = [None] * world_size if dist.get_rank() == dst else None
    dist.gather_object(text, received, dst=dst, group=group)
    if received is None:
        return None
    return Report.merge(Report.from_json(item) for item in received)


def _check_cuda_for_nccl() -> None:
    import torch

    if not torch.cuda.is_available():
        raise DistributedReportError(
            "gather_report: the process group uses NCCL but CUDA is not available; "
            "gather_object needs each rank's GPU (torch.cuda.set_device(local_rank))")
