"""Bit-for-bit tensor comparison and position-dependent digests.

Two tensors are *equal* here when their metadata match and their element bytes
match: each tensor is viewed as the integer dtype of the same item size (bool as
``uint8``, complex as its real dtype), so NaN payloads and ``-0.0`` count, unlike
``torch.equal`` or ``torch.testing.assert_close``.  An optional tolerance (``atol``
and ``rtol``, or ``max_ulp``) relaxes the comparison of floating-point values.

Public interface (stable; ``recheck.watch`` builds on it):

* :func:`compare_tensors` returns ``None`` when two tensors are identical (or
  within tolerance) and a :class:`TensorDiff` describing the difference otherwise.
* :func:`digest` returns a 128-bit, position-dependent hash of a tensor's
  metadata and bytes, computed on the tensor's own device.
* :func:`bit_view` exposes the integer view the comparison uses.
"""

from __future__ import annotations

import ctypes
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Tolerance", "TensorDiff", "bit_view", "bits_equal", "bits_float", "compare_tensors", "digest",
           "format_bits", "host_memory", "local_tensor", "same", "unwrapped"]

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


#: The largest ``max_ulp``: ULP distances are compared as int64 tensors.
MAX_ULP = 2 ** 63 - 1


@dataclass(frozen=True)
class Tolerance:
    """A relaxed comparison: ``|a - b| <= atol + rtol * |b|`` or at most ``max_ulp`` ULPs."""

    atol: float = 0.0
    rtol: float = 0.0
    max_ulp: int | None = None

    def __post_init__(self) -> None:
        if not (self.atol >= 0 and self.rtol >= 0) or (self.max_ulp is not None and self.max_ulp < 0):
            raise ValueError("tolerances must be non-negative numbers")
        if math.isinf(self.atol) or math.isinf(self.rtol):
            raise ValueError("tolerances must be finite")

    @classmethod
    def of(cls, atol: float | None = None, rtol: float | None = None,
           max_ulp: int | None = None) -> Tolerance | None:
        """The tolerance that options ask for, or None for exact bits (every face's one rule).

        ``atol`` and ``rtol`` go together, as ``torch.testing.assert_close`` requires;
        ``max_ulp`` stands alone.  Raises ``ValueError`` naming what is wrong.
        """
        if atol is None and rtol is None and max_ulp is None:
            return None
        if max_ulp is not None:
            if atol is not None or rtol is not None:
                raise ValueError("pass either max_ulp or atol and rtol, not both")
            if isinstance(max_ulp, bool) or not isinstance(max_ulp, int) or not 0 <= max_ulp <= MAX_ULP:
                raise ValueError(f"max_ulp must be a whole number from 0 to 2**63 - 1, got {max_ulp!r}")
            return cls(max_ulp=max_ulp)
        if atol is None or rtol is None:
            given, missing = ("atol", "rtol") if rtol is None else ("rtol", "atol")
            raise ValueError(f"{given} was given without {missing}: pass both, as "
                             "torch.testing.assert_close requires (rtol=0 for an absolute tolerance)")
        for name, value in (("atol", atol), ("rtol", rtol)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number of 0 or more, got {value!r}")
        return cls(atol=float(atol), rtol=float(rtol))

    def __str__(self) -> str:
        if self.max_ulp is not None:
            return f"up to {self.max_ulp} ulp allowed"
        return f"up to atol={self.atol:g}, rtol={self.rtol:g} allowed"


@dataclass(frozen=True)
class TensorDiff:
    """How two tensors differ: metadata first, then values.

    ``metadata`` lists assert_close-style sentences (``the values for attribute
    'dtype' do not match: torch.float32 != torch.float64``); when it is non-empty
    the value fields are left empty.  Indices are tuples into the tensor's shape.
    """

    metadata: tuple[str, ...] = ()
    description: str = ""
    mismatched: int = 0
    numel: int = 0
    first_index: tuple[int, ...] | None = None
    first_original: Any = None
    first_recomputed: Any = None
    first_original_bits: str = ""
    first_recomputed_bits: str = ""
    first_ulp: int | None = None
    max_abs_diff: float | None = None
    max_abs_index: tuple[int, ...] | None = None
    tolerance: Tolerance | None = None
    #: integer or boolean values: compared exactly whatever the tolerance
    exact_values: bool = False

    def lines(self) -> list[str]:
        """The assert_close-style text of this difference, one list item per line."""
        out = [self.description] if self.description else []
        if self.metadata:
            return out + list(self.metadata)
        share = 100.0 * self.mismatched / self.numel if self.numel else 0.0
        if self.tolerance is None:
            how = "bitwise"
        elif self.exact_values:
            how = "(integer values are compared exactly; the tolerance applies to floating-point values)"
        else:
            how = f"beyond tolerance ({self.tolerance})"
        out.append(f"{self.mismatched:,} / {self.numel:,} elements differ {how} ({share:.3g}%)")
        if self.first_index is not None:
            ulp = f", {self.first_ulp} ulp" if self.first_ulp is not None else ""
            out.append(
                f"first difference at index {_index(self.first_index)}: "
                f"original {self.first_original!r} ({self.first_original_bits}), "
                f"recomputed {self.first_recomputed!r} ({self.first_recomputed_bits}){ulp}"
            )
        if self.max_abs_diff is not None and self.max_abs_index is not None:
            out.append(
                f"greatest absolute difference: {self.max_abs_diff!r} "
                f"at index {_index(self.max_abs_index)}"
            )
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def unwrapped(t: torch.Tensor) -> tuple[list[tuple[str, torch.Tensor]], str] | None:
    """The parts of a tensor subclass that wraps others (FSDP2's ``DTensor``, torch's
    ``TwoTensor``), or None for any other tensor: the tensors it names in
    ``__tensor_flatten__``, in order, and the text of everything else it holds there.

    Only the names whose values are tensors are inner tensors: a ``DTensor`` names its
    ``device_mesh`` too, which is metadata and goes into the text with the placements.  Read
    with ``getattr`` only, never a tensor operation: an operation on a ``DTensor`` may run a
    collective, and ranks that compare different values would then call different ones.
    """
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter or not hasattr(t, "__tensor_flatten__"):
        return None
    wrapper: Any = t  # ``__tensor_flatten__`` is the wrapper subclass's method, not Tensor's
    names, context = wrapper.__tensor_flatten__()
    inner: list[tuple[str, torch.Tensor]] = []
    metadata = [repr(context)]
    for name in names:
        value = getattr(t, name, None)
        if isinstance(value, torch.Tensor):
            inner.append((name, value))
        else:
            metadata.append(f"{name}={value!r}")
    return inner, "; ".join(metadata)


def local_tensor(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` itself, or the one tensor a wrapper subclass holds (a ``DTensor``'s local shard),
    read without a tensor operation; None for a wrapper of several tensors."""
    parts = unwrapped(t)
    if parts is None:
        return t
    return local_tensor(parts[0][0][1]) if len(parts[0]) == 1 else None


def _index(index: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, index)) + ")" if len(index) != 1 else f"({index[0]},)"


def describe_tensor(t: torch.Tensor) -> str:
    """``float32[4, 8] on cpu`` (plus ``requires_grad`` when set)."""
    dtype = str(t.dtype).replace("torch.", "")
    text = f"{dtype}[{', '.join(map(str, t.shape))}] on {t.device}"
    return text + (", requires_grad" if t.requires_grad else "")


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as same-width integers (contiguous, detached).

    Complex tensors are viewed as real pairs first (so the last dimension doubles);
    bool becomes ``uint8``.  Raises ``TypeError`` for layouts without plain storage.
    """
    t = t.detach()
    if t.layout != torch.strided:
        raise TypeError(f"bitwise comparison needs a strided tensor, got layout {t.layout}")
    return _reinterpreted(t).contiguous()


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors have the same shape, dtype, device, layout and element bytes.

    The same answer as ``torch.equal(bit_view(a), bit_view(b))`` for strided tensors,
    without the contiguous copies: a same-width integer view keeps the strides, so
    a transposed weight is compared where it lies.  Two contiguous plain CPU tensors are
    compared with the C library's ``memcmp`` over their bytes, which reads them once, in place,
    with no tensor made (``torch.equal`` of their integer views dispatches a kernel and reduces);
    the answer is the same.
    """
    parts_a, parts_b = unwrapped(a), unwrapped(b)
    if parts_a is not None or parts_b is not None:  # compared on this rank's inner tensors only
        return (parts_a is not None and parts_b is not None and type(a) is type(b) and a.shape == b.shape
                and a.dtype == b.dtype and parts_a[1] == parts_b[1] and len(parts_a[0]) == len(parts_b[0])
                and all(bits_equal(x, y) for (_, x), (_, y) in zip(parts_a[0], parts_b[0])))
    a, b = a.detach(), b.detach()
    if (a.shape != b.shape or a.dtype != b.dtype or a.device != b.device
            or a.layout != b.layout):
        return False
    if a.device.type == "meta":
        return True
    if a.layout != torch.strided:
        return torch.equal(bit_view(a), bit_view(b))  # raises TypeError, as bit_view does
    if type(a) is torch.Tensor and type(b) is torch.Tensor:
        held_a, held_b = _holds_elements(a), _holds_elements(b)
        if not (held_a and held_b):  # a freed storage (FSDP's ``resize_(0)``) has no bytes to read
            return held_a == held_b
        if _MEMCMP is not None and a.is_cpu and _in_place_bytes(a) and _in_place_bytes(b):
            size = a.nbytes
            return not size or _MEMCMP(a.data_ptr(), b.data_ptr(), size) == 0
    return torch.equal(_reinterpreted(a), _reinterpreted(b))


def same(before: Any, after: Any, tolerance: Tolerance | None = None) -> bool:
    """Whether a value a forward recorded is the one its recompute recorded: the one equality of
    recorded state.  Two tensor prints (``recheck.runtime.digests.TensorPrint``) agree in every
    byte, or within ``tolerance`` when both hold copies; a print never equals a plain value; a
    plain value's record ``(print, shown)`` is compared by its print."""
    if type(before) is tuple and type(after) is tuple:
        return bool(before[0] == after[0])
    tensor_a, tensor_b = hasattr(before, "matches"), hasattr(after, "matches")
    if tensor_a and tensor_b:
        return bool(before.matches(after, tolerance))
    return not (tensor_a or tensor_b) and bool(before[0] == after[0])


def _holds_elements(t: torch.Tensor) -> bool:
    """Whether ``t``'s storage reaches as far as its last element (FSDP frees a storage with
    ``resize_(0)``, leaving the tensor's shape: reading it would read freed memory)."""
    if not t.numel():
        return True
    if t.is_contiguous():  # its elements are the ``nbytes`` from its offset on: no walk over strides
        return t.storage_offset() * t.element_size() + t.nbytes <= t.untyped_storage().nbytes()
    last = t.storage_offset() + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if stride > 0)
    return (last + 1) * t.element_size() <= t.untyped_storage().nbytes()


def _in_place_bytes(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements are its memory from ``data_ptr()`` on, in row-major order, as
    they read: contiguous, not quantized, without a negative or conjugate bit."""
    return t.is_contiguous() and not t.is_quantized and not t.is_neg() and not t.is_conj()


def _memcmp() -> Any:
    """The C library's ``memcmp`` through ctypes (None where it cannot be found)."""
    try:
        library = ctypes.CDLL(None) if not hasattr(ctypes, "windll") else ctypes.cdll.msvcrt
        function = library.memcmp
    except (OSError, AttributeError, TypeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return function


_MEMCMP = _memcmp()


def _reinterpreted(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as same-width integers, strides kept (a copy only for conj/neg bits)."""
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    t = t.resolve_neg().resolve_conj()
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    int_dtype = _INT_OF_SIZE.get(t.element_size())
    if int_dtype is None:
        raise TypeError(f"no integer dtype of {t.element_size()} bytes for {t.dtype}")
    return t.view(int_dtype)


def format_bits(value: int, itemsize: int) -> str:
    """``0x3dff0000``: the unsigned hexadecimal of an element's bit pattern."""
    return f"0x{value & ((1 << (8 * itemsize)) - 1):0{2 * itemsize}x}"


def _metadata_differences(a: torch.Tensor, b: torch.Tensor, check_requires_grad: bool) -> list[str]:
    out = []
    pairs = [("shape", tuple(a.shape), tuple(b.shape)), ("dtype", a.dtype, b.dtype),
             ("device", a.device, b.device), ("layout", a.layout, b.layout)]
    if check_requires_grad:
        pairs.append(("requires_grad", a.requires_grad, b.requires_grad))
    for name, left, right in pairs:
        if left != right:
            out.append(f"the values for attribute '{name}' do not match: {left} != {right}")
    return out


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """Map float bit patterns to integers whose difference is the ULP distance."""
    wide = bits.to(torch.int64)
    size = bits.element_size()
    sign = 1 << (8 * size - 1)
    if size == 8:
        magnitude = wide & torch.iinfo(torch.int64).max
        return torch.where(wide < 0, -magnitude, magnitude)
    wide = wide & ((1 << (8 * size)) - 1)
    magnitude = wide & (sign - 1)
    return torch.where(wide >= sign, -magnitude, magnitude)


def _value_mismatch(a: torch.Tensor, b: torch.Tensor, tol: Tolerance | None,
                    bits_a: torch.Tensor, bits_b: torch.Tensor) -> torch.Tensor:
    """Boolean mask (in the bit view's shape) of elements that count as different, given the
    two tensors' :func:`bit_view`s."""
    differs = bits_a != bits_b
    floating = a.is_floating_point() or a.is_complex()
    if tol is None or not floating:
        return differs
    real_a = torch.view_as_real(a.detach().resolve_conj()) if a.is_complex() else a.detach()
    real_b = torch.view_as_real(b.detach().resolve_conj()) if b.is_complex() else b.detach()
    both_nan = torch.isnan(real_a) & torch.isnan(real_b)
    if tol.max_ulp is not None:
        ulps = (_ordered(bits_a) - _ordered(bits_b)).abs()
        close = ulps <= tol.max_ulp
    else:
        da, db = real_a.double(), real_b.double()
        close = (da - db).abs() <= tol.atol + tol.rtol * db.abs()
        close = close | (da == db)  # equal infinities
    return differs & ~(close | both_nan)


def _item(t: torch.Tensor, index: tuple[int, ...]) -> Any:
    value = t[index].item() if t.dim() else t.item()
    return value


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index of the ``flat``-th element of a row-major tensor of ``shape`` (what
    ``torch.unravel_index`` gives, without making tensors)."""
    index = []
    for size in reversed(shape):
        flat, at = divmod(flat, size)
        index.append(at)
    return tuple(reversed(index))


def _ordered_int(bits: int, itemsize: int) -> int:
    """:func:`_ordered` of one element's bit pattern, as a Python integer (its difference with
    another's is their ULP distance, without the int64 overflow of two far apart doubles)."""
    width = 8 * itemsize
    bits &= (1 << width) - 1
    sign = 1 << (width - 1)
    magnitude = bits & (sign - 1)
    return -magnitude if bits & sign else magnitude


def compare_tensors(
    original: torch.Tensor,
    recomputed: torch.Tensor,
    *,
    tolerance: Tolerance | None = None,
    check_requires_grad: bool = True,
    description: str = "",
) -> TensorDiff | None:
    """Compare two tensors bit for bit (or within ``tolerance``).

    Returns ``None`` when they are identical, else a :class:`TensorDiff`.  Metadata
    (shape, dtype, device, layout, and ``requires_grad`` unless disabled) are checked
    first; when they differ, values are not compared.  A difference is described with a
    dozen tensor operations, whatever the tensor's size (a step's comparison of twins
    describes every parameter, gradient and buffer that differs): the first differing
    element's index, bits and ULP distance are worked out in Python.  A tensor subclass that
    wraps others (a ``DTensor``) is compared on this rank's inner tensors (its local shard),
    never with an operation on the wrapper, which may run a collective; indices are then the
    shard's.
    """
    meta = _metadata_differences(original, recomputed, check_requires_grad)
    if meta:
        return TensorDiff(metadata=tuple(meta), description=description, numel=original.numel())
    parts_a, parts_b = unwrapped(original), unwrapped(recomputed)
    if parts_a is not None or parts_b is not None:
        return _compare_wrapped(original, recomputed, parts_a, parts_b, tolerance, description)
    if original.device.type == "meta":
        return None
    if original.layout != torch.strided:
        original, recomputed = original.to_dense(), recomputed.to_dense()
    a, b = original.detach(), recomputed.detach()
    bits_a, bits_b = bit_view(a), bit_view(b)
    mask = _value_mismatch(a, b, tolerance, bits_a, bits_b)
    count = int(mask.sum())
    if count == 0:
        return None
    numel = original.numel()
    complex_values = a.is_complex()
    if complex_values:
        # Report complex elements by their position in the complex tensor.
        mask = mask.reshape(*a.shape, 2).any(-1)
        count = int(mask.sum())
    shape = tuple(a.shape)
    # the first differing element: the first greatest of the mask's bytes (argmax gives the first)
    flat = int(mask.reshape(-1).view(torch.uint8).argmax()) if mask.dim() else 0
    first = _unravel(flat, shape)
    itemsize = bits_a.element_size()
    if complex_values:
        pos = first + (0,)
        bits_a_first, bits_b_first = int(bits_a[pos]), int(bits_b[pos])
    else:
        bits_a_first = int(bits_a[first]) if first else int(bits_a)
        bits_b_first = int(bits_b[first]) if first else int(bits_b)
    first_ulp = None
    max_abs = max_index = None
    if a.is_floating_point():
        first_ulp = abs(_ordered_int(bits_a_first, itemsize) - _ordered_int(bits_b_first, itemsize))
    if a.is_floating_point() or complex_values or a.dtype != torch.bool:
        # in double precision, one copy of each side at most (``sub_`` widens ``b`` as it reads it)
        diff = (a.to(torch.complex128) - b.to(torch.complex128)).abs() if complex_values \
            else a.to(torch.float64, copy=True).sub_(b).abs_()
        diff = torch.where(mask, diff.nan_to_num_(nan=math.inf), 0.0).reshape(-1)
        flat_max = int(diff.argmax())
        max_abs = float(diff[flat_max])
        max_index = _unravel(flat_max, shape)
    return TensorDiff(
        description=description,
        mismatched=count,
        numel=numel,
        first_index=first,
        first_original=_item(a, first),
        first_recomputed=_item(b, first),
        first_original_bits=format_bits(bits_a_first, itemsize),
        first_recomputed_bits=format_bits(bits_b_first, itemsize),
        first_ulp=first_ulp,
        max_abs_diff=max_abs,
        max_abs_index=max_index,
        tolerance=tolerance,
        exact_values=not (a.is_floating_point() or a.is_complex()),
    )


def _compare_wrapped(a: torch.Tensor, b: torch.Tensor,
                     parts_a: tuple[list[tuple[str, torch.Tensor]], str] | None,
                     parts_b: tuple[list[tuple[str, torch.Tensor]], str] | None,
                     tolerance: Tolerance | None, description: str) -> TensorDiff | None:
    """:func:`compare_tensors` of two tensors of which one at least wraps others: their type
    and the metadata they hold as such, then each inner tensor in turn (the first that differs)."""
    name_a, name_b = type(a).__qualname__, type(b).__qualname__
    if parts_a is None or parts_b is None or name_a != name_b:
        return TensorDiff(metadata=(f"the values for attribute 'type' do not match: {name_a} != {name_b}",),
                          description=description, numel=a.numel())
    if parts_a[1] != parts_b[1] or [n for n, _ in parts_a[0]] != [n for n, _ in parts_b[0]]:
        return TensorDiff(metadata=(f"the {name_a}'s metadata do not match: {parts_a[1]} != {parts_b[1]}",),
                          description=description, numel=a.numel())
    for (name, x), (_, y) in zip(parts_a[0], parts_b[0]):
        inner = f"{description}, this rank's {name_a}.{name}: {describe_tensor(x)}" if description else ""
        diff = compare_tensors(x, y, tolerance=tolerance, check_requires_grad=False, description=inner)
        if diff is not None:
            return diff
    return None


# -- digest -------------------------------------------------------------------------------------

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit integer
_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_M2 = -7723592293110705685  # 0x94D049BB133111EB


def _lsr(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` is arithmetic)."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    x = (x ^ _lsr(x, 30)) * _M1
    x = (x ^ _lsr(x, 27)) * _M2
    return x ^ _lsr(x, 31)


def _mix_int(value: int) -> int:
    x = value & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def digest(t: torch.Tensor) -> int:
    """An exact, position-dependent 128-bit hash of a tensor's metadata and bytes.

    Every element's bit pattern is mixed with its flat index (splitmix64) and the
    mixed words are summed modulo 2**64 in two independent lanes, on the tensor's
    device; only two integers travel to the host.  Equal tensors (same shape, dtype
    and bytes) always give equal digests; swapping two elements changes it.  A tensor
    subclass that wraps others (a ``DTensor``) is digested from this rank's inner tensors and
    its metadata (:func:`unwrapped`), with no collective.
    """
    parts = unwrapped(t)
    if parts is not None:  # this rank's inner tensors and the wrapper's metadata: no collective
        head = zlib.crc32(f"{type(t).__qualname__}\0{t.dtype}\0{tuple(t.shape)}\0{parts[1]}".encode())
        low, high = _mix_int(head), _mix_int(head ^ 0x5A5A)
        for _, inner in parts[0]:
            value = digest(inner)
            low, high = _mix_int(low ^ (value & 0xFFFFFFFFFFFFFFFF)), _mix_int(high ^ (value >> 64))
        return (high << 64) | low
    head = zlib.crc32(str(t.dtype).encode())
    for size in t.shape:
        head = _mix_int(head ^ (size + 0x9E3779B9))
    if t.device.type == "meta" or t.numel() == 0:
        return (_mix_int(head) << 64) | _mix_int(head ^ 0x5A5A)
    bits = bit_view(t)
    words = bits.reshape(-1).to(torch.int64)
    if t.element_size() < 8:
        words = words & ((1 << (8 * bits.element_size())) - 1)
    index = torch.arange(words.numel(), device=words.device, dtype=torch.int64)
    lane1 = _splitmix(words ^ _splitmix(index * _GOLDEN + 1)).sum()
    lane2 = _splitmix(words * _M2 + _splitmix(index ^ _M1)).sum()
    low, high = (int(v) & 0xFFFFFFFFFFFFFFFF for v in torch.stack([lane1, lane2]).tolist())
    return (_mix_int(high ^ head) << 64) | _mix_int(low ^ _mix_int(head))


def float_bits(value: float) -> int:
    """The IEEE-754 double bit pattern of a Python float (so ``-0.0 != 0.0``)."""
    return _UNPACK_Q(_PACK_D(value))[0]


def bits_float(bits: int) -> float:
    """The float whose bit pattern :func:`float_bits` gave (to show a value that is gone)."""
    return struct.unpack("<d", struct.pack("<q", bits))[0]


#: compiled once: every float of every module attribute is read at every invocation
_PACK_D, _UNPACK_Q = struct.Struct("<d").pack, struct.Struct("<q").unpack


def host_memory(address: int, size: int) -> Any:
    """The ``size`` bytes of host memory at ``address`` as a ctypes array, read in place (no copy;
    ``.raw`` copies them into ``bytes``).  The caller keeps the memory alive while it reads."""
    array = _ARRAYS.get(size)
    if array is None:
        if len(_ARRAYS) >= _ARRAYS_SIZE:
            _ARRAYS.clear()
        array = _ARRAYS[size] = ctypes.c_char * size
    return array.from_address(address)


#: ``ctypes.c_char * size`` by size: ctypes keeps an array type only while something holds it,
#: and a type lives in a reference cycle, so after every garbage collection a reader that made
#: its own would build a new class (every saved tensor's digest, every RNG state read)
_ARRAYS: dict[int, Any] = {}
_ARRAYS_SIZE = 1024
