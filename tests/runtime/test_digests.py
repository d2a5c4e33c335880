"""Digests are exact (every byte in order counts, for every hash recheck may use) and read a
tensor's bytes in place, leaving the tensor as it was."""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recheck.runtime import digests
from recheck.runtime.bits import bit_view, digest as device_digest
from recheck.runtime.digests import print_tensor

HASHERS = [hashlib.sha256]
try:
    import xxhash

    HASHERS.append(xxhash.xxh3_128)
except ImportError:  # pragma: no cover - xxhash comes with recheck[torch]
    pass


@pytest.fixture(params=HASHERS, ids=lambda h: h.__name__)
def hasher(request, monkeypatch):
    monkeypatch.setattr(digests, "_HASHER", request.param)
    return request.param


def _cpu(t: torch.Tensor) -> int:
    return print_tensor(t, "digest").digest


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.bool]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), size=st.integers(1, 300), position=st.integers(0, 10_000),
       bit=st.integers(0, 63), seed=st.integers(0, 2**16))
def test_a_one_bit_flip_anywhere_changes_every_digest(dtype, size, position, bit, seed):
    generator = torch.Generator().manual_seed(seed)
    t = torch.randint(0, 100, (size,), generator=generator).to(dtype)
    flipped = t.clone()
    raw = flipped.view(torch.uint8)
    index = position % raw.numel()
    raw[index] ^= 1 << (bit % (1 if dtype is torch.bool else 8))
    try:
        for hasher in HASHERS:
            digests._HASHER = hasher
            assert _cpu(t) != _cpu(flipped), (hasher, dtype, index)
    finally:
        digests._HASHER = digests._hasher()
    assert device_digest(t) != device_digest(flipped)


def test_nan_payloads_and_negative_zero_count(hasher):
    quiet = struct.unpack("<f", struct.pack("<I", 0x7FC00000))[0]
    payload = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    nan = torch.tensor([quiet])
    assert _cpu(nan) != _cpu(payload) and device_digest(nan) != device_digest(payload)
    assert _cpu(torch.tensor([0.0])) != _cpu(torch.tensor([-0.0]))


def test_position_shape_and_dtype_count(hasher):
    t = torch.arange(6, dtype=torch.float32)
    assert _cpu(t) != _cpu(t.flip(0))
    assert _cpu(t) != _cpu(t.reshape(2, 3))
    assert _cpu(t) != _cpu(t.view(torch.int32))
    assert _cpu(t.reshape(2, 3).t()) == _cpu(t.reshape(2, 3).t().contiguous())  # row-major bytes


def test_the_digest_in_use_is_named():
    assert digests.DIGEST_NAME in ("xxh3-128", "sha256")


def test_a_digest_leaves_the_storage_resizable():
    # Tensor.numpy() would mark the storage as not resizable for good; Megatron's
    # CheckpointWithoutOutput frees an output's storage with resize_(0) after it was digested
    tensor = torch.randn(4, 8)
    print_tensor(tensor, "digest")
    print_tensor(tensor[:, ::2], "digest")
    tensor.untyped_storage().resize_(0)
    assert tensor.untyped_storage().size() == 0


