"""A parameter FSDP2 gathers anew between forward and recompute, under ``watch()``.

With ``reshard_after_forward=True`` FSDP2 frees each unsharded parameter's storage after the
forward and all-gathers it again before the recompute: the same ``nn.Parameter`` then lies
at another address, possibly one that another parameter of the region had at forward.  A
saved parameter is told by the parameter's identity and version, so this is no difference.
The regather is done here by hand, in one process, with the two addresses swapped (what the
allocator does now and then under FSDP2, which made the finding intermittent).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import recheck


def _regathered_swapped(first: nn.Parameter, second: nn.Parameter) -> None:
    """Each parameter's values again, in the storage the other one had: FSDP2's free and
    all-gather, with the allocator handing the addresses out the other way round."""
    values_first, values_second = first.detach().clone(), second.detach().clone()
    storage_first, storage_second = first.untyped_storage(), second.untyped_storage()
    moved_first = torch.empty(0).set_(storage_second, 0, values_first.shape, values_first.stride())
    moved_second = torch.empty(0).set_(storage_first, 0, values_second.shape, values_second.stride())
    moved_first.copy_(values_first)
    moved_second.copy_(values_second)
    first.data, second.data = moved_first, moved_second


def test_parameters_gathered_again_at_each_others_addresses_are_no_difference():
    torch.manual_seed(0)
    inner, outer = nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False)
    x = torch.randn(4, 16, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        y = checkpoint(lambda t: torch.tanh(outer(torch.tanh(inner(t)))), x, use_reentrant=False)
        before = (inner.weight.data_ptr(), outer.weight.data_ptr())
        _regathered_swapped(inner.weight, outer.weight)
        assert (outer.weight.data_ptr(), inner.weight.data_ptr()) == before
        y.sum().backward()
    assert w.report.ok, str(w.report)
    assert w.report.stats["verified"] == 1


def test_a_parameter_changed_before_the_recompute_is_still_found():
    torch.manual_seed(0)
    inner, outer = nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False)
    x = torch.randn(4, 16, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        y = checkpoint(lambda t: torch.tanh(outer(torch.tanh(inner(t)))), x, use_reentrant=False)
        _regathered_swapped(inner.weight, outer.weight)
        with torch.no_grad():
            inner.weight.mul_(2.0)  # an optimizer step between forward and recompute
        y.sum().backward()
    assert not w.report.ok
