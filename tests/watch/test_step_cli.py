"""`recheck check --step file.py:fn`: the CLI face of watch(), on the steps in fixtures/steps/."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ROOT / "fixtures" / "steps" / "train_steps.py"


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "recheck", "check", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("step, kinds", [
    ("clean_step", set()),
    ("global_flipped_step", {"global", "recompute"}),
    ("optimizer_before_backward_step", {"param_version", "recompute"}),
])
def test_steps_report_their_hazards(step, kinds):
    out = run("--step", f"{STEPS}:{step}", "--format", "json")
    assert out.returncode == (1 if kinds else 0), out.stderr
    (report,) = json.loads(out.stdout)["steps"]
    assert {f["kind"] for f in report["findings"]} == kinds


def test_text_output_names_region_callsite_and_rule():
    out = run("--step", f"{STEPS}:global_flipped_step")
    assert out.returncode == 1
    assert "global `train_steps.SCALE` was 1.0 at forward and 2.0 at recompute" in out.stdout
    assert "Block.forward" in out.stdout and "train_steps.py:37" in out.stdout
    assert "see `recheck explain RC101`" in out.stdout
    assert out.stdout.rstrip().endswith("recheck: ran 1 step: 1 with findings")


def test_strict_and_store_come_from_tool_recheck(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.recheck]\nstrict = true\nstore = "copy"\n')
    out = run("--step", f"{STEPS}:global_flipped_step", cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "strict=True" in out.stdout
    assert "first difference at index" in out.stdout  # store="copy" shows the first differing element


@pytest.mark.parametrize("args, message", [
    ((), "nothing to check"),
    (("--step", "nope.py:f"), "no such file: nope.py"),
    (("--step", "no-colon"), "expected FILE.py:FUNCTION"),
    ((f"{STEPS}:clean_step", "--step", f"{STEPS}:clean_step"), "not both"),
    ((f"{ROOT}/fixtures/models/zoo.py:region_mlp", "--strict"), "--strict and --store go with --step"),
])
def test_usage_errors_exit_2(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr
