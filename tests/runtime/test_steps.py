"""``runtime.steps``: a restored training loop is, printed, the loop as it was (check_step compares it)."""

from __future__ import annotations

import torch

import recheck
from recheck.runtime.steps import discover_state

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
#: a module-global optimizer, as training scripts write it: check_step reaches it as a global
OPTIMIZER = torch.optim.AdamW(MODEL.parameters(), lr=1e-3)
DATA = torch.randn(3, 4)


def step():
    out = torch.utils.checkpoint.checkpoint(MODEL, DATA, use_reentrant=False)
    out.pow(2).mean().backward()
    OPTIMIZER.step()
    OPTIMIZER.zero_grad(set_to_none=True)


step()  # Adam's state exists, as past a training loop's first step


def test_restored_optimizer_keeps_its_param_groups_key_order_and_shared_objects():
    before = [list(group) for group in OPTIMIZER.param_groups]
    betas = OPTIMIZER.param_groups[0]["betas"]
    restore = discover_state(step).loop_snapshot()
    step()
    restore()
    assert [list(group) for group in OPTIMIZER.param_groups] == before  # load_state_dict puts "params" last
    assert OPTIMIZER.param_groups[0]["betas"] is betas  # the tuple ``defaults`` holds too


def test_check_step_of_a_step_with_a_module_global_adamw_finds_nothing():
    # the optimizer printed as a global differed between the first run (the original object)
    # and the second (restored): key order and the betas tuple's identity
    report = recheck.check_step(step)
    assert report.ok, str(report)
