"""``check_step`` on FSDP2 models in a real 2-rank gloo world (scenarios:
``fixtures/distributed/world_fsdp_step.py``; the regather itself, in one process:
``test_fsdp_regather.py``; each hazard and the clean model watched step after step: ``test_matrix.py``).

A sharded parameter is a ``DTensor``: it names its device mesh among its inner tensors, and an
operation on it may run a collective.  recheck compares and digests it on this rank's local
shard, and a decision to run the step again is taken by all ranks together, so a check where
only one rank's shard differs completes (a hang is a failure: the world has a timeout).
"""

from __future__ import annotations

import pytest
import world_fsdp_step

from recheck.distributed.launch import run_world

#: real torch.distributed worlds on spawned ranks
pytestmark = pytest.mark.slow

#: seconds the world may run before its ranks are killed (a normal run takes under 15 s)
WORLD_TIMEOUT = 90


def world(scenario: str) -> list[dict]:
    return run_world(world_fsdp_step.fsdp_step_world, 2, args=(scenario,), timeout=WORLD_TIMEOUT)


def test_a_difference_in_one_ranks_shard_is_reported_on_that_rank_only():
    rank0, rank1 = world("rank0_half")
    kinds0 = {kind for kind, _ in rank0["findings"]}
    assert "global" in kinds0, rank0
    assert ("state", "parameter `half.linear.weight`") in rank0["findings"] or \
        any(kind == "state" and "linear.weight" in str(subject) for kind, subject in rank0["findings"]), rank0
    # rank 1's shard is the uncheckpointed step's, bit for bit
    assert rank1["findings"] == [], rank1


def test_rounding_on_sharded_parameters_is_a_note_that_says_why_it_was_not_rerun_in_float64():
    for rank, outcome in enumerate(world("rounding")):
        assert outcome["ok"], (rank, outcome)
        (note,) = [n for n in outcome["notes"] if "only by rounding" in n]
        assert "judged by size" in note and "sharded" in note, (rank, note)
        assert not any("raised" in n for n in outcome["notes"]), (rank, outcome["notes"])
