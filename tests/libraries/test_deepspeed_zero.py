"""DeepSpeed ZeRO-1/2/3 engines in a real 2-rank gloo world on CPU: ``watch()`` and ``check_step``.

Scenario code: ``deepspeed_world.py`` beside this file (run on each rank by ``run_world``, under
a timeout: a hang is a failure).  Per stage, a model of three checkpointed blocks (torch's
non-reentrant checkpoint twice, DeepSpeed's own reentrant one once), clean, with dropout
checkpointed without RNG preservation, with a module counter, with a BatchNorm in training mode
and with a global flipped before the backward, the hazards on rank 1 only.

* ``watch()``: a clean engine gives nothing on any rank (ZeRO-3's own bookkeeping, the counts
  its hooks keep on every module, is DeepSpeed's, not the region's); a hazard is found with its
  kind on its rank and on no other.
* ``check_step``: a ZeRO optimizer keeps its own state beside the torch optimizer it wraps
  (gradient partitions, the norm, ZeRO-3's parameter partitions, a loss scaler), which no
  snapshot can put back, so the check is refused before anything runs, naming the engine's
  optimizer, and the training state (master weights included) is as it was.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
from library_env import require  # noqa: E402

require("deepspeed")
import deepspeed_world  # noqa: E402

from recheck.distributed.launch import run_world  # noqa: E402

#: real torch.distributed worlds on spawned ranks
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")]

#: seconds a stage's world may run before its ranks are killed (ZeRO-3's takes about 90 s on 2 busy cores)
WORLD_TIMEOUT = 400
OPTIMIZERS = {1: "DeepSpeedZeroOptimizer", 2: "DeepSpeedZeroOptimizer", 3: "DeepSpeedZeroOptimizer_Stage3"}


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda stage: f"zero{stage}")
def zero(request) -> tuple[int, list[dict]]:
    return request.param, run_world(deepspeed_world.zero_world, 2, args=(request.param,), timeout=WORLD_TIMEOUT)


def test_a_clean_engine_gives_nothing_under_watch_on_any_rank(zero):
    _, ranks = zero
    for rank, outcome in enumerate(ranks):
        assert outcome["clean"]["watch"] == [], (rank, outcome["clean"]["watch"])


@pytest.mark.parametrize("case, finding", [("dropout", ("rng", "cpu RNG")),
                                           ("counter", ("state", "attribute `self.calls`")),
                                           ("batchnorm", ("buffer", "buffer `norm.running_mean`")),
                                           ("global", ("global", "global `deepspeed_world.SCALE`"))])
def test_a_hazard_is_found_under_watch_with_its_kind_on_its_rank_only(zero, case, finding):
    _, ranks = zero
    hazard = ranks[deepspeed_world.HAZARD_RANK][case]["watch"]
    assert finding in hazard, hazard
    assert {kind for kind, _ in hazard} <= {finding[0], "recompute"}, hazard
    for rank, outcome in enumerate(ranks):
        if rank != deepspeed_world.HAZARD_RANK:
            assert outcome[case]["watch"] == [], (rank, outcome[case]["watch"])


def test_check_step_refuses_a_zero_optimizer_up_front_naming_it_and_changes_no_training_state(zero):
    stage, ranks = zero
    for rank, outcome in enumerate(ranks):
        for case in deepspeed_world.CASES:
            refused = outcome[case]["refused"]
            assert refused is not None, (rank, case, outcome[case]["check_step"])
            assert f"DeepSpeedEngine.optimizer, a {OPTIMIZERS[stage]} wrapping a torch optimizer" in refused, refused
            assert "recheck.watch()" in refused, refused
            # master partitions, the inner optimizer's moments, parameters (partitions), step counts
            assert outcome[case]["changed"] == [], (rank, case, outcome[case]["changed"])
