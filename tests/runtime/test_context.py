"""The context a region computes in, read and compared in one place for every face."""

from __future__ import annotations

import torch

from recheck.runtime.context import AUTOCAST_DEVICE_TYPES, context_differences, current_context


def test_reads_grad_mode_autocast_per_device_type_and_default_dtype():
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        now = current_context()
    assert not now.grad_enabled
    assert now.autocast_of("cpu") == (True, torch.float16)
    assert now.autocast_of("cuda") == (False, None)
    assert now.default_dtype == torch.float32
    assert {"cpu", "cuda"} <= set(AUTOCAST_DEVICE_TYPES)


def test_the_grad_mode_at_the_checkpoint_call_stands_for_the_forward_s():
    with torch.no_grad():  # a reentrant forward, or an autograd.Function's, runs under no_grad
        assert current_context(grad_enabled=True).grad_enabled


def test_each_difference_is_one_subject_with_both_values():
    with torch.autocast("cpu", dtype=torch.float16):
        forward = current_context()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            recompute = current_context()
    finally:
        torch.set_default_dtype(torch.float32)
    found = {subject: message for subject, message, _ in context_differences(forward, recompute)}
    assert found == {
        "grad mode": "grad mode was on at forward and off at recompute",
        "autocast `cpu`": "autocast `cpu` was enabled (float16) at forward and enabled (bfloat16) at recompute",
        "default dtype": "default dtype was float32 at forward and float64 at recompute",
    }
    assert "grad mode" not in {s for s, _, _ in context_differences(forward, recompute, compare_grad=False)}


def test_a_disabled_autocast_s_dtype_does_not_matter():
    with torch.autocast("cpu", dtype=torch.float16, enabled=False):
        forward = current_context()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        recompute = current_context()
    assert context_differences(forward, recompute) == []
