"""What a forward keeps of a tensor: an exact digest (default) or a full copy.

A :class:`TensorPrint` is compared with the recomputed tensor's print.  Digests are exact
and position dependent: CPU tensors hash their dtype, shape and bytes, read in place without a
copy, with XXH3-128 (``xxhash``, installed with ``recheck[torch]``: a non-cryptographic hash
that runs near memory speed, so hashing every saved tensor stays a small part of a step; see
``benchmarks/watch_costs.py``), or with SHA-256 truncated to 128 bits (``hashlib``, several
times slower) where xxhash is not installed; tensors on other devices use ``recheck.runtime.bits.digest`` (128-bit,
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
import math
import sys
from typing import Any, Literal

import torch

from recheck.runtime.bits import Tolerance, bit_view, compare_tensors, digest, host_memory, unwrapped

__all__ = ["DIGEST_NAME", "STORES", "ParameterView", "Store", "TensorPrint", "memory_order", "parameter_print_of",
           "parameter_view", "planned_digest", "planned_print_of", "print_activation", "print_buffer", "print_saved",
           "print_tensor", "tensor_digest"]

Store = Literal["digest", "copy"]
STORES: tuple[str, ...] = ("digest", "copy")


class TensorPrint:
    """Metadata plus digest of a tensor, and its copy when the store keeps copies.

    Immutable by convention.  A plain slotted class, not a frozen dataclass: a print is taken
    for every saved tensor of every forward and recompute, and a frozen dataclass's
    ``__init__`` (``object.__setattr__`` per field) cost more than digesting a small tensor.
    """

    __slots__ = ("copy", "device", "digest", "dtype", "order", "requires_grad", "shape", "unreadable", "version")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: str, digest: int,
                 copy: torch.Tensor | None = None, requires_grad: bool = False, unreadable: str | None = None,
                 version: int | None = None, order: tuple[int, ...] | None = None) -> None:
        self.shape, self.dtype, self.device, self.digest = shape, dtype, device, digest
        self.copy, self.requires_grad, self.unreadable = copy, requires_grad, unreadable
        #: for a parameter (or a view of one): its version counter, which identifies it instead of
        #: its bytes (see :func:`print_saved`)
        self.version = version
        #: the order of dimensions the bytes were hashed in, outermost first (None: row-major;
        #: see :func:`print_tensor`)
        self.order = order

    def _fields(self) -> tuple[Any, ...]:
        return (self.shape, self.dtype, self.device, self.digest, self.copy, self.requires_grad,
                self.unreadable, self.version, self.order)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorPrint):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (f"TensorPrint(shape={self.shape!r}, dtype={self.dtype!r}, device={self.device!r}, "
                f"digest={self.digest:#034x}, copy={'...' if self.copy is not None else None}, "
                f"requires_grad={self.requires_grad!r}, unreadable={self.unreadable!r}, version={self.version!r}, "
                f"order={self.order!r})")

    @property
    def description(self) -> str:
        """``float32[4, 8] on cpu`` (as ``describe_tensor`` writes it)."""
        text = f"{str(self.dtype).replace('torch.', '')}[{', '.join(map(str, self.shape))}] on {self.device}"
        text += ", requires_grad" if self.requires_grad else ""
        return text + (f" (values not compared: {self.unreadable})" if self.unreadable else "")

    def same(self, other: TensorPrint) -> bool:
        """True when metadata and every byte agree."""
        return (self.digest == other.digest and self.shape == other.shape and self.dtype == other.dtype
                and self.device == other.device)

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
    byte is read (a model's weights are most of what its layers save: their hashing is skipped,
    and the contiguous copy of every transposed weight).  A write through ``.data`` bypasses version counters; it
    still shows in the activations the parameter computes, which are digested.  ``parameter`` is
    the compared module's parameter whose storage ``tensor`` views (None: not one); anything
    else is :func:`print_tensor` of its bytes.

    ``tensor`` is the tensor as the saved-tensor hook got it, not detached: its print is what a
    detached one's would be (``requires_grad`` False), and nothing here records autograd history.
    """
    view = parameter_view(tensor, parameter)
    return print_activation(tensor, store) if view is None else parameter_print_of(view)


#: what identifies a saved parameter's view (see :func:`parameter_view`)
ParameterView = tuple[tuple[int, ...], torch.dtype, str, int, "int | torch.SymInt", tuple[int, ...], int]


