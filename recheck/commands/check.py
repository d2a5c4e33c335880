"""``recheck check TARGET...``: run the dynamic checker on regions named on the command line.

A target is ``file.py`` (every module-level ``region_*`` callable), ``file.py:name`` or
``pkg.module:name``; a named callable returns ``(region, args)`` or
``(region, args, kwargs)``.  Exit status: 0 clean, 1 findings, 2 usage or import error
(with the traceback of the user's code).
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
    parser.add_argument("targets", nargs="+", metavar="TARGET",
                        help="file.py, file.py:name or pkg.module:name")
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
    names = ("use_reentrant", "preserve_rng_state", "early_stop", "atol", "rtol", "max_ulp")
    return {n: getattr(ns, n) for n in names if getattr(ns, n) is not None}


def _error(message: str, user_traceback: str = "") -> int:
    if user_traceback:
        sys.stderr.write(user_traceback if user_traceback.endswith("\n") else user_traceback + "\n")
    print(f"recheck check: error: {message}", file=sys.stderr)
    return 2


def run(ns: argparse.Namespace) -> int:
    """Check every region the targets name; 0 clean, 1 findings, 2 usage or import error."""
    from recheck.checker.api import check
    from recheck.checker.run import RegionError
    from recheck.checker.targets import TargetError, _user_frames, build_region, load_target
    from recheck.findings import Report

    try:
        targets = [t for spec in ns.targets for t in load_target(spec)]
    except TargetError as exc:
        return _error(str(exc), exc.user_traceback)
    reports: list[tuple[str, Report]] = []
    for target in targets:
        options = {**target.options, **_overrides(ns)}
        try:
            region = build_region(target)
            with contextlib.redirect_stdout(sys.stderr):  # the region's prints stay off stdout
                report = check(region.fn, *region.args, **region.kwargs, **options)
        except TargetError as exc:
            return _error(str(exc), exc.user_traceback)
        except (RegionError, TypeError, ValueError) as exc:
            if isinstance(exc, RegionError):
                return _error(f"{target.label}: {exc}")
            return _error(f"{target.label}: the region raised {type(exc).__name__}: {exc}",
                          _user_frames(exc))
        except Exception as exc:  # the region's own error, re-raised by check()
            return _error(f"{target.label}: the region raised {type(exc).__name__}: {exc}",
                          _user_frames(exc))
        title = f"target         {target.label}\n{report.title or ''}".rstrip()
        reports.append((target.label, Report(report.findings, title=title, notes=report.notes,
                                             stats=report.stats)))
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
