"""The counted hold the runtime's process-wide keepers share (``recheck.runtime.holds``)."""

from __future__ import annotations

import threading

import pytest

from recheck.runtime.effects import hold_logging, release_logging
from recheck.runtime.holds import Hold
from recheck.runtime.naming import hold_cwd, release_cwd


def _hold() -> tuple[Hold, list[str]]:
    calls: list[str] = []
    return Hold("hold_thing", lambda: calls.append("first"), lambda: calls.append("last")), calls


def test_the_first_holder_sets_up_and_the_last_tears_down_once_each():
    hold, calls = _hold()
    hold.take()
    hold.take()  # nested: a block inside a block
    assert calls == ["first"] and hold.count == 2
    hold.release()
    assert calls == ["first"] and hold.count == 1
    hold.release()
    assert calls == ["first", "last"] and hold.count == 0
    hold.take()  # held again: set up again
    assert calls == ["first", "last", "first"]
    hold.release()


def test_a_release_without_a_hold_raises_and_leaves_the_count_alone():
    hold, calls = _hold()
    with pytest.raises(RuntimeError, match=r"release_thing\(\) without hold_thing\(\)"):
        hold.release()
    assert hold.count == 0 and calls == []


def test_a_set_up_that_raises_leaves_the_thing_unheld():
    def broken() -> None:
        raise OSError("no")

    hold = Hold("hold_thing", broken)
    with pytest.raises(OSError):
        hold.take()
    assert hold.count == 0
    with pytest.raises(RuntimeError):
        hold.release()


def test_the_owner_lock_is_the_one_taken():
    lock = threading.Lock()
    seen: list[bool] = []
    hold = Hold("hold_thing", lambda: seen.append(lock.locked()), lambda: seen.append(lock.locked()), lock)
    hold.take()
    hold.release()
    assert seen == [True, True] and not lock.locked()


def test_holds_from_many_threads_balance():
    hold, calls = _hold()
    hold.take()  # held throughout: the threads never set it up or tear it down

    def work() -> None:
        for _ in range(200):
            hold.take()
            hold.release()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert hold.count == 1 and calls == ["first"]
    hold.release()


@pytest.mark.parametrize(("take", "release", "name"), [
    (hold_logging, release_logging, "logging"),
    (hold_cwd, release_cwd, "cwd"),
])
def test_the_runtime_holds_all_refuse_an_unbalanced_release(take, release, name):
    take()
    release()
    with pytest.raises(RuntimeError, match=f"release_{name}\\(\\) without hold_{name}\\(\\)"):
        release()
