"""An Interceptor that records what the hooks hear (shared by the interception tests)."""

from __future__ import annotations

import contextlib

from recheck.intercept.hooks import Interceptor, Run


class Recorder(Interceptor):
    """Records every run of every region function and every call started and released, and
    bypasses when asked."""

    def __init__(self, bypassing: bool = False) -> None:
        self.bypassing = bypassing
        self.events: list[tuple[str, str, int]] = []
        self.calls: list = []
        self.released_calls = 0

    def started(self, call):
        self.calls.append(call)

    def bypass(self, call):
        return self.bypassing

    @contextlib.contextmanager
    def region_run(self, call, phase, args=None, kwargs=None):
        try:
            yield Run()
        finally:  # early stop ends a non-reentrant recompute by raising through the region
            self.events.append((call.entry, phase.value, call.runs))

    def released(self, call):
        self.released_calls += 1