def test_the_digest_is_of_the_row_major_bytes():
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert print_tensor(tensor.t(), "digest").same(print_tensor(tensor.t().contiguous(), "digest"))
    assert not print_tensor(tensor, "digest").same(print_tensor(tensor.t().contiguous(), "digest"))
    assert print_tensor(-tensor, "digest").same(print_tensor(tensor.neg().resolve_neg(), "digest"))


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_a_saved_tensor_is_hashed_where_it_lies_and_equal_values_print_alike(shape, data):
    from recheck.runtime.digests import memory_order, print_saved

    permutation = data.draw(st.permutations(range(len(shape))))
    base = torch.randn(*shape)
    lying = base.permute(permutation)  # dense, in another order of dimensions (attention's keys)
    forward = print_saved(lying, "digest")
    assert forward.order == (None if lying.is_contiguous() else memory_order(lying))
    # the recompute prints in the forward's order: equal values are equal prints, however laid out
    for again in (lying.clone(), lying.contiguous(), lying.clone(memory_format=torch.preserve_format)):
        assert forward.same(print_tensor(again, "digest", forward.order))
    # one bit of one element flipped, anywhere, is found
    flipped = lying.contiguous()
    raw = flipped.view(torch.int32).view(-1)
    index = data.draw(st.integers(0, raw.numel() - 1))
    raw[index] ^= 1 << data.draw(st.integers(0, 31))
    assert not forward.same(print_tensor(flipped, "digest", forward.order))


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.integers(0, 4), min_size=1, max_size=4), data=st.data())
def test_memory_order_follows_torchs_own_rule_of_contiguity(shape, data):
    from recheck.runtime.digests import memory_order

    # a permuted, sliced or broadcast view: gaps, overlaps, sizes 0 and 1 (any stride)
    tensor = torch.randn(*shape).permute(data.draw(st.permutations(range(len(shape)))))
    dim = data.draw(st.integers(0, len(shape) - 1))
    kind = data.draw(st.sampled_from(["as is", "step", "expand", "narrow"]))
    if kind == "step":
        tensor = tensor[(slice(None),) * dim + (slice(None, None, 2),)]
    elif kind == "expand" and tensor.shape[dim] == 1:
        tensor = tensor.expand(*[3 if d == dim else -1 for d in range(tensor.dim())])
    elif kind == "narrow" and tensor.shape[dim] > 1:
        tensor = tensor.narrow(dim, 1, tensor.shape[dim] - 1)
    strides = tensor.stride()
    expected = tuple(sorted(range(len(strides)), key=strides.__getitem__, reverse=True))
    lies = tensor.permute(expected).is_contiguous()
    assert memory_order(tensor) == (expected if lies else None)
    if lies and tensor.numel():  # read in place: the same print as through a row-major copy
        copied = tensor.permute(expected).contiguous()
        assert print_tensor(tensor, "digest", expected).digest == \
            digests._cpu_digest(copied, tuple(copied.shape), expected)
    # row-major, gaps or not: the bits of a row-major copy
    assert print_tensor(tensor, "digest").digest == digests._cpu_digest(bit_view(tensor).view(tensor.dtype))


def test_an_order_is_part_of_what_is_hashed():
    from recheck.runtime.digests import memory_order, print_saved

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    assert memory_order(t) == (1, 0)
    in_order = print_tensor(t, "digest", (1, 0))
    assert not in_order.same(print_tensor(t, "digest"))  # another order: another print
    assert not in_order.same(print_tensor(t.contiguous().t().contiguous(), "digest"))
    # NaN payloads and -0.0 still count
    z = torch.tensor([[0.0, 1.0], [2.0, 3.0]]).t()
    neg = z.clone()
    neg[0, 0] = -0.0
    assert not print_saved(z, "digest").same(print_tensor(neg, "digest", memory_order(z)))
    # gaps, overlaps and broadcast dimensions are hashed row-major (through a copy), as before
    assert memory_order(torch.randn(4, 4)[:, ::2]) is None
    assert memory_order(torch.randn(3).expand(2, 3)) is None
    assert print_saved(torch.randn(3).expand(2, 3), "digest").order is None


def test_a_saved_tensor_is_printed_as_it_was_saved_without_recording_autograd_history():
    from recheck.runtime.digests import memory_order, print_saved

    from torch.overrides import TorchFunctionMode

    class History(TorchFunctionMode):
        """The ops that made a tensor with autograd history."""

        def __init__(self) -> None:
            super().__init__()
            self.made: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if isinstance(result, torch.Tensor) and result.grad_fn is not None:
                self.made.append(getattr(func, "__name__", str(func)))
            return result

    leaf = torch.randn(3, 4, requires_grad=True)
    activation = (leaf * 2).t()  # a non-contiguous view with a grad_fn, as a pack hook gets it
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t), History() as history:
        order = memory_order(activation)
        printed = print_saved(activation, "digest")
        again = print_tensor(activation, "digest", order, saved=True)
        row_major = print_tensor(activation, "digest", saved=True)  # through a row-major copy
        copied = print_tensor(activation, "copy", order, saved=True)
    assert history.made == [] and packed == []  # no autograd history, nothing saved for backward
    assert row_major.order is None and not row_major.requires_grad
    assert printed.same(again) and printed.digest == print_tensor(activation.detach(), "digest", order).digest
    assert not printed.requires_grad and not again.requires_grad and not copied.requires_grad
    assert print_tensor(activation, "digest").requires_grad  # a tensor that was not saved says it


def test_a_saved_parameter_view_is_its_identity_and_version_and_any_other_tensor_its_bytes():
    from recheck.runtime.digests import print_saved

    weight = torch.nn.Parameter(torch.randn(2, 3))
    view = weight.t()
    by_identity = print_saved(view, "digest", weight)
    assert by_identity.version == weight._version and not by_identity.requires_grad
    with torch.no_grad():
        weight.add_(1)
    assert not by_identity.same(print_saved(view, "digest", weight))
    # without the parameter it views (not a compared module's), the bytes are printed
    assert print_saved(view, "digest").version is None


