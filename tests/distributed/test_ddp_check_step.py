"""``check_step`` on DistributedDataParallel models in a real 2-rank gloo world (scenarios:
``fixtures/distributed/world_ddp_step.py``).

Both the step as written and its twin run with DDP's gradient synchronisation off
(``no_sync()``), comparing each rank's local gradients; DDP's own bookkeeping is not compared.
A ``static_graph`` DDP, whose C++ reducer state cannot be put back, is refused before anything
runs.  Every case: training state after the check equals the state before, and training goes on
with the ranks in step (a hang is a failure: the world has a timeout).
"""

from __future__ import annotations

import pytest
import world_ddp_step

from recheck.distributed.launch import run_world

#: real torch.distributed worlds on spawned ranks
pytestmark = pytest.mark.slow

#: seconds the world may run before its ranks are killed (a normal run takes under 10 s)
WORLD_TIMEOUT = 90


def world(scenario: str) -> list[dict]:
    return run_world(world_ddp_step.ddp_step_world, 2, args=(scenario,), timeout=WORLD_TIMEOUT)


def test_a_clean_ddp_step_checked_on_its_very_first_iteration_gives_nothing():
    for rank, outcome in enumerate(world("clean")):
        assert outcome["refusal"] is None, (rank, outcome)
        assert outcome["findings"] == [], (rank, outcome)
        assert outcome["unchanged"] and outcome["in_step"], (rank, outcome)


def test_dropout_without_rng_preservation_under_ddp_is_found_on_every_rank():
    for rank, outcome in enumerate(world("dropout")):
        kinds = {kind for kind, _ in outcome["findings"]}
        assert {"rng", "recompute"} <= kinds, (rank, outcome)
        assert not any("_has_rebuilt_buckets" in str(subject) or "_module_parameters" in str(subject)
                       for _, subject in outcome["findings"]), (rank, outcome)
        assert outcome["unchanged"] and outcome["in_step"], (rank, outcome)


def test_static_graph_ddp_is_refused_up_front_and_training_goes_on():
    for rank, outcome in enumerate(world("static_graph")):
        refusal = outcome["refusal"]
        assert refusal is not None, (rank, outcome)
        assert "static_graph=True" in refusal and "`model`" in refusal and "unwrapped module" in refusal, refusal
        assert outcome["unchanged"] and outcome["in_step"], (rank, outcome)


def test_a_block_shared_across_reentrant_checkpoints_under_ddp_is_clean_and_left_as_it_was():
    for rank, outcome in enumerate(world("shared_reentrant")):
        assert outcome["refusal"] is None and outcome["findings"] == [], (rank, outcome)
        assert outcome["unchanged"], (rank, outcome)


@pytest.mark.parametrize("scenario, warmup", [("clean", 0), ("norm", 1), ("norm", 2)])
def test_training_after_a_ddp_check_is_the_training_without_it(scenario, warmup):
    checked = run_world(world_ddp_step.ddp_step_world, 2, args=(scenario, warmup, True), timeout=WORLD_TIMEOUT)
    plain = run_world(world_ddp_step.ddp_step_world, 2, args=(scenario, warmup, False), timeout=WORLD_TIMEOUT)
    for rank, (outcome, reference) in enumerate(zip(checked, plain)):
        assert outcome["refusal"] is None and outcome["findings"] == [], (rank, outcome["findings"])
        assert all(a.equal(b) for a, b in zip(outcome["trained"], reference["trained"])), rank
        assert outcome["rebuilt"] == reference["rebuilt"], (rank, outcome["rebuilt"])
