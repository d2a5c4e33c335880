"""``recheck check TARGET...``: run the dynamic checker on regions named on the command line
(:mod:`recheck.loading`), or ``--step file.py:fn`` on a zero-argument training step.

A target that cannot be checked is an error and the others still run; Ctrl-C prints what was
checked so far.  Options are validated before any region runs; flags override ``[tool.recheck]``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from recheck.commands.arguments import count
from recheck.config import TOLERANCES
from recheck.output import json as _json
from recheck.output.text import plural
from recheck.progress import paint, terminal_report

NAME = "check"
HELP = "check that checkpointed regions recompute exactly what their forward computed"
#: Ends the summary when Ctrl-C stopped the run (exit status 130); what ran before is reported.
_INTERRUPTED = "; interrupted (Ctrl-C), the rest not checked"
#: The most ``--repeats`` a ``--step`` is run with (each is a whole run of the step and its snapshot).
_MOST_REPEATS = 1000


def _tolerance(name: str) -> Any:
    """The parser of ``--atol``, ``--rtol`` or ``--max-ulp``: a number that ``Tolerance.of`` accepts.

    The one rule every face applies (``check()``, ``watch()``, ``[tool.recheck]``, pytest),
    here when the command line is read, before any file is imported: an infinite or NaN
    ``--atol`` or a ``--max-ulp`` past what the comparison holds is a usage error.
    """
    kind = int if name == "max_ulp" else float

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {'whole ' if kind is int else ''}number: {text!r}") from None
        from recheck.runtime.bits import Tolerance

        try:
            if kind is int:
                Tolerance.of(max_ulp=int(value))
            else:
                Tolerance.of(atol=value if name == "atol" else 0.0, rtol=value if name == "rtol" else 0.0)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Targets, output format, checkpoint configuration and tolerance options."""
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="file.py, file.py:name or pkg.module:name")
    parser.add_argument("--step", action="append", default=[], metavar="FILE.py:FN",
                        help="check a zero-argument training step against its uncheckpointed twin "
                             "(recheck.check_step: run as written under recheck.watch(), then with every "
                             "checkpoint bypassed, end states compared bit for bit; repeatable)")
    parser.add_argument("--watch-only", action="store_true",
                        help="with --step: only verify each recomputation against its own forward "
                             "(recheck.watch()), without the uncheckpointed twin")
    parser.add_argument("--repeats", type=count(1, _MOST_REPEATS), default=None, metavar="N",
                        help="with --step: runs of the step as written (what differs between them is "
                             f"not blamed on checkpointing; default 1, at most {_MOST_REPEATS})")
    parser.add_argument("--strict", action="store_true", default=None,
                        help="with --step: the old name of --no-early-stop")
    parser.add_argument("--store", choices=("digest", "copy"), default=None,
                        help="with --step: keep digests (default) or full copies of each forward")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="output format (default: text)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bar (one is drawn on stderr only when it is a terminal)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="text: every entry of each report with its detail (by default at most ten, "
                             "causes first; JSON always holds everything)")
    parser.add_argument("--use-reentrant", action=argparse.BooleanOptionalAction, default=None,
                        help="checkpoint variant to check (default: non-reentrant, or the "
                             "target's CHECK_OPTIONS)")
    parser.add_argument("--preserve-rng-state", action=argparse.BooleanOptionalAction,
                        default=None, help="checkpoint's preserve_rng_state (default: on)")
    parser.add_argument("--early-stop", action=argparse.BooleanOptionalAction, default=None,
                        help="non-reentrant checkpoint's early_stop: the configuration checked for a "
                             "region (default: on); with --step, --no-early-stop replays every "
                             "recomputation fully (default: as each call says)")
    parser.add_argument("--atol", type=_tolerance("atol"), default=None,
                        help="absolute tolerance (default: exact)")
    parser.add_argument("--rtol", type=_tolerance("rtol"), default=None,
                        help="relative tolerance (default: exact)")
    parser.add_argument("--max-ulp", type=_tolerance("max_ulp"), default=None,
                        help="allowed distance in units in the last place, instead of --atol/--rtol "
                             "(default: exact)")


def _overrides(ns: argparse.Namespace) -> dict[str, Any]:
    """Check options from the flags, over the tolerance of ``[tool.recheck]``.

    A tolerance is one setting: ``--atol``/``--rtol`` or ``--max-ulp`` on the command line
    replaces the file's tolerance (and a region's own CHECK_OPTIONS tolerance) as a whole.
    Raises ConfigError for a file that sets both kinds.
    """
    from recheck.config import ConfigError, load_config

    config = load_config()
    options = {n: config.values[n] for n in TOLERANCES if n in config.values}
    if "max_ulp" in options and ("atol" in options or "rtol" in options):
        raise ConfigError(f"{config.path}: [tool.recheck] sets both max-ulp and atol/rtol; "
                          "a tolerance is either a ULP distance or atol/rtol, keep one")
    if ("atol" in options) != ("rtol" in options):
        raise ConfigError(f"{config.path}: [tool.recheck] sets only one of atol and rtol; "
                          "give both, as torch.testing.assert_close takes them (rtol = 0 for an absolute tolerance)")
    from recheck.runtime.bits import Tolerance

    try:
        Tolerance.of(**options)
    except ValueError as exc:
        raise ConfigError(f"{config.path}: [tool.recheck]: {exc}") from None
    flags = {n: getattr(ns, n) for n in TOLERANCES if getattr(ns, n) is not None}
    if flags:
        options = flags
    names = ("use_reentrant", "preserve_rng_state", "early_stop")
    options.update({n: getattr(ns, n) for n in names if getattr(ns, n) is not None})
    return options


