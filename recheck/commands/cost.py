"""``recheck cost FILE.py:STEP``: what checkpointing saves and costs in a training step.

One process by default; ``--ranks N`` runs a pipeline step on N local gloo ranks, ``--plan``
predicts each pipeline stage's peaks from a one-process run, ``--suggest`` finds the fastest
plan within ``--budget`` (the forms and exit codes: ``docs/cost.md``, ``docs/exit-codes.md``).
torch is imported only inside :func:`run`; every JSON form is printed through
:func:`recheck.output.json.dumps`, as every face prints its JSON.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from recheck.commands.arguments import count
from recheck.cost.pipeline.schedules import KINDS as SCHEDULE_KINDS
from recheck.cost.units import parse_bytes
from recheck.output.json import dumps

NAME = "cost"
HELP = (
    "measure a training step with its checkpoints as written and bypassed: retained saved "
    "state, peak memory, recompute work and time, per region"
)

_DEFAULT_FUNCTION = "step"
#: The most timed runs per mode ``--repeats`` asks for.
_MOST_REPEATS = 10_000
#: Seconds a ``--ranks`` world may run before its processes are killed.
_DEFAULT_TIMEOUT = 300.0


def _size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("--timeout must be more than 0 seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="FILE.py:STEP",
        help=f"a zero-argument callable doing forward + backward (file.py:name or pkg.module:name; "
        f"the name defaults to '{_DEFAULT_FUNCTION}')",
    )
    parser.add_argument("--repeats", type=count(1, _MOST_REPEATS, "--repeats"), default=5,
                        help=f"timed runs per mode (default 5, at most {_MOST_REPEATS}; --ranks and --plan trace "
                        "one run per mode)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress display (one is drawn on stderr only when it is a terminal)")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of memory over the step (needs matplotlib)")
    parser.add_argument(
        "--budget",
        type=_size,
        metavar="SIZE",
        help="a memory budget such as 40GiB: report the largest microbatch that fits each mode",
    )
    planner = parser.add_argument_group("choosing what to checkpoint")
    planner.add_argument("--suggest", action="store_true",
                         help="choose the fastest plan within --budget (which modules to checkpoint, fully or "
                         "selectively), run it and verify it with check_step beside the folklore plans; a model "
                         "that does not checkpoint yet is planned over its repeated blocks, with the line to add")
    planner.add_argument("--objective", choices=("time", "throughput"),
                         help="with --suggest: least step time (default), or most samples per second over the "
                         "batch sizes that fit (the step takes a batch_size argument)")
    planner.add_argument("--clock", choices=("wall", "cpu"),
                         help="with --suggest: time runs by wall time (default) or by the process's CPU time "
                         "(steadier on a shared CPU machine with the step on one thread)")
    planner.add_argument("--save-plan", metavar="PATH",
                         help="with --suggest: write the plan as JSON (recheck.apply_plan(model, PATH) applies it)")
    pipeline = parser.add_argument_group("pipelines (torch.distributed.pipelining)")
    pipeline.add_argument("--ranks", type=count(1, 64, "--ranks"), metavar="N",
                          help="run STEP's pipeline on N local gloo ranks and print the per-stage table; "
                          "STEP() returns the rank's zero-argument step")
    pipeline.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                          help=f"with --ranks: kill the ranks after this long (default {_DEFAULT_TIMEOUT:g})")
    pipeline.add_argument("--plan", action="store_true",
                          help="predict per-stage retained and observed peaks from one microbatch run in one process "
                          "(each stage's forward inside recheck.tag(stage=s))")
    pipeline.add_argument("--schedule", choices=SCHEDULE_KINDS, help="with --plan: the schedule to lay out")
    pipeline.add_argument("--microbatches", type=count(1, 100_000, "--microbatches"), metavar="M",
                          help="with --plan: microbatches per step")
    pipeline.add_argument("--stages", type=count(1, 4096, "--stages"), metavar="S",
                          help="with --plan: stage count (must match the stages the step tags; default: those)")


def _target_spec(target: str) -> str:
    _, colon, name = target.rpartition(":")
    if not colon or not name or "/" in name or "\\" in name:
        return f"{target}:{_DEFAULT_FUNCTION}"
    return target


def _usage_problem(ns: argparse.Namespace) -> str | None:
    suggesting = [flag for flag, value in (("--objective", ns.objective), ("--save-plan", ns.save_plan),
                                           ("--clock", ns.clock)) if value]
    if suggesting and not ns.suggest:
        return f"{suggesting[0]} needs --suggest"
    if ns.suggest:
        if ns.budget is None:
            return "--suggest needs --budget SIZE: the memory the plan must fit, such as 24GiB"
        other = [flag for flag, value in (("--ranks", ns.ranks is not None), ("--plan", ns.plan),
                                          ("--plot", ns.plot)) if value]
        if other:
            return f"{other[0]} does not go with --suggest"
    if ns.plan and ns.ranks is not None:
        return "--plan and --ranks are separate modes; use one"
    planning = [name for name in ("schedule", "microbatches", "stages") if getattr(ns, name) is not None]
    if planning and not ns.plan:
        return f"--{planning[0]} needs --plan"
    if ns.timeout is not None and ns.ranks is None:
        return "--timeout needs --ranks"
    if ns.plan and (ns.schedule is None or ns.microbatches is None):
        return "--plan needs --schedule and --microbatches"
    if ns.plan or ns.ranks is not None:
        extra = [flag for flag, value in (("--plot", ns.plot), ("--budget", ns.budget)) if value]
        if extra:
            return f"{extra[0]} applies to a single-process step, not with --ranks or --plan"
    return None


def _error(message: str, details: str = "") -> int:
    print(f"recheck cost: error: {message}", file=sys.stderr)
    if details:
        print(details, file=sys.stderr, end="" if details.endswith("\n") else "\n")
    return 2


def _print(ns: argparse.Namespace, text: Callable[[], str], document: Callable[[], object]) -> None:
    """``document()`` as JSON with ``--format json``, else ``text()``."""
    print(dumps(document()) if ns.format == "json" else text())


def run(ns: argparse.Namespace) -> int:
    from recheck.dependencies import require_torch

    problem = _usage_problem(ns)
    if problem:
        return _error(problem)
    require_torch("recheck cost")
    if ns.ranks is not None:
        return _run_ranks(ns)
    from recheck.loading import TargetError, UserCodeFailed, load_target, run_user_code
    from recheck.progress import progress

    with progress("loading", quiet=ns.quiet) as bar:  # the user's file, and torch with it
        bar.describe(ns.target)
        failure: TargetError | None = None
        try:
            (target,) = load_target(_target_spec(ns.target))
        except TargetError as exc:
            failure = exc
    if failure is not None:  # said once the bar is gone
        return _error(str(failure), failure.user_traceback or "")
    if ns.plan:
        return _run_plan(ns, target.factory, target.label)
    if ns.suggest:
        return _run_suggest(ns, target.factory, target.label)
    from recheck.cost.measurement import measure
    from recheck.cost.plot import PlotError

    try:
        with progress(f"measuring {target.label}", quiet=ns.quiet) as bar:
            bar.describe(f"checkpointed and bypassed, {ns.repeats} timed run{'s' if ns.repeats != 1 else ''} each")
            with bar.redirected():  # the step's prints stay off stdout (JSON)
                comparison = run_user_code(measure, target.factory, repeats=ns.repeats, budget=ns.budget)
    except UserCodeFailed as exc:  # the user's step failed or exited, or it is not a step: no traceback dump
        return _error(f"measuring {target.label} failed: {exc}")
    _print(ns, comparison.__str__, comparison.to_dict)
    if ns.plot:
        try:
            written = comparison.plot(ns.plot)
        except PlotError as exc:
            return _error(str(exc))
        print(f"recheck cost: memory plot written to {written}", file=sys.stderr)
    return 0


def _run_ranks(ns: argparse.Namespace) -> int:
    """``--ranks N``: every rank measures its stage; the table is printed here."""
    from recheck.cost.pipeline.stage_table import render_stages, stages_to_dict
    from recheck.cost.pipeline.stages import rank_entry
    from recheck.distributed.launch import WorldFailed, WorldTimeout, run_world
    from recheck.progress import progress

    spec = _target_spec(ns.target)
    try:
        timeout = _DEFAULT_TIMEOUT if ns.timeout is None else ns.timeout
        with progress(f"measuring {spec} on {ns.ranks} ranks", quiet=ns.quiet):
            per_rank = run_world(rank_entry, ns.ranks, args=([spec],), timeout=timeout)
    except WorldFailed as exc:
        last = exc.remote_traceback.strip().splitlines()[-1] if exc.remote_traceback.strip() else "no traceback"
        return _error(f"rank {exc.rank} of {ns.ranks} failed running {spec}: {last}", exc.remote_traceback)
    except WorldTimeout as exc:
        return _error(f"{spec} on {ns.ranks} rank(s): {exc} (raise --timeout if the step is slow)")
    reports = []
    for results in per_rank:
        outcome = results[spec]
        if isinstance(outcome, str):  # "rank R of N: what is wrong"
            return _error(outcome)
        reports += outcome
    _print(ns, lambda: render_stages(reports, spec), lambda: stages_to_dict(reports, spec))
    return 0


def _run_plan(ns: argparse.Namespace, step: Callable[[], object], label: str) -> int:
    """``--plan``: one process, one microbatch, a predicted table."""
    from recheck.cost.pipeline.plan import NoStageTags, measure_plan, predict
    from recheck.cost.pipeline.stage_table import plan_to_dict, render_plan
    from recheck.loading import UserCodeFailed, run_user_code
    from recheck.progress import progress

    try:
        with progress(f"measuring {label} for the plan", quiet=ns.quiet) as bar:
            with bar.redirected():  # the step's prints stay off stdout (JSON)
                measurement = run_user_code(measure_plan, step, own=(NoStageTags, ValueError))
        predictions = predict(measurement, ns.schedule, ns.microbatches, ns.stages)
    except NoStageTags as exc:
        return _error(f"{label}: {exc}")
    except ValueError as exc:
        return _error(str(exc))
    except UserCodeFailed as exc:  # the user's step failed or exited: say so, no traceback dump
        return _error(f"measuring {label} failed: {exc}")
    _print(ns, lambda: render_plan(predictions, ns.schedule, ns.microbatches, label),
           lambda: plan_to_dict(predictions, ns.schedule, ns.microbatches, label))
    return 0


def _run_suggest(ns: argparse.Namespace, step: Callable[..., object], label: str) -> int:
    """``--suggest``: the plan, its runs beside the anchors', the candidates."""
    from recheck.cost.planner.candidates import NoRepeatedUnit
    from recheck.cost.planner.solver import SolverLimit
    from recheck.cost.planner.suggest import suggest
    from recheck.cost.planner.suggestion import NothingFits
    from recheck.loading import UserCodeFailed, run_user_code
    from recheck.progress import progress

    try:
        with progress(f"planning {label}", quiet=ns.quiet) as bar:
            def tell(what: str, done: int, total: int) -> None:
                bar.count(done, total)
                bar.describe(what)

            with bar.redirected():  # the step's prints stay off stdout (JSON)
                suggestion = run_user_code(suggest, step, budget=ns.budget, objective=ns.objective or "time",
                                           repeats=ns.repeats, clock=ns.clock or "wall", progress=tell,
                                           own=(NoRepeatedUnit, NothingFits, SolverLimit, ValueError))
    except (NoRepeatedUnit, NothingFits, SolverLimit, ValueError) as exc:
        return _error(f"{label}: {exc}")
    except UserCodeFailed as exc:  # the user's step failed or exited: say so, no traceback dump
        return _error(f"planning {label} failed: {exc}")
    suggestion.step = label
    if ns.save_plan:
        try:
            with open(ns.save_plan, "w", encoding="utf-8") as handle:
                handle.write(suggestion.plan.to_json() + "\n")
        except OSError as exc:
            return _error(f"cannot write the plan to {ns.save_plan}: {exc.strerror or exc}")
    _print(ns, suggestion.__str__, suggestion.to_dict)
    if ns.save_plan:
        print(f"recheck cost: plan written to {ns.save_plan}", file=sys.stderr)
    run = suggestion.suggested
    return 0 if run.verified and run.fits(suggestion.budget) else 1
