"""Per-stage memory of a real 2-stage pipeline against ``recheck cost --plan``'s prediction.

Spawns one gloo world of two CPU ranks that runs ``fixtures/pipeline/pipeline_steps.py``'s
GPipe and 1F1B steps in two shapes (4 microbatches of 8 rows, 8 microbatches of 4 rows;
two checkpointed MLP blocks per stage), each traced with its checkpoints as written and
bypassed; then measures the same stage modules with ``recheck cost --plan``'s one-process
run (one microbatch of the shape's size) and prints, per shape, schedule, stage and mode,
the measured figures beside the schedule's prediction from the measured bundles and the
plan's predictions, with the plan's errors on the retained-state peak and on the observed
peak.

Run: ``python benchmarks/pipeline_table.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recheck.loading import load_target  # noqa: E402
from recheck.cost.pipeline.plan import measure_plan, predict  # noqa: E402
from recheck.cost.pipeline.stage_table import plan_error, render_comparison, render_stages  # noqa: E402
from recheck.cost.pipeline.stages import rank_entry  # noqa: E402
from recheck.distributed.launch import run_world  # noqa: E402

FIXTURE = ROOT / "fixtures" / "pipeline" / "pipeline_steps.py"
#: shape -> (real-run step per schedule, planning step)
SHAPES = {
    "4 microbatches of 8 rows": ({"gpipe": f"{FIXTURE}:gpipe_step", "1f1b": f"{FIXTURE}:one_f_one_b_step"},
                                 f"{FIXTURE}:plan_step"),
    "8 microbatches of 4 rows": ({"gpipe": f"{FIXTURE}:gpipe_8_step", "1f1b": f"{FIXTURE}:one_f_one_b_8_step"},
                                 f"{FIXTURE}:plan_8_step"),
}
from recheck.cost.router import MODES as _MODES  # noqa: E402


def _errors(real, plans) -> dict[str, dict[str, float | None]]:
    return {
        f"{kind}/stage{p.stage}/{mode}": {
            "retained": plan_error(p.retained_peak[mode], r.modes[mode].retained_peak),
            "observed": None if p.observed_peak.get(mode) is None
            else plan_error(p.observed_peak[mode], r.modes[mode].observed_peak),
        }
        for kind in plans
        for p in plans[kind]
        for r in real[kind]
        if r.stage == p.stage
        for mode in _MODES
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before the world is killed")
    ns = parser.parse_args()
    specs = [spec for steps, _ in SHAPES.values() for spec in steps.values()]
    started = time.perf_counter()
    per_rank = run_world(rank_entry, 2, args=(specs,), timeout=ns.timeout)
    world_seconds = time.perf_counter() - started
    results: dict[str, dict] = {}
    plan_seconds = 0.0
    for shape, (steps, plan_spec) in SHAPES.items():
        real = {kind: [report for ranks in per_rank for report in ranks[spec]] for kind, spec in steps.items()}
        (plan_target,) = load_target(plan_spec)
        started = time.perf_counter()
        measurement = measure_plan(plan_target.factory)
        plan_seconds += time.perf_counter() - started
        microbatches = real["gpipe"][0].microbatches
        plans = {kind: predict(measurement, kind, microbatches) for kind in steps}
        results[shape] = {"steps": steps, "real": real, "plans": plans, "errors": _errors(real, plans)}
    if ns.json:
        print(json.dumps({
            shape: {
                "real": {kind: [r.to_dict() for r in reports] for kind, reports in found["real"].items()},
                "plan": {kind: [p.to_dict() for p in predictions] for kind, predictions in found["plans"].items()},
                "plan_errors": found["errors"],
            } for shape, found in results.items()
        } | {"world_seconds": world_seconds, "plan_seconds": plan_seconds}, indent=2))
        return 0
    for shape, found in results.items():
        print(f"== {shape}")
        print(render_comparison(found["real"], found["plans"]))
        print()
    first = next(iter(results.values()))
    for kind, spec in first["steps"].items():
        print(render_stages(first["real"][kind], Path(spec).name))
        print()
    print(f"2-rank world, 4 steps x 2 modes (spawn included): {world_seconds:.1f} s; "
          f"one-process plans: {plan_seconds:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
