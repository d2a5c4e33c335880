"""Merging reports of several ranks, per-rank file names, and gather_report's guards (no processes)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from recheck.distributed.reports import (
    DistributedReportError,
    gather_report,
    rank_report_path,
)
from recheck.findings import Finding, Invocation, Report


def rank_report(rank: int, *, findings: int = 0, notes: tuple[str, ...] = (), world_size: int = 3) -> Report:
    found = [Finding("global", f"global `SCALE` flipped ({rank}.{i})", region="Block.region",
                     invocation=Invocation(i + 1, findings, {"rank": rank, "microbatch": i}),
                     subject="global `SCALE`") for i in range(findings)]
    stats = {"regions": 1, "invocations": 4, "verified": 4, "findings": findings, "rank": rank,
             "world_size": world_size}
    return Report(found, title=f"watch (rank {rank} of {world_size}): 4 invocation(s)", notes=notes, stats=stats)


def test_merge_orders_by_rank_and_keeps_every_ranks_stats():
    merged = Report.merge([rank_report(2, findings=1), rank_report(0), rank_report(1, findings=2)])
    assert [f.invocation.tags["rank"] for f in merged] == [1, 1, 2]
    assert [f.message for f in merged][:2] == ["global `SCALE` flipped (1.0)", "global `SCALE` flipped (1.1)"]
    assert merged.stats["invocations"] == 12 and merged.stats["findings"] == 3
    assert merged.stats["world_size"] == 3 and "rank" not in merged.stats
    assert [s["rank"] for s in merged.stats["ranks"]] == [0, 1, 2]
    assert merged.stats["ranks"][1] == rank_report(1, findings=2).stats
    assert merged.title.splitlines() == [f"watch (rank {r} of 3): 4 invocation(s)" for r in range(3)]
    assert not merged.ok


def test_merge_deduplicates_notes_and_leaves_its_inputs_alone():
    inputs = [rank_report(1, notes=("compiled", "strict")), rank_report(0, notes=("strict",))]
    before = [(list(r.findings), list(r.notes), dict(r.stats)) for r in inputs]
    merged = Report.merge(inputs)
    assert merged.notes == ["strict", "compiled"]
    assert [(list(r.findings), list(r.notes), dict(r.stats)) for r in inputs] == before


def test_merge_survives_a_json_round_trip():
    merged = Report.merge([rank_report(1, findings=1), rank_report(0)])
    again = Report.from_json(merged.to_json())
    assert again.stats == merged.stats
    assert [f.to_dict() for f in again] == [f.to_dict() for f in merged]
    assert again.title == merged.title and again.notes == merged.notes


def test_merge_of_reports_without_a_rank_keeps_their_order_after_the_ranked_ones():
    plain = [Report([Finding("rng", "cpu RNG differs", subject="cpu RNG")], stats={"invocations": 1}),
             Report(stats={"invocations": 2, "label": "text is not summed"})]
    merged = Report.merge([plain[0], rank_report(0, findings=1), plain[1]])
    assert [f.kind for f in merged] == ["global", "rng"]
    assert merged.stats["invocations"] == 7
    assert "label" not in merged.stats and merged.stats["ranks"][2]["label"] == "text is not summed"
    assert "world_size" in merged.stats  # only one world size among the inputs


def test_merge_of_nothing_is_an_empty_report():
    merged = Report.merge([])
    assert merged.ok and merged.title is None and merged.stats == {"ranks": []}


def test_merge_of_different_world_sizes_names_none():
    merged = Report.merge([rank_report(0, world_size=2), rank_report(1, world_size=4)])
    assert "world_size" not in merged.stats


@pytest.mark.parametrize("path, rank, expected", [
    ("report.json", 1, "report.rank1.json"),
    ("out/run.report.json", 0, "out/run.report.rank0.json"),
    ("out/report", 3, "out/report.rank3"),
])
def test_rank_report_path_puts_the_rank_before_the_suffix(path, rank, expected):
    assert rank_report_path(path, rank).as_posix() == expected


@pytest.mark.parametrize("rank", [-1, 1.0, True, "1"])
def test_rank_report_path_refuses_a_bad_rank(rank):
    with pytest.raises(ValueError, match="rank must be a whole number"):
        rank_report_path("report.json", rank)


def test_gather_report_outside_a_process_group_returns_the_report_merged():
    assert not dist.is_initialized()
    merged = gather_report(rank_report(0, findings=1))
    assert [f.message for f in merged] == ["global `SCALE` flipped (0.0)"]
    assert merged.stats["ranks"] == [rank_report(0, findings=1).stats]


def fake_group(monkeypatch: pytest.MonkeyPatch, backend: str) -> list:
    """An initialised 2-rank group of ``backend`` as torch.distributed's query functions see it."""
    gathered: list = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(dist, "gather_object", lambda obj, out, dst, group: gathered.append((obj, out, dst)))
    return gathered


def test_gather_report_refuses_nccl_without_cuda(monkeypatch):
    gathered = fake_group(monkeypatch, "nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DistributedReportError, match="NCCL but CUDA is not available"):
        gather_report(rank_report(0))
    assert gathered == []


@pytest.mark.parametrize("dst", [2, -1, "0", True])
def test_gather_report_refuses_a_destination_outside_the_world(monkeypatch, dst):
    gathered = fake_group(monkeypatch, "gloo")
    with pytest.raises(DistributedReportError, match=r"dst must be a rank of the world \(0 to 1\)"):
        gather_report(rank_report(0), dst=dst)
    assert gathered == []


def test_gather_report_sends_json_text(monkeypatch):
    gathered = fake_group(monkeypatch, "gloo")
    assert gather_report(rank_report(0), dst=1) is None  # this process is rank 0, not the destination
    ((sent, out, dst),) = gathered
    assert (out, dst) == (None, 1)
    assert isinstance(sent, str)
    assert Report.from_json(sent).stats == rank_report(0).stats
