"""What each part of ``watch()`` costs in the timed ratio: the ratio again with that part made free.

``watch_profile.py`` times phases in place, with timers that add their own cost; callgrind
(``watch_instructions.py``) counts instructions, which miss what a cache miss costs between
torch's kernels.  This answers the question a change is chosen by, "what would the ratio be if
this part cost nothing?", by switching one part off at a time and timing watched steps against
plain ones (interleaved rounds, best of each, this process's CPU time):

* ``state``: the module state read three times an invocation (``capture.module_state``),
* ``entry``: the RNG streams and globals (``capture.entry_state``),
* ``params``: the parameter versions (``capture.parameter_versions``),
* ``saved``: every saved tensor's print (``parameter_view``, ``print_activation``, ``planned_digest``;
  what is left is its metadata, which torch's own check compares),
* ``naming``: naming the region and its call site (``describe``, ``call_site``),
* ``effects``: the capture of a recompute's logging, output and warnings,
* ``all``: every part above at once: what is left is the interception itself (the patched
  entry points, the call's record, the saved-tensor hooks, the module pre-hook, the scope),
  the floor that no cut to the parts can go below.

A part switched off answers from a memo of its first answer (a print that never changes), or
does nothing: the watch is then **not exact** and finds nothing; the figure is only what that
part costs.  The parts do not add up (they share caches), and runs of the same code move by
about ±0.03, so compare figures of one run.

    python benchmarks/watch_ablation.py [--models mlp,llama,resnet,vit] [--parts state,entry,...]
                                        [--rounds 5] [--steps 5]

Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any, Callable, Iterator

from timing import interleaved  # this folder's
from watch_overhead import MODELS, print_rows

CPU = time.process_time
PARTS = ("state", "entry", "params", "saved", "naming", "effects", "all")


@contextlib.contextmanager
def _patched(owner: Any, attribute: str, value: Any) -> Iterator[None]:
    original = getattr(owner, attribute)
    setattr(owner, attribute, value)
    try:
        yield
    finally:
        setattr(owner, attribute, original)


def _memo(function: Callable[..., Any], key: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` answering every call from its first answer for the same ``key(...)``."""
    answers: dict[Any, Any] = {}

    def memo(*args: Any, **kwargs: Any) -> Any:
        k = key(*args, **kwargs)
        if k not in answers:
            answers[k] = function(*args, **kwargs)
        return answers[k]

    return memo


class _NoCapture:
    """An effect capture that captures nothing."""

    def __init__(self, passthrough: bool = False) -> None:
        self.effects: list[Any] = []

    def __enter__(self) -> _NoCapture:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


@contextlib.contextmanager
def switched_off(part: str) -> Iterator[None]:
    """``part`` of ``watch()`` made free for the duration (see the module's docstring)."""
    from recheck.intercept import hooks
    from recheck.runtime.digests import TensorPrint
    from recheck.watcher import capture, dispatch, records

    with contextlib.ExitStack() as stack:
        if part == "all":
            for each in PARTS[:-1]:
                stack.enter_context(switched_off(each))
        elif part == "state":
            stack.enter_context(_patched(capture, "module_state", _memo(
                capture.module_state, lambda modules, *a, **k: id(k.get("reach")))))
        elif part == "entry":
            stack.enter_context(_patched(capture, "entry_state", _memo(
                capture.entry_state, lambda reach, **k: (id(reach), tuple(sorted(k.items()))))))
        elif part == "params":
            stack.enter_context(_patched(capture, "parameter_versions", _memo(
                capture.parameter_versions, lambda reach, pairs=None, *a, **k: (id(reach), pairs is None))))
        elif part == "saved":
            # no bytes read: the tensor's metadata only (torch's own check compares it)
            def metadata(tensor: Any, *args: Any, **kwargs: Any) -> TensorPrint:
                return TensorPrint(tuple(tensor.shape), tensor.dtype, "cpu", 0)

            for name in ("print_activation", "print_tensor"):
                stack.enter_context(_patched(records, name, metadata))
            # a tensor read in place is compared by its digest alone: the metadata's; a parameter's
            # view (its identity and version) is read that way too
            stack.enter_context(_patched(records, "planned_digest",
                                         lambda tensor: (tuple(tensor.shape), tensor.dtype, 0, None)))
            stack.enter_context(_patched(records, "parameter_view", lambda tensor, parameter: None))
        elif part == "naming":
            stack.enter_context(_patched(hooks, "describe", _memo(hooks.describe, lambda function, site: type(function))))
            stack.enter_context(_patched(hooks, "call_site", lambda *a, **k: None))
        elif part == "effects":
            stack.enter_context(_patched(dispatch, "EffectCapture", _NoCapture))
        else:
            raise ValueError(f"unknown part {part!r}; choose from {', '.join(PARTS)}")
        yield


def ratios(step: Callable[[], Any], parts: list[str], rounds: int, steps: int) -> dict[str, float]:
    """The watched/plain ratio with nothing off and with each part off, from interleaved rounds."""
    import recheck

    def run(mode: str) -> float:
        context = contextlib.nullcontext() if mode == "plain" else recheck.watch(raise_on_finding=False)
        off = switched_off(mode) if mode in PARTS else contextlib.nullcontext()
        with off:
            start = CPU()
            with context:
                for _ in range(steps):
                    step()
            return CPU() - start

    least = interleaved(run, ["plain", "watch", *parts], rounds)
    return {mode: least[mode] / least["plain"] for mode in ["watch", *parts]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps in each timed watch() block")
    ns = parser.parse_args(argv)
    parts = [p.strip() for p in ns.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if ns.rounds < 1 or ns.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    import torch

    torch.set_num_threads(1)
    print(f"watched/plain, best of {ns.rounds} interleaved rounds of {ns.steps} steps; "
          "a part switched off is free and the watch is not exact")
    print(f"{'model':8} {'watch':>6} " + " ".join(f"{'-' + p:>8}" for p in parts))

    def row(step: Callable[[], Any]) -> str:
        found = ratios(step, parts, ns.rounds, ns.steps)
        return f"{found['watch']:6.2f} " + " ".join(f"{found[p]:8.2f}" for p in parts)

    print_rows(ns.models, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
