"""A failed recompute's cause is read from evidence in state, never from the wording of torch's error.

Selective checkpointing under autocast with its weight cache (``fixtures/twins/sac_autocast_cache.py``)
fails because the recompute casts a weight the forward took from the cache: the failing dispatch
mode (its storage of what the forward recorded, the cast and its tensor) and the forward's context
(autocast on, its cache on) say so.  An error that merely reads like that one, or a storage miss of
another cast, is not put down to autocast's cache.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import recheck

CACHE = "autocast's weight cache"


def _notes(step) -> list[str]:
    with pytest.raises(RuntimeError) as raised:
        with warnings.catch_warnings(), recheck.watch(raise_on_finding=False):
            warnings.simplefilter("ignore")
            step()
    return getattr(raised.value, "__notes__", [])


class _Flip(nn.Module):
    """A layer whose recompute does what its forward did not, once ``recomputing`` is set."""

    recomputing = False

    def __init__(self, cast: bool) -> None:
        super().__init__()
        self.scale, self.cast = nn.Parameter(torch.ones(4)), cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _Flip.recomputing:  # (first: early stop ends the recompute at its last saved tensor)
            if not self.cast:  # the region's own error, worded as selective checkpointing words a miss
                raise RuntimeError("aten._to_copy.default encountered during backward but not found in storage.")
            x = x.to(torch.float64).to(x.dtype)  # a cast of an activation the forward never made
        return torch.tanh(x) * self.scale  # (ops autocast does not cast)


def _saving_nothing(ctx, op, *args, **kwargs):
    return CheckpointPolicy.PREFER_RECOMPUTE


def _step(cast: bool):
    torch.manual_seed(0)
    layer, x = _Flip(cast), torch.randn(2, 4, requires_grad=True)
    context_fn = functools.partial(create_selective_checkpoint_contexts, _saving_nothing)

    def step():
        _Flip.recomputing = False
        with torch.autocast("cpu", dtype=torch.bfloat16):  # its cache on, as by default
            out = checkpoint(layer, x * 2, use_reentrant=False, context_fn=context_fn)
        _Flip.recomputing = True
        try:
            out.float().sum().backward()
        finally:
            _Flip.recomputing = False

    return step


@pytest.mark.parametrize("cast", [False, True], ids=["error worded like a miss", "miss of an activation's cast"])
def test_a_failure_that_only_reads_like_the_autocast_cache_s_is_not_put_down_to_it(cast):
    notes = _notes(_step(cast))
    assert notes and "in _Flip.forward (" in notes[0], notes
    assert CACHE not in notes[0], notes[0]
