"""The figures of ``recheck cost --suggest`` (issue 16): predicted against measured peak, the suggested plan's
step time against the fastest anchor plan within the same budget, and check_step's verdict on every plan run.

Three steps, three budgets each (15%, 50% and 85% of the way from the peak with every unit checkpointed
to the peak with nothing checkpointed):

* ``fixtures/models/cost_demo.py:step`` (4 transformer blocks, the poor ``tanh`` region, 3 MLP layers);
* a tiny transformers Llama (4 decoder layers, gradient checkpointing on), where transformers imports;
* ``fixtures/models/gpt_stack.py:step``, a 12-layer plain-torch GPT, every layer checkpointed.

Each budget is one ``recheck.suggest()`` call, as a user runs it: census, solve, the suggested plan and the
anchors (nothing, every layer, every other layer, selective on every layer, and the step as written) traced
for their peak, timed in turns with ``--repeats`` rounds, and verified with ``check_step``.  On CPU the peak
is the storage ledger's observed peak of a traced run; on CUDA ``max_memory_allocated`` is printed beside it.

    OMP_NUM_THREADS=1 python benchmarks/suggest_table.py [--repeats 9] [--clock cpu] [--models demo,llama,gpt]
    [--json out.json]

Targets: predicted peak within 5% of measured; the suggested plan never slower than the fastest anchor that
fits.  Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's recheck first, also in an environment with another installed


def _load(name: str, relative: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relative))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def demo_step():
    return _load("recheck_bench_cost_demo", "fixtures/models/cost_demo.py").step


def gpt_step():
    return _load("recheck_bench_gpt_stack", "fixtures/models/gpt_stack.py").step


def llama_step():
    return _load("recheck_bench_tiny_llama", "fixtures/models/tiny_llama.py").build(width=64, tokens=128, vocab=256)[0]


MODELS = {"demo": ("cost_demo.py:step", demo_step), "llama": ("tiny Llama (transformers)", llama_step),
          "gpt": ("gpt_stack.py:step (12 layers)", gpt_step)}


def unit_peaks(step) -> tuple[int, int]:
    from recheck.cost.planner.candidates import find_candidates
    from recheck.cost.planner.census import mode_config, trace_config
    from recheck.runtime.steps import discover_state

    state = discover_state(step)
    restore = state.snapshot()
    candidates = find_candidates(step, state, restore)
    try:
        return tuple(trace_config(step, state, restore, candidates, mode_config(m, candidates)).observed_peak
                     for m in ("full", "none"))
    finally:
        restore()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    parser.add_argument("--models", default="demo,llama,gpt")
    parser.add_argument("--fractions", default="0.15,0.5,0.85")
    parser.add_argument("--json", metavar="PATH")
    ns = parser.parse_args(argv)
    import torch

    from recheck.cost.planner.suggest import suggest
    from recheck.cost.units import format_bytes

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start, "
          f"clock {ns.clock}, {ns.repeats} timed rounds per plan")
    header = ("| step | budget | predicted peak | measured peak | error | suggested plan | suggested time | "
              "fastest anchor within budget | its time | suggested / anchor | timing spread | check_step |")
    rows, records = [], []
    for key in ns.models.split(","):
        label, make = MODELS[key]
        try:
            step = make()
        except ImportError as exc:
            print(f"{label}: skipped ({exc}); run it in the real-library environment")
            continue
        low, high = unit_peaks(step)
        for fraction in (float(f) for f in ns.fractions.split(",")):
            budget = int(low + fraction * (high - low))
            started = time.perf_counter()
            s = suggest(step, budget=budget, repeats=ns.repeats, clock=ns.clock)
            took = time.perf_counter() - started
            run, best = s.suggested, s.best_anchor()
            runs = [run, *s.anchors]
            verdicts = sum(r.verified for r in runs)
            plan = s.plan.describe() if len(s.plan.modules) <= 3 else \
                f"{len(s.plan.modules)} modules: " + ", ".join(f"{p} {v[0]}" for p, v in s.plan.modules)
            measured = format_bytes(run.measured_peak)
            if run.cuda:
                measured += f" (cuda {format_bytes(run.cuda['max_memory_allocated'])})"
            anchor = (f"{best.name} | {best.measured_seconds * 1e3:.1f} ms | "
                      f"{run.measured_seconds / best.measured_seconds:.2f}") if best else "none fits | - | -"
            rows.append(f"| {label} | {format_bytes(budget)} | {format_bytes(run.predicted_peak)} | {measured} | "
                        f"{run.peak_error:+.2%} | {plan} | {run.measured_seconds * 1e3:.1f} ms | {anchor} | "
                        f"{run.timing_spread:.0%} | {verdicts}/{len(runs)} ok |")
            records.append({"step": label, "budget": budget, "seconds": took, "suggestion": s.to_dict()})
            print(f"  {label} at {format_bytes(budget)}: done in {took:.0f} s", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print()
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for row in rows:
        print(row)
    if ns.json:
        with open(ns.json, "w", encoding="utf-8") as handle:
            json.dump(records, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
