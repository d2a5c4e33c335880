"""Per-stage saved state of a real 2-stage pipeline, GPipe vs 1F1B, checkpointed vs bypassed.

Spawns one gloo world of two CPU ranks that runs ``fixtures/pipeline/pipeline_steps.py``'s
GPipe step and its 1F1B step (4 microbatches, two checkpointed MLP blocks per stage), each
traced with its checkpoints as written and bypassed; then measures the same stage
modules with ``recheck cost --plan``'s one-process run and prints, per schedule, stage and
mode, the measured figures beside the schedule's prediction from the measured bundles
and the plan's prediction, with the plan's error on the retained-state peak.

Run: ``python benchmarks/pipeline_table.py [--microbatches M] [--json]`` (``--microbatches``
changes only the plan's layout check: the real run uses the fixture's 4).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recheck.checker.targets import load_target
from recheck.cost.plan import measure_plan, predict
from recheck.cost.stage_table import plan_error, render_comparison, render_stages
from recheck.cost.stages import rank_entry
from recheck.distributed.launch import run_world

FIXTURE = ROOT / "fixtures" / "pipeline" / "pipeline_steps.py"
SPECS = {"gpipe": f"{FIXTURE}:gpipe_step", "1f1b": f"{FIXTURE}:one_f_one_b_step"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the world is killed")
    ns = parser.parse_args()
    started = time.perf_counter()
    per_rank = run_world(rank_entry, 2, args=(list(SPECS.values()),), timeout=ns.timeout)
    world_seconds = time.perf_counter() - started
    real = {kind: [report for results in per_rank for report in results[spec]] for kind, spec in SPECS.items()}
    (plan_target,) = load_target(f"{FIXTURE}:plan_step")
    started = time.perf_counter()
    measurement = measure_plan(plan_target.factory)
    plan_seconds = time.perf_counter() - started
    microbatches = real["gpipe"][0].microbatches
    plans = {kind: predict(measurement, kind, microbatches) for kind in SPECS}
    if ns.json:
        errors = {
            f"{kind}/stage{p.stage}/{mode}": plan_error(p.retained_peak[mode], r.modes[mode].retained_peak)
            for kind in SPECS
            for p in plans[kind]
            for r in real[kind]
            if r.stage == p.stage
            for mode in ("checkpointed", "bypassed")
        }
        print(json.dumps({
            "real": {kind: [r.to_dict() for r in reports] for kind, reports in real.items()},
            "plan": {kind: [p.to_dict() for p in predictions] for kind, predictions in plans.items()},
            "plan_errors": errors,
            "world_seconds": world_seconds,
            "plan_seconds": plan_seconds,
        }, indent=2))
        return 0
    print(render_comparison(real, plans))
    for kind, spec in SPECS.items():
        print()
        print(render_stages(real[kind], Path(spec).name))
    print(f"\n2-rank world (spawn included): {world_seconds:.1f} s; one-process plan: {plan_seconds:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
