"""``recheck run --check-step`` on an unmodified transformers ``Trainer`` script: the twin of
``Trainer.training_step`` leaves the Trainer's optimizer (accelerate's wrapper), scheduler and
callback handler as the step as written does, and the check puts them back in place."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from library_env import require

require("torch")
require("transformers")
require("accelerate")

PROGRAM = Path(__file__).resolve().parents[2] / "fixtures" / "programs" / "hf_clm.py"


def test_check_step_on_a_trainer_reports_no_state_difference(tmp_path):
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "recheck", "run", "--check-step", "--report", str(report),
                          "--format", "json", str(PROGRAM), "--output_dir", str(tmp_path / "clm"), "--max_steps", "3",
                          "--gradient_checkpointing", "--use_cpu", "--report_to", "none", "--save_strategy", "no",
                          "--disable_tqdm", "true"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    document = json.loads(report.read_text())["report"]
    assert document["stats"]["check_step"]["step"].startswith("Trainer.training_step")  # the twin ran
    assert document["findings"] == [], document["findings"]
    for name in ("optimizer", "lr_scheduler", "callback_handler"):  # not even "cannot compare"
        assert not [note for note in document["notes"] if f".{name}`" in note], document["notes"]