def _options_for(target_options: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A region's CHECK_OPTIONS under the command line's and the file's settings."""
    options = dict(target_options)
    if any(n in overrides for n in TOLERANCES):
        for name in TOLERANCES:
            options.pop(name, None)
    options.update(overrides)
    return options


def _usage_problem(ns: argparse.Namespace) -> str | None:
    """What is wrong with the command line itself, before anything is imported or run."""
    if ns.step and ns.targets:
        return "give region TARGETs or --step, not both"
    if not ns.step and not ns.targets:
        return "nothing to check: give a TARGET (file.py, file.py:name, pkg.module:name) or --step FILE.py:FN"
    if ns.targets and (ns.strict is not None or ns.store is not None or ns.watch_only or ns.repeats is not None):
        return "--strict, --store, --watch-only and --repeats go with --step"
    if ns.repeats is not None and ns.watch_only:
        return "--repeats runs the twin, not with --watch-only"
    if ns.step and any(getattr(ns, n) is not None for n in ("use_reentrant", "preserve_rng_state")):
        return ("--use-reentrant and --preserve-rng-state choose the checkpoint a region TARGET is checked "
                "under; a --step runs its checkpoints as written")
    if ns.strict and ns.early_stop is True:
        return "--strict is the old name of --no-early-stop; it cannot go with --early-stop"
    if ns.max_ulp is not None and (ns.atol is not None or ns.rtol is not None):
        return "pass either --max-ulp or --atol/--rtol, not both (a tolerance is one or the other)"
    if (ns.atol is None) != (ns.rtol is None):
        return ("--atol and --rtol go together, as torch.testing.assert_close takes them "
                "(--rtol 0 for an absolute tolerance)")
    return None


@dataclass(frozen=True)
class _Broken:
    """A target that could not be checked: what went wrong, and the user's traceback."""

    message: str
    user_traceback: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "traceback": self.user_traceback or None}


def _error(message: str, user_traceback: str = "") -> int:
    """An error on stderr (after the user's traceback, if any); the exit status 2."""
    sys.stdout.flush()  # keep stdout and stderr in the order things happened
    if user_traceback:
        sys.stderr.write(user_traceback if user_traceback.endswith("\n") else user_traceback + "\n")
    print(f"{paint('recheck check: error:', 'red', sys.stderr)} {message}", file=sys.stderr)
    return 2


def _run_steps(ns: argparse.Namespace) -> int:
    """``--step``: each training step once under watch(); one report each, then a summary."""
    from recheck.config import load_config
    from recheck.loading import UserCodeFailed, run_user_code
    from recheck.watcher.step import StepError, load_step, run_step

    options = _watch_options(load_config(), ns)
    from recheck.progress import progress

    outcomes: list[tuple[str, Any]] = []
    interrupted = False  # Ctrl-C: what ran so far is still reported
    with progress("running step", quiet=ns.quiet) as bar:
        for target in ns.step:
            bar.describe(target)
            try:
                with bar.redirected():  # the step's prints stay off stdout
                    if ns.watch_only:
                        outcome: Any = run_user_code(run_step, target, **options, own=(StepError,))
                    else:
                        from recheck.checker.api import check_step

                        outcome = run_user_code(check_step, load_step(target), repeats=ns.repeats or 1,
                                                **options, own=(StepError,))
            except StepError as exc:
                outcome = _Broken(str(exc), exc.user_traceback)
            except UserCodeFailed as exc:  # the step's own error or exit
                outcome = _Broken(f"the step raised {exc}", exc.user_traceback)
            except KeyboardInterrupt:
                interrupted = True
                break
            outcomes.append((target, outcome))
    broken = [t for t, o in outcomes if isinstance(o, _Broken)]
    dirty = [o for _, o in outcomes if not isinstance(o, _Broken) and not o.ok]
    summary = f"recheck: ran {plural(len(outcomes), 'step')}: {len(dirty)} with findings"
    if broken:
        summary += f", {plural(len(broken), 'error')}"
    return _finish(ns, outcomes, summary, "step", broken, dirty, interrupted,
                   lambda text: _json.steps_document(outcomes, with_findings=len(dirty), errors=len(broken),
                                                     interrupted=interrupted, text=text))


