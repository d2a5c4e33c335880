"""What check() says of saved tensors that differ (``recheck.checker.compare``)."""

import torch

from recheck.checker.compare import Context, saved_tensor_findings
from recheck.findings import Invocation


def _context():
    return Context(region="block", invocation=Invocation(index=1, of=1), tolerance=None,
                   use_reentrant=False, preserve_rng_state=True)


def test_a_difference_with_the_forwards_bytes_shows_the_first_differing_element():
    forward, recomputed = torch.zeros(2, 3), torch.zeros(2, 3)
    recomputed[1, 2] = -0.0
    [finding] = saved_tensor_findings(_context(), [(1, forward, recomputed, 0), (4, forward, recomputed, 0)], 6)
    assert "first difference at index (1, 2)" in finding.detail and "also differ: saved tensor #4" in finding.detail


def test_equal_bytes_and_module_buffers_say_nothing():
    forward = torch.randn(4)
    assert saved_tensor_findings(_context(), [(1, forward, forward.clone(), 0)], 1) == []
    assert saved_tensor_findings(_context(), [(1, forward, forward + 1, 77)], 1, skip_storages=frozenset({77})) == []
