"""Errors are evidence: a step that fails only when checkpointed is a finding, with its cause.

Fixtures (fixtures/twins/): a TorchFunctionMode entered around the forward only
(``forward_only_mode``), a dispatch mode likewise (``forward_only_dispatch``), forward hooks a
wrapper removes before the backward (``forward_only_hooks``), a size chosen from a flag flipped
between forward and backward (``runtime_size``), a compiled block run eagerly at recompute
(``compile_fallback``), a mixed-precision cast for the wrapper's call only (``forward_only_cast``),
selective checkpointing with autocast's weight cache (``sac_autocast_cache``, torch's own
``RuntimeError``); each with a fixed variant that must be clean.
"""

from __future__ import annotations

import functools
from pathlib import Path
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import CheckpointError, checkpoint

import recheck
from recheck.checker.twin import FAILS_UNCHECKPOINTED
from recheck.watcher.failure import ONLY_WHEN_CHECKPOINTED
from source_modules import load_file

ROOT = Path(__file__).resolve().parents[2]
TWINS = ROOT / "fixtures" / "twins"

#: fixture -> what the finding names as the cause
CAUSES = {
    "forward_only_mode": "cause: torch-function modes were [ExactLinear] at forward and [] at recompute",
    "forward_only_hooks": "cause: forward hooks of `proj` were [group_pairs] at forward and [] at recompute",
    "runtime_size": "cause: global `runtime_size.LOW_MEMORY` was False at forward and True at recompute",
    "forward_only_dispatch": "cause: dispatch modes were [FlopCounter] at forward and [] at recompute",
    "compile_fallback": "cause: torch.compile stance was default at forward and force_eager at recompute",
    "forward_only_cast": "cause: attribute `self.compute_dtype` changed between forward and recompute: "
                         "torch.bfloat16 -> None",
    # selective checkpointing's own caching and cached modes are no cause
    "sac_autocast_cache": "cause: autocast's weight cache served a cast at forward that the recompute dispatches",
}
#: the error torch raises, where it is not ``CheckpointError``
ERRORS = {"sac_autocast_cache": RuntimeError}


@functools.lru_cache(maxsize=None)
def fixture(name: str):
    sys.path.insert(0, str(TWINS))
    try:
        return load_file(TWINS / f"{name}.py", name)
    finally:
        sys.path.remove(str(TWINS))


def _quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call(*args, **kwargs)


def _state(model: nn.Module):
    return [t.detach().clone() for t in model.state_dict().values()], [p.grad for p in model.parameters()]


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_the_step_raises_as_written(name):
    """The premise: torch's checkpoint raises on each fixture, and each runs unchecked when fixed."""
    step, _ = fixture(name).make_step()
    with pytest.raises(ERRORS.get(name, CheckpointError)):
        _quiet(step)
    step, _ = fixture(name).make_step(fixed=True)
    _quiet(step)


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_a_step_failing_only_when_checkpointed_is_a_finding_naming_its_cause(name):
    step, model = fixture(name).make_step()
    before = _state(model)
    report = _quiet(recheck.check_step, step)  # no error: a report
    failed = [f for f in report.findings if f.subject == ONLY_WHEN_CHECKPOINTED]
    assert len(failed) == 1, str(report)
    finding = failed[0]
    assert finding.kind == "recompute" and not report.ok
    assert finding.message.startswith(f"{ONLY_WHEN_CHECKPOINTED}: {ERRORS.get(name, CheckpointError).__name__}: ")
    assert finding.region is not None and finding.region.startswith("Block.forward (") and f"{name}.py:" in finding.region
    assert finding.invocation is not None and finding.invocation.index >= 1
    assert CAUSES[name] in finding.detail, finding.detail
    assert name in ERRORS or "first differing saved tensor: saved tensor #" in finding.detail
    assert "without checkpointing (every checkpoint bypassed) the step completes" in finding.detail
    # the check leaves no trace, although the step as written raised
    after = _state(model)
    assert all(torch.equal(a, b) for a, b in zip(before[0], after[0])) and after[1] == before[1]
    if name == "runtime_size":
        assert fixture(name).LOW_MEMORY is False


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_the_fixed_variants_are_clean(name):
    step, _ = fixture(name).make_step(fixed=True)
    report = _quiet(recheck.check_step, step)
    assert report.ok, str(report)


