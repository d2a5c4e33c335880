"""recheck never breaks the run it watches: values in messages are one bounded line, and a failure
of recheck's own observation becomes a note while the user's step goes on.

The model is ``classification_head.py``: a sequence-classification head that sets
``config.problem_type`` between the checkpointed layers' forward and their recompute, on a
config that every layer holds and that prints itself over many lines (transformers' case).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import recheck
from classification_head import build
from read_state import ReadingLayer
from recheck.findings import Finding
from recheck.watcher import records

VARIANTS = pytest.mark.parametrize("use_reentrant", [False, True], ids=["non-reentrant", "reentrant"])
FIXTURE = Path(__file__).with_name("classification_head.py")
ROOT = Path(__file__).resolve().parents[2]
#: what a message may hold at most: a few bounded values and the words around them
LONGEST_MESSAGE = 400


def _step(model, inputs, labels):
    loss, _ = model(inputs, labels)
    loss.backward()
    return loss.detach()


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _plain_grads(use_reentrant: bool) -> dict[str, torch.Tensor]:
    model, inputs, labels = build(use_reentrant, checkpointed=False)
    _step(model, inputs, labels)
    return _grads(model)


def _assert_messages_bounded(findings) -> None:
    for finding in findings:
        assert "\n" not in finding.message and len(finding.message) <= LONGEST_MESSAGE, finding.message


@VARIANTS
def test_watch_survives_a_head_that_sets_problem_type_on_a_multiline_config(use_reentrant):
    model, inputs, labels = build(use_reentrant)
    with recheck.watch(raise_on_finding=False) as w:
        _step(model, inputs, labels)
    assert model.config.problem_type == "single_label_classification"
    assert w.report.stats["verified"] == 2, str(w.report)
    _assert_messages_bounded(w.report)
    plain = _plain_grads(use_reentrant)
    grads = _grads(model)
    assert grads.keys() == plain.keys()
    assert all(torch.equal(grads[name], plain[name]) for name in plain)


def test_a_long_value_rebound_is_shown_around_its_first_difference():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.prompt = "You are a helpful assistant.\n" * 20 + "Answer briefly."

        def forward(self, x):  # (a prompt the region does not read would be no finding)
            return self.fc(x) if self.prompt else x

    layer = Layer()
    x = torch.randn(2, 4, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        out = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        layer.prompt = layer.prompt.replace("briefly", "at length")
        out.sum().backward()
    (finding,) = [f for f in w.report if f.subject == "attribute `self.prompt`"]
    _assert_messages_bounded([finding])
    before, after = finding.message.split(": ", 1)[1].split(" -> ")
    assert "Answer briefly." in before and "Answer at length." in after, finding.message


def test_check_step_survives_a_head_that_sets_problem_type():
    model, inputs, labels = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        optimizer.zero_grad()
        _step(model, inputs, labels)
        optimizer.step()

    report = recheck.check_step(step)
    assert report.stats["watch"]["verified"] == 2, str(report)
    _assert_messages_bounded(report)
    assert model.config.problem_type is None  # the check leaves no trace


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["twin", "watch-only"])
def test_check_step_cli_survives_a_head_that_sets_problem_type(mode):
    out = subprocess.run([sys.executable, "-m", "recheck", "check", "--step", f"{FIXTURE}:train_step",
                          "--format", "json", *(["--watch-only"] if mode == "watch-only" else [])],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode in (0, 1), out.stderr
    (report,) = json.loads(out.stdout)["steps"]
    _assert_messages_bounded(Finding.from_dict(f) for f in report["findings"])


def _broken(*args, **kwargs):
    raise RuntimeError("recheck's own comparison broke")


@pytest.mark.parametrize("where, use_reentrant", [
    ("compare_saved", False),  # torch's determinism check compares each saved tensor (non-reentrant only)
    *((where, reentrant) for where in ("begin_recompute", "end_recompute", "findings_of") for reentrant in (False, True)),
])
def test_a_failure_of_recheck_s_own_comparison_is_a_note_and_the_step_goes_on(monkeypatch, use_reentrant, where):
    monkeypatch.setattr(records.InvocationRecord, where, _broken)
    model, inputs, labels = build(use_reentrant, problem_type="single_label_classification")
    with recheck.watch(raise_on_finding=False) as w:
        _step(model, inputs, labels)
    plain = _plain_grads(use_reentrant)
    grads = _grads(model)
    assert grads.keys() == plain.keys()
    assert all(torch.equal(grads[name], plain[name]) for name in plain)
    notes = [n for n in w.report.notes if n.startswith("could not ")]
    assert notes and all("RuntimeError: recheck's own comparison broke" in n for n in notes), w.report.notes
    assert all("\n" not in n for n in w.report.notes)


def test_a_failure_of_recheck_s_own_comparison_under_check_step_is_a_note(monkeypatch):
    monkeypatch.setattr(records.InvocationRecord, "end_recompute", _broken)
    model, inputs, labels = build(problem_type="single_label_classification")
    report = recheck.check_step(lambda: _step(model, inputs, labels))
    assert any(n.startswith("could not ") and "recheck's own comparison broke" in n for n in report.notes), \
        report.notes


def test_the_user_s_own_error_in_a_recompute_still_propagates_unchanged():
    class Flaky(torch.nn.Module):
        calls = 0

        def forward(self, x):
            Flaky.calls += 1
            if Flaky.calls == 2:
                raise KeyError("the user's own error")
            return x.sin()

    x = torch.randn(3, requires_grad=True)
    with pytest.raises(KeyError, match="the user's own error"):
        with recheck.watch(raise_on_finding=False):
            torch.utils.checkpoint.checkpoint(Flaky(), x, use_reentrant=False).sum().backward()


def _window_training(window, steps: int = 2, layer: type | None = None):
    """A training loop that calls the window as the Trainer and Lightning callbacks do (``layer``:
    the class its decoder layers are made, one that reads ``problem_type`` has a finding)."""
    model, inputs, labels = build()
    for decoder_layer in model.model.layers if layer is not None else ():
        decoder_layer.__class__ = layer
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        window.begin()
        optimizer.zero_grad()
        _step(model, inputs, labels)
        optimizer.step()
        window.end()
    return model


def test_the_trainer_callbacks_window_survives_a_head_that_sets_problem_type():
    from recheck.integrations.step_window import StepWindow

    logged = []
    window = StepWindow(2, False, lambda level, message: logged.append(message), {})
    _window_training(window)
    assert len(window.reports) == 2 and window.report.stats["verified"] == 4
    _assert_messages_bounded(window.report)


def test_a_report_the_callbacks_cannot_word_is_logged_and_training_goes_on(monkeypatch):
    import recheck.findings
    from recheck.integrations.step_window import StepWindow

    monkeypatch.setattr(recheck.findings, "format_report", _broken)
    logged = []
    window = StepWindow(2, False, lambda level, message: logged.append(message), {})
    model = _window_training(window, layer=ReadingLayer)
    assert model.config.problem_type == "single_label_classification"
    assert len(window.reports) == 2
    assert any(m.startswith("recheck: could not word the report of training step 1: RuntimeError") for m in logged)


def test_a_saved_tensor_print_that_fails_leaves_torch_s_own_check_working(monkeypatch):
    """Under ``determinism_check="none"`` torch still compares what the check made of each saved tensor."""
    calls = []

    def print_once_broken(self, tensor, base=None):
        calls.append(None)
        if len(calls) == 1:  # the forward's first saved tensor only: the recompute's are printed
            raise RuntimeError("no print today")
        return original(self, tensor, base)

    original = records.InvocationRecord.saved_print
    monkeypatch.setattr(records.InvocationRecord, "saved_print", print_once_broken)
    layer = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    x = torch.randn(2, 4, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False, determinism_check="none").sum().backward()
    assert x.grad is not None
    assert any(n.startswith("could not print a saved tensor") for n in w.report.notes), w.report.notes


def test_a_state_read_that_fails_at_a_saved_tensor_is_a_note_under_a_full_replay(monkeypatch):
    def broken(self, store):
        raise RuntimeError("no state today")

    monkeypatch.setattr(records.Forward, "state", broken)
    layer = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    x = torch.randn(2, 4, requires_grad=True)
    with recheck.watch(raise_on_finding=False, early_stop=False) as w:
        torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False).sum().backward()
    assert x.grad is not None
    assert any(n.startswith("could not ") and "no state today" in n for n in w.report.notes), w.report.notes


@pytest.mark.parametrize("call", ["info", "log", "exception", "explicit_stacklevel"])
def test_a_log_record_made_in_a_watched_block_names_the_user_s_line(call):
    # recheck hears logging by patching Logger's methods while a block runs; the record the
    # program's handlers get must still name the program's file and line, not recheck's
    import logging

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("recheck-test-caller")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = Keep()
    logger.addHandler(handler)

    def helper():
        logger.info("from the helper", stacklevel=2)

    try:
        with recheck.watch(raise_on_finding=False):
            line = sys._getframe().f_lineno + 2
            if call == "info":
                logger.info("hello")
            elif call == "log":
                logger.log(logging.WARNING, "hello")
            elif call == "exception":
                logger.exception("hello")
            else:
                helper()
    finally:
        logger.removeHandler(handler)
    [record] = records
    assert record.filename == Path(__file__).name
    assert record.funcName == "test_a_log_record_made_in_a_watched_block_names_the_user_s_line"
    if call != "explicit_stacklevel":
        assert record.lineno in range(line, line + 7)


class _Retold:
    """An object whose text changes while its fingerprint (here, a constant) does not."""

    text = "first"

    def __repr__(self) -> str:
        return self.text


def test_a_watch_block_that_cannot_start_leaves_no_text_kept(monkeypatch):
    from recheck.runtime.fingerprints import show_printed
    from recheck.watcher.dispatch import DISPATCHER

    def fails(session):
        raise RuntimeError("cannot start")

    monkeypatch.setattr(DISPATCHER, "enter", fails)
    with pytest.raises(RuntimeError, match="cannot start") as caught:  # (its traceback holds the block)
        with recheck.watch():
            pass
    monkeypatch.undo()
    # outside any block a text is made afresh each time: nothing of the failed block keeps it
    value = _Retold()
    assert show_printed(value, 0) == "first"
    value.text = "second"
    assert show_printed(value, 0) == "second", caught
