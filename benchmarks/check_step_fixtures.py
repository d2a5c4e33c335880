"""Which hazards of ``fixtures/twins/`` each face catches: ``watch()`` alone, and ``check_step()``.

For every fixture step (the hazard) and its fixed variant: the number of findings ``watch()``
reports around one run of the step, and what ``check_step()`` reports (its kinds).  A hazard is
caught when the count is not zero; a fixed variant must be clean in both.

    python benchmarks/check_step_fixtures.py
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TWINS = ROOT / "fixtures" / "twins"
#: fixture -> (hazard steps, clean steps)
STEPS = {
    "moe_router": (["step"], ["fixed_step"]),
    "levit_cache": (["step"], ["fixed_step"]),
    "moe_tracker": (["step"], ["fixed_step"]),
    "diffusion_checkpoint": (["step"], ["fixed_step"]),
    "amp_checkpoint": (["step"], ["fixed_step"]),
    "compiled_budget": (["step"], ["fixed_step"]),
    "dynamic_cache": (["step"], ["fixed_step"]),
    "batchnorm_outside": (["inside_step"], ["closure_step", "method_step", "partial_step"]),
    "encoder_decoder": ([], ["step", "nonreentrant_step"]),
    "nested_checkpoint": ([], ["reentrant_step", "mixed_step", "nonreentrant_step"]),
}


def load(name: str):
    sys.path.insert(0, str(TWINS))
    try:
        spec = importlib.util.spec_from_file_location(f"recheck_twin_{name}", TWINS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module
    finally:
        sys.path.remove(str(TWINS))


def main() -> int:
    import recheck

    warnings.simplefilter("ignore")
    print(f"{'fixture':<22} {'step':<18} {'kind':<7} {'watch() alone':>14}  check_step")
    caught = {"watch": 0, "check_step": 0}
    hazards = clean_ok = cleans = 0
    for name, (bad, good) in STEPS.items():
        module = load(name)
        for label, steps in (("hazard", bad), ("fixed", good)):
            for step_name in steps:
                step = getattr(module, step_name, None)
                if step is None:
                    print(f"{name:<22} {step_name:<18} missing")
                    continue
                with recheck.watch(raise_on_finding=False) as w:
                    try:
                        step()
                    except Exception as exc:  # noqa: BLE001 - torch's own error for a hazard
                        print(f"  ({step_name} raised under watch: {type(exc).__name__})")
                report = recheck.check_step(getattr(load(name), step_name))
                kinds = ",".join(sorted(report.kinds)) or "clean"
                print(f"{name:<22} {step_name:<18} {label:<7} {len(w.report):>14}  {len(report)} ({kinds})")
                if label == "hazard":
                    hazards += 1
                    caught["watch"] += bool(len(w.report))
                    caught["check_step"] += bool(len(report))
                else:
                    cleans += 1
                    clean_ok += report.ok and w.report.ok
    print(f"hazards caught: watch() alone {caught['watch']} of {hazards}, check_step {caught['check_step']} of {hazards}; "
          f"fixed variants clean in both: {clean_ok} of {cleans}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
