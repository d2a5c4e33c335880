"""Where ``watch()``'s time per checkpoint invocation goes, measured in place, phase by phase.

For each model of ``benchmarks/watch_overhead.py`` this first times a plain step and a watched
one (interleaved rounds, best of each, this process's CPU time) for what ``watch()`` adds per
invocation; then it wraps recheck's phases with timers and runs watched steps again, and
prints each phase's time per invocation and its calls per invocation:

* the call's bookkeeping (``_new_call``: naming the region, the record),
* the forward's start and end (RNG, parameter versions, the scope of modules, module state,
  the prints of what autograd saved),
* each saved tensor's print (``saved_print`` at pack time, ``planned_digest``,
  ``parameter_view`` or ``print_activation`` when the forward returns) and its recompute's
  comparison (``compare_saved``),
* the recompute's start and end (state compared, effects captured), and
* the parts they are made of (``module_state``, ``entry_state``, ``parameter_versions`` ...).

Phases nest (a forward's end includes its module state), so the rows do not add up; a parent
row less its children is its own time.  The timers add about a microsecond a wrapped call,
and the figures are taken between torch's kernels, where the caches are cold: a phase costs
two to five times what a loop over it alone measures, which is what the user pays.  Use
``watch_calls.py`` for exact counts and callgrind for exact instructions; this says which
phase to work on.

    python benchmarks/watch_profile.py [--models mlp,llama,resnet,vit] [--rounds 10]

Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
import warnings
from typing import Any, Callable

from watch_overhead import MODELS, built  # this folder's, as timing.py is to the others

CPU = time.process_time

#: (module path, owner name or "", attribute): the phases timed, outermost first
PHASES = (
    ("recheck.intercept.hooks", "Interceptor", "_new_call"),
    ("recheck.intercept.hooks", "Interceptor", "generator"),
    ("recheck.watcher.dispatch", "Dispatcher", "_open_forward"),
    ("recheck.watcher.dispatch", "Dispatcher", "_close_forward"),
    ("recheck.watcher.dispatch", "Dispatcher", "_open_recompute"),
    ("recheck.watcher.dispatch", "Dispatcher", "_close_recompute"),
    ("recheck.watcher.dispatch", "Dispatcher", "_module_called"),
    ("recheck.watcher.records", "InvocationRecord", "saved_print"),
    ("recheck.watcher.records", "InvocationRecord", "compare_saved"),
    ("recheck.watcher.records", "InvocationRecord", "begin_forward"),
    ("recheck.watcher.records", "InvocationRecord", "end_forward"),
    ("recheck.watcher.records", "InvocationRecord", "begin_recompute"),
    ("recheck.watcher.records", "InvocationRecord", "end_recompute"),
    ("recheck.watcher.records", "Forward", "scope"),
    ("recheck.watcher.records", "", "parameter_view"),
    ("recheck.watcher.records", "", "print_activation"),
    ("recheck.watcher.records", "", "planned_digest"),
    ("recheck.watcher.records", "", "print_tensor"),
    ("recheck.watcher.capture", "", "module_state"),
    ("recheck.watcher.capture", "", "entry_state"),
    ("recheck.watcher.capture", "", "parameter_versions"),
    ("recheck.watcher.capture", "", "buffer_versions"),
    ("recheck.watcher.dispatch", "", "reach_of"),
)

#: the parts of those phases that ``--detail`` times as well (each wrapped call adds its timer's
#: microsecond to every phase around it)
DETAIL = (
    ("recheck.intercept.hooks", "", "call_site"),
    ("recheck.intercept.hooks", "", "describe"),
    ("recheck.watcher.dispatch", "Dispatcher", "started"),
    ("recheck.watcher.records", "InvocationRecord", "__init__"),
    ("recheck.watcher.records", "Forward", "__init__"),
    ("recheck.watcher.records", "Forward", "_pointers"),
    ("recheck.watcher.records", "", "input_tensors"),
    ("recheck.watcher.records", "", "current_context"),
    ("recheck.watcher.records", "", "context_differences"),
    ("recheck.watcher.capture", "", "direct_modules"),
    ("recheck.watcher.capture", "", "with_submodules"),
    ("recheck.watcher.capture", "", "changed_buffers"),
    ("recheck.watcher.capture", "", "rng_fingerprints"),
    ("recheck.watcher.capture", "", "kept_shallow"),
    ("recheck.watcher.capture", "", "show_printed"),
    ("recheck.runtime.effects", "EffectCapture", "__enter__"),
    ("recheck.runtime.effects", "EffectCapture", "__exit__"),
    ("recheck.watcher.records", "InvocationRecord", "_compare_state"),
)


class Timers:
    """Wraps the phases with timers (process CPU time is too coarse: ``perf_counter``)."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._undo: list[Callable[[], None]] = []

    def install(self, phases: tuple[tuple[str, str, str], ...] = PHASES) -> None:
        import importlib

        for module_name, owner_name, attribute in phases:
            module = importlib.import_module(module_name)
            owner = getattr(module, owner_name) if owner_name else module
            original = owner.__dict__[attribute] if owner_name else getattr(module, attribute)
            label = f"{owner_name}.{attribute}" if owner_name else attribute
            setattr(owner, attribute, self._timed(original, label))
            self._undo.append(functools.partial(setattr, owner, attribute, original))
            if not owner_name:  # a function imported by name into the modules that call it
                for other in ("recheck.watcher.records", "recheck.watcher.capture", "recheck.watcher.dispatch",
                              "recheck.intercept.hooks"):
                    caller = importlib.import_module(other)
                    if other != module_name and getattr(caller, attribute, None) is original:
                        setattr(caller, attribute, getattr(owner, attribute))
                        self._undo.append(functools.partial(setattr, caller, attribute, original))

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _timed(self, function: Callable[..., Any], label: str) -> Callable[..., Any]:
        seconds, calls, clock = self.seconds, self.calls, time.perf_counter

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[label] += clock() - start
                calls[label] += 1

        return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,llama,resnet,vit")
    parser.add_argument("--rounds", type=int, default=10, help="watched blocks of 5 steps per figure")
    parser.add_argument("--detail", action="store_true", help="time the parts of the phases as well")
    ns = parser.parse_args(argv)
    if ns.rounds < 1:
        parser.error(f"--rounds must be at least 1 (got {ns.rounds})")
    unknown = [name for name in ns.models.split(",") if name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    import torch

    import recheck

    torch.set_num_threads(1)
    for name, step, why in built(ns.models):
        if step is None:
            print(f"{name}: skipped: {why}")
            continue
        invocations = [0]

        def plain() -> None:
            for _ in range(5):
                step()

        def watched() -> None:
            with recheck.watch(raise_on_finding=False) as block:
                for _ in range(5):
                    step()
            invocations[0] += block.report.stats["invocations"]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain(), watched()
            best_plain = best_watched = float("inf")
            for _ in range(ns.rounds):
                start = CPU()
                plain()
                best_plain = min(best_plain, CPU() - start)
                start = CPU()
                watched()
                best_watched = min(best_watched, CPU() - start)
            per_step = invocations[0] / (ns.rounds + 1) / 5
            timers = Timers()
            timers.install(PHASES + DETAIL if ns.detail else PHASES)
            try:
                invocations[0] = 0
                for _ in range(ns.rounds):
                    watched()
            finally:
                timers.uninstall()
        added = (best_watched - best_plain) / 5 / per_step
        print(f"\n{name}: plain step {best_plain / 5 * 1e3:.2f} ms, watched {best_watched / 5 * 1e3:.2f} ms "
              f"({best_watched / best_plain:.2f}x), {per_step:.0f} invocations a step: "
              f"{added * 1e6:.0f} us added per invocation")
        print(f"  {'us/inv':>8} {'calls/inv':>9}  phase (timed, in place)")
        count = invocations[0] or 1
        for label, seconds in timers.seconds.most_common():
            print(f"  {seconds / count * 1e6:8.1f} {timers.calls[label] / count:9.2f}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
