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
from recheck.runtime.bits import digest as device_digest
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
