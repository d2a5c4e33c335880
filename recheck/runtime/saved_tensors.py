"""A bit-for-bit ``determinism_check`` for non-reentrant checkpoint.

torch's ``"default"`` check compares only the shape, dtype and device of every
tensor autograd saved.  :func:`bitwise_determinism` registers a mode in
``torch.utils.checkpoint._allowed_determinism_checks_to_fns`` whose metadata object
also holds the saved tensor (so the region's activations stay in memory during the
check, as without checkpoint).  Metadata differences still make torch raise
its usual ``CheckpointError``; value differences are *recorded* (and torch is told
the tensors match) so that backward completes and gradients stay comparable.

The registration is removed on exit; on a torch without the registry the context
manager yields ``None`` and the caller keeps torch's default check.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Iterator

import torch

from recheck.runtime.bits import bits_equal

__all__ = ["MODE", "SavedTensorLog", "bitwise_determinism"]

MODE = "recheck-bitwise"


class SavedTensorLog:
    """Saved tensors whose recomputed bytes differed.

    Each mismatch is ``(position, original copy, recomputed copy, storage pointer)``;
    the pointer lets a caller recognise a saved module buffer (BatchNorm's running
    statistics), whose difference is reported as a ``buffer`` finding instead.
    """

    def __init__(self) -> None:
        self.mismatches: list[tuple[int, torch.Tensor, torch.Tensor, int]] = []
        self.counter = itertools.count(1)
        self.compared = 0
        self.frozen = False  # set once the forward returned: later metadata are the recompute's
        self.pending: list[_BitwiseMetadata] = []

    def freeze(self) -> None:
        """Take the forward's copies of saved leaves now that the forward has returned.

        A kernel may fill a tensor after saving it (RReLU saves its noise buffer, then
        draws into it), so a copy taken at pack time would hold uninitialized bytes.
        Copying at the end of the forward sees what backward will use, and still
        precedes anything the caller does between forward and recompute.
        """
        for metadata in self.pending:
            if metadata.leaf and metadata.ref is not None:
                metadata.copy = metadata.ref.clone()
        self.pending.clear()
        self.frozen = True


_active: list[SavedTensorLog] = []


class _BitwiseMetadata:
    """What the pack hook stores per saved tensor: metadata plus the tensor's bytes."""

    __slots__ = ("shape", "dtype", "device", "copy", "ref", "leaf", "position", "storage")

    def __init__(self, x: torch.Tensor) -> None:
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.device
        log = _active[-1] if _active else None
        self.position = next(log.counter) if log is not None else 0
        try:
            # Intermediates are held by reference (the memory of an uncheckpointed step,
            # no copying): changing one in place after saving it makes the plain run fail.
            # Leaves (parameters, buffers, inputs) can change between forward and
            # recompute, so the forward's are copied, once, by ``SavedTensorLog.freeze``.
            # The recompute's tensors (created after the freeze) are compared as they are.
            strided = x.layout == torch.strided
            self.leaf = x.is_leaf and not (log is not None and log.frozen)
            self.ref = x.detach() if strided else None
            copy_now = self.leaf and log is None  # no log to freeze it later
            self.copy = None if self.ref is None else self.ref.clone() if copy_now else self.ref
            self.storage = x.untyped_storage().data_ptr() if self.copy is not None else 0
        except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
            self.copy, self.ref, self.leaf, self.storage = None, None, False, 0
        if log is not None and not log.frozen and self.ref is not None:
            log.pending.append(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _BitwiseMetadata):
            return NotImplemented
        log = _active[-1] if _active else None
        if (self.shape, self.dtype, self.device) != (other.shape, other.dtype, other.device):
            if log is not None and self.copy is not None and other.ref is not None:
                log.compared += 1  # recorded, then torch raises its CheckpointError with our repr
                log.mismatches.append((self.position, self.copy, other.ref.clone(), self.storage))
            return False
        if log is None or self.copy is None or other.copy is None:
            return True
        log.compared += 1
        # ``self`` is the forward's (copied when its forward returned), ``other`` the
        # recompute's, read now that the recompute has run: both after any in-kernel fill.
        recomputed = other.ref if other.ref is not None else other.copy
        if self.device.type != "meta" and not bits_equal(self.copy, recomputed):
            log.mismatches.append((self.position, self.copy, recomputed.clone(), self.storage))
        return True

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return NotImplemented if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{{'shape': {self.shape}, 'dtype': {self.dtype}, 'device': {self.device}}}"


@contextlib.contextmanager
def bitwise_determinism() -> Iterator[SavedTensorLog | None]:
    """Register :data:`MODE` for the duration; yields the log, or None without a registry."""
    registry = getattr(torch.utils.checkpoint, "_allowed_determinism_checks_to_fns", None)
    if not isinstance(registry, dict):
        yield None
        return
    log = SavedTensorLog()
    previous = registry.get(MODE)
    registry[MODE] = _BitwiseMetadata
    _active.append(log)
    try:
        yield log
    finally:
        _active.remove(log)
        if previous is None:
            registry.pop(MODE, None)
        else:
            registry[MODE] = previous
