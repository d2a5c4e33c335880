"""recheck.runtime.bits: bitwise comparison, tolerances and digests."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recheck.runtime import bits
from recheck.runtime.bits import Tolerance, bit_view, compare_tensors, digest


def test_identical_tensors_compare_equal():
    a = torch.randn(3, 4)
    assert compare_tensors(a, a.clone()) is None


def test_negative_zero_differs_from_zero():
    diff = compare_tensors(torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))
    assert diff is not None and diff.mismatched == 1
    assert diff.first_index == (0,)
    assert diff.first_original_bits == "0x00000000"
    assert diff.first_recomputed_bits == "0x80000000"


def test_nan_payloads_count_and_equal_nans_match():
    nan = torch.tensor([float("nan")])
    assert compare_tensors(nan, nan.clone()) is None
    other = nan.view(torch.int32).add(1).view(torch.float32)
    assert math.isnan(other.item())
    diff = compare_tensors(nan, other)
    assert diff is not None and diff.mismatched == 1


def test_first_and_greatest_difference_are_reported():
    a = torch.zeros(2, 3)
    b = a.clone()
    b[0, 2] = 0.5
    b[1, 1] = -2.0
    diff = compare_tensors(a, b)
    assert diff.mismatched == 2 and diff.numel == 6
    assert diff.first_index == (0, 2)
    assert diff.first_original == 0.0 and diff.first_recomputed == 0.5
    assert diff.max_abs_diff == 2.0 and diff.max_abs_index == (1, 1)
    text = str(diff)
    assert "2 / 6 elements differ bitwise" in text
    assert "first difference at index (0, 2)" in text
    assert "greatest absolute difference: 2.0 at index (1, 1)" in text


def test_metadata_differences_come_first():
    diff = compare_tensors(torch.zeros(2), torch.zeros(3))
    assert diff.metadata and "'shape'" in diff.metadata[0]
    diff = compare_tensors(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert "the values for attribute 'dtype' do not match" in diff.metadata[0]
    diff = compare_tensors(torch.zeros(2), torch.zeros(2).requires_grad_())
    assert "requires_grad" in diff.metadata[0]
    assert compare_tensors(torch.zeros(2), torch.zeros(2).requires_grad_(),
                           check_requires_grad=False) is None


def test_non_contiguous_complex_and_bool():
    a = torch.randn(4, 3)
    assert compare_tensors(a.t(), a.t().contiguous()) is None
    c = torch.randn(3, dtype=torch.complex64)
    d = c.clone()
    d[1] = d[1] + 1j
    diff = compare_tensors(c, d)
    assert diff.mismatched == 1 and diff.first_index == (1,)
    b = torch.tensor([True, False])
    assert compare_tensors(b, torch.tensor([True, True])).first_index == (1,)
    assert bit_view(b).dtype == torch.uint8


def test_integer_and_half_precision():
    assert compare_tensors(torch.arange(4), torch.arange(4)) is None
    diff = compare_tensors(torch.ones(2, dtype=torch.bfloat16), torch.full((2,), 2.0, dtype=torch.bfloat16))
    assert diff.mismatched == 2 and diff.first_original_bits == "0x3f80"


def test_tolerances():
    a = torch.tensor([1.0, 2.0])
    b = torch.nextafter(a, torch.tensor(math.inf))
    assert compare_tensors(a, b) is not None
    assert compare_tensors(a, b, tolerance=Tolerance(max_ulp=1)) is None
    assert compare_tensors(a, b + 1e-3, tolerance=Tolerance(max_ulp=1)) is not None
    assert compare_tensors(a, a + 1e-6, tolerance=Tolerance(atol=1e-5)) is None
    diff = compare_tensors(a, a + 1e-3, tolerance=Tolerance(atol=1e-5))
    assert diff is not None and "beyond tolerance" in str(diff)
    assert compare_tensors(a, a * 1.001, tolerance=Tolerance(rtol=1e-2)) is None
    with pytest.raises(ValueError):
        Tolerance(atol=-1.0)


def test_digest_is_exact_and_position_dependent():
    a = torch.arange(8, dtype=torch.float32)
    assert digest(a) == digest(a.clone())
    swapped = a.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert digest(swapped) != digest(a)
    assert digest(a) != digest(a.view(2, 4))
    assert digest(torch.tensor([0.0])) != digest(torch.tensor([-0.0]))
    assert digest(torch.zeros(2, 3).t()) == digest(torch.zeros(3, 2))
    assert digest(a) != digest(a + 1)
    assert digest(a) != digest(a.to(torch.int32).view(torch.float32))
    assert 0 <= digest(a) < 2 ** 128


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=16),
       st.data())
def test_single_bit_flip_is_always_found(values, data):
    a = torch.tensor(values, dtype=torch.float32)
    index = data.draw(st.integers(0, len(values) - 1))
    bit = data.draw(st.integers(0, 31))
    b = a.clone()
    b.view(torch.int32)[index] ^= (1 << bit) if bit < 31 else -(1 << 31)
    diff = compare_tensors(a, b)
    assert diff is not None and diff.mismatched == 1 and diff.first_index == (index,)
    assert digest(a) != digest(b)


def test_integer_state_under_a_tolerance_says_it_is_compared_exactly():
    # issue 14: "1 / 1 elements differ beyond tolerance (up to atol=1, rtol=1 allowed)" for an
    # int64 counter differing by 1 contradicted itself
    for tolerance in (Tolerance.of(atol=1, rtol=1), Tolerance.of(max_ulp=10**9)):
        diff = compare_tensors(torch.tensor(1), torch.tensor(2), tolerance=tolerance)
        text = str(diff)
        assert "integer values are compared exactly; the tolerance applies to floating-point values" in text
        assert "beyond tolerance" not in text
    floats = compare_tensors(torch.tensor([1.0]), torch.tensor([3.0]), tolerance=Tolerance.of(atol=1, rtol=0))
    assert "beyond tolerance (up to atol=1, rtol=0 allowed)" in str(floats)


def test_host_memory_reads_a_tensor_in_place_with_one_type_per_size():
    from recheck.runtime import bits

    t = torch.arange(12, dtype=torch.uint8)
    view = bits.host_memory(t.data_ptr(), t.numel())
    assert view.raw == bytes(t.tolist())
    t[0] = 99  # in place: no copy was made
    assert view.raw[0] == 99
    assert type(bits.host_memory(t.data_ptr(), 12)) is type(view)
    assert type(bits.host_memory(t.data_ptr(), 5)) is not type(view)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool,
          torch.complex64]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(1, 300), st.data())
def test_bits_equal_finds_every_single_bit_flip_in_place(dtype, length, data):
    # contiguous CPU tensors are compared with memcmp: a flip of any bit of any byte shows
    a = torch.randn(length, dtype=torch.float64).mul(7).to(dtype) if dtype is not torch.bool \
        else torch.rand(length) > 0.5
    b = a.clone()
    assert bits.bits_equal(a, b)
    raw = b.view(torch.uint8) if dtype is not torch.bool else b.view(torch.uint8)
    if dtype.is_complex:
        raw = torch.view_as_real(b).view(torch.uint8).reshape(-1)
    position = data.draw(st.integers(0, raw.numel() - 1))
    bit = data.draw(st.integers(0, 7))
    raw.view(-1)[position] ^= 1 << bit
    assert not bits.bits_equal(a, b) and not bits.bits_equal(b, a)
    assert bits.bits_equal(a, b) == torch.equal(bit_view(a), bit_view(b))


def test_bits_equal_counts_nan_payloads_and_negative_zero():
    nan = torch.tensor([float("nan")])
    other = nan.clone()
    other.view(torch.int32)[0] ^= 1
    assert bits.bits_equal(nan, nan.clone()) and not bits.bits_equal(nan, other)
    assert not bits.bits_equal(torch.tensor([0.0]), torch.tensor([-0.0]))


def test_bits_equal_reads_values_not_memory_where_the_two_differ():
    a = torch.randn(6)
    neg = torch._neg_view(a)  # memory of a, values of -a
    assert bits.bits_equal(neg, -a) and not bits.bits_equal(neg, a)
    c = torch.randn(4, dtype=torch.complex64)
    assert bits.bits_equal(c.conj(), c.conj().resolve_conj()) and not bits.bits_equal(c.conj(), c)
    t = torch.randn(3, 5)
    assert bits.bits_equal(t.t(), t.t().contiguous())
    assert bits.bits_equal(t[:, 1:], t.clone()[:, 1:]) and not bits.bits_equal(t[:, 1:], t[:, :4])
    empty = torch.empty(0, 3)
    assert bits.bits_equal(empty, empty.clone())


def test_bits_equal_never_reads_a_freed_storage():
    # FSDP frees a parameter's storage with resize_(0) and keeps its shape
    a = torch.randn(8)
    freed = a.clone()
    freed.untyped_storage().resize_(0)
    assert not bits.bits_equal(a, freed) and not bits.bits_equal(freed, a)
    assert bits.bits_equal(freed, freed)


def test_bits_equal_falls_back_for_tensor_subclasses():
    class Tagged(torch.Tensor):
        pass

    a = torch.randn(5)
    assert bits.bits_equal(a.as_subclass(Tagged), a.clone().as_subclass(Tagged))
    b = a.clone()
    b[2] += 1
    assert not bits.bits_equal(a.as_subclass(Tagged), b.as_subclass(Tagged))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.int64, torch.complex64])
def test_a_comparison_leaves_both_tensors_as_they_were(dtype):
    """The difference is worked out in double precision on copies: a float64 tensor is not
    the copy of itself that ``to(float64)`` would give."""
    a = torch.arange(6, dtype=torch.float64).reshape(2, 3).to(dtype)
    b = a.clone()
    b[1, 2] = 7
    before = (a.clone(), b.clone(), a._version, b._version)
    diff = compare_tensors(a, b)
    assert diff is not None and diff.first_index == (1, 2) and diff.max_abs_index == (1, 2)
    assert torch.equal(a, before[0]) and torch.equal(b, before[1]) and (a._version, b._version) == before[2:]


def test_the_ulp_distance_of_doubles_far_apart_is_not_wrapped():
    """Two doubles of opposite signs can be more than 2**63 ULPs apart: the distance is exact."""
    a, b = torch.tensor([1e308], dtype=torch.float64), torch.tensor([-1e308], dtype=torch.float64)
    magnitude = a.view(torch.int64).item()
    assert compare_tensors(a, b).first_ulp == 2 * magnitude > 2 ** 63
    assert compare_tensors(torch.tensor([1.0]), torch.tensor([-1.0])).first_ulp == 2 * 0x3F800000


def test_same_is_the_one_bitwise_equality_of_recorded_values():
    """``bits.same`` compares what a forward recorded with what its recompute recorded: two
    tensor prints byte for byte (or within a tolerance when both hold copies), a print never
    equals a plain value, and plain values by their print (the first item of their record)."""
    from recheck.runtime.digests import print_tensor

    a = torch.tensor([1.0, 2.0])
    nudged = torch.tensor([1.0, 2.0 + 2e-7])
    assert bits.same(print_tensor(a, "digest"), print_tensor(a.clone(), "digest"))
    assert not bits.same(print_tensor(a, "digest"), print_tensor(torch.tensor([0.0, -0.0]), "digest"))
    assert not bits.same(print_tensor(a, "copy"), print_tensor(nudged, "copy"))
    assert bits.same(print_tensor(a, "copy"), print_tensor(nudged, "copy"), Tolerance(rtol=1e-5, atol=0))
    assert not bits.same(print_tensor(a, "digest"), ("tensor", "shown"))
    assert bits.same((3, "3"), (3, "three"))
    assert not bits.same((3, "3"), (4, "3"))
