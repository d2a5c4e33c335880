"""``recheck cost --plan`` and ``--ranks``: output and the errors (exit 2, one line, no traceback dump)."""

from __future__ import annotations

import json
import multiprocessing
import textwrap
from pathlib import Path

import pytest

from recheck.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "pipeline" / "pipeline_steps.py"

RANK_STEPS = textwrap.dedent(
    """
    import time

    import torch.distributed as dist

    def broken_on_rank_1():
        if dist.get_rank() == 1:
            raise RuntimeError("stage 1 cannot be built")
        return dist.barrier

    def hangs():
        time.sleep(600)

    def no_step_on_rank_1():
        return None if dist.get_rank() == 1 else dist.barrier
    """
)


def run_command(*argv: str) -> int:
    return main(["cost", *argv])


def test_plan_prints_the_prediction(capsys):
    assert run_command("--plan", f"{FIXTURE}:plan_step", "--schedule", "1f1b", "--microbatches", "4") == 0
    out = capsys.readouterr().out
    assert "predicted for 1f1b, 2 stage(s), 4 microbatches" in out
    assert "retained saved state, peak (predicted)       28.00 KiB     76.00 KiB" in out
    # stage 0: 258.50 KiB parameters + 16 KiB buffers and data, 258.50 KiB gradients, 3 outputs held,
    # 2 bundles, and the rise of a later backward (its weight gradients made before they are added)
    assert "observed peak (predicted)                   631.00 KiB    679.25 KiB" in out
    assert "  ... at action                                     B1            B1" in out
    assert "not predicted" not in out


def test_plan_json(capsys):
    argv = ["--plan", f"{FIXTURE}:plan_step", "--schedule", "gpipe", "--microbatches", "8", "--stages", "2", "--format", "json"]
    assert run_command(*argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schedule"] == "gpipe" and [s["theoretical_bundles"] for s in data["stages"]] == [8, 8]
    assert "theoretical_bundles" in data["definitions"] and "predicted_observed_peak" in data["definitions"]
    for stage in data["stages"]:
        for mode in ("checkpointed", "bypassed"):
            terms = stage["observed_terms"][mode]
            # GPipe's second backward: every gradient, 7 bundles, 8 outputs held, a later backward's rise
            at_second_backward = (terms["fixed"] + terms["gradients"] + 7 * terms["bundle"] + 8 * terms["kept"]
                                  + stage["stage"] * terms["sent_gradient"] + terms["backward_rise"])
            assert stage["observed_peak"][mode] == at_second_backward and terms["peak_action"] == "B1"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--plan", "{fixture}:untagged_step", "--schedule", "gpipe", "--microbatches", "4"], "recheck.tag(stage=s)"),
        (["--plan", "{fixture}:plan_step", "--schedule", "gpipe", "--microbatches", "4", "--stages", "3"],
         "--stages 3: the planning step ran 2 stage(s)"),
        (["--plan", "{fixture}:plan_step", "--schedule", "gpipe"], "--plan needs --schedule and --microbatches"),
        (["{fixture}:plan_step", "--schedule", "gpipe"], "--schedule needs --plan"),
        (["--plan", "--ranks", "2", "{fixture}:plan_step", "--schedule", "gpipe", "--microbatches", "4"],
         "--plan and --ranks are separate modes"),
        (["--ranks", "2", "{fixture}:gpipe_step", "--budget", "1GiB"], "--budget applies to a single-process step"),
        (["{fixture}:plan_step", "--timeout", "5"], "--timeout needs --ranks"),
        (["--plan", "{fixture}:missing", "--schedule", "gpipe", "--microbatches", "4"], "has no attribute 'missing'"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, message):
    assert run_command(*[a.format(fixture=FIXTURE) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("ranks", ["0", "65", "two"])
def test_bad_rank_counts_exit_2(capsys, ranks):
    with pytest.raises(SystemExit) as exited:
        run_command("--ranks", ranks, f"{FIXTURE}:gpipe_step")
    assert exited.value.code == 2
    assert "argument --ranks" in capsys.readouterr().err


@pytest.mark.slow
def test_ranks_prints_the_per_stage_table(capsys):
    # one rank holding the whole pipeline: a single stage that is both first and last
    assert run_command("--ranks", "1", "--timeout", "120", "--format", "json", f"{FIXTURE}:gpipe_step") == 0
    (stage,) = json.loads(capsys.readouterr().out)["stages"]
    assert (stage["rank"], stage["num_stages"], stage["schedule"], stage["theoretical_bundles"]) == (0, 1, "gpipe", 4)
    for mode in stage["modes"].values():
        assert mode["alive_at_peak"] == [0, 1, 2, 3]
        assert mode["predicted_retained_peak"] == mode["retained_peak"]
    assert stage["comm_buffer_bytes"] == 0  # no neighbour to talk to


@pytest.fixture
def rank_steps(tmp_path):
    path = tmp_path / "rank_steps.py"
    path.write_text(RANK_STEPS)
    return path


@pytest.mark.slow
def test_a_failing_rank_is_named_with_its_traceback(rank_steps, capsys):
    assert run_command("--ranks", "2", "--timeout", "60", f"{rank_steps}:broken_on_rank_1") == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("recheck cost: error: rank 1 of 2 failed running")
    assert first.endswith("RuntimeError: stage 1 cannot be built")
    assert 'raise RuntimeError("stage 1 cannot be built")' in err  # the user's frame
    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_a_rank_whose_step_is_missing_stops_every_rank(rank_steps, capsys):
    # rank 0 built its step; it must not wait for rank 1 in the schedule until --timeout
    assert run_command("--ranks", "2", "--timeout", "120", f"{rank_steps}:no_step_on_rank_1") == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == ("recheck cost: error: rank 1 of 2: STEP must return the zero-argument step "
                                   "to run on this rank, got NoneType")
    assert not multiprocessing.active_children()


@pytest.mark.slow
def test_a_world_past_its_timeout_is_killed(rank_steps, capsys):
    assert run_command("--ranks", "2", "--timeout", "2", f"{rank_steps}:hangs") == 2
    err = capsys.readouterr().err
    assert "did not finish within 2 s; killed (raise --timeout if the step is slow)" in err
    assert not multiprocessing.active_children()
