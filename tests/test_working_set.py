"""The working-set lab: the figures the issue fixes, predictions, the loop, bad input."""

import io
import subprocess
import sys

import pytest

from recheck.commands.lab import interact
from recheck.working_set import LabError, WorkingSetLab


def run_cli(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "recheck", "lab", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_reset_replays_the_first_sixteen_requests():
    lab = WorkingSetLab(capacity=4, stride=4)
    assert (lab.requests, lab.hits, lab.working_set) == (16, 12, 4)


@pytest.mark.parametrize(
    "capacity, stride, steps, requests, hits",
    [(4, 4, 1, 17, 13), (2, 4, 0, 16, 0), (16, 1, 16, 32, 16), (1, 0, 3, 19, 18)],
)
def test_lru_figures(capacity, stride, steps, requests, hits):
    lab = WorkingSetLab(capacity, stride)
    lab.step(steps)
    assert (lab.requests, lab.hits, lab.misses) == (requests, hits, requests - hits)


def test_cli_figures_from_the_issue():
    out = run_cli("--capacity", "4", "--stride", "4", "--steps", "1")
    assert out.returncode == 0, out.stderr
    assert "17 requests, 13 hits, 4 misses" in out.stdout
    out = run_cli("--capacity", "2", "--stride", "4")
    assert out.returncode == 0, out.stderr
    assert "16 requests, 0 hits, 16 misses" in out.stdout
    assert "does not rematerialize activations, preserve RNG state, trace autograd" in out.stdout


def test_prediction_held_and_not_held():
    held = run_cli("--capacity", "4", "--stride", "4", "--steps", "4", "--predict", "4")
    assert "prediction: 4 of the next 4 requests hit" in held.stdout
    assert "prediction held: predicted 4 hits, got 4" in held.stdout
    missed = run_cli("--capacity", "2", "--stride", "4", "--steps", "2", "--predict", "1")
    assert "prediction did not hold: predicted 1 hits, got 0" in missed.stdout


def test_predict_without_steps_is_a_usage_error():
    out = run_cli("--predict", "2")
    assert out.returncode == 2
    assert "--predict needs --steps" in out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (("--capacity", "0"), "capacity must be at least 1 line, got 0"),
        (("--stride", "-4"), "stride must be 0 or more, got -4"),
        (("--capacity", "four"), "capacity must be a whole number, got 'four'"),
        (("--steps", "1.5"), "steps must be a whole number, got '1.5'"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(args, message):
    out = run_cli(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_interactive_loop_from_stdin():
    script = "show\nstep 1\ncapacity 2\npredict 0\nstep 2\nstride x\nfly\ncapacity\nquit\n"
    out = run_cli("-i", stdin=script)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "16 requests, 12 hits, 4 misses" in text  # show after the initial reset
    assert "17 requests, 13 hits, 4 misses" in text  # step 1
    assert "16 requests, 0 hits, 16 misses" in text  # capacity 2 resets
    assert "prediction held: predicted 0 hits, got 0" in text
    assert "18 requests, 0 hits, 18 misses" in text
    assert "error: stride must be a whole number, got 'x'" in text
    assert "error: unknown command 'fly'" in text
    assert "error: 'capacity' takes one number" in text
    assert "does not rematerialize activations" in text


def test_interactive_loop_ends_at_end_of_input():
    stdout = io.StringIO()
    assert interact(WorkingSetLab(4, 4), io.StringIO("step 3\n"), stdout) == 0
    assert "19 requests, 15 hits, 4 misses" in stdout.getvalue()


def test_library_rejects_bad_settings():
    with pytest.raises(LabError):
        WorkingSetLab(0, 1)
    with pytest.raises(LabError):
        WorkingSetLab(2, -1)
    with pytest.raises(LabError):
        WorkingSetLab(True, 1)


def test_steps_past_the_limit_are_a_usage_error_naming_it():
    from recheck.working_set import MAX_STEPS

    out = run_cli("--steps", str(MAX_STEPS + 1))
    assert out.returncode == 2
    assert f"steps must be at most {MAX_STEPS}" in out.stderr
    assert "repeats" in out.stderr  # why: more steps show nothing new
    assert out.stdout == "" and "Traceback" not in out.stderr
    edge = run_cli("--capacity", "4", "--stride", "4", "--steps", str(MAX_STEPS))
    assert edge.returncode == 0, edge.stderr
    assert f"{16 + MAX_STEPS} requests" in edge.stdout


def test_interactive_step_past_the_limit_is_an_error_and_the_loop_goes_on():
    from recheck.working_set import MAX_STEPS

    stdout = io.StringIO()
    assert interact(WorkingSetLab(4, 4), io.StringIO(f"step {MAX_STEPS + 1}\nstep 1\n"), stdout) == 0
    assert f"error: step count must be at most {MAX_STEPS}" in stdout.getvalue()
    assert "17 requests, 13 hits, 4 misses" in stdout.getvalue()


def test_library_step_is_bounded_too():
    from recheck.working_set import MAX_STEPS

    lab = WorkingSetLab(4, 4)
    with pytest.raises(LabError, match=f"at most {MAX_STEPS}"):
        lab.step(MAX_STEPS + 1)
    assert lab.requests == 16  # nothing was served


def test_a_huge_number_is_not_echoed_whole():
    out = run_cli("--steps", "9" * 5000)
    assert out.returncode == 2
    assert len(out.stderr) < 600 and "Traceback" not in out.stderr