def _finish(ns: argparse.Namespace, outcomes: list[tuple[str, Any]], summary: str, heading: str, broken: list[Any],
            dirty: list[Any], interrupted: bool, document: Any) -> int:
    """Print each outcome (or the JSON ``document(summary)``), each error to stderr, the summary; the exit status."""
    summary += _INTERRUPTED if interrupted else ""
    if ns.format == "json":
        print(_json.dumps(document(summary)))
    for label, outcome in outcomes:
        if isinstance(outcome, _Broken):
            _error(f"{label}: {outcome.message}", outcome.user_traceback)
        elif ns.format != "json":
            print(f"{heading} {label}\n" if heading else "", end="")
            print(terminal_report(outcome, verbose=ns.verbose, stream=sys.stdout))
            print()
    if ns.format != "json":
        print(paint(summary, "red" if broken or dirty or interrupted else "green"))
    # 130 when Ctrl-C stopped the run, else 2 for an error (over findings), 1 for findings, 0 clean
    return 130 if interrupted else 2 if broken else 1 if dirty else 0


def _watch_options(config: Any, ns: argparse.Namespace | None = None) -> dict[str, Any]:
    """``watch()`` options of ``--step`` (or of ``recheck run``: no flags) over ``[tool.recheck]``, validated."""
    from recheck.config import ConfigError, watch_options
    from recheck.watcher.options import WatchOptions

    given = {n: getattr(ns, n) for n in ("early_stop", "strict", "store")} if ns else {}
    flags = {n: getattr(ns, n) for n in TOLERANCES if getattr(ns, n) is not None} if ns else {}
    options = watch_options(config.values, tolerance=flags, **given)
    try:
        WatchOptions.of(**options, where="recheck check --step")
    except (TypeError, ValueError) as exc:
        where = f"{config.path}: " if config.path and not flags else ""
        raise ConfigError(f"{where}{exc}") from None
    return options


def _check_one(target: Any, overrides: dict[str, Any], bar: Any) -> Any:
    """The report of one region, or what kept it from being checked."""
    from recheck.checker.api import check
    from recheck.checker.twin import RegionError
    from recheck.loading import TargetError, UserCodeFailed, build_region, run_user_code

    options = _options_for(target.options, overrides)
    if "max_ulp" in options and ("atol" in options or "rtol" in options):
        return _Broken("its CHECK_OPTIONS set both max_ulp and atol/rtol; a tolerance is one or the other")
    try:
        region = build_region(target)
    except TargetError as exc:
        return _Broken(str(exc), exc.user_traceback)
    try:
        with bar.redirected():  # the region's prints stay off stdout
            report = run_user_code(check, region.fn, *region.args, kwargs=region.kwargs, **options,
                                   own=(RegionError,))
    except RegionError as exc:
        return _Broken(str(exc))
    except UserCodeFailed as exc:  # the region's own error or exit, re-raised by check()
        return _Broken(f"the region raised {exc}", exc.user_traceback)
    report.title = f"target         {target.label}\n{report.title or ''}".rstrip()
    return report


def run(ns: argparse.Namespace) -> int:
    """Check every region the targets name: 0 clean, 1 findings, 2 an error (any target's,
    the others still checked), 130 Ctrl-C (what was checked so far is reported)."""
    from recheck.dependencies import require_torch

    problem = _usage_problem(ns)
    if problem:
        return _error(problem)
    require_torch("recheck check")
    if ns.step:
        return _run_steps(ns)
    from recheck.progress import progress

    overrides = _overrides(ns)  # a bad [tool.recheck] stops here, before any region runs
    planned: list[Any] = []  # targets and, in their place, the specs that failed to load
    from recheck.loading import TargetError, load_target

    interrupted = False  # Ctrl-C: what was checked so far is still reported
    with progress("loading", quiet=ns.quiet) as bar:  # the user's files, and torch with them
        for spec in ns.targets:
            bar.describe(spec)
            try:
                planned += load_target(spec)
            except TargetError as exc:
                planned.append((spec, _Broken(str(exc), exc.user_traceback)))
            except KeyboardInterrupt:
                interrupted = True
                break
    outcomes: list[tuple[str, Any]] = []
    regions = sum(not isinstance(p, tuple) for p in planned)
    with progress("checking", total=regions, unit="region", quiet=ns.quiet) as bar:
        for target in planned:
            if isinstance(target, tuple):
                outcomes.append(target)
                continue
            if interrupted:  # while loading: the targets that failed to load are still reported
                continue
            bar.describe(target.label)
            try:
                outcomes.append((target.label, _check_one(target, overrides, bar)))
            except KeyboardInterrupt:
                interrupted = True
                break
            bar.advance()
    broken = [label for label, o in outcomes if isinstance(o, _Broken)]
    reports = [(label, o) for label, o in outcomes if not isinstance(o, _Broken)]
    dirty = [r for _, r in reports if not r.ok]
    differences = sum(len(r) for r in dirty)
    summary = (f"recheck: checked {plural(len(reports), 'region')}: "
               f"{len(dirty)} with findings ({plural(differences, 'difference')}), "
               f"{len(reports) - len(dirty)} clean")
    if broken:
        summary += f"; {plural(len(broken), 'error')} ({', '.join(broken)})"
    return _finish(ns, outcomes, summary, "", broken, dirty, interrupted,
                   lambda text: _json.check_document(outcomes, regions=len(reports), with_findings=len(dirty),
                                                     differences=differences, errors=len(broken),
                                                     interrupted=interrupted, text=text))