def test_forward_pre_hooks_of_an_outer_call_are_named_as_the_cause():
    step, _ = fixture("forward_only_hooks").make_step(pre=True)
    [failed] = [f for f in _quiet(recheck.check_step, step).findings if f.subject == ONLY_WHEN_CHECKPOINTED]
    assert "cause: forward-pre hooks of `proj` were [group_input_pairs] at forward and [] at recompute" in failed.detail
    step, _ = fixture("forward_only_hooks").make_step(fixed=True, pre=True)
    assert _quiet(recheck.check_step, step).ok


def test_a_step_that_fails_without_checkpointing_too_raises_its_own_error_with_a_note():
    torch.manual_seed(0)
    layer = nn.Linear(4, 4)
    x = torch.randn(2, 3)  # the wrong width: the layer fails checkpointed or not

    def step():
        checkpoint(layer, x, use_reentrant=False).sum().backward()

    with pytest.raises(RuntimeError, match="cannot be multiplied") as raised:
        _quiet(recheck.check_step, step)
    assert FAILS_UNCHECKPOINTED in getattr(raised.value, "__notes__", [])


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_watch_lets_the_checkpoint_error_propagate_with_the_explanation(name):
    step, _ = fixture(name).make_step()
    with pytest.raises(ERRORS.get(name, CheckpointError)) as raised:
        with recheck.watch(raise_on_finding=True) as watched:
            _quiet(step)
    notes = getattr(raised.value, "__notes__", [])
    assert len(notes) == 1, notes
    assert notes[0].startswith("recheck: the recompute of a checkpointed region differs from its forward")
    assert CAUSES[name] in notes[0] and "in Block.forward (" in notes[0]
    assert any(CAUSES[name] in note for note in watched.report.notes)


class _Gate(nn.Module):
    """A layer whose recompute raises when a switch was turned on after its forward."""

    strict = False

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if _Gate.strict:
            raise RuntimeError("the gate is strict now")
        return torch.tanh(self.fc(x))


def test_an_error_raised_during_the_recompute_is_explained_by_check_step_and_watch():
    torch.manual_seed(0)
    gate = _Gate()
    x = torch.randn(2, 4, requires_grad=True)

    def step():
        _Gate.strict = False
        out = checkpoint(gate, x, use_reentrant=False)
        _Gate.strict = True
        try:
            out.sum().backward()
        finally:
            _Gate.strict = False

    report = _quiet(recheck.check_step, step)
    failed = [f for f in report.findings if f.subject == ONLY_WHEN_CHECKPOINTED]
    assert len(failed) == 1 and "RuntimeError: the gate is strict now" in failed[0].message, str(report)
    assert "_Gate.forward (" in str(failed[0].region)
    with pytest.raises(RuntimeError, match="strict") as raised:
        with recheck.watch(raise_on_finding=False):
            _quiet(step)
    assert any("in _Gate.forward (" in note for note in getattr(raised.value, "__notes__", []))


def test_an_error_outside_any_recompute_is_left_as_it_is_by_watch():
    with pytest.raises(ValueError) as raised:
        with recheck.watch(raise_on_finding=False):
            raise ValueError("not checkpointing's")
    assert not getattr(raised.value, "__notes__", [])


pytest_plugins = ["pytester"]


def test_pytest_recheck_shows_the_explanation_with_the_checkpoint_error(pytester):
    pytester.makepyfile(test_hooked=f"""
import sys
sys.path.insert(0, {str(TWINS)!r})
import forward_only_hooks

def test_step():
    step, _ = forward_only_hooks.make_step()
    step()
""")
    result = pytester.runpytest_subprocess("--recheck", "-W", "ignore")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*CheckpointError*",
                                 "*recheck: the recompute of a checkpointed region differs from its forward*",
                                 "*cause: forward hooks of `proj` were [[]group_pairs[]] at forward and [[][]] at recompute*"])


def test_a_failure_of_the_explanation_never_replaces_the_users_error(monkeypatch):
    import recheck.watcher.failure as failure

    def broken(records, exc):
        raise RuntimeError("recheck's own bug")

    monkeypatch.setattr(failure, "explain_failure", broken)
    step, _ = fixture("forward_only_hooks").make_step()
    with pytest.raises(CheckpointError) as raised:
        with recheck.watch(raise_on_finding=False) as watched:
            _quiet(step)
    assert not getattr(raised.value, "__notes__", [])
    assert any(note.startswith("could not explain the error that ended the block: RuntimeError: recheck's own bug")
               for note in watched.report.notes)
    step, _ = fixture("forward_only_hooks").make_step()
    report = _quiet(recheck.check_step, step)  # the finding still says what failed, without the cause
    failed = [f for f in report.findings if f.subject == ONLY_WHEN_CHECKPOINTED]
    assert len(failed) == 1 and "CheckpointError" in failed[0].message