def test_a_parameter_view_is_equal_exactly_where_its_print_is():
    """A recompute compares ``parameter_view`` tuples, and prints only where they differ."""
    from recheck.runtime.digests import parameter_print_of, parameter_view, print_saved

    weight, other = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(4, 3))
    views = [lambda w: w, lambda w: w.t(), lambda w: w[1:], lambda w: w[:3], lambda w: w.view(3, 4)]
    for make in views:
        for again in views:
            for owner in (weight, other):
                first, second = parameter_view(make(weight), weight), parameter_view(again(owner), owner)
                assert parameter_print_of(first) == print_saved(make(weight), "digest", weight)
                assert (first == second) == parameter_print_of(first).same(parameter_print_of(second))
    before = parameter_view(weight.t(), weight)
    with torch.no_grad():
        weight.mul_(1.0)  # the same values, a new version
    assert parameter_view(weight.t(), weight) != before
    # a buffer or a frozen parameter is printed by its bytes
    assert parameter_view(weight, torch.randn(4, 3)) is None and parameter_view(weight, None) is None
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    assert parameter_view(frozen, frozen) is None


@settings(max_examples=120, deadline=None)
@given(shape=st.lists(st.integers(0, 4), max_size=3),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.bool,
                              torch.complex64, torch.uint8]),
       view=st.sampled_from(["as is", "neg", "transposed", "sliced", "permuted", "expanded", "gapped", "strided"]))
def test_the_planned_print_is_the_general_print_or_declines(shape, dtype, view):
    from recheck.runtime.digests import memory_order, planned_digest, planned_print_of

    tensor = (torch.randn(tuple(shape)) * 10).to(dtype)
    if view == "neg" and dtype.is_floating_point:
        tensor = torch._neg_view(tensor)
    elif view == "transposed" and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)
    elif view == "sliced" and tensor.dim() >= 1 and tensor.shape[0] > 1:
        tensor = tensor[1:]
    elif view == "permuted" and tensor.dim() == 3:
        tensor = tensor.permute(2, 0, 1)
    elif view == "expanded" and tensor.dim() >= 1 and tensor.shape[0] == 1:
        tensor = tensor.expand(3, *tensor.shape[1:])
    elif view == "gapped" and tensor.dim() >= 1 and tensor.shape[-1] > 1:
        tensor = tensor[..., : tensor.shape[-1] // 2]  # attention's q of one projection: gaps between rows
    elif view == "strided" and tensor.dim() >= 1:
        tensor = tensor[..., ::2]
    order = None if tensor.is_contiguous() else memory_order(tensor)
    for _ in range(2):  # the layout's plan made, then found
        found = planned_digest(tensor)  # what a recompute compares, without a print
        fast = None if found is None else planned_print_of(found)  # what a forward keeps
        if fast is not None:
            assert fast.order == order
            assert fast == print_tensor(tensor, "digest", order, saved=True)  # every field
            assert found == (fast.shape, fast.dtype, fast.digest, fast.order)
        else:
            assert found is None  # declined: a negative view, no integer view of its width
            assert tensor.is_neg() or dtype.is_complex


@settings(max_examples=120, deadline=None)
@given(shape=st.lists(st.integers(0, 4), max_size=3),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.float64, torch.int64, torch.bool, torch.complex64]),
       view=st.sampled_from(["as is", "neg", "transposed", "gapped", "expanded"]), requires_grad=st.booleans(),
       store=st.sampled_from(["digest", "copy"]))