def parameter_view(tensor: torch.Tensor, parameter: torch.Tensor | None) -> ParameterView | None:
    """``(shape, dtype, device, id of the parameter, storage offset, strides, version)``: what
    :func:`print_saved` prints a view of ``parameter`` by, none of its bytes read; None where
    it prints its bytes (no parameter, or not a leaf that requires grad).  Two are equal
    exactly where their prints are: a recompute compares it with its forward's, and makes a
    print (:func:`parameter_print_of`) only where they differ."""
    if parameter is None or not (parameter.is_leaf and parameter.requires_grad) or parameter.layout is not _STRIDED:
        return None
    return (tuple(tensor.shape), tensor.dtype, "cpu" if tensor.is_cpu else _device_name(tensor), id(parameter),
            tensor.storage_offset(), tensor.stride(), parameter._version)


def parameter_print_of(view: ParameterView) -> TensorPrint:
    """The print of what :func:`parameter_view` gave: its identity, view and version."""
    shape, dtype, device, identity, offset, strides, version = view
    # made without a call to ``__init__``: every slot set, as ``TensorPrint(shape, dtype, device,
    # digest, None, False, None, version)`` sets them
    printed = _NEW_PRINT(TensorPrint)
    printed.shape, printed.dtype, printed.device, printed.requires_grad = shape, dtype, device, False
    printed.digest = hash((identity, offset, strides, version)) & ((1 << 64) - 1)
    printed.copy = printed.unreadable = printed.order = None
    printed.version = version
    return printed


def print_activation(tensor: torch.Tensor, store: Store) -> TensorPrint:
    """The print of a saved tensor that is no parameter's view (:func:`print_saved`'s own
    case for those): its bytes, read by :func:`planned_digest` (in place where they lie densely:
    most activations row-major, a transposed one in its memory order; else through one row-major
    copy), or else by :func:`print_tensor`."""
    if store == "digest":
        found = planned_digest(tensor)
        if found is not None:
            return planned_print_of(found)
    return print_tensor(tensor, store, None if tensor.is_contiguous() else memory_order(tensor), saved=True)


def print_buffer(tensor: torch.Tensor, store: Store) -> TensorPrint:
    """``print_tensor(tensor, store)``, made from :func:`planned_digest` where that reads the
    tensor row-major (every field the same): a module's buffers are printed three times an
    invocation (a record reads its modules' state at the forward's end and around the recompute),
    and a block of BatchNorm layers holds many."""
    if store == "digest" and not tensor.requires_grad:
        found = planned_digest(tensor)
        if found is not None and found[3] is None:
            return planned_print_of(found)
    return print_tensor(tensor, store)


def planned_digest(tensor: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype, int, tuple[int, ...] | None] | None:
    """``(shape, dtype, digest, order)`` of a plain CPU tensor autograd saved, read by the plan
    of its layout: its bytes in place where they lie densely, row-major (``order`` None: most
    saved activations) or in another order of its dimensions (``order``, its
    :func:`memory_order`: a transposed key), else through one row-major copy (a view with gaps,
    overlaps or broadcast dimensions: attention's q, k and v sliced from one projection;
    ``order`` None); None for any other (then :func:`print_tensor`, whose print in the same
    order has this digest).  No print is made: a recompute's saved tensor, compared with its
    forward's and almost always equal, needs none (see :func:`planned_print_of`).  What a
    layout asks (its order, the hash's header, the array type its bytes are read through, the
    integer view a copy is made of) is worked out once per shape, strides and dtype.  A
    subclass (a fake, functional or distributed tensor, whose bytes may not be there to read) is
    declined, as is a negative view (its bytes are not its values) and a dtype without an
    integer view of its width (a complex one)."""
    if type(tensor) is not _TENSOR or not (tensor.is_cpu and tensor.layout is _STRIDED) or tensor.is_neg() \
            or _HASHER is not _XXH3_128 or _XXH3_128_SEEDED is None:  # (without xxhash, both are None)
        return None
    dtype = tensor.dtype
    plan = _PLANS.get((tensor.shape, tensor.stride(), dtype)) or _plan(tensor, dtype)
    shape, seed, array, order, width, itemsize = plan
    if seed is None:
        return None
    if array is None:  # no elements
        return shape, dtype, _XXH3_128_SEEDED(b"", seed), order
    # ``_address``'s refusal of a freed storage, without its call (a plain tensor is no fake
    # one), and without making the storage's object: the storage's own pointer is null
    address = tensor.data_ptr()
    if address == tensor.storage_offset() * itemsize:  # freed with ``resize_(0)``: the general path says so
        return None
    if width is None:
        return shape, dtype, _XXH3_128_SEEDED(array.from_address(address), seed), order
    # the row-major bits, as ``print_tensor`` copies them (``bits`` is held while they are read)
    bits = tensor.view(width).contiguous()
    value = _XXH3_128_SEEDED(array.from_address(bits.data_ptr()), seed)
    return shape, dtype, value, order


