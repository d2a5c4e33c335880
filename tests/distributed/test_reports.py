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


# -- merging through the launcher's store (recheck run under torchrun) ------------------------------


@pytest.fixture
def launcher_store(monkeypatch):
    """A TCPStore served here, and the variables torchrun's agent gives its ranks to reach it."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    for name, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(store.port), "TORCHELASTIC_RUN_ID": "test-run",
                        "TORCHELASTIC_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(name, value)
    yield store


def test_rank_0_merges_the_reports_the_other_ranks_put_in_the_launcher_store(launcher_store):
    from recheck.distributed.reports import merge_through_launcher

    assert merge_through_launcher(rank_report(1, findings=2), 1, 3, "exit", wait=5) is None
    assert merge_through_launcher(rank_report(2, findings=1), 2, 3, "exit", wait=5) is None
    merged = merge_through_launcher(rank_report(0), 0, 3, "exit", wait=5)
    assert [s["rank"] for s in merged.stats["ranks"]] == [0, 1, 2]
    assert [f.invocation.tags["rank"] for f in merged] == [1, 1, 2]
    assert not merged.notes


def test_a_rank_that_never_reports_is_named_and_rank_0_does_not_wait_for_it(launcher_store):
    from recheck.distributed.reports import merge_through_launcher

    merge_through_launcher(rank_report(1, findings=1), 1, 3, "window", wait=5)
    merged = merge_through_launcher(rank_report(0), 0, 3, "window", wait=0.3)
    assert [s["rank"] for s in merged.stats["ranks"]] == [0, 1]
    assert merged.notes == ["rank(s) 2 sent no report within 0.3 s: their own output has it"]
    # another stage is another exchange: rank 1's window report is not its exit report
    assert len(merge_through_launcher(rank_report(0), 0, 2, "exit", wait=0.1).stats["ranks"]) == 1


def test_without_a_launcher_store_merging_refuses_with_the_reason(monkeypatch):
    from recheck.distributed.reports import merge_through_launcher

    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    with pytest.raises(DistributedReportError, match="not run by torchrun"):
        merge_through_launcher(rank_report(0), 0, 2, "exit", wait=0.1)


@pytest.mark.slow
def test_recheck_run_under_torchrun_prints_one_merged_report_on_rank_0(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "recheck", "run", "--steps", "2", "--format", "json", "--report",
                          str(tmp_path / "report.json"), "fixtures/programs/train_ddp.py"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=240)
    assert "(rank 1: its report is in rank 0's)" in out.stderr, out.stderr
    assert out.stderr.count("recheck run: summary") == 1  # rank 0 alone prints the report
    summary = out.stderr[out.stderr.index("recheck run: summary"):]
    assert "watch (rank 0 of 2)" in summary and "watch (rank 1 of 2)" in summary and "(rank=1)" in summary
    assert "RC002" in summary and out.returncode == 1  # rank 1's finding makes rank 0 exit 1
    merged = json.loads((tmp_path / "report.json").read_text())
    assert [s["rank"] for s in merged["report"]["stats"]["ranks"]] == [0, 1]
    assert json.loads((tmp_path / "report.rank1.json").read_text())["rank"] == 1
