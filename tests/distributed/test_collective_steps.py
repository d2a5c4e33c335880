"""``check_step`` on a step that makes its own collectives over plain modules, in a real 2-rank
gloo world (scenario: ``fixtures/distributed/world_collective_step.py``).

Nothing the step reaches says that it spans ranks (no DDP, no DTensor, no pipeline object), yet
each further run of it makes collectives: a decision to run it again (in float64, to tell
rounding from a hazard) taken on one rank alone hung both.  A step that made a collective is
now agreed run by run by every rank.  A hang is a failure: the world has a timeout.
"""

from __future__ import annotations

import pytest
import torch
import world_collective_step

from recheck.distributed.launch import run_world

#: real torch.distributed worlds on spawned ranks
pytestmark = pytest.mark.slow

#: seconds the world may run before its ranks are killed (a normal run takes under 20 s)
WORLD_TIMEOUT = 120


def test_a_hazard_on_one_rank_of_a_step_averaging_its_own_gradients_completes_and_is_named_there():
    rank0, rank1 = run_world(world_collective_step.collective_step_world, 2, timeout=WORLD_TIMEOUT)
    assert ("rng", "cpu RNG") in rank1["findings"], rank1
    # rank 0's gradients differ through the average, with no cause of its own
    assert not any(kind == "rng" for kind, _ in rank0["findings"]), rank0
    assert not any("rerun" in note and "raised" in note for note in rank0["notes"] + rank1["notes"]), rank0["notes"]
    # a training step after the check keeps the replicas equal, as data parallelism does
    assert all(torch.equal(a, b) for a, b in zip(rank0["parameters"], rank1["parameters"]))
