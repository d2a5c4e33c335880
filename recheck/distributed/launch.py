"""Run a function on N local ranks joined in one process group, with a timeout and cleanup.

::

    results = run_world(train_one_step, 2, args=(config,), timeout=60)

Each rank is a fresh process (``spawn``) that joins a process group through a ``FileStore``
in the world's own temporary folder (no rendezvous port is chosen ahead and bound later, so
no other process can take it in between; the backend's own connections bind port 0),
calls ``function(rank, world_size, *args)``, and hands its return value back through a file
(so it must be picklable).  ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` are set as a
launcher sets them; ``MASTER_ADDR``/``MASTER_PORT`` are not, as there is no TCP master.  The group is destroyed however the function
ends.  If any rank raises, :class:`WorldFailed` carries that rank's traceback; if the
world has not finished after ``timeout`` seconds, every rank still alive is killed and
:class:`WorldTimeout` is raised.  No process outlives the call.

``function`` must be importable by the children (defined at module level in a module they
can import: the parent's ``sys.path`` is passed on by ``spawn``), and a script that calls
:func:`run_world` needs the usual ``if __name__ == "__main__":`` guard.

``backend="nccl"`` gives each rank its own GPU (``torch.cuda.set_device(rank)``) before the
group is made, and is refused up front when there are fewer CUDA devices than ranks.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["WorldFailed", "WorldTimeout", "run_world"]


class WorldFailed(RuntimeError):
    """A rank raised; ``rank`` and ``remote_traceback`` say which and where."""

    def __init__(self, rank: int, remote_traceback: str) -> None:
        last = remote_traceback.strip().splitlines()[-1] if remote_traceback.strip() else "(no traceback)"
        super().__init__(f"rank {rank} failed: {last}\n{remote_traceback}")
        self.rank, self.remote_traceback = rank, remote_traceback


class WorldTimeout(RuntimeError):
    """The world did not finish in time; its processes were killed."""


def _rank_main(
    rank: int,
    world_size: int,
    backend: str,
    timeout: float,
    results: str,
    function: Callable[..., Any],
    args: Sequence[Any],
) -> None:
    import torch.distributed as dist

    out = Path(results) / f"rank{rank}.pickle"
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        if backend == "nccl":
            import torch

            torch.cuda.set_device(rank)
        store = dist.FileStore(str(Path(results) / "rendezvous"), world_size)
        store.set_timeout(timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
    except BaseException:  # noqa: BLE001 - whatever ends the rank goes back to the parent
        payload = ("error", traceback.format_exc(), time.time())
    else:
        try:
            payload = ("ok", function(rank, world_size, *args), time.time())
        except BaseException:  # noqa: BLE001 - the parent re-raises it with this rank's traceback and time
            payload = ("error", traceback.format_exc(), time.time())
        finally:
            dist.destroy_process_group()
    with open(out, "wb") as handle:
        pickle.dump(payload, handle)
    if payload[0] == "error":
        raise SystemExit(1)


def run_world(
    function: Callable[..., Any],
    world_size: int,
    *,
    args: Sequence[Any] = (),
    timeout: float = 120.0,
    backend: str = "gloo",
) -> list[Any]:
    """``[function(rank, world_size, *args) for each rank]``, computed by ``world_size`` processes."""
    import torch.multiprocessing as mp

    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive whole number, got {world_size!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    if backend == "nccl":
        _check_gpus(world_size)
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="recheck-world-") as results:
        context = mp.start_processes(
            _rank_main,
            args=(world_size, backend, timeout, results, function, tuple(args)),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WorldTimeout(f"{world_size} rank(s) did not finish within {timeout:g} s; killed")
                try:
                    if context.join(timeout=min(remaining, 1.0)):
                        break
                except mp.ProcessExitedException:
                    break  # a rank failed: its result file has the traceback
                except mp.ProcessRaisedException:
                    break
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            for process in context.processes:
                process.join(timeout=10)
        return _collect(Path(results), world_size)


def _check_gpus(world_size: int) -> None:
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available < world_size:
        raise ValueError(f"backend 'nccl' needs one CUDA device per rank: {world_size} rank(s), "
                         f"{available} device(s); use backend='gloo' on CPU")


def _collect(results: Path, world_size: int) -> list[Any]:
    values: list[Any] = []
    failures: list[tuple[float, int, str]] = []
    for rank in range(world_size):
        path = results / f"rank{rank}.pickle"
        if not path.exists():
            failures.append((float("inf"), rank, "the process ended without a result (killed, or it crashed)"))
            continue
        with open(path, "rb") as handle:
            status, value, when = pickle.load(handle)
        if status == "error":
            failures.append((when, rank, value))
        values.append(value)
    if failures:
        # the rank that raised first is the cause; the others usually failed waiting for it
        _, rank, text = min(failures)
        raise WorldFailed(rank, text)
    return values
