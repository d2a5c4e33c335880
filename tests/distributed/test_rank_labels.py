"""Rank labels, pipelining labels and per-rank pytest reports, in this process (no spawned world).

``current_place()`` falls back to the launcher's ``RANK``/``WORLD_SIZE`` when no process
group is initialised, which lets these tests play a rank of a world without starting one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch._dynamo  # kept loaded across in-process pytester runs
import torch.distributed.pipelining  # the labels patch only an imported module
from torch.utils.checkpoint import checkpoint

import recheck
from recheck.intercept import pipelining

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
SCALE = 1.0


def scaled(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * SCALE)


def flipped_global_step() -> None:
    """One checkpointed call whose backward runs with ``SCALE`` changed (a ``global`` finding)."""
    global SCALE
    y = checkpoint(scaled, torch.randn(4, 8, requires_grad=True), use_reentrant=False)
    SCALE = 3.0
    try:
        y.sum().backward()
    finally:
        SCALE = 1.0


@pytest.fixture
def rank_1_of_2(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")


def test_a_rank_labels_its_findings_stats_and_title(rank_1_of_2):
    with recheck.watch(raise_on_finding=False) as w, recheck.tag(stage=0, microbatch=3):
        flipped_global_step()
    (finding,) = w.report.by_kind("global")
    assert list(finding.invocation.tags.items()) == [("rank", 1), ("stage", 0), ("microbatch", 3)]
    assert "call 1 of 1 (rank=1, stage=0, microbatch=3)" in str(w.report)
    assert (w.report.stats["rank"], w.report.stats["world_size"]) == (1, 2)
    assert w.report.title.startswith("watch (rank 1 of 2): 1 checkpoint invocation(s)")


def test_the_users_own_rank_tag_wins(rank_1_of_2):
    with recheck.watch(raise_on_finding=False) as w, recheck.tag(rank="replica-a"):
        flipped_global_step()
    (finding,) = w.report.by_kind("global")
    assert dict(finding.invocation.tags) == {"rank": "replica-a"}
    assert w.report.stats["rank"] == 1  # the report still says which process wrote it


def test_a_single_process_gets_no_rank(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with recheck.watch(raise_on_finding=False) as w:
        flipped_global_step()
    (finding,) = w.report.by_kind("global")
    assert dict(finding.invocation.tags) == {}
    assert "rank" not in w.report.stats and "world_size" not in w.report.stats
    assert w.report.title.startswith("watch: 1 checkpoint invocation(s)")
    assert w.gather() is not None  # no process group: this process's report, merged alone


def test_watch_installs_the_pipelining_labels_while_active():
    assert not pipelining.installed()
    with recheck.watch(raise_on_finding=False):
        assert pipelining.installed()
        with recheck.watch(raise_on_finding=False):
            assert pipelining.installed()
        assert pipelining.installed()
    assert not pipelining.installed()


def test_watch_releases_the_pipelining_labels_when_the_block_raises():
    with pytest.raises(ZeroDivisionError), recheck.watch(raise_on_finding=False):
        raise ZeroDivisionError("the user's step failed")
    assert not pipelining.installed()


PYTEST_CASE = """
import torch
from torch.utils.checkpoint import checkpoint

SCALE = 1.0

def test_flipped():
    global SCALE
    y = checkpoint(lambda t: torch.tanh(t * SCALE), torch.randn(4, 8, requires_grad=True), use_reentrant=False)
    SCALE = 2.0
    try:
        y.sum().backward()
    finally:
        SCALE = 1.0
"""


def test_pytest_report_and_summary_carry_the_launchers_rank(pytester, monkeypatch, rank_1_of_2):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    pytester.makepyfile(test_case=PYTEST_CASE)
    result = pytester.runpytest("-p", "recheck._pytest_plugin", "--recheck", "--recheck-report", "out/report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*recheck summary (rank 1 of 2)*", "recheck (rank 1 of 2): 1 test(s) watched*"])
    assert not (pytester.path / "out" / "report.json").exists()
    document = json.loads((pytester.path / "out" / "report.rank1.json").read_text())
    assert (document["rank"], document["world_size"]) == (1, 2)
    (test,) = document["tests"]
    assert {f["invocation"]["tags"]["rank"] for f in test["findings"]} == {1}


def test_pytest_report_keeps_its_name_in_a_single_process(pytester, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_case=PYTEST_CASE)
    result = pytester.runpytest("-p", "recheck._pytest_plugin", "--recheck", "--recheck-report", "report.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*= recheck summary =*"])
    document = json.loads((pytester.path / "report.json").read_text())
    assert "rank" not in document


def test_the_launchers_variables_are_read_when_the_block_starts(rank_1_of_2, monkeypatch):
    with recheck.watch(raise_on_finding=False) as w:
        monkeypatch.setenv("RANK", "0")  # set by the launcher before the process starts: read once
        flipped_global_step()
    (finding,) = w.report.by_kind("global")
    assert dict(finding.invocation.tags) == {"rank": 1}
