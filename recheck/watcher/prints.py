"""What a forward keeps of a tensor: an exact digest (default) or a full copy.

A :class:`TensorPrint` is compared with the recomputed tensor's print.  Digests are exact
and position dependent: CPU tensors hash their bytes with BLAKE2b-128 (``hashlib``, about
30x faster here than the elementwise digest), tensors on other devices use
``recheck.checker.bits.digest`` (128-bit, computed on the device; only two integers
reach the host).  Copies (``store="copy"``) are detached clones on the same device, which let a
mismatch report its first differing element with both bit patterns.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import torch

from recheck.checker.bits import bit_view, compare_tensors, describe_tensor, digest

__all__ = ["STORES", "Store", "TensorPrint", "print_tensor"]

Store = Literal["digest", "copy"]
STORES: tuple[str, ...] = ("digest", "copy")


@dataclass(frozen=True)
class TensorPrint:
    """Metadata plus digest of a tensor, and its copy when the store keeps copies."""

    description: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    digest: int
    copy: torch.Tensor | None = None

    def same(self, other: TensorPrint) -> bool:
        """True when metadata and every byte agree."""
        return (self.shape, self.dtype, self.device, self.digest) == (
            other.shape,
            other.dtype,
            other.device,
            other.digest,
        )

    def difference(self, other: TensorPrint) -> str:
        """Text describing how ``other`` (recomputed) differs from this (original)."""
        if self.copy is not None and other.copy is not None:
            diff = compare_tensors(self.copy, other.copy, check_requires_grad=False)
            if diff is not None:
                return "\n".join([self.description, *diff.lines()])
        if (self.shape, self.dtype, self.device) != (other.shape, other.dtype, other.device):
            return f"original {self.description}, recomputed {other.description}"
        return (
            f"{self.description}: bytes differ (digest {self.digest:032x} != {other.digest:032x}); "
            'use store="copy" to see the first differing element'
        )


def print_tensor(tensor: torch.Tensor, store: Store) -> TensorPrint:
    """The print of ``tensor`` under ``store`` ("digest" or "copy")."""
    with torch.no_grad():
        plain = tensor.detach()
        try:
            if plain.layout != torch.strided:
                plain = plain.to_dense()
            value = _cpu_digest(plain) if plain.device.type == "cpu" else digest(plain)
        except (TypeError, RuntimeError, NotImplementedError) as exc:
            # a tensor without plain bytes (a subclass, an exotic layout or dtype): metadata only
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return TensorPrint(f"{describe_tensor(plain)} (values not compared: {reason})",
                               tuple(plain.shape), plain.dtype, str(plain.device), 0)
        copy = plain.clone() if store == "copy" else None
    return TensorPrint(describe_tensor(plain), tuple(plain.shape), plain.dtype, str(plain.device), value, copy)


def _cpu_digest(tensor: torch.Tensor) -> int:
    """BLAKE2b-128 of the tensor's dtype, shape and bytes in row-major order."""
    head = f"{tensor.dtype}{tuple(tensor.shape)}".encode()
    data = bit_view(tensor).numpy().tobytes() if tensor.numel() else b""
    return int.from_bytes(hashlib.blake2b(head + b"\0" + data, digest_size=16).digest(), "little")
