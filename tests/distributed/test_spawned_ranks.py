"""``pytest --recheck`` on a test that starts its own processes: ``torch.multiprocessing.spawn``
(and ``start_processes(..., start_method="fork")``) of two gloo ranks, or a forked
``multiprocessing.Process``, inside the test.

Each child's checkpoint calls are watched in its own process and its report comes back to
the test: a hazard on rank 1 fails the test and is named with its rank; a clean world
passes; a child that dies before reporting is named in the test's notes; a child that makes
no checkpoint call, and a pool's workers, change nothing.  The two-rank worlds run in a real
``python -m pytest`` process under pytester's timeout (slow: each spawned rank imports torch);
the forked children in-process (fast).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch._dynamo  # noqa: F401  (kept loaded across in-process pytester runs)

import recheck.watcher  # noqa: F401

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
#: seconds the inner pytest run (four two-rank worlds) may take
TIMEOUT = 240

CASE = """
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.checkpoint import checkpoint


def region(t):
    return torch.nn.functional.dropout(t.sin(), 0.5).exp()


def step(rank, store, preserve):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    try:
        x = torch.randn(4, 8, requires_grad=True)
        checkpoint(region, x, use_reentrant=False, preserve_rng_state=preserve).sum().backward()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def clean(rank, store):
    step(rank, store, True)


def rank_1_drops_the_rng_state(rank, store):
    step(rank, store, rank != 1)


def rank_1_dies(rank, store):
    if rank == 1:
        os._exit(3)
    x = torch.randn(4, 8, requires_grad=True)
    checkpoint(region, x, use_reentrant=False).sum().backward()


def test_clean_world(tmp_path):
    mp.spawn(clean, args=(str(tmp_path / "store"),), nprocs=2)


def test_spawned_hazard(tmp_path):
    mp.spawn(rank_1_drops_the_rng_state, args=(str(tmp_path / "store"),), nprocs=2)


def test_forked_hazard(tmp_path):
    mp.start_processes(rank_1_drops_the_rng_state, args=(str(tmp_path / "store"),), nprocs=2,
                       start_method="fork")


def test_a_rank_dies(tmp_path):
    with pytest.raises(mp.ProcessExitedException):
        mp.spawn(rank_1_dies, args=(str(tmp_path / "store"),), nprocs=2)


def test_no_checkpoint():
    assert torch.ones(2).sum() == 2
"""


@pytest.fixture
def world_run(pytester, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_case=CASE)
    result = pytester.runpytest_subprocess("-p", "recheck._pytest_plugin", "-p", "no:cacheprovider", "--recheck",
                                           "--recheck-report", "report.json", timeout=TIMEOUT)
    document = json.loads((pytester.path / "report.json").read_text())
    return result, {test["nodeid"].rpartition("::")[2]: test for test in document["tests"]}


@pytest.mark.slow
def test_each_spawned_rank_is_watched_and_one_verdict_is_given(world_run):
    result, tests = world_run
    output = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed")) == (3, 2), output
    # clean: both ranks' calls verified, nothing found
    assert tests["test_clean_world"]["findings"] == [], output
    assert tests["test_clean_world"]["stats"]["invocations"] == 2, output
    assert tests["test_clean_world"]["stats"]["verified"] == 2, output
    # the hazard of rank 1 alone, under spawn and under fork, named with its rank
    for name in ("test_spawned_hazard", "test_forked_hazard"):
        findings = tests[name]["findings"]
        assert {"rng", "recompute"} <= {f["kind"] for f in findings}, output
        assert {f["invocation"]["tags"].get("rank") for f in findings} == {1}, output
        assert tests[name]["stats"]["invocations"] == 2, output
    result.stdout.fnmatch_lines(["*FAILED test_case.py::test_spawned_hazard*", "*FAILED test_case.py::test_forked_hazard*"])
    failure = output.split("_ test_spawned_hazard _")[1].split("_ test_forked_hazard _")[0]
    assert "child process(es) rank 0, rank 1" in failure and "(rank=1)" in failure and "(rank=0)" not in failure
    # the rank that died is named; the one that lived was watched
    died = tests["test_a_rank_dies"]
    assert any("rank 1" in note and "wrote no report" in note for note in died["notes"]), died
    assert not died["findings"], died
    # a test that starts no world and makes no checkpoint call is still counted as such
    assert tests["test_no_checkpoint"]["stats"].get("invocations", 0) == 0
    result.stdout.fnmatch_lines(["tests that made no checkpoint call: *", "*test_case.py::test_no_checkpoint"])


FORKED = """
import multiprocessing
import os

import torch
from torch.utils.checkpoint import checkpoint


def hazard():
    x = torch.randn(4, 8, requires_grad=True)
    region = lambda t: torch.nn.functional.dropout(t, 0.5).exp()
    checkpoint(region, x, use_reentrant=False, preserve_rng_state=False).sum().backward()


def quiet():
    pass


def dies():
    os._exit(3)


def run(target):
    process = multiprocessing.get_context("fork").Process(target=target, name="child")
    process.start()
    process.join(timeout=60)
    return process.exitcode


def test_child_hazard():
    assert run(hazard) == 0


def test_child_without_checkpoint():
    assert run(quiet) == 0


def test_child_dies():
    assert run(dies) == 3


def test_pool():
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.map(abs, [-1]) == [1]
"""


def run_forked(pytester, monkeypatch, *options):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_forked=FORKED)
    result = pytester.runpytest("-p", "recheck._pytest_plugin", "-p", "no:cacheprovider", *options)
    return result


def test_a_forked_childs_hazard_fails_its_test_and_a_dead_child_is_named(pytester, monkeypatch):
    result = run_forked(pytester, monkeypatch, "--recheck", "--recheck-report", "report.json")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["*FAILED test_forked.py::test_child_hazard*"])
    tests = {test["nodeid"].rpartition("::")[2]: test
             for test in json.loads((pytester.path / "report.json").read_text())["tests"]}
    assert {"rng", "recompute"} <= {f["kind"] for f in tests["test_child_hazard"]["findings"]}
    assert "child process(es) child" in tests["test_child_hazard"]["title"]
    (note,) = tests["test_child_dies"]["notes"]
    assert note.startswith("child (child process ") and "ended with exit code 3 and wrote no report" in note
    for name in ("test_child_without_checkpoint", "test_pool"):
        assert tests[name]["findings"] == [] and tests[name]["notes"] == [], tests[name]
        assert not tests[name]["stats"].get("invocations")


def test_children_are_left_alone_without_recheck(pytester, monkeypatch):
    result = run_forked(pytester, monkeypatch)
    result.assert_outcomes(passed=4)
