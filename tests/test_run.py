"""``recheck run``: an unmodified program run as python runs it, inside ``watch()``, with a step window."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recheck.findings import Report

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "fixtures" / "programs"


def recheck_run(*args, cwd=ROOT, stderr=subprocess.PIPE):
    return subprocess.run([sys.executable, "-m", "recheck", "run", *map(str, args)], cwd=cwd,
                          stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300)


def python(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)


def shown(stdout):
    seen = json.loads(stdout.strip().splitlines()[0])
    seen.pop("file")  # python 3.9+ makes a script's __file__ absolute; runpy keeps it as typed
    return seen


# -- running the program as python would ----------------------------------------------------------


def test_a_script_sees_the_argv_name_and_path_python_gives_it():
    args = ["fixtures/programs/show_argv.py", "a", "--steps", "5", "--format", "json", "-m", "x", "-h"]
    watched = recheck_run(*args)
    plain = python(*args)
    assert watched.returncode == 0, watched.stderr
    assert shown(watched.stdout) == shown(plain.stdout)
    assert shown(watched.stdout)["argv"] == args  # recheck's look-alike options are the program's
    assert shown(watched.stdout)["name"] == "__main__" and shown(watched.stdout)["main_is_me"]
    assert shown(watched.stdout)["path0"] == str(PROGRAMS)


def test_a_module_sees_the_argv_and_path_python_m_gives_it():
    watched = recheck_run("--steps", "1", "-m", "programs.show_argv", "--steps", "5", cwd=ROOT / "fixtures")
    plain = python("-m", "programs.show_argv", "--steps", "5", cwd=ROOT / "fixtures")
    assert watched.returncode == 0, watched.stderr
    assert shown(watched.stdout) == shown(plain.stdout)
    assert shown(watched.stdout)["argv"] == [str(PROGRAMS / "show_argv.py"), "--steps", "5"]
    assert shown(watched.stdout)["path0"] == str(ROOT / "fixtures")


# -- exit status ---------------------------------------------------------------------------------


def test_a_clean_program_exits_0_with_its_report_on_stderr():
    out = recheck_run(PROGRAMS / "train_clean.py")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [line for line in python(PROGRAMS / "train_clean.py").stdout.splitlines()]
    assert "recheck: no difference found" in out.stderr
    assert "watched the whole program (3 steps); a step is one torch.optim.Optimizer.step() call" in out.stderr
    assert "no finding; the program exited with status 0" in out.stderr


def test_findings_exit_1_and_exit_zero_makes_them_0():
    out = recheck_run(PROGRAMS / "train_loop.py", "--steps", "2")
    assert out.returncode == 1, out.stderr
    assert "RC002" in out.stderr and "the program exited with status 0" in out.stderr
    assert recheck_run("--exit-zero", PROGRAMS / "train_loop.py", "--steps", "2").returncode == 0


def test_a_program_that_raises_exits_with_its_status_and_traceback():
    out = recheck_run(PROGRAMS / "raises.py")
    plain = python(PROGRAMS / "raises.py")
    assert out.returncode == plain.returncode == 1
    traceback = out.stderr[out.stderr.index("Traceback"):out.stderr.index("recheck run: summary")]
    assert traceback == plain.stderr  # as python prints it: no runpy or recheck frame
    assert out.stdout == plain.stdout == "one step done\n"


def test_sys_exit_status_is_the_program_status():
    assert recheck_run(PROGRAMS / "show_argv.py", "exit=3").returncode == 3
    assert recheck_run(PROGRAMS / "show_argv.py", "exit=0").returncode == 0


@pytest.mark.parametrize("argv, message", [
    ([], "nothing to run"),
    (["no_such_script.py"], "'no_such_script.py': no such file"),
    (["-m", "no_such_module_anywhere"], "no module named 'no_such_module_anywhere'"),
    (["-m"], "-m needs a MODULE"),
    (["--report", ".", "fixtures/programs/train_clean.py"], "is a folder"),
])
def test_usage_errors_exit_2_before_anything_runs(argv, message, capsys):
    from recheck.cli import main

    assert main(["run", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_command_module_does_not_import_torch():
    code = ("import sys; from recheck.cli import main; import recheck.commands.run_program; "
            "status = main(['run', 'no_such_script.py']); print(status, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr


# -- the step window -----------------------------------------------------------------------------

WATCHED_PER_STEP = """
import torch
from torch.utils.checkpoint import checkpoint
from recheck.intercept import patches

