"""A test that hangs ends the run with every thread's stack printed, under the project's pytest
settings (``faulthandler_timeout`` with ``faulthandler_exit_on_timeout`` in pyproject.toml), instead
of stalling CI without a word."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DEADLOCK = '''
import threading

first, second = threading.Lock(), threading.Lock()
both_hold_one = threading.Barrier(2)


def first_then_second():
    with first:
        both_hold_one.wait()
        with second:
            pass


def second_then_first():
    with second:
        both_hold_one.wait()
        with first:
            pass


def test_two_threads_take_two_locks_in_opposite_orders():
    threads = [threading.Thread(target=f, daemon=True) for f in (first_then_second, second_then_first)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
'''


@pytest.mark.slow
def test_a_deadlocked_test_ends_the_run_with_every_thread_s_stack(tmp_path):
    (tmp_path / "test_deadlock.py").write_text(DEADLOCK)
    # the project's settings, with a timeout of 2 s instead of the suite's
    run = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "-p", "no:cacheprovider",
                          "-o", "faulthandler_timeout=2", str(tmp_path / "test_deadlock.py")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0, run.stdout
    assert "Timeout" in run.stderr, run.stderr
    for function in ("first_then_second", "second_then_first", "test_two_threads_take_two_locks_in_opposite_orders"):
        assert function in run.stderr, (function, run.stderr)
