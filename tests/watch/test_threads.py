"""watch() with checkpoint calls from several threads: each recompute's effect capture records
its own thread's output, warnings and logging only, and the block leaves stdout, stderr, the
warnings module and ``logging.Logger`` exactly as it found them (issue 40, item 5)."""

from __future__ import annotations

import logging
import sys
import threading
import traceback
import warnings

import pytest
import torch
import torch._dynamo  # noqa: F401  (checkpoint imports it on first call, and with it sympy, which adds a filter)
from torch.utils.checkpoint import checkpoint

import recheck

LOGGER = logging.getLogger("recheck.tests.threads")


def _process_state() -> dict[str, object]:
    return {"stdout": sys.stdout, "stderr": sys.stderr, "filters": list(warnings.filters),
            "filters list": warnings.filters, "showwarning": warnings.showwarning,
            "_showwarnmsg": warnings._showwarnmsg, "_showwarnmsg_impl": warnings._showwarnmsg_impl,
            "logging": {name: logging.Logger.__dict__.get(name)
                        for name in ("debug", "info", "warning", "error", "critical", "fatal", "log")}}


def _threaded_block(steps: int, region=None, threads: int = 2) -> recheck.Watch:
    model = torch.nn.Linear(4, 4)
    region = region or model
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for step in range(steps):  # (no draw from torch's process-wide RNG: not what is tested here)
                x = torch.linspace(-1, 1, 8).add(step).reshape(2, 4).requires_grad_()
                checkpoint(region, x, use_reentrant=False).sum().backward()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    with recheck.watch(raise_on_finding=False) as w:
        # daemon threads and a bounded join: a block that stops making progress fails with every
        # thread's stack, and a stuck thread cannot keep the test process from ending
        running = [threading.Thread(target=work, name=f"worker{i}", daemon=True) for i in range(threads)]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join(timeout=300)
        stuck = [thread.name for thread in running if thread.is_alive()]
        assert not stuck, f"{stuck} still running after 300 s:\n" + "\n".join(
            "".join(traceback.format_stack(frame)) for frame in sys._current_frames().values())
    assert not errors, errors
    return w


def test_a_block_with_two_threads_leaves_streams_warnings_and_logging_as_it_found_them():
    before = _process_state()
    for _ in range(4):  # the interleaving that left the capture behind came on the first run, every run
        w = _threaded_block(250)
        assert w.report.ok and w.report.stats["verified"] == 500
        assert _process_state() == before
        assert sys.stdout is before["stdout"] and sys.stderr is before["stderr"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn("still seen after the block")
    assert [str(w.message) for w in seen] == ["still seen after the block"]
    with pytest.warns(UserWarning, match="pytest sees it too"):
        warnings.warn("pytest sees it too")


def test_each_thread_s_recompute_records_its_own_effects_only():
    def region(x):
        name = threading.current_thread().name
        sys.stdout.write(f"<{name}>")
        LOGGER.warning("log from %s", name)
        warnings.warn(f"warning from {name}")
        return x.sin()

    before = _process_state()
    with warnings.catch_warnings():
        # shown at every call, so each recompute's warning is shown again: a side effect
        warnings.simplefilter("always")
        warnings.showwarning = lambda *args, **kwargs: None
        w = _threaded_block(60, region)
    assert _process_state() == before
    findings = [f for f in w.report.findings if f.kind == "side_effect"]
    assert len(findings) == 3 * 120  # one per channel per recompute, no more
    by_channel: dict[str, list[str]] = {}
    for finding in findings:
        by_channel.setdefault(finding.subject, []).append(finding.detail)
    assert sorted(by_channel) == ["logging", "stdout", "warning"]
    for channel, details in by_channel.items():
        assert len(details) == 120, channel
        for detail in details:  # exactly one entry, of one thread
            assert detail.count("worker") == 1, (channel, detail)
        assert {d.split("worker")[1][0] for d in details} == {"0", "1"}


def test_a_thread_without_a_capture_is_not_recorded_and_writes_straight_through():
    from recheck.runtime.effects import EffectCapture

    started, release = threading.Event(), threading.Event()
    outside: list[str] = []

    class Sink:
        def write(self, text: str) -> int:
            outside.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    def other() -> None:
        started.wait()
        print("from the other thread")
        warnings.warn("other thread's warning")
        release.set()

    saved = sys.stdout
    sys.stdout = Sink()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            thread = threading.Thread(target=other)
            thread.start()
            with EffectCapture() as capture:
                print("mine")
                started.set()
                release.wait(10)
            thread.join()
    finally:
        sys.stdout = saved
    assert [e.text for e in capture.effects if e.channel == "stdout"] == ["mine", "\n"]
    assert not [e for e in capture.effects if e.channel == "warning"]
    assert "".join(outside) == "from the other thread\n"
    assert [str(w.message) for w in seen] == ["other thread's warning"]


def test_a_stream_the_program_replaces_in_the_block_is_still_captured_and_left_as_the_program_set_it():
    import io

    def region(x):
        print("again")
        return x.sin()

    before, replaced = sys.stdout, io.StringIO()
    try:
        with recheck.watch(raise_on_finding=False) as w:
            checkpoint(region, torch.ones(2, requires_grad=True), use_reentrant=False).sum().backward()
            sys.stdout = replaced
            checkpoint(region, torch.ones(2, requires_grad=True), use_reentrant=False).sum().backward()
        assert sys.stdout is replaced
    finally:
        sys.stdout = before
    assert [f.subject for f in w.report.findings] == ["stdout", "stdout"]
    assert replaced.getvalue() == "again\nagain\n"  # the forward's print and the recompute's, passed through


def test_a_region_s_own_catch_warnings_gets_its_warnings_in_the_recompute_too():
    def region(x):
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always")
            warnings.warn("the region's own")
        assert [str(w.message) for w in log] == ["the region's own"]
        return x.cos()

    with recheck.watch(raise_on_finding=False) as w:
        checkpoint(region, torch.ones(2, requires_grad=True), use_reentrant=False).sum().backward()
    assert w.report.ok and w.report.stats["verified"] == 1
