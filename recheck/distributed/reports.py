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

:func:`merge_through_launcher` merges without a collective, for ``recheck run`` under
``torchrun``: each rank puts its report in the launcher's own store (torchrun's agent serves it
at ``MASTER_ADDR:MASTER_PORT`` while the ranks run, ``TORCHELASTIC_USE_AGENT_STORE=True``) and
rank 0 reads them, waiting a bounded time.  No process group is needed (the program may
have destroyed its own), no rank waits for another's collective, and a rank that never
reports is named in the merged report's notes instead of hanging rank 0.

torch is imported only when :func:`gather_report` runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from recheck.findings import Report

__all__ = ["DistributedReportError", "gather_report", "merge_through_launcher", "rank_report_path"]


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


def merge_through_launcher(report: Report, rank: int, world_size: int, stage: str, wait: float) -> Report | None:
    """Rank 0: every rank's ``report`` of ``stage`` merged, waiting at most ``wait`` seconds for
    the others (a rank whose report did not come is named in a note); other ranks: theirs sent, None.

    ``DistributedReportError`` when there is no launcher store to meet in (not under torchrun's
    agent) or it cannot be reached.
    """
    from datetime import timedelta

    from torch.distributed import TCPStore

    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not env.get("MASTER_PORT", "").isdigit():
        raise DistributedReportError("no launcher store to merge the ranks' reports in (not run by torchrun)")
    prefix = f"recheck-run/{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{stage}/"
    try:
        store = TCPStore(env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=max(wait, 1.0)))
        if rank != 0:
            store.set(f"{prefix}{rank}", report.to_json(indent=None))
            return None
        reports, missing = [report], list(range(1, world_size))
        deadline = time.monotonic() + wait
        while missing:
            for other in [r for r in missing if store.check([f"{prefix}{r}"])]:
                reports.append(Report.from_json(store.get(f"{prefix}{other}").decode()))
                missing.remove(other)
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    except (RuntimeError, ValueError) as exc:  # torch's DistStoreError is a RuntimeError
        raise DistributedReportError(f"the launcher store at {env.get('MASTER_ADDR')}:{env['MASTER_PORT']} "
                                     f"could not be used ({exc})") from exc
    merged = Report.merge(reports)
    if missing:
        merged.notes.append(f"rank(s) {', '.join(map(str, missing))} sent no report within {wait:g} s: "
                            "their own output has it")
    return merged