def test_a_buffer_is_printed_as_print_tensor_prints_it(shape, dtype, view, requires_grad, store):
    """``print_buffer`` takes the planned digest's way where it can and gives the same print, every field."""
    from recheck.runtime.digests import print_buffer

    tensor = (torch.randn(tuple(shape)) * 10).to(dtype)
    if view == "neg" and dtype.is_floating_point:
        tensor = torch._neg_view(tensor)
    elif view == "transposed" and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)
    elif view == "gapped" and tensor.dim() >= 1 and tensor.shape[-1] > 1:
        tensor = tensor[..., : tensor.shape[-1] // 2]
    elif view == "expanded" and tensor.dim() >= 1 and tensor.shape[0] == 1:
        tensor = tensor.expand(3, *tensor.shape[1:])
    if requires_grad and (dtype.is_floating_point or dtype.is_complex) and view != "neg":
        tensor = tensor.detach().requires_grad_()
    for _ in range(2):  # the layout's plan made, then found
        made, general = print_buffer(tensor, store), print_tensor(tensor, store)
        if store == "copy":
            assert made.copy is not None and torch.equal(made.copy, general.copy)
            made.copy = general.copy = None
        assert made == general


def test_a_view_with_gaps_is_printed_by_its_own_elements_only():
    """q, k and v sliced from one projection: read through a row-major copy of their elements,
    so what lies in the gaps (the other two) does not count, and every element does."""
    from recheck.runtime.digests import planned_digest

    qkv = torch.randn(8, 17, 3, 2, 32)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous() and planned_digest(q)[3] is None
    before = [planned_digest(t) for t in (q, k, v)]
    assert len({b[2] for b in before}) == 3
    assert planned_digest(q.contiguous()) == before[0]  # its row-major bytes: as laid out densely
    k.add_(1)  # in the gaps between q's rows
    assert planned_digest(q) == before[0] and planned_digest(k) != before[1]
    v[7, 1, 16, 31] += 1  # its last element
    assert planned_digest(v) != before[2]


def test_the_in_place_fast_print_declines_a_tensor_subclass():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from recheck.runtime.digests import planned_digest

    class Tagged(torch.Tensor):
        pass

    assert planned_digest(torch.randn(3).as_subclass(Tagged)) is None
    assert planned_digest(torch.nn.Parameter(torch.randn(3))) is None
    with FakeTensorMode():
        fake = torch.randn(3)
    assert planned_digest(fake) is None
    assert print_tensor(fake, "digest", saved=True).unreadable  # the general path: metadata only


def test_a_tensor_whose_storage_was_freed_is_printed_by_its_metadata():
    # Megatron's CheckpointWithoutOutput and FSDP free a storage with resize_(0): the data
    # pointer is then null, and reading the bytes there would crash the process
    from recheck.runtime.digests import planned_digest, print_saved

    base = torch.randn(5, 8)
    # the whole tensor (a null data pointer), a view at an offset (the offset's pointer) and a
    # view with gaps (which a copy would read): none is read
    views = [base, base[1:], base[1:, :3], base.t()]
    base.untyped_storage().resize_(0)
    for tensor in views:
        assert planned_digest(tensor) is None
        for printed in (print_saved(tensor, "digest"), print_tensor(tensor, "digest"), print_tensor(tensor, "copy")):
            assert printed.unreadable and "no bytes" in printed.unreadable and printed.shape == tuple(tensor.shape)


def test_the_print_of_a_saved_parameter_sets_every_slot_as_the_constructor_does():
    # made without ``__init__``: no slot may be left unset or set otherwise
    from recheck.runtime.digests import TensorPrint, print_saved

    weight = torch.nn.Parameter(torch.randn(2, 3))
    for view in (weight, weight.t(), weight[1:]):
        printed = print_saved(view, "digest", weight)
        made = TensorPrint(tuple(view.shape), view.dtype, "cpu", printed.digest, None, False, None, weight._version)
        assert all(getattr(printed, slot) == getattr(made, slot) for slot in TensorPrint.__slots__)
        assert printed == made


def test_a_tensor_digest_is_the_cpu_prints_digest_on_the_cpu_and_the_device_digest_elsewhere():
    from recheck.runtime.fingerprints import fingerprint

    t = torch.randn(4, 3)
    assert digests.tensor_digest(t) == _cpu(t)
    assert digests.tensor_digest(t.t()) == _cpu(t.t().contiguous())  # a view: its row-major bytes
    assert digests.tensor_digest(torch.nn.Parameter(t.clone())) == _cpu(t)
    meta = torch.empty(3, device="meta")  # no bytes on the CPU to read
    assert digests.tensor_digest(meta) == device_digest(meta)
    # what a global's or an attribute's print holds of a tensor (a global optimizer's moments)
    assert fingerprint(t)[-1] == digests.tensor_digest(t)
    flipped = t.clone()
    flipped.view(torch.int32)[2, 1] ^= 1
    assert fingerprint(flipped) != fingerprint(t)


def test_a_wrapper_subclass_is_digested_by_the_tensors_it_wraps():
    """A subclass that wraps others (FSDP2's DTensor; here torch's TwoTensor) has no bytes of its
    own: it is digested by each tensor ``__tensor_flatten__`` names, in order."""
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    a, b = torch.randn(3, 2), torch.randn(3, 2)
    wrapped = two_tensor.TwoTensor(a, b)
    assert digests.tensor_digest(wrapped) == digests.tensor_digest(two_tensor.TwoTensor(a.clone(), b.clone()))
    assert digests.tensor_digest(torch.nn.Parameter(wrapped)) == digests.tensor_digest(wrapped)
    for inner in (a, b):
        flipped = inner.clone()
        flipped.view(torch.int32)[1, 0] ^= 1
        other = two_tensor.TwoTensor(flipped, b) if inner is a else two_tensor.TwoTensor(a, flipped)
        assert digests.tensor_digest(other) != digests.tensor_digest(wrapped)
    assert digests.tensor_digest(two_tensor.TwoTensor(b, a)) != digests.tensor_digest(wrapped)  # in order
