"""recheck.distributed: the local world launcher, the rank lookup, and pipelining labels."""

from __future__ import annotations

import socket
import sys
import types

import launch_functions as fns
import pytest

from recheck.distributed import launch
from recheck.distributed.launch import WorldFailed, WorldTimeout, run_world
from recheck.distributed.world import Place, current_place
from recheck.intercept import pipelining
from recheck.runtime.tags import current_tags, tag


def _spawned_children() -> list:
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.is_alive()]


@pytest.mark.slow
def test_results_come_back_in_rank_order():
    results = run_world(fns.sum_of_ranks, 2, args=(10,), timeout=90)
    assert results == [
        {"rank": 0, "world_size": 2, "total": 21, "env_rank": "0"},
        {"rank": 1, "world_size": 2, "total": 21, "env_rank": "1"},
    ]
    assert _spawned_children() == []


@pytest.mark.slow
def test_the_rank_that_raised_first_is_named_with_its_traceback():
    with pytest.raises(WorldFailed) as caught:
        run_world(fns.rank_one_raises, 2, timeout=90)
    assert caught.value.rank == 1
    assert "ValueError: planted failure on rank 1" in str(caught.value).splitlines()[0]
    assert "launch_functions.py" in caught.value.remote_traceback
    assert _spawned_children() == []


@pytest.mark.slow
def test_a_world_past_its_timeout_is_killed():
    with pytest.raises(WorldTimeout, match="did not finish within 3 s"):
        run_world(fns.sleeps, 2, timeout=3)
    assert _spawned_children() == []


@pytest.mark.parametrize("size", [0, -1, 1.5])
def test_bad_world_size_is_refused(size):
    with pytest.raises(ValueError, match="world_size"):
        run_world(fns.sum_of_ranks, size, args=(0,))


def test_bad_timeout_is_refused():
    with pytest.raises(ValueError, match="timeout"):
        run_world(fns.sum_of_ranks, 1, args=(0,), timeout=0)


def test_nccl_without_a_gpu_per_rank_is_refused_before_spawning():
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has a GPU per rank")
    with pytest.raises(ValueError, match="backend 'nccl' needs one CUDA device per rank: 2 rank"):
        run_world(fns.sum_of_ranks, 2, args=(0,), backend="nccl")
    assert _spawned_children() == []


@pytest.mark.slow
def test_start_up_does_not_depend_on_a_port_staying_free(monkeypatch):
    # The race of a port found free "a moment ago" and bound later, made certain: another
    # process's listening socket holds the port such a probe would hand out.  A world that
    # rendezvoused on that port failed (bind refused, or ranks reaching the squatter:
    # Gloo's "connectFullMesh failed ... Connection closed by peer").
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        monkeypatch.setattr(launch, "free_port", lambda: taken, raising=False)
        assert run_world(fns.rendezvous_seen, 2, timeout=60) == [
            {"rank": 0, "master_port": None, "total": 1},
            {"rank": 1, "master_port": None, "total": 1},
        ]
    assert _spawned_children() == []


@pytest.mark.slow
def test_current_place_inside_an_initialised_group():
    assert run_world(fns.place_seen, 2, timeout=90) == [(0, 2, "gloo"), (1, 2, "gloo")]


def test_current_place_from_launcher_variables(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed", None)  # not imported: env only
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert current_place() == Place(3, 4, None)
    assert str(current_place()) == "rank 3 of 4"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert current_place() is None
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert current_place() is None
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "4")
    assert current_place() is None
    monkeypatch.delenv("RANK")
    assert current_place() is None


# -- pipelining labels --------------------------------------------------------------------


class _FakeStageBase:
    """Stands in for torch's _PipelineStageBase: the chunk methods return the labels in force."""

    stage_index = 1
    num_stages = 2

    def forward_one_chunk(self, fwd_chunk_id, args=(), kwargs=None):
        if fwd_chunk_id == 99:
            raise RuntimeError("forward failed")
        return dict(current_tags())

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        return dict(current_tags())

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        return dict(current_tags())


@pytest.fixture
def fake_stage_module(monkeypatch):
    module = types.ModuleType(pipelining.STAGE_MODULE)
    originals = {name: _FakeStageBase.__dict__[name] for name in
                 ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")}
    module._PipelineStageBase = _FakeStageBase
    monkeypatch.setitem(sys.modules, pipelining.STAGE_MODULE, module)
    yield originals
    assert not pipelining.installed()
    for name, original in originals.items():
        assert _FakeStageBase.__dict__[name] is original


def test_chunks_are_labelled_and_listeners_told(fake_stage_module):
    recorder = fns._Recorder()
    assert pipelining.acquire(recorder)
    try:
        stage = _FakeStageBase()
        assert stage.forward_one_chunk(3, ()) == {"stage": 1, "microbatch": 3}
        assert stage.backward_one_chunk(bwd_chunk_id=2) == {"stage": 1, "microbatch": 2}
        assert stage.backward_weight_one_chunk(2) == {"stage": 1, "microbatch": 2}
        with pytest.raises(RuntimeError, match="forward failed"):
            stage.forward_one_chunk(99)
    finally:
        pipelining.release(recorder)
    assert recorder.actions == [
        ("begin", "forward", 1, 3), ("end", "forward", 1, 3),
        ("begin", "backward", 1, 2), ("end", "backward", 1, 2),
        ("begin", "backward_weight", 1, 2), ("end", "backward_weight", 1, 2),
        ("begin", "forward", 1, 99), ("end", "forward", 1, 99),
    ]


def test_user_labels_win_over_automatic_ones(fake_stage_module):
    pipelining.acquire()
    try:
        with tag(stage="encoder", step=7):
            assert _FakeStageBase().forward_one_chunk(0) == {"stage": "encoder", "step": 7, "microbatch": 0}
    finally:
        pipelining.release()


def test_nested_acquire_keeps_the_patch_until_the_last_release(fake_stage_module):
    pipelining.acquire()
    pipelining.acquire()
    pipelining.release()
    assert pipelining.installed()
    assert _FakeStageBase().forward_one_chunk(1) == {"stage": 1, "microbatch": 1}
    pipelining.release()
    assert not pipelining.installed()
    with pytest.raises(RuntimeError, match="released more often"):
        pipelining.release()


def test_nothing_is_patched_when_pipelining_was_never_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, pipelining.STAGE_MODULE, None)
    assert pipelining.acquire() is False
    assert not pipelining.installed()
    pipelining.release()


@pytest.mark.slow
def test_a_real_1f1b_schedule_is_labelled_per_stage_and_microbatch():
    results = run_world(fns.labelled_pipeline, 2, timeout=120)
    for rank, result in enumerate(results):
        assert result["patched"] and result["restored"]
        # PipelineStage's shape inference runs the module once outside any chunk: unlabelled
        labelled = [t for t in result["tags"] if t]
        assert labelled == [{"stage": rank, "microbatch": 0}, {"stage": rank, "microbatch": 1}]
        assert len(result["tags"]) - len(labelled) <= 1
        begins = [a[1:] for a in result["actions"] if a[0] == "begin"]
        assert sorted(begins) == sorted([("forward", rank, 0), ("forward", rank, 1),
                                         ("backward", rank, 0), ("backward", rank, 1)])
