"""Fixtures of the planner tests: small copies of the demo and of the GPT stack, loaded from their files.

The models are small so that a whole suggestion (census, solve, plan and anchor runs,
check_step on each) takes seconds on two shared cores; the figures asserted are the model's
against what the runs measured, never a wall time.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from source_modules import load_file

from recheck.cost.planner.candidates import find_candidates
from recheck.cost.planner.census import mode_config, trace_config
from recheck.runtime.steps import discover_state

ROOT = Path(__file__).resolve().parents[3]


def load_gpt() -> ModuleType:
    """``fixtures/models/gpt_stack.py`` (its 12-layer step is built at import, once)."""
    return load_file(ROOT / "fixtures" / "models" / "gpt_stack.py", "recheck_gpt_stack")


@pytest.fixture(scope="session")
def gpt() -> ModuleType:
    return load_gpt()


@pytest.fixture
def small_demo(demo):
    """The cost demo, small: 3 blocks, the tanh region, 2 MLP layers; one step taken (Adam's state)."""
    step, model, optimizer = demo.make_step(blocks=3, mlp_layers=2, seq=16, dim=32, hidden=64, default_batch=4)
    step()
    return step, model, optimizer


def unit_peaks(step) -> tuple[int, int]:
    """Observed peaks of ``step`` with every unit checkpointed and with nothing checkpointed."""
    state = discover_state(step)
    restore = state.snapshot()
    candidates = find_candidates(step, state, restore)
    return tuple(trace_config(step, state, restore, candidates, mode_config(m, candidates)).observed_peak
                 for m in ("full", "none"))


@pytest.fixture
def peaks():
    return unit_peaks
