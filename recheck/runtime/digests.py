"""What a forward keeps of a tensor: an exact digest (default) or a full copy.

A :class:`TensorPrint` is compared with the recomputed tensor's print.  Digests are exact
and position dependent: CPU tensors hash their dtype, shape and bytes with SHA-256
truncated to 128 bits (``hashlib``, read in place without a copy; SHA-256 runs on the
CPU's SHA extensions where present, measured 2.2x faster than BLAKE2b here), tensors on
other devices use ``recheck.runtime.bits.digest`` (128-bit, computed on the device; only
two integers reach the host).  A print is taken for every saved tensor of every
forward and recompute, so :func:`print_tensor` avoids per-call work that only a
mismatch report needs (the description is built when asked for).  Copies
(``store="copy"``) are detached clones on the same device, which let a mismatch report
its first differing element with both bit patterns.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass
from typing import Literal

import torch

from recheck.runtime.bits import Tolerance, bit_view, compare_tensors, digest

__all__ = ["STORES", "Store", "TensorPrint", "print_tensor"]

Store = Literal["digest", "copy"]
STORES: tuple[str, ...] = ("digest", "copy")


@dataclass(frozen=True)
class TensorPrint:
    """Metadata plus digest of a tensor, and its copy when the store keeps copies."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    digest: int
    copy: torch.Tensor | None = None
    requires_grad: bool = False
    #: why the values were not digested (metadata only), or None
    unreadable: str | None = None

    @property
    def description(self) -> str:
        """``float32[4, 8] on cpu`` (as ``describe_tensor`` writes it)."""
        text = f"{str(self.dtype).replace('torch.', '')}[{', '.join(map(str, self.shape))}] on {self.device}"
        text += ", requires_grad" if self.requires_grad else ""
        return text + (f" (values not compared: {self.unreadable})" if self.unreadable else "")

    def same(self, other: TensorPrint) -> bool:
        """True when metadata and every byte agree."""
        return (self.shape, self.dtype, self.device, self.digest) == (
            other.shape,
            other.dtype,
            other.device,
            other.digest,
        )

    def matches(self, other: TensorPrint, tolerance: Tolerance | None = None) -> bool:
        """:meth:`same`, or within ``tolerance`` when both prints hold copies."""
        if tolerance is None or self.copy is None or other.copy is None:
            return self.same(other)
        return compare_tensors(self.copy, other.copy, tolerance=tolerance, check_requires_grad=False) is None

    def difference(self, other: TensorPrint, tolerance: Tolerance | None = None) -> str:
        """Text describing how ``other`` (recomputed) differs from this (original)."""
        if self.copy is not None and other.copy is not None:
            diff = compare_tensors(self.copy, other.copy, tolerance=tolerance, check_requires_grad=False)
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
    plain = tensor.detach()
    shape, dtype, device = tuple(plain.shape), plain.dtype, plain.device
    try:
        if plain.layout != torch.strided:
            plain = plain.to_dense()
        if device.type == "cpu":
            value = _cpu_digest(plain)
        else:
            with torch.no_grad():
                value = digest(plain)
    except (TypeError, RuntimeError, NotImplementedError) as exc:
        # a tensor without plain bytes (a subclass, an exotic layout or dtype): metadata only
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return TensorPrint(shape, dtype, str(device), 0, None, tensor.requires_grad, reason)
    copy = plain.clone() if store == "copy" else None
    return TensorPrint(shape, dtype, str(device), value, copy, tensor.requires_grad)


#: integer dtype of each element width, for the in-place byte view of plain CPU tensors
_SAME_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: per dtype: (its name for the hash's header, the integer dtype it is viewed as, or None
#: where ``bit_view`` must convert: complex, or widths without an integer dtype)
_DTYPE_PLAN: dict[torch.dtype, tuple[str, torch.dtype | None]] = {}


def _plan(dtype: torch.dtype) -> tuple[str, torch.dtype | None]:
    plan = _DTYPE_PLAN.get(dtype)
    if plan is None:
        same_width = None if dtype.is_complex else _SAME_WIDTH.get(torch.empty((), dtype=dtype).element_size())
        plan = _DTYPE_PLAN[dtype] = (str(dtype), same_width)
    return plan


def _cpu_digest(tensor: torch.Tensor) -> int:
    """SHA-256 (first 128 bits) of the tensor's dtype, shape and bytes in row-major order.

    A contiguous real tensor is hashed in place, its memory read through a ``ctypes`` array
    (not ``Tensor.numpy()``, which marks the storage as not resizable for good: Megatron's
    ``CheckpointWithoutOutput`` and FSDP free storages with ``resize_(0)``); anything else
    (non-contiguous, complex, negative views) goes through ``bit_view``, which makes the same
    row-major bytes in a new tensor.
    """
    name, same_width = _plan(tensor.dtype)
    hasher = hashlib.sha256(f"{name}{tuple(tensor.shape)}\0".encode())
    if tensor.numel():
        if same_width is not None and tensor.is_contiguous() and not tensor.is_neg():
            bits = tensor
        else:
            bits = bit_view(tensor)
        hasher.update((ctypes.c_char * (bits.numel() * bits.element_size())).from_address(bits.data_ptr()))
    return int.from_bytes(hasher.digest()[:16], "little")
