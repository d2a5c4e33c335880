"""Functions run on spawned ranks by test_launch.py (the children import them from here)."""

from __future__ import annotations

import os
import time
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn


def sum_of_ranks(rank: int, world_size: int, offset: int) -> dict:
    total = torch.tensor([rank + offset])
    dist.all_reduce(total)
    return {"rank": rank, "world_size": world_size, "total": int(total), "env_rank": os.environ["RANK"]}


def rendezvous_seen(rank: int, world_size: int) -> dict:
    total = torch.tensor([rank])
    dist.all_reduce(total)
    return {"rank": rank, "master_port": os.environ.get("MASTER_PORT"), "total": int(total)}


def rank_one_raises(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("planted failure on rank 1")
    dist.barrier()
    return rank


def sleeps(rank: int, world_size: int) -> None:
    time.sleep(600)


def place_seen(rank: int, world_size: int) -> tuple:
    from recheck.distributed.world import current_place

    place = current_place()
    return (place.rank, place.world_size, place.backend)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        from recheck.runtime.tags import current_tags

        _Block.tags_seen.append(dict(current_tags()))
        return checkpoint(torch.tanh, self.linear(x), use_reentrant=False)

    tags_seen: ClassVar[list[dict]] = []


class _Recorder:
    def __init__(self) -> None:
        self.actions: list[tuple[str, str, int, int]] = []

    def chunk_begins(self, action) -> None:
        self.actions.append(("begin", action.phase, action.stage, action.microbatch))

    def chunk_ends(self, action) -> None:
        self.actions.append(("end", action.phase, action.stage, action.microbatch))


def labelled_pipeline(rank: int, world_size: int) -> dict:
    """A 1F1B step over 2 microbatches with the labels acquired; what the stage saw."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from recheck.intercept import pipelining
    torch.manual_seed(0)
    stage = PipelineStage(_Block(), rank, world_size, torch.device("cpu"), input_args=(torch.zeros(2, 8),))
    schedule = Schedule1F1B(stage, n_microbatches=2, loss_fn=lambda out, target: out.pow(2).mean())
    recorder = _Recorder()
    patched = pipelining.acquire(recorder)
    try:
        if rank == 0:
            schedule.step(torch.randn(4, 8))
        else:
            schedule.step(target=torch.zeros(4, 8))
    finally:
        pipelining.release(recorder)
    from torch.distributed.pipelining.stage import _PipelineStageBase

    restored = not hasattr(_PipelineStageBase.forward_one_chunk, "__recheck_original__")
    return {"patched": patched, "restored": restored, "tags": _Block.tags_seen, "actions": recorder.actions}
