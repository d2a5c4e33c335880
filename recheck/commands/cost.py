"""``recheck cost file.py:step``: what checkpointing saves and costs in a training step.

Exit codes: 0 measured, 2 usage, import or measurement error.  torch is imported only
inside :func:`run`.
"""

from __future__ import annotations

import argparse
import sys

from recheck.cost.units import parse_bytes

NAME = "cost"
HELP = (
    "measure a training step with its checkpoints as written and bypassed: retained saved "
    "state, peak memory, recompute work and time, per region"
)

_DEFAULT_FUNCTION = "step"


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _repeats(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("--repeats must be 1 or more")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="FILE.py:STEP",
        help=f"a zero-argument callable doing forward + backward (file.py:name or pkg.module:name; "
        f"the name defaults to '{_DEFAULT_FUNCTION}')",
    )
    parser.add_argument("--repeats", type=_repeats, default=5, help="timed runs per mode (default 5)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of memory over the step (needs matplotlib)")
    parser.add_argument(
        "--budget",
        type=_size,
        metavar="SIZE",
        help="a memory budget such as 40GiB: report the largest microbatch that fits each mode",
    )


def _target_spec(target: str) -> str:
    location, colon, name = target.rpartition(":") if target.count(":") else (target, "", "")
    if not colon or not name or "/" in name or "\\" in name:
        return f"{target}:{_DEFAULT_FUNCTION}"
    return target


def run(ns: argparse.Namespace) -> int:
    from recheck.checker.targets import TargetError, load_target

    try:
        (target,) = load_target(_target_spec(ns.target))
    except TargetError as exc:
        print(f"recheck cost: error: {exc}", file=sys.stderr)
        if exc.user_traceback:
            print(exc.user_traceback, file=sys.stderr, end="")
        return 2
    from recheck.cost.compare import measure
    from recheck.cost.plot import PlotError

    try:
        comparison = measure(target.factory, repeats=ns.repeats, budget=ns.budget)
    except Exception as exc:  # the user's step failed, or it is not a step: say so, no traceback dump
        print(f"recheck cost: error: measuring {target.label} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if ns.format == "json":
        print(comparison.to_json())
    else:
        print(comparison)
    if ns.plot:
        try:
            written = comparison.plot(ns.plot)
        except PlotError as exc:
            print(f"recheck cost: error: {exc}", file=sys.stderr)
            return 2
        print(f"recheck cost: memory plot written to {written}", file=sys.stderr)
    return 0
