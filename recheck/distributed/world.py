"""This process's place in a torch.distributed world, read without initialising anything."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Place", "any_rank", "collectives_made", "current_place", "launched_place"]


@dataclass(frozen=True)
class Place:
    """``rank`` of ``world_size``; ``backend`` is None when only the launcher's variables say so."""

    rank: int
    world_size: int
    backend: str | None = None

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world_size}"


def current_place(launched: Any = None) -> Place | None:
    """The initialised default process group's rank, else ``RANK``/``WORLD_SIZE`` set by
    torchrun or another launcher; None for a single process (world size 1 or unknown).

    torch.distributed is consulted only if it is already imported.  ``launched`` is what
    :func:`launched_place` gave earlier, to use instead of reading the environment again (a
    ``watch()`` block reads it once: the launcher sets it before the process starts, and each
    invocation's record asks for the place).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
        if world_size > 1:
            return Place(dist.get_rank(), world_size, str(dist.get_backend()))
        return None
    place = launched_place() if launched is None else launched
    return place or None


def launched_place() -> Place | Literal[False]:
    """The place ``RANK``/``WORLD_SIZE`` give (False: they give none)."""
    environ = os.environ
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return False
    try:
        rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return False
    return Place(rank, world_size) if world_size > 1 and 0 <= rank < world_size else False


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank of the default process group: one ``all_reduce`` that
    every rank must call, so that a decision that changes what the ranks do next (run a step
    again, and with it the step's own collectives) is taken by all of them together.  ``flag``
    itself outside an initialised world of more than one rank."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return flag
    import torch

    backend = str(dist.get_backend())
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    vote = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(vote, op=dist.ReduceOp.MAX)
    return bool(vote.item())


def collectives_made() -> int:
    """How many collectives this process has made in the process groups it belongs to (their
    sequence numbers summed; 0 outside an initialised world of more than one rank).  A step that
    made one ran together with the other ranks (DeepSpeed's engine, a user's own ``all_reduce``),
    whatever objects it reaches, so every further run of it must be agreed by all of them."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return 0
    made = 0
    for group in list(dist.distributed_c10d._world.pg_map):
        try:
            made += group._get_sequence_number_for_group()
        except Exception:  # noqa: BLE001 - a backend that counts none (counted by the others)
            continue
    return made
