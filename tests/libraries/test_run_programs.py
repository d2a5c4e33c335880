"""``recheck run --steps 2`` on the example programs a user would try first, unmodified: a
``run_clm.py``-style transformers ``Trainer`` script (tiny Llama, ``--gradient_checkpointing``)
and a Lightning script, each in its own interpreter, as ``.ci/run`` runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from library_env import require

require("torch")
require("transformers")
require("accelerate")
require("lightning")

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "fixtures" / "programs"


def recheck_run(tmp_path, *args):
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "recheck", "run", "--steps", "2", "--report", str(report),
                          "--format", "json", *map(str, args)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    return out, json.loads(report.read_text())


def test_a_transformers_trainer_script_with_gradient_checkpointing(tmp_path):
    out, document = recheck_run(tmp_path, PROGRAMS / "hf_clm.py", "--output_dir", tmp_path / "clm", "--max_steps",
                                "4", "--gradient_checkpointing", "--use_cpu", "--report_to", "none",
                                "--save_strategy", "no", "--disable_tqdm", "true")
    assert out.returncode == 0, out.stderr
    assert "trained 4 steps" in out.stdout  # the run goes on after the watched steps
    assert document["steps"] == {"asked": 2, "watched": 2, "unit": "optimizer step", "optimizer_steps": 2,
                                 "backward_calls": 2, "window_ended": True}
    stats = document["report"]["stats"]
    assert stats["invocations"] == 4 and stats["verified"] == 4  # 2 decoder layers, 2 steps
    assert "recheck run: the first 2 step(s) ended" in out.stderr.split("trained 4 steps")[0]


def test_a_lightning_script_reports_its_hazard_and_checks_clean_without_it(tmp_path):
    out, document = recheck_run(tmp_path, PROGRAMS / "lightning_train.py", "--max-steps", "4")
    assert out.returncode == 1, out.stderr
    assert "trained 4 steps" in out.stdout
    assert "RC002" in {f["code"] for f in document["report"]["findings"]}  # preserve_rng_state=False
    assert document["steps"]["watched"] == 2 and document["report"]["stats"]["invocations"] == 2
    clean, document = recheck_run(tmp_path, PROGRAMS / "lightning_train.py", "--max-steps", "4",
                                  "--preserve-rng-state")
    assert clean.returncode == 0, clean.stderr
    assert document["report"]["ok"]
