"""``recheck run --steps 2`` on a timm training loop, unmodified: a ResNet with timm's own gradient
checkpointing (``checkpoint_seq`` over its stages), as ``.ci/run`` runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from library_env import require

require("torch")
require("timm")

PROGRAM = Path(__file__).resolve().parents[2] / "fixtures" / "programs" / "timm_train.py"


def recheck_run(tmp_path, *args, json_report=True):
    report = tmp_path / "report.json"
    options = ["--report", str(report), "--format", "json"] if json_report else []
    out = subprocess.run([sys.executable, "-m", "recheck", "run", "--steps", "2", *options, str(PROGRAM),
                          "--model", "resnet18", "--steps", "4", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    return out, (json.loads(report.read_text()) if json_report else None)


def test_a_timm_training_loop_reports_batchnorm_once_on_one_screen(tmp_path):
    out, document = recheck_run(tmp_path)
    assert out.returncode == 1, out.stderr
    assert "trained 4 steps" in out.stdout  # training goes on after the watched steps
    assert {f["code"] for f in document["report"]["findings"]} == {"RC106"}  # BatchNorm statistics, every stage
    text, _ = recheck_run(tmp_path, json_report=False)
    window = text.stderr.split("recheck run: summary")[0].split("runs unwatched")[-1]
    lines = window.strip().splitlines()
    assert 0 < len(lines) <= 25, window  # the default report fits a screen; JSON keeps every finding
    assert "timm/models/" in window and "site-packages" not in window  # a library file by its import path


def test_the_same_loop_with_batchnorm_in_eval_mode_is_clean(tmp_path):
    out, document = recheck_run(tmp_path, "--eval-norm")
    assert out.returncode == 0, out.stderr
    assert document["report"]["ok"]
