"""Nested checkpoints (timm's MetaFormer: each stage checkpoints its blocks, the model its stages).

A checkpoint call made inside a reentrant checkpoint's forward runs under that forward's
``no_grad`` and is never recomputed itself: the outer recompute makes it again.  A call made
during any recompute is the call the forward made at the same place, made again.  watch()
compares each such run with that call's forward, so every invocation is verified (before:
10 calls, 6 verified, 4 counted "without grad" in the reentrant fixture; 8 calls, 6 verified,
2 "never recomputed" in the non-reentrant one).
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest
import torch
from source_modules import load_file
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck

NESTED = Path(__file__).resolve().parents[2] / "fixtures" / "twins" / "nested_checkpoint.py"


def watched(step):
    with warnings.catch_warnings(), recheck.watch(raise_on_finding=False) as w:
        warnings.simplefilter("ignore")  # reentrant checkpoints whose inputs need no grad warn
        step()
    return w.report


@pytest.mark.parametrize(("outer", "inner", "invocations", "replaced", "made_again"), [
    (True, True, 10, 4, 4),
    (True, False, 10, 4, 4),
    (False, False, 8, 0, 2),  # early stop ends the outer recompute before its last two calls ran
    (False, True, 10, 0, 4),
])
def test_every_nested_invocation_is_verified(outer, inner, invocations, replaced, made_again):
    step, _ = load_file(NESTED, "recheck_twins_nested_checkpoint").make_step(outer, inner)
    report = watched(step)
    stats = report.stats
    assert report.ok, str(report)
    assert stats["invocations"] == stats["verified"] == invocations, stats
    assert (stats["replaced"], stats["made_again"]) == (replaced, made_again), stats
    assert stats["without_grad"] == stats["never_recomputed"] == 0, stats
    if replaced:
        assert any(f"{replaced} checkpoint call(s) were made inside a reentrant checkpoint's forward" in note
                   for note in report.notes), report.notes


class lucky_block(nn.Module):
    """Draws from Python's random (which no checkpoint restores)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * random.random()


def test_a_hazard_inside_a_replaced_call_is_found_where_it_is():
    blocks = nn.ModuleList([lucky_block(), nn.Linear(4, 4)])

    def stage(x):
        return blocks[1](checkpoint(blocks[0], x, use_reentrant=True))

    x = torch.randn(2, 4, requires_grad=True)
    report = watched(lambda: checkpoint(stage, x, use_reentrant=True).sum().backward())
    rng = report.by_kind("rng")
    assert {f.subject for f in rng} == {"Python random"}, str(report)
    assert {f.region.split(" ")[0].rsplit(".", 1)[-1] for f in rng} == {"stage", "forward"}, str(report)


def test_a_call_not_made_again_at_the_same_place_is_not_matched():
    blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
    calls = []

    def stage(x):  # its recompute takes another branch: the inner call is another region
        calls.append(1)
        inner = blocks[0] if len(calls) == 1 else blocks[1]
        return checkpoint(inner, x, use_reentrant=False)

    x = torch.randn(2, 4, requires_grad=True)
    report = watched(lambda: checkpoint(stage, x, use_reentrant=True).sum().backward())
    assert report.stats["made_again"] == 0, report.stats
    assert report.stats["replaced"] == 1