def _plan(tensor: torch.Tensor, dtype: torch.dtype) -> _Plan:
    """How :func:`planned_digest` reads a tensor of this shape, strides and dtype: its shape,
    the seed of its hash (None: declined), the array type of its bytes, the order they lie in,
    the integer dtype of the row-major copy its bytes are read from (None: read in place), and
    the size of an element."""
    shape, strides, contiguous = tuple(tensor.shape), tensor.stride(), tensor.is_contiguous()
    order = None if contiguous else memory_order(tensor)
    copied = order is None and not contiguous  # gaps, overlaps or broadcast dimensions
    hashed = shape if order is None else tuple([shape[d] for d in order])
    _, seed, same_width, array = _header(dtype, hashed, order)
    if same_width is None:
        plan: _Plan = (shape, None, None, None, None, 0)
    else:
        plan = (shape, seed, array, order, same_width if copied else None, tensor.element_size())
    if len(_PLANS) >= _HEADERS_SIZE:
        _PLANS.clear()
    _PLANS[(tensor.shape, strides, dtype)] = plan
    return plan


#: per layout, :func:`planned_digest`'s reading of it (see :func:`_plan`)
_Plan = tuple[tuple[int, ...], "int | None", Any, "tuple[int, ...] | None", "torch.dtype | None", int]
_PLANS: dict[tuple[Any, tuple[int, ...], torch.dtype], _Plan] = {}


def planned_print_of(found: tuple[tuple[int, ...], torch.dtype, int, tuple[int, ...] | None]) -> TensorPrint:
    """The print of what :func:`planned_digest` gave (its bytes are not read again)."""
    printed = _NEW_PRINT(TensorPrint)  # every slot set, as ``TensorPrint(shape, dtype, "cpu", value, order=...)`` sets them
    printed.shape, printed.dtype, printed.digest, printed.order = found
    printed.device, printed.requires_grad = "cpu", False
    printed.copy = printed.unreadable = printed.version = None
    return printed


_STRIDED = torch.strided
_TENSOR = torch.Tensor
_NEW_PRINT = object.__new__


def print_tensor(tensor: torch.Tensor, store: Store, order: tuple[int, ...] | None = None, *,
                 saved: bool = False) -> TensorPrint:
    """The print of ``tensor`` under ``store`` ("digest" or "copy").

    ``order`` (a permutation of the dimensions, outermost first; CPU tensors) hashes the bytes
    in that order of dimensions instead of row-major: ``tensor.permute(order)``'s row-major
    bytes.  Where ``order`` is the tensor's own :func:`memory_order`, that is its memory as it
    lies, read without a copy.  Two prints are comparable when they were hashed in the same
    order (the order is part of the hashed header): a recompute prints its saved tensor in the
    order its forward's print was taken (``order=original.order``), so equal values give equal
    digests, whatever the recomputed tensor's strides.
    """
    shape, dtype, device = tuple(tensor.shape), tensor.dtype, "cpu" if tensor.is_cpu else _device_name(tensor)
    plain = tensor
    try:
        if plain.layout is not torch.strided:
            plain = plain.detach().to_dense()
        if device == "cpu":
            if order is None:
                value = _cpu_digest(plain, shape)
            elif len(order) == len(shape) and _lies_in(shape, plain.stride(), order):
                # its memory as it lies is ``permute(order)``'s row-major bytes: read in place
                value = _cpu_digest(plain, tuple([shape[d] for d in order]), order, lies=True)
            else:
                permuted = plain.detach().permute(order)
                value = _cpu_digest(permuted, tuple(permuted.shape), order)
        else:
            order = None
            with torch.no_grad():
                value = digest(plain.detach())
    except (TypeError, RuntimeError, NotImplementedError, IndexError) as exc:
        # a tensor without plain bytes (a subclass, an exotic layout or dtype): metadata only
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return TensorPrint(shape, dtype, device, 0, None, not saved and tensor.requires_grad, reason)
    copy = plain.detach().clone() if store == "copy" else None
    return TensorPrint(shape, dtype, device, value, copy, not saved and tensor.requires_grad, None, None, order)


