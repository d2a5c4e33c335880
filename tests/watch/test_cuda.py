"""watch() on CUDA: device RNG streams, digests computed on the device, BatchNorm buffers.

Skipped where no CUDA device is present (the project's CI machines have none); run on a
GPU machine with ``python -m pytest tests/watch/test_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
VARIANTS = pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])


def region_with_dropout():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.5), nn.GELU()).cuda()
    return block, torch.randn(16, 64, device="cuda", requires_grad=True)


@VARIANTS
def test_cuda_dropout_with_preserved_rng_is_clean(reentrant):
    block, x = region_with_dropout()
    with recheck.watch() as w:
        for _ in range(2):
            checkpoint(block, x, use_reentrant=reentrant).sum().backward()
    assert w.report.ok, str(w.report)
    assert w.report.stats["verified"] == 2


@VARIANTS
def test_cuda_dropout_without_preserved_rng_is_reported(reentrant):
    block, x = region_with_dropout()
    with recheck.watch(raise_on_finding=False, store="copy") as w:
        checkpoint(block, x, use_reentrant=reentrant, preserve_rng_state=False).sum().backward()
    assert "rng" in w.report.kinds, str(w.report)
    assert any(f.subject == "cuda:0 RNG" for f in w.report.by_kind("rng"))
    assert "recompute" in w.report.kinds


def test_cuda_batchnorm_statistics_updated_twice():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU()).cuda()
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(block, x, use_reentrant=False).sum().backward()
    assert w.report.kinds == {"buffer"}, str(w.report)
