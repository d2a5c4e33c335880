"""Training after ``check_step`` on a DistributedDataParallel model is the training without it, in a
real 2-rank gloo world (scenarios: ``fixtures/distributed/world_ddp_step.py``; each hazard under
DDP: ``test_matrix.py``).

Both the step as written and its twin run with DDP's gradient synchronisation off
(``no_sync()``), comparing each rank's local gradients; DDP's own bookkeeping (the buckets it
rebuilds in its first iterations, the buffers it broadcasts) is put back, never compared, and
training goes on with the ranks in step (a hang is a failure: the world has a timeout).
"""

from __future__ import annotations

import pytest
import world_ddp_step

from recheck.distributed.launch import run_world

#: real torch.distributed worlds on spawned ranks
pytestmark = pytest.mark.slow

#: seconds the world may run before its ranks are killed (a normal run takes under 10 s)
WORLD_TIMEOUT = 90


@pytest.mark.parametrize("scenario, warmup", [("clean", 0), ("norm", 1), ("norm", 2)])
def test_training_after_a_ddp_check_is_the_training_without_it(scenario, warmup):
    checked = run_world(world_ddp_step.ddp_step_world, 2, args=(scenario, warmup, True), timeout=WORLD_TIMEOUT)
    plain = run_world(world_ddp_step.ddp_step_world, 2, args=(scenario, warmup, False), timeout=WORLD_TIMEOUT)
    for rank, (outcome, reference) in enumerate(zip(checked, plain)):
        assert outcome["refusal"] is None and outcome["findings"] == [], (rank, outcome["findings"])
        assert all(a.equal(b) for a, b in zip(outcome["trained"], reference["trained"])), rank
        assert outcome["rebuilt"] == reference["rebuilt"], (rank, outcome["rebuilt"])