def tensor_digest(tensor: torch.Tensor) -> int:
    """128 bits of a hash of ``tensor``'s dtype, shape and bytes, as a print's ``digest``: on the
    CPU, one call over its memory (:func:`_cpu_digest`, bound by memory bandwidth); on another
    device, or for a tensor whose bytes cannot be read in place, ``bits.digest``, which hashes
    them where they are with torch kernels (on the CPU far slower than XXH3, which is why the
    CPU path reads the bytes in place: a global optimizer printed whole, its parameters and
    Adam's moments with it, is hashed at every run of a ``check_step``)."""
    plain = tensor.detach()
    if type(plain) is not torch.Tensor and hasattr(plain, "__tensor_flatten__"):
        return _wrapper_digest(plain)
    if plain.is_cpu and plain.layout is torch.strided:
        try:
            return _cpu_digest(plain)
        except (TypeError, RuntimeError, NotImplementedError):
            pass  # a subclass or a dtype without plain bytes: hashed as ``bits.digest`` hashes it
    with torch.no_grad():
        return digest(plain)


def _wrapper_digest(tensor: torch.Tensor) -> int:
    """:func:`tensor_digest` of a tensor subclass that wraps others (FSDP2's ``DTensor``, its
    local shard; torch's ``TwoTensor``), which has no bytes of its own to read: its type,
    dtype and shape, the digest of each inner tensor (:func:`bits.unwrapped`), in order, and
    the text of what else it holds (a ``DTensor``'s placements and device mesh)."""
    parts_of = unwrapped(tensor)
    inner, metadata = parts_of if parts_of is not None else ([], "")
    parts = [f"{type(tensor).__module__}.{type(tensor).__qualname__}", str(tensor.dtype),
             repr(tuple(tensor.shape)), metadata]
    parts += [f"{name}={tensor_digest(value)}" for name, value in inner]
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:16], "big")


def memory_order(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """The dimensions of a non-overlapping, dense tensor from outermost to innermost in memory
    (``tensor.permute(order)`` is contiguous: its row-major bytes are the tensor's memory as it
    lies); None for a tensor with gaps, overlaps or broadcast dimensions (hashed row-major,
    through a copy)."""
    strides = tensor.stride()
    order = tuple(sorted(range(len(strides)), key=strides.__getitem__, reverse=True))
    return order if _lies_in(tuple(tensor.shape), strides, order) else None


def _lies_in(shape: tuple[int, ...], strides: tuple[int, ...], order: tuple[int, ...]) -> bool:
    """Whether ``permute(order)`` of a tensor of ``shape`` and ``strides`` is contiguous, by
    torch's own rule (a dimension of size 1 has any stride; no elements is contiguous), worked
    out from the numbers without making the permuted view: a saved transposed activation is
    printed at every forward and every recompute, so the answer is kept per layout."""
    key = (shape, strides, order)
    known = _LIES_IN.get(key)
    if known is None:
        if len(_LIES_IN) >= _HEADERS_SIZE:
            _LIES_IN.clear()
        known = _LIES_IN[key] = _worked_out(shape, strides, order)
    return known


def _worked_out(shape: tuple[int, ...], strides: tuple[int, ...], order: tuple[int, ...]) -> bool:
    if 0 in shape:
        return True
    expected = 1
    for dim in reversed(order):
        size = shape[dim]
        if size != 1:
            if strides[dim] != expected:
                return False
            expected *= size
    return True


#: :func:`_lies_in`'s answers, per (shape, strides, order)
_LIES_IN: dict[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], bool] = {}


#: the names of devices other than the CPU (``str(torch.device)`` builds a new string at each call)
_DEVICE_NAMES: dict[torch.device, str] = {}


def _device_name(tensor: torch.Tensor) -> str:
    if tensor.is_cpu:
        return "cpu"
    device = tensor.device
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


#: integer dtype of each element width, for the in-place byte view of plain CPU tensors
_SAME_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: per (dtype, shape, order): the hash's header, its 64-bit XXH3 (the seed of the one-shot XXH3-128),
#: the integer dtype the tensor is viewed as, or None where ``bit_view`` must convert (complex,
#: or widths without an integer dtype), and the ctypes array type its bytes are read through in
#: place (None: no bytes, or no in-place read)
_Header = tuple[bytes, int, "torch.dtype | None", Any]
_HEADERS: dict[tuple[torch.dtype, tuple[int, ...], tuple[int, ...] | None], _Header] = {}
_HEADERS_SIZE = 4096


