"""What one aten operator costs: floating-point operations and bytes moved.

FLOPs come from torch's own formulas (``torch.utils.flop_counter.flop_registry``), which
cover matmul-like operators only (mm, addmm, bmm, baddbmm, convolution, attention).
Everything else (pointwise, softmax, normalisation, copies) counts zero FLOPs there, so a
replay of pointwise code would look free; this module therefore also counts the bytes
each non-matmul operator reads and writes.  View operators move nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

__all__ = ["Work", "op_work"]

# Operators that neither compute nor move data (metadata queries, aliasing).
_FREE = {
    torch.ops.aten.detach.default,
    torch.ops.aten.alias.default,
    torch.ops.aten.lift_fresh.default,
}


@dataclass
class Work:
    """FLOPs of matmul-like operators and bytes read+written by all other operators."""

    flops: int = 0
    bytes_moved: int = 0

    def add(self, other: Work) -> None:
        """Accumulate ``other`` into this total."""
        self.flops += other.flops
        self.bytes_moved += other.bytes_moved

    def minus(self, other: Work) -> Work:
        """The difference ``self - other`` (may be negative when measured, not modelled)."""
        return Work(self.flops - other.flops, self.bytes_moved - other.bytes_moved)

    def to_dict(self) -> dict[str, int]:
        """``{"flops": ..., "bytes_moved": ...}``."""
        return {"flops": self.flops, "bytes_moved": self.bytes_moved}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def op_work(func: Any, args: tuple, kwargs: dict, out: Any) -> Work:
    """FLOPs (matmul-like operators) or bytes moved (all others) by one operator call."""
    packet = getattr(func, "_overloadpacket", None)
    if packet in flop_registry:
        return Work(flops=int(flop_registry[packet](*args, **kwargs, out_val=out)))
    if func in _FREE or getattr(func, "is_view", False):
        return Work()
    read: dict[int, int] = {}
    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            read.setdefault(id(leaf), _nbytes(leaf))
    written = sum(_nbytes(leaf) for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor))
    return Work(bytes_moved=sum(read.values()) + written)
