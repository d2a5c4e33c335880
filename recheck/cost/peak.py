"""Allocator peaks on CUDA: ``max_memory_allocated`` and ``max_memory_reserved``.

On CPU there is no caching allocator to ask; the observed peak comes from the storage
ledger of the traced run (:mod:`recheck.cost.trace`), which sees every storage an
operator creates.  On CUDA the allocator's own counters are read around an untraced
run: *allocated* is what tensors occupy (block-rounded), *reserved* adds the blocks the
caching allocator keeps (fragmentation and cache), which is what ``out of memory`` is
judged against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from recheck.runtime.steps import StepState

__all__ = ["CudaPeak", "cuda_in_use", "cuda_peak"]


@dataclass(frozen=True)
class CudaPeak:
    """Peaks of one run, in bytes, relative to nothing (absolute allocator counters)."""

    device: str
    allocated: int
    reserved: int
    allocated_before: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "device": self.device,
            "max_memory_allocated": self.allocated,
            "max_memory_reserved": self.reserved,
            "allocated_before_step": self.allocated_before,
        }


def cuda_in_use(state: StepState) -> bool:
    """Whether the step's model lives on a CUDA device (or CUDA is already initialised)."""
    if not torch.cuda.is_available():
        return False
    if any(p.is_cuda for p in state.parameters()):
        return True
    return bool(torch.cuda.is_initialized())


def _device(state: StepState) -> torch.device:
    for p in state.parameters():
        if p.is_cuda:
            return p.device
    return torch.device("cuda", torch.cuda.current_device())


class cuda_peak:
    """``with cuda_peak(state) as peak: step()``; then ``peak.result`` (None off CUDA)."""

    def __init__(self, state: StepState) -> None:
        self.state = state
        self.active = cuda_in_use(state)
        self.result: CudaPeak | None = None

    def __enter__(self) -> cuda_peak:
        if self.active:
            self.device = _device(self.state)
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.before = torch.cuda.memory_allocated(self.device)
        return self

    def synchronize(self) -> None:
        """Wait for queued device work (so a wall-clock time covers it); no-op off CUDA."""
        if self.active:
            torch.cuda.synchronize(self.device)

    def __exit__(self, *exc: object) -> None:
        if self.active:
            torch.cuda.synchronize(self.device)
            self.result = CudaPeak(
                device=str(self.device),
                allocated=torch.cuda.max_memory_allocated(self.device),
                reserved=torch.cuda.max_memory_reserved(self.device),
                allocated_before=self.before,
            )
