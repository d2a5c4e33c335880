"""RNG streams: one exact encoding of a state, whatever tensor it comes in."""

from __future__ import annotations

import random

import torch

from recheck.runtime import rng
from recheck.runtime.rng import RngRecord, rng_fingerprint, rng_fingerprints, rng_states


def test_a_state_tensor_is_its_bytes_however_it_is_laid_out():
    state = torch.default_generator.get_state()
    exact = ("tensor", bytes(state.tolist()))
    assert rng_fingerprint(state) == exact  # what get_state() returns: read in place
    # the same bytes in a strided view, or in another dtype, read through a copy
    doubled = torch.stack([state, state], dim=1)[:, 0]
    assert not doubled.is_contiguous() and rng_fingerprint(doubled) == exact
    assert rng_fingerprint(state.view(torch.int8)) == exact
    assert rng_fingerprint(torch.empty(0, dtype=torch.uint8)) == ("tensor", b"")


def test_a_draw_moves_the_cpu_stream_and_restore_puts_it_back():
    record = RngRecord({})
    before = rng_fingerprint(rng_states()["cpu RNG"])
    torch.rand(1)
    random.random()
    assert rng_fingerprint(rng_states()["cpu RNG"]) != before
    assert record.changed_streams() >= {"cpu RNG", "Python random"}
    record.restore()
    assert rng_fingerprint(rng_states()["cpu RNG"]) == before and not record.changed_streams()


def test_an_initialized_accelerator_is_read_per_device_and_skipped_at_restore_once_gone(monkeypatch):
    # the CUDA path without a GPU: what an initialized CUDA runtime with two devices answers
    states = {0: torch.zeros(16, dtype=torch.uint8), 1: torch.ones(16, dtype=torch.uint8)}
    put: list[int] = []
    monkeypatch.setattr(rng, "_ACCELERATORS", (("cuda", torch.cuda),))  # a CUDA build, as on a GPU machine
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda index: states[index])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, index: put.append(index))
    found = rng_states()
    assert rng_fingerprint(found["cuda:1 RNG"]) == ("tensor", bytes([1] * 16)) and "cuda:0 RNG" in found
    record = RngRecord({})
    record.restore()
    assert put == [0, 1]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # a forked child: nothing to put back
    put.clear()
    record.restore()
    assert put == []


def test_fingerprints_are_the_fingerprints_of_the_states(monkeypatch):
    import numpy

    generator = torch.Generator().manual_seed(3)
    numpy.random.seed(1)
    random.seed(2)
    states = rng_states({"g": generator})
    assert rng_fingerprints({"g": generator}) == {name: rng_fingerprint(s) for name, s in states.items()}
    torch.rand(1)
    assert rng_fingerprints({"g": generator})["cpu RNG"] != rng_fingerprint(states["cpu RNG"])
    # only the host streams asked for are read
    assert set(rng_fingerprints(None, frozenset())) == {"cpu RNG"}
    assert set(rng_fingerprints(None, {"Python random"})) == {"cpu RNG", "Python random"}
    # the one question ``watch()``'s entry state asks before reading the CPU stream alone
    assert rng.only_cpu(None, frozenset()) and rng.only_cpu({}, set())
    assert not rng.only_cpu({"g": generator}, frozenset()) and not rng.only_cpu(None, {"Python random"})
    monkeypatch.setattr(rng, "_ACCELERATORS", (("cuda", torch.cuda),))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda index: torch.full((4,), 7, dtype=torch.uint8))
    assert rng_fingerprints(None, frozenset())["cuda:0 RNG"] == ("tensor", bytes([7] * 4))
    assert not rng.only_cpu(None, frozenset())