def _header(dtype: torch.dtype, shape: tuple[int, ...], order: tuple[int, ...] | None = None) -> _Header:
    entry = _HEADERS.get((dtype, shape, order))
    if entry is None:
        width = torch.empty((), dtype=dtype).element_size()
        same_width = None if dtype.is_complex else _SAME_WIDTH.get(width)
        if len(_HEADERS) >= _HEADERS_SIZE:
            _HEADERS.clear()
        # row-major bytes of a shape, or the bytes of the dimensions in ``order`` (another header)
        header = (f"{dtype}{shape}\0" if order is None else f"{dtype}{shape} in order {order}\0").encode()
        seed = _XXH3_64(header) if _XXH3_64 is not None else 0
        size = math.prod(shape) * width
        array = ctypes.c_char * size if same_width is not None and size else None
        entry = _HEADERS[(dtype, shape, order)] = (header, seed, same_width, array)
    return entry


def _cpu_digest(tensor: torch.Tensor, shape: tuple[int, ...] | None = None,
                order: tuple[int, ...] | None = None, *, lies: bool = False) -> int:
    """128 bits of a hash of the tensor's dtype, shape and bytes in row-major order.

    A contiguous real tensor is hashed in place, its memory read through a ``ctypes`` array
    (not ``Tensor.numpy()``, which marks the storage as not resizable for good: Megatron's
    ``CheckpointWithoutOutput`` and FSDP free storages with ``resize_(0)``); anything else
    (non-contiguous, complex, negative views) goes through ``bit_view``, which makes the same
    row-major bytes in a new tensor.  With XXH3 the header is the seed of one call over the
    bytes (XXH3-128 seeded by the header's XXH3-64), which saves the hasher object per print.

    ``lies``: the caller found that ``tensor``'s memory as it lies is its bytes in ``order`` (a
    permutation of its dimensions; ``shape`` is the permuted one), so they are read in place too.
    """
    dtype, shape = tensor.dtype, tuple(tensor.shape) if shape is None else shape
    header, seed, same_width, array = _HEADERS.get((dtype, shape, order)) or _header(dtype, shape, order)
    data: Any = b""
    plain = same_width is not None and not tensor.is_neg()  # its bytes are its elements' bits
    if plain and (lies or tensor.is_contiguous()):
        if array is not None:  # read in place through the array type of its size
            data = array.from_address(_address(tensor))
    elif tensor.nbytes:
        _address(tensor)  # (a view of a freed storage: its copy would read freed memory)
        detached = tensor.detach().permute(order) if lies and order is not None else tensor.detach()
        # the same bits as ``bit_view`` gives, in one view and one copy where no bit is to resolve
        bits = detached.view(same_width).contiguous() if plain and same_width is not None else bit_view(detached)
        data = host_memory(_address(bits), bits.nbytes)
    if _HASHER is _XXH3_128 and _XXH3_128_SEEDED is not None:
        return _XXH3_128_SEEDED(data, seed)
    hasher = _HASHER(header)
    hasher.update(data)
    return int.from_bytes(hasher.digest()[:16], "little")


def _address(tensor: torch.Tensor) -> int:
    """Where a CPU tensor's bytes are, to read them in place; ``RuntimeError`` where it has none
    (a fake tensor, made under ``FakeTensorMode`` by a tracer, has the address 0: read, that
    would crash the process)."""
    if type(tensor) is not _TENSOR:
        fake = sys.modules.get("torch._subclasses.fake_tensor")
        if fake is not None and isinstance(tensor, fake.FakeTensor):
            raise RuntimeError("a fake tensor has no bytes")
    address = tensor.data_ptr()
    # a storage freed with ``resize_(0)`` (FSDP, Megatron) has the address 0, and a view into it
    # at an offset the offset's: read or copied, either would crash the process
    if tensor.nbytes and address == tensor.storage_offset() * tensor.element_size():
        raise RuntimeError("the tensor has no bytes to read (its storage is freed)")
    return address


def _hasher() -> Any:
    """XXH3-128 where xxhash is installed, SHA-256 otherwise (both exact over every byte)."""
    try:
        import xxhash
    except ImportError:
        return hashlib.sha256
    return xxhash.xxh3_128


#: the hash of CPU digests (see the module's docstring)
_HASHER = _hasher()
try:
    import xxhash as _xxhash
except ImportError:  # sha256 only
    _XXH3_128 = _XXH3_128_SEEDED = _XXH3_64 = None
else:
    _XXH3_128, _XXH3_128_SEEDED, _XXH3_64 = _xxhash.xxh3_128, _xxhash.xxh3_128_intdigest, _xxhash.xxh3_64_intdigest
#: which one it is, for reports and benchmarks
DIGEST_NAME = "xxh3-128" if _HASHER is not hashlib.sha256 else "sha256"
