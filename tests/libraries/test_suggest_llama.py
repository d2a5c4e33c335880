"""``recheck.suggest`` on a real transformers model: its decoder layers are the units, the plan fits and
checks clean, and the plan applied with the model's own checkpointing off runs at the measured peak."""

from __future__ import annotations

import warnings

import pytest
from library_env import require

torch = require("torch")
transformers = require("transformers")

import recheck  # noqa: E402
from recheck.cost.planner.candidates import find_candidates  # noqa: E402
from recheck.cost.planner.census import mode_config, trace_config  # noqa: E402
from recheck.runtime.steps import discover_state  # noqa: E402


def llama():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "fixtures" / "models" / "tiny_llama.py"
    spec = importlib.util.spec_from_file_location("recheck_fixture_tiny_llama", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.build(width=32, tokens=64, vocab=128)


@pytest.mark.slow
def test_a_tiny_llama_gets_a_plan_over_its_decoder_layers_that_fits_and_checks_clean():
    step, model = llama()
    state = discover_state(step)
    restore = state.snapshot()
    candidates = find_candidates(step, state, restore)
    assert [(c.name, c.kind, c.written) for c in candidates.items] == [
        (f"model.layers.{i}", "unit", True) for i in range(4)]
    low, high = (trace_config(step, state, restore, candidates, mode_config(m, candidates)).observed_peak
                 for m in ("full", "none"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = recheck.suggest(step, budget=(low + high) // 2, repeats=1)
    assert s.suggested.fits(s.budget) and s.suggested.verified, str(s)
    assert abs(s.suggested.peak_error) <= 0.05
    assert all(a.verified for a in s.anchors), str(s)
    model.gradient_checkpointing_disable()
    # transformers turns the KV cache off while it checkpoints: off without it, the cache is kept
    # (64 KiB more here), so the user's run keeps it off to run the step that was measured
    model.config.use_cache = False
    with recheck.apply_plan(model, s.plan):
        assert recheck.check_step(step).ok
        assert recheck.measure(step, repeats=1).checkpointed.observed_peak == s.suggested.measured_peak
