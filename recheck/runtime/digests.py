"""What a forward keeps of a tensor: an exact digest (default) or a full copy.

A :class:`TensorPrint` is compared with the recomputed tensor's print.  Digests are exact
and position dependent: CPU tensors hash their dtype, shape and bytes, read in place without a
copy, with XXH3-128 (``xxhash``, installed with ``recheck[torch]``; measured 11 GB/s on one core
here, against 1.7 GB/s for SHA-256), or with SHA-256 truncated to 128 bits (``hashlib``) where
xxhash is not installed; tensors on other devices use ``recheck.runtime.bits.digest`` (128-bit,
computed on the device; only two integers reach the host).  Both are functions of every byte in
order: a one-bit flip anywhere, a NaN payload or ``-0.0`` changes the digest.  A print is taken for every saved tensor of every
forward and recompute, so :func:`print_tensor` avoids per-call work that only a
mismatch report needs (the description is built when asked for).  Copies
(``store="copy"``) are detached clones on the same device, which let a mismatch report
its first differing element with both bit patterns.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import torch

from recheck.runtime.bits import Tolerance, bit_view, compare_tensors, digest

__all__ = ["DIGEST_NAME", "STORES", "Store", "TensorPrint", "print_saved", "print_tensor"]

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
    #: for a parameter (or a view of one): its version counter, which identifies it instead of
    #: its bytes (see :func:`print_saved`)
    version: int | None = None

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
        if self.version is not None and other.version is not None:
            return (f"{self.description}: a parameter (or a view of one), version {self.version} at "
                    f"forward and {other.version} at recompute")
        return (
            f"{self.description}: bytes differ (digest {self.digest:032x} != {other.digest:032x}); "
            'use store="copy" to see the first differing element'
        )


def print_saved(tensor: torch.Tensor, store: Store, parameter: torch.Tensor | None = None) -> TensorPrint:
    """The print of a tensor autograd saved: a parameter is identified by its version counter.

    A saved parameter, or a view of one (a linear layer saves ``weight.t()``), is the same object
    in the forward and in the recompute; what can change between them is an in-place update,
    which moves its version counter.  So its print is its identity, view and version, and no
    byte is read (on ResNet-18 that skips about 37 MiB of hashing per step, and the contiguous
    copy of every transposed weight).  A write through ``.data`` bypasses version counters; it
    still shows in the activations the parameter computes, which are digested.  Everything else
    is :func:`print_tensor`.  ``parameter`` names the parameter a detached view belongs to (autograd
    hands the saved-tensor hooks detached views, which no longer know their ``_base``).
    """
    base = parameter if parameter is not None else tensor._base if tensor._base is not None else tensor
    if not (base.is_leaf and base.requires_grad) or base.layout != torch.strided:
        return print_tensor(tensor, store)
    plain = tensor.detach()
    identity = hash((id(base), plain.storage_offset(), plain.stride(), base._version))
    return TensorPrint(tuple(plain.shape), plain.dtype, str(plain.device), identity & ((1 << 64) - 1),
                       None, tensor.requires_grad, None, base._version)


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
    """128 bits of a hash of the tensor's dtype, shape and bytes in row-major order.

    A contiguous real tensor is hashed in place, its memory read through a ``ctypes`` array
    (not ``Tensor.numpy()``, which marks the storage as not resizable for good: Megatron's
    ``CheckpointWithoutOutput`` and FSDP free storages with ``resize_(0)``); anything else
    (non-contiguous, complex, negative views) goes through ``bit_view``, which makes the same
    row-major bytes in a new tensor.
    """
    name, same_width = _plan(tensor.dtype)
    hasher = _HASHER(f"{name}{tuple(tensor.shape)}\0".encode())
    if tensor.numel():
        if same_width is not None and tensor.is_contiguous() and not tensor.is_neg():
            bits = tensor
        else:
            bits = bit_view(tensor)
        hasher.update((ctypes.c_char * (bits.numel() * bits.element_size())).from_address(bits.data_ptr()))
    return int.from_bytes(hasher.digest()[:16], "little")


def _hasher() -> Any:
    """XXH3-128 where xxhash is installed, SHA-256 otherwise (both exact over every byte)."""
    try:
        import xxhash
    except ImportError:
        return hashlib.sha256
    return xxhash.xxh3_128


#: the hash of CPU digests (see the module's docstring)
_HASHER = _hasher()
#: which one it is, for reports and benchmarks
DIGEST_NAME = "xxh3-128" if _HASHER is not hashlib.sha256 else "sha256"
