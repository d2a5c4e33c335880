"""recheck.check_step() inside watch() blocks (a test ``pytest --recheck`` watches): the check
takes the interception over for its length and the blocks go on after it (issue 40, item 13)."""

from __future__ import annotations

import logging
import sys

import torch
from torch.utils.checkpoint import checkpoint

import recheck
from recheck.intercept import patches


def test_blocks_set_aside_for_a_check_step_resume_with_their_pending_calls():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
    x = torch.ones(2, 3, requires_grad=True)

    def step():
        model.zero_grad()
        checkpoint(model, x, use_reentrant=False).sum().backward()

    original = torch.utils.checkpoint.checkpoint
    stdout, info = sys.stdout, logging.Logger.__dict__["info"]
    with recheck.watch(raise_on_finding=False) as outer:
        with recheck.watch(raise_on_finding=False) as inner:
            pending = checkpoint(model, torch.ones(2, 3, requires_grad=True), use_reentrant=False)
            report = recheck.check_step(step)
            assert report.ok, report
            assert patches.installed() is not None  # taken back
            pending.sum().backward()  # a call made before the check, recomputed after it
            checkpoint(model, torch.ones(2, 3, requires_grad=True), use_reentrant=False).sum().backward()
    for block in (outer, inner):
        assert block.report.ok and block.report.stats["invocations"] == 2, block.report
        assert block.report.stats["verified"] == 2
        assert any("recheck.check_step() ran inside this block" in note for note in block.report.notes)
    assert patches.installed() is None and torch.utils.checkpoint.checkpoint is original
    assert sys.stdout is stdout and logging.Logger.__dict__["info"] is info


def test_a_check_step_refused_inside_a_forward_leaves_the_block_as_it_was():
    refused = []

    def region(t):
        try:
            recheck.check_step(lambda: None)
        except RuntimeError as exc:
            refused.append(str(exc))
        return t.sin()

    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(region, torch.ones(2, requires_grad=True), use_reentrant=False).sum().backward()
    assert len(refused) == 2 and all("already intercepted" in text for text in refused)  # forward, recompute
    assert w.report.stats["invocations"] == 1 and patches.installed() is None
