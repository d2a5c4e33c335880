"""check_step's noise floor: what the step as written differs by between its own runs.

On an accelerator with deterministic algorithms off, correct code differs from run to run
(atomics in backward).  check_step runs the step as written twice first there; a difference
from the uncheckpointed twin within what the step's own runs differ by is a note with its size,
never a finding, and a larger one (a hazard) stays a finding.  CPU kernels are deterministic, so
the jitter here is made by hand: each run reads its factor from a file descriptor, whose position no
check puts back (the runs, in order: as written and again, lean; both again keeping copies; the
twin).
"""

from __future__ import annotations

import os
import types
import warnings

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck
noise_floor_reason = getattr(__import__("recheck.checker.twin", fromlist=["x"]), "noise_floor_reason", None)


def _step(preserve_rng_state: bool, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    factors = tmp_path / "factors"
    factors.write_bytes(bytes([0, 2, 0, 2, 1]))  # the twin's lies between the step's own two
    source = os.open(factors, os.O_RDONLY)  # a descriptor: its position is the kernel's

    def step():
        out = checkpoint(model, x, use_reentrant=False, preserve_rng_state=preserve_rng_state)
        (out.sum() * (1.0 + 1e-6 * int.from_bytes(os.read(source, 1) or b"\x00", "little"))).backward()

    return step, source


def _check(step, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return recheck.check_step(step, **options)


def test_differences_within_the_step_s_own_noise_are_a_note_with_its_size(tmp_path):
    step, source = _step(preserve_rng_state=True, tmp_path=tmp_path)
    try:
        report = _check(step, repeats=2)
    finally:
        os.close(source)
    assert report.ok, str(report)
    note = next(n for n in report.notes if "not deterministic from run to run" in n)
    assert "up to" in note, note


def test_a_hazard_larger_than_the_noise_stays_a_finding(tmp_path):
    step, source = _step(preserve_rng_state=False, tmp_path=tmp_path)
    try:
        report = _check(step, repeats=2)
    finally:
        os.close(source)
    kinds = {f.kind for f in report.findings}
    assert "gradient" in kinds, str(report)  # the twin's own differences, not only the watch's cause
    assert "rng" in kinds


def test_the_floor_is_measured_only_on_an_accelerator_without_deterministic_algorithms():
    on = lambda device: {"w": types.SimpleNamespace(device=torch.device(device))}  # noqa: E731
    assert noise_floor_reason(on("cpu")) is None
    reason = noise_floor_reason(on("cuda"))
    assert reason is not None and "cuda" in reason and "deterministic" in reason
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert noise_floor_reason(on("cuda")) is None
    finally:
        torch.use_deterministic_algorithms(previous)