torch.manual_seed(0)
layer = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(layer.parameters(), lr=0.1)
for step in range(1, 6):
    intercepted = patches.installed() is not None
    checkpoint(layer, torch.randn(2, 4), use_reentrant=False).sum().backward()
    opt.step()
    print(step, intercepted)
"""


def test_steps_2_stops_intercepting_after_the_second_optimizer_step(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(WATCHED_PER_STEP)
    report = tmp_path / "report.json"
    out = recheck_run("--steps", "2", "--format", "json", "--report", report, script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:5] == ["1 True", "2 True", "3 False", "4 False", "5 False"]
    document = json.loads(report.read_text())
    assert document["steps"]["unit"] == "optimizer step" and document["steps"]["watched"] == 2
    assert document["report"]["stats"]["invocations"] == 2  # the calls of steps 3-5 were not seen


def test_the_report_prints_when_the_steps_end_and_again_at_exit():
    out = recheck_run("--steps", "2", PROGRAMS / "train_loop.py", "--steps", "5", stderr=subprocess.STDOUT)
    text = out.stdout
    ended = text.index("recheck run: the first 2 step(s) ended")
    assert text.index("step 1 loss") < ended < text.index("step 3 loss")
    assert text.index("step 5 loss") < text.index("recheck run: summary")
    assert text.count("watched the first 2 steps; a step is one torch.optim.Optimizer.step() call") == 2
    assert "calls 1–2 of 2" in text  # the report counts only the first two steps' invocations


def test_without_an_optimizer_a_step_is_one_backward_call(tmp_path):
    report = tmp_path / "report.json"
    out = recheck_run("--steps", "2", "--format", "json", "--report", report, PROGRAMS / "backward_only.py")
    assert out.returncode == 0, out.stderr
    document = json.loads(report.read_text())
    assert document["steps"]["unit"] == "backward" and document["steps"]["watched"] == 2
    assert document["report"]["stats"]["invocations"] == 2
    assert "a step is one torch.autograd.backward call" in out.stderr


def test_json_report_to_a_path_holds_the_run_and_the_whole_report(tmp_path):
    path = tmp_path / "out" / "report.json"
    out = recheck_run("--format", "json", "--report", path, PROGRAMS / "train_loop.py", "--steps", "3")
    assert out.returncode == 1
    document = json.loads(path.read_text())
    assert document["program"] == str(PROGRAMS / "train_loop.py")
    assert document["argv"][1:] == ["--steps", "3"] and document["program_status"] == 0
    report = Report.from_dict(document["report"])
    assert not report.ok and {f.code for f in report} >= {"RC002"}
    assert "recheck run: summary" in out.stderr  # the person at the terminal still reads the text


# -- the step counter in process -----------------------------------------------------------------


REENTRANT_BACKWARD = """
import torch
from torch.utils.checkpoint import checkpoint

layer = torch.nn.Linear(4, 4)
for _ in range(4):
    checkpoint(layer, torch.randn(2, 4, requires_grad=True), use_reentrant=True).sum().backward()
