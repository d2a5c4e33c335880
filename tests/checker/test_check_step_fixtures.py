"""``benchmarks/check_step_fixtures.py``: every mechanism of issue 42 and every classic hazard caught by
the faces that can see it, every fixed variant clean under both (the script's exit status says so)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "check_step_fixtures.py"


@pytest.mark.slow
def test_every_mechanism_is_caught_and_every_fixed_variant_is_clean():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "FAILED" not in result.stdout
    assert result.stdout.startswith("| mechanism | fixture | `check_step` | `watch()` |")
    assert "hazards caught: check_step " in result.stdout
