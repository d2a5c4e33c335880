"""Digests read a tensor's bytes in place and leave the tensor as it was."""

from __future__ import annotations

import torch

from recheck.runtime.digests import print_tensor


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
