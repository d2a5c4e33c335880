"""``recheck check TARGET...``: run the dynamic checker on regions named on the command line.

A target is ``file.py`` (every module-level ``region_*`` callable), ``file.py:name`` or
``pkg.module:name``; a named callable returns ``(region, args)`` or
``(region, args, kwargs)``.  ``recheck check --step file.py:fn`` instead runs a
zero-argument training step once under ``recheck.watch()`` and reports every checkpoint
call it made.  Exit status: 0 clean, 1 findings, 2 usage or import error (with the
traceback of the user's code).  Tolerances, ``strict`` and ``store`` default to
``[tool.recheck]``; flags override it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

NAME = "check"
HELP = "check that checkpointed regions recompute exactly what their forward computed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Targets, output format, checkpoint configuration and tolerance options."""
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="file.py, file.py:name or pkg.module:name")
    parser.add_argument("--step", action="append", default=[], metavar="FILE.py:FN",
                        help="run a zero-argument training step under recheck.watch() and report "
                             "every checkpoint call it makes (repeatable)")
    parser.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                        help="with --step: also replay every recomputation fully (early stop off)")
    parser.add_argument("--store", choices=("digest", "copy"), default=None,
                        help="with --step: keep digests (default) or full copies of each forward")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="output format (default: text)")
    parser.add_argument("--use-reentrant", action=argparse.BooleanOptionalAction, default=None,
                        help="checkpoint variant to check (default: non-reentrant, or the "
                             "target's CHECK_OPTIONS)")
    parser.add_argument("--preserve-rng-state", action=argparse.BooleanOptionalAction,
                        default=None, help="checkpoint's preserve_rng_state (default: on)")
    parser.add_argument("--early-stop", action=argparse.BooleanOptionalAction, default=None,
                        help="non-reentrant checkpoint's early_stop (default: on)")
    parser.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: exact)")
    parser.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: exact)")
    parser.add_argument("--max-ulp", type=int, default=None,
                        help="allowed distance in units in the last place (default: exact)")


def _overrides(ns: argparse.Namespace) -> dict[str, Any]:
    """Check options from the flags, over the tolerances of ``[tool.recheck]``."""
    from recheck.config import load_config

    table = load_config().values
    options = {n: table[n] for n in ("atol", "rtol", "max_ulp") if n in table}
    names = ("use_reentrant", "preserve_rng_state", "early_stop", "atol", "rtol", "max_ulp")
    options.update({n: getattr(ns, n) for n in names if getattr(ns, n) is not None})
    return options


def _run_steps(ns: argparse.Namespace) -> int:
    """``--step``: each training step once under watch(); one report each, then a summary."""
    from recheck.config import load_config
    from recheck.watcher.step import StepError, run_step

    table = load_config().values
    strict = ns.strict if ns.strict is not None else table.get("strict", False)
    store = ns.store or table.get("store", "digest")
    reports = []
    for target in ns.step:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # the step's prints stay off stdout
                report = run_step(target, strict=strict, store=store)
        except StepError as exc:
            return _error(str(exc), exc.user_traceback)
        except Exception as exc:  # the step's own error
            from recheck.checker.targets import user_frames

            return _error(f"{target}: the step raised {type(exc).__name__}: {exc}", user_frames(exc))
        reports.append((target, report))
    dirty = [r for _, r in reports if not r.ok]
    if ns.format == "json":
        print(json.dumps({"steps": [{"target": t, **r.to_dict()} for t, r in reports]}, indent=2, default=repr))
    else:
        for target, report in reports:
            print(f"step {target}")
            print(report)
            print()
        print(f"recheck: ran {len(reports)} step{'s' if len(reports) != 1 else ''}: {len(dirty)} with findings")
    return 1 if dirty else 0


def _error(message: str, user_traceback: str = "") -> int:
    if user_traceback:
        sys.stderr.write(user_traceback if user_traceback.endswith("\n") else user_traceback + "\n")
    print(f"recheck check: error: {message}", file=sys.stderr)
    return 2


def run(ns: argparse.Namespace) -> int:
    """Check every region the targets name; 0 clean, 1 findings, 2 usage or import error."""
    from recheck.dependencies import require_torch

    if ns.step and ns.targets:
        return _error("give region TARGETs or --step, not both")
    if not ns.step and not ns.targets:
        return _error("nothing to check: give a TARGET (file.py, file.py:name, pkg.module:name) or --step FILE.py:FN")
    if ns.targets and (ns.strict is not None or ns.store is not None):
        return _error("--strict and --store go with --step")
    require_torch("recheck check")
    if ns.step:
        return _run_steps(ns)
    from recheck.checker.api import check
    from recheck.checker.run import RegionError
    from recheck.checker.targets import TargetError, build_region, load_target, user_frames
    from recheck.findings import Report

    try:
        targets = [t for spec in ns.targets for t in load_target(spec)]
    except TargetError as exc:
        return _error(str(exc), exc.user_traceback)
    reports: list[tuple[str, Report]] = []
    overrides = _overrides(ns)
    for target in targets:
        options = {**target.options, **overrides}
        try:
            region = build_region(target)
            with contextlib.redirect_stdout(sys.stderr):  # the region's prints stay off stdout
                report = check(region.fn, *region.args, **region.kwargs, **options)
        except TargetError as exc:
            return _error(str(exc), exc.user_traceback)
        except RegionError as exc:
            return _error(f"{target.label}: {exc}")
        except Exception as exc:  # the region's own error, re-raised by check()
            return _error(f"{target.label}: the region raised {type(exc).__name__}: {exc}",
                          user_frames(exc))
        report.title = f"target         {target.label}\n{report.title or ''}".rstrip()
        reports.append((target.label, report))
    dirty = [r for _, r in reports if not r.ok]
    differences = sum(len(r) for r in dirty)
    summary = (f"recheck: checked {len(reports)} region{'s' if len(reports) != 1 else ''}: "
               f"{len(dirty)} with findings ({differences} difference"
               f"{'s' if differences != 1 else ''}), {len(reports) - len(dirty)} clean")
    if ns.format == "json":
        payload = {"reports": [{"target": label, **r.to_dict()} for label, r in reports],
                   "summary": {"regions": len(reports), "with_findings": len(dirty),
                               "differences": differences, "text": summary}}
        print(json.dumps(payload, indent=2, default=repr))
    else:
        for _, report in reports:
            print(report)
            print()
        print(summary)
    return 1 if dirty else 0