"""


def test_a_reentrant_checkpoints_inner_backward_is_not_a_step(tmp_path):
    # In a fresh interpreter: whether an optimizer exists is a fact of the process (any optimizer
    # made earlier, by another test in this one, makes the step an optimizer step).
    script, report = tmp_path / "reentrant.py", tmp_path / "report.json"
    script.write_text(REENTRANT_BACKWARD)
    out = recheck_run("--steps", "2", "--format", "json", "--report", report, script)
    assert out.returncode == 0, out.stderr
    document = json.loads(report.read_text())
    assert document["steps"]["unit"] == "backward" and document["steps"]["watched"] == 2
    assert document["report"]["stats"]["invocations"] == 2


def test_a_failure_of_recheck_at_the_step_boundary_is_a_note_and_the_program_goes_on():
    import torch

    from recheck.watcher.program import ProgramWatch

    def broken(_watcher):
        raise RuntimeError("renderer broke")

    original = torch.autograd.backward
    watcher = ProgramWatch(1, {}, on_window_end=broken)
    watcher.start()
    try:
        layer = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        for _ in range(3):
            layer(torch.randn(2, 4)).sum().backward()
            opt.step()  # the window ends here, and its callback raises
    finally:
        report = watcher.stop()
    assert any("renderer broke" in note for note in report.notes)
    assert torch.autograd.backward is original  # no trace left


def test_a_relative_report_path_is_the_one_given_even_when_the_program_changes_folder(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    script = tmp_path / "wander.py"
    script.write_text("import os\nos.chdir('elsewhere')\nprint('moved')\n")
    out = recheck_run("--format", "json", "--report", "report.json", script, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "report.json").read_text())["program_status"] == 0
    assert not (tmp_path / "elsewhere" / "report.json").exists()


def test_json_without_report_goes_to_stderr_and_stdout_stays_the_programs():
    out = recheck_run("--format", "json", PROGRAMS / "train_clean.py")
    assert out.returncode == 0, out.stderr
    assert all(line.startswith("step ") for line in out.stdout.splitlines())
    document = json.loads(out.stderr[out.stderr.index("{"):])
    assert document["report"]["ok"] and document["steps"]["watched"] == 3


def test_a_watch_that_cannot_start_is_a_note_and_nothing_raises():
    from recheck.watcher.program import ProgramWatch

    watcher = ProgramWatch(1, {"store": "bogus"})
    watcher.start()  # never raised into the program
    report = watcher.stop()
    assert any("store" in note for note in report.notes)


def test_under_a_launcher_each_rank_writes_its_own_report_file(tmp_path):
    report = tmp_path / "report.json"
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2"}
    out = subprocess.run([sys.executable, "-m", "recheck", "run", "--format", "json", "--report", str(report),
                          str(PROGRAMS / "train_clean.py")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert not report.exists()
    document = json.loads((tmp_path / "report.rank1.json").read_text())
    assert (document["rank"], document["world_size"]) == (1, 2)


def test_an_optimizer_that_steps_an_inner_optimizer_is_one_step():
    import torch
    from torch.utils.checkpoint import checkpoint

    from recheck.watcher.program import OPTIMIZER_STEP, ProgramWatch

    class Wrapping(torch.optim.Optimizer):  # ZeroRedundancyOptimizer's shape: an optimizer around a local one
        def __init__(self, params):
            params = list(params)
            super().__init__(params, {})
            self.inner = torch.optim.SGD(params, lr=0.1)

        def step(self, closure=None):
            return self.inner.step(closure)

    layer = torch.nn.Linear(4, 4)
    opt = Wrapping(layer.parameters())
    watcher = ProgramWatch(2, {})
    watcher.start()
    try:
        for _ in range(4):
            checkpoint(layer, torch.randn(2, 4), use_reentrant=False).sum().backward()
            opt.step()
    finally:
        watcher.stop()
    assert (watcher.unit, watcher.optimizer_steps) == (OPTIMIZER_STEP, 2)
    assert watcher.report.stats["invocations"] == 2


# -- --check-step ---------------------------------------------------------------------------------


def test_check_step_compares_the_next_call_of_the_step_function_and_leaves_no_trace(tmp_path):
    report = tmp_path / "report.json"
    script = PROGRAMS / "train_step_function.py"
    out = recheck_run("--check-step", "--format", "json", "--report", report, script)
    assert out.returncode == 1, out.stderr
    assert out.stdout == python(script).stdout  # the twin's runs are put back: every loss as without recheck
    document = json.loads(report.read_text())
    assert document["steps"]["watched"] == 1  # --check-step watches one step unless --steps says more
    twin = document["report"]["stats"]["check_step"]
    assert twin["step"] == "train_step (train_step_function.py:32)" and twin["runs"] >= 2
    kinds = [f["kind"] for f in document["report"]["findings"]]
    assert kinds.count("recompute") == 2 and "gradient" in kinds  # the watched step's; the twin's own
    assert "--check-step: the next call of train_step" in out.stderr


def test_check_step_of_a_clean_step_function_finds_nothing():
    out = recheck_run("--check-step", "--steps", "2", PROGRAMS / "train_step_function.py", "--clean")
    assert out.returncode == 0, out.stderr
    assert "was compared with its uncheckpointed twin: no findings" in out.stderr


def test_check_step_on_a_loop_body_says_why_it_compares_nothing():
    out = recheck_run("--check-step", "--exit-zero", PROGRAMS / "train_clean.py")
    assert out.returncode == 0, out.stderr
    assert "no step was compared with its twin: its forward and backward run in the top level of train_clean.py" \
        in out.stderr
    assert "a loop body is not a function recheck can call again" in out.stderr


# -- the terminal's width --------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_report_wraps_to_its_width_and_plain_text_does_not(monkeypatch):
    from recheck.commands.run_program import _text
    from recheck.findings import Finding

    monkeypatch.setenv("COLUMNS", "50")
    monkeypatch.setenv("NO_COLOR", "1")
    where = "in Block.forward (model.py:8), call 1 of 4, checkpointed at train.py:30 inside a long loop"
    report = Report([Finding("rng", f"cpu RNG state differs {where}", subject="cpu RNG")],
                    title="recheck run train.py: watched the first 2 steps; a step is one optimizer step")
    wrapped = _text(report, verbose=False, stream=Terminal())
    assert max(map(len, wrapped.splitlines())) <= 50
    assert " ".join(wrapped.split()) == " ".join(_text(report, verbose=False).split())  # every word kept
    assert "\n    a step is one optimizer step" in wrapped  # a continuation is indented under its line
    assert max(map(len, _text(report, verbose=False, stream=io.StringIO()).splitlines())) > 50


def test_fit_width_counts_colour_codes_as_nothing_and_keeps_long_words_whole():
    from recheck.progress import fit_width

    assert fit_width("\x1b[1mbold\x1b[0m word", 9) == "\x1b[1mbold\x1b[0m word"
    assert fit_width("  a /a/very/long/path/name b", 10) == "  a\n    /a/very/long/path/name\n    b"
    assert fit_width("unchanged without a width " * 9, None) == "unchanged without a width " * 9


def test_check_step_leaves_a_profiler_of_the_programs_own_in_place(tmp_path):
    script = tmp_path / "profiled.py"
    script.write_text("import runpy, sys\nsteps = []\n"
                      "sys.setprofile(lambda f, e, a: steps.append(1) if e == 'call' and f.f_code.co_name == "
                      "'train_step' else None)\n"
                      f"runpy.run_path({str(PROGRAMS / 'train_step_function.py')!r}, run_name='__main__')\n"
                      "sys.setprofile(None)\nprint('profiled steps', len(steps))\n")
    out = recheck_run("--check-step", "--exit-zero", script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "profiled steps 4"  # the program's profiler saw every step
    assert "the program runs under a profiler (sys.setprofile)" in out.stderr


def test_the_window_report_starts_on_a_line_of_its_own_after_a_progress_bar(tmp_path):
    script = tmp_path / "bar.py"
    script.write_text("import sys\nimport torch\n"
                      "layer = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(layer.parameters(), lr=0.1)\n"
                      "for step in range(1, 4):\n"
                      "    print(f'\\r{step}/3 steps', end='', file=sys.stderr, flush=True)\n"
                      "    layer(torch.randn(2, 4)).sum().backward()\n"
                      "    opt.step()\n")
    out = subprocess.run([sys.executable, "-m", "recheck", "run", "--steps", "2", str(script)], cwd=ROOT,
                         capture_output=True, timeout=300)  # bytes: text mode would turn the bar's \r into \n
    assert out.returncode == 0, out.stderr
    assert b"\r2/3 steps\nrecheck run: the first 2 step(s) ended" in out.stderr  # not after the bar's text
