"""``watch()`` inside real torch.distributed worlds (gloo over loopback, spawned ranks).

Each world runs once per module (``run_world``: a free port, a timeout after which every
rank is killed, join and ``destroy_process_group`` however it ends) and its ranks write
their reports as JSON into ``tmp_path``; the tests read them back with
``Report.from_json``.  Scenario code: ``fixtures/distributed/world_*.py``.

* 4 ranks, data parallel: DDP and FSDP2 clean, a global flipped on one rank, reports merged
  on rank 0 (``Watch.gather``) and on the last rank (``gather_report``);
* 2 ranks, a 2-stage pipeline: GPipe and 1F1B over 4 microbatches, clean (the schedule's
  shape inference included) and with the user's own tag.

Each hazard under each framework, on 2 ranks: ``test_matrix.py``.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import world_data_parallel
import world_pipeline

from recheck.distributed.launch import run_world
from recheck.findings import Report

#: real torch.distributed worlds on spawned ranks
pytestmark = pytest.mark.slow

#: seconds a world may run before its ranks are killed (a normal run takes 10-25 s on 2 cores)
WORLD_TIMEOUT = 150
DATA_PARALLEL_RANKS = 4
GLOBAL_RANK = 2          # flips SCALE under DDP
FSDP_GLOBAL_RANK = 3     # flips SCALE under FSDP2
SCHEDULES = ("ScheduleGPipe", "Schedule1F1B")


def read_report(path: Path) -> Report:
    return Report.from_json(path.read_text(encoding="utf-8"))


def no_children_left() -> bool:
    return not [p for p in multiprocessing.active_children() if p.is_alive()]


@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data_parallel")
    run_world(world_data_parallel.data_parallel_world, DATA_PARALLEL_RANKS,
              args=(str(out), GLOBAL_RANK, FSDP_GLOBAL_RANK), timeout=WORLD_TIMEOUT)
    assert no_children_left()
    return out


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pipeline")
    run_world(world_pipeline.pipeline_world, 2, args=(str(out),), timeout=WORLD_TIMEOUT)
    assert no_children_left()
    return out


# -- data parallel -------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["ddp_clean", "fsdp_clean"])
def test_clean_data_parallel_runs_give_nothing_on_any_rank(data_parallel, scenario):
    for rank in range(DATA_PARALLEL_RANKS):
        report = read_report(data_parallel / f"{scenario}.rank{rank}.json")
        assert report.ok, str(report)
        assert report.stats["invocations"] == report.stats["verified"] > 0
        assert (report.stats["rank"], report.stats["world_size"]) == (rank, DATA_PARALLEL_RANKS)
        assert f"watch (rank {rank} of {DATA_PARALLEL_RANKS}):" in report.title


@pytest.mark.parametrize("scenario, hazard_rank", [("ddp_global", GLOBAL_RANK), ("fsdp_global", FSDP_GLOBAL_RANK)])
def test_a_global_flipped_on_one_rank_is_found_on_that_rank_only(data_parallel, scenario, hazard_rank):
    for rank in range(DATA_PARALLEL_RANKS):
        report = read_report(data_parallel / f"{scenario}.rank{rank}.json")
        if rank != hazard_rank:
            assert report.ok, str(report)
            continue
        found = report.by_kind("global")
        assert [f.invocation.index for f in found] == [1, 2], str(report)  # both blocks of the stack
        for finding in found:
            assert finding.subject == "global `world_models.SCALE`"
            assert "1.0 at forward and 2.0 at recompute" in finding.message
            assert dict(finding.invocation.tags) == {"rank": hazard_rank}
        assert f"call 2 of 2 (rank={hazard_rank})" in str(report)


def test_merged_report_on_rank_0_holds_the_hazard_rank_and_every_ranks_stats(data_parallel):
    outcomes = [json.loads((data_parallel / f"outcome.rank{r}.json").read_text()) for r in range(DATA_PARALLEL_RANKS)]
    # raise_on_finding=True still raises on the rank with the finding, after taking part in the gather
    assert [o["ddp_global_raised"] for o in outcomes] == [r == GLOBAL_RANK for r in range(DATA_PARALLEL_RANKS)]
    assert [o["ddp_global_gathered"] for o in outcomes] == [True, False, False, False]
    merged = read_report(data_parallel / "ddp_global.merged.json")
    assert {f.invocation.tags["rank"] for f in merged} == {GLOBAL_RANK}
    assert merged.kinds == read_report(data_parallel / f"ddp_global.rank{GLOBAL_RANK}.json").kinds
    assert [s["rank"] for s in merged.stats["ranks"]] == list(range(DATA_PARALLEL_RANKS))
    assert merged.stats["world_size"] == DATA_PARALLEL_RANKS
    assert merged.stats["invocations"] == sum(s["invocations"] for s in merged.stats["ranks"])
    assert merged.stats["findings"] == len(merged.findings)
    assert [line.split(":")[0] for line in merged.title.splitlines()] == [
        f"watch (rank {r} of {DATA_PARALLEL_RANKS})" for r in range(DATA_PARALLEL_RANKS)]


def test_gather_report_to_another_rank(data_parallel):
    last = DATA_PARALLEL_RANKS - 1
    outcomes = [json.loads((data_parallel / f"outcome.rank{r}.json").read_text()) for r in range(DATA_PARALLEL_RANKS)]
    assert [o["fsdp_global_gathered"] for o in outcomes] == [r == last for r in range(DATA_PARALLEL_RANKS)]
    merged = read_report(data_parallel / "fsdp_global.merged.json")
    assert {f.invocation.tags["rank"] for f in merged} == {FSDP_GLOBAL_RANK}
    assert [s["rank"] for s in merged.stats["ranks"]] == list(range(DATA_PARALLEL_RANKS))


# -- pipeline ------------------------------------------------------------------------------


def read_block(out: Path, name: str) -> tuple[Report, list[dict[str, Any]]]:
    document = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
    return Report.from_json(json.dumps(document["report"])), document["tags"]


def chunk_tags(tags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tags of the invocations made inside a pipeline chunk (the shape inference of a
    schedule's first step runs outside any chunk and carries only the rank)."""
    return [t for t in tags if "microbatch" in t]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_clean_pipeline_tags_every_chunk_with_stage_and_microbatch(pipeline, schedule):
    for rank in range(2):
        report, tags = read_block(pipeline, f"{schedule}.clean.rank{rank}")
        assert report.ok, str(report)
        inside = chunk_tags(tags)
        assert [t["microbatch"] for t in inside] == [0, 0, 1, 1, 2, 2, 3, 3]  # 2 blocks per stage
        assert {(t["rank"], t["stage"]) for t in inside} == {(rank, rank)}
        assert all(t == {"rank": rank} for t in tags if t not in inside)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_user_tags_win_over_the_pipeline_labels(pipeline, schedule):
    for rank in range(2):
        report, tags = read_block(pipeline, f"{schedule}.user_tags.rank{rank}")
        assert report.ok, str(report)
        assert tags and all(t["stage"] == "mine" and t["rank"] == rank for t in tags)
        assert sorted({t["microbatch"] for t in tags}) == [0, 1, 2, 3]
