"""`recheck check --step file.py:fn`: the CLI face of watch(), on the steps in fixtures/steps/."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: each test runs `python -m recheck` in a new process
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STEPS = ROOT / "fixtures" / "steps" / "train_steps.py"


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "recheck", "check", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("step, kinds, twin", [
    ("clean_step", set(), set()),
    # the recompute against its forward (watch), and the gradients against the uncheckpointed twin
    ("global_flipped_step", {"global", "recompute"}, {"gradient"}),
    # the step zeroes the gradients at its end and its parameters are updated before the hazard
    # reaches them: the twins end alike
    ("optimizer_before_backward_step", {"param_version", "recompute"}, set()),
])
@pytest.mark.parametrize("mode", ["twin", "watch-only"])
def test_steps_report_their_hazards(step, kinds, twin, mode):
    out = run("--step", f"{STEPS}:{step}", "--format", "json", *(["--watch-only"] if mode == "watch-only" else []))
    assert out.returncode == (1 if kinds else 0), out.stderr
    (report,) = json.loads(out.stdout)["steps"]
    assert {f["kind"] for f in report["findings"]} == (kinds | twin if mode == "twin" else kinds)


def test_text_output_names_region_callsite_and_rule():
    out = run("--step", f"{STEPS}:global_flipped_step")
    assert out.returncode == 1
    assert "global `train_steps.SCALE` was 1.0 at forward and 2.0 at recompute" in out.stdout
    assert "Block.forward" in out.stdout and "train_steps.py:37" in out.stdout
    assert "see `recheck explain RC101`" in out.stdout
    assert out.stdout.rstrip().endswith("recheck: ran 1 step: 1 with findings")


@pytest.mark.parametrize("table", ["early-stop = false", "strict = true"])
def test_early_stop_and_store_come_from_tool_recheck(tmp_path, table):
    (tmp_path / "pyproject.toml").write_text(f'[tool.recheck]\n{table}\nstore = "copy"\n')
    out = run("--step", f"{STEPS}:global_flipped_step", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "early_stop=False: non-reentrant recomputations were replayed fully" in out.stdout
    assert "first difference at index" in out.stdout  # store="copy" shows the first differing element


@pytest.mark.parametrize("args, message", [
    ((), "nothing to check"),
    (("--step", "nope.py:f"), "no such file: nope.py"),
    (("--step", "no-colon"), "expected FILE.py:FUNCTION"),
    ((f"{STEPS}:clean_step", "--step", f"{STEPS}:clean_step"), "not both"),
    ((f"{ROOT}/fixtures/models/zoo.py:region_mlp", "--strict"), "--strict, --store, --watch-only and --repeats go with --step"),
    (("--step", f"{STEPS}:clean_step", "--watch-only", "--repeats", "2"), "not with --watch-only"),
])
def test_usage_errors_exit_2(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr


def test_step_takes_the_tolerance_and_early_stop_of_watch(tmp_path):
    out = run("--step", f"{STEPS}:global_flipped_step", "--no-early-stop", "--atol", "10", "--rtol", "10",
              cwd=tmp_path)
    # the global's value differs exactly (never tolerated); the saved tensor only by a tolerated amount
    assert out.returncode == 1, out.stderr
    assert "global `train_steps.SCALE`" in out.stdout and "saved tensors" not in out.stdout
    bad = run("--step", f"{STEPS}:global_flipped_step", "--atol", "1e-3", cwd=tmp_path)
    assert bad.returncode == 2 and "--atol and --rtol go together" in bad.stderr
