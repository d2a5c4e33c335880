"""``recheck run [options] (SCRIPT.py | -m MODULE) [ARGS...]``: a program inside ``recheck.watch()``.

The program runs as ``python`` would run it (its ``sys.argv``, ``__main__``, ``sys.path[0]`` and
exit status), like ``coverage run``; ``--steps N`` stops intercepting after N steps, so the rest
of the run pays nothing.  The report goes to stderr: the program's stdout stays the program's."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from recheck.output.text import plural
from recheck.progress import paint, terminal_report
from recheck.commands.arguments import count

NAME = "run"
HELP = ("run a Python program as python would, verifying every checkpoint call of its first "
        "training steps (recheck.watch())")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The step window, the report's path and format, and the program with its arguments."""
    parser.usage = ("%(prog)s [--steps N] [--check-step] [--report PATH] [--format {text,json}] [--exit-zero] [--verbose] "
                    "(SCRIPT.py | -m MODULE) [ARGS...]")
    parser.add_argument("--steps", type=count(1), default=None, metavar="N",
                        help="watch only the first N steps (optimizer steps, or backward calls when no "
                             "optimizer steps), then stop intercepting (default: the whole program)")
    parser.add_argument("--check-step", action="store_true",
                        help="also compare the step after the watched ones with its uncheckpointed twin "
                             "(check_step), when the program's step is a function it calls once per step")
    parser.add_argument("--report", default=None, metavar="PATH",
                        help="also write the final report to PATH, in --format")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="format of the final report (default: text); without --report a JSON "
                             "report goes to stderr")
    parser.add_argument("--exit-zero", action="store_true",
                        help="exit with 0 when the program succeeded, even with findings")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="text: every entry of the report with its detail (by default at most ten, causes "
                             "first; JSON always holds everything)")
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, default=None, metavar="MODULE",
                        help="run a library module as a script (python -m MODULE); the rest are its arguments")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="SCRIPT.py [ARGS...]",
                        help="the program and its arguments (everything after it is the program's)")


def _error(message: str) -> int:
    print(f"recheck run: error: {message}", file=sys.stderr)
    return 2


def _usage_problem(ns: argparse.Namespace) -> str | None:
    """What keeps the program from being started, before torch or the program is imported."""
    if ns.module is not None:
        if not ns.module:
            return "-m needs a MODULE name (recheck run -m MODULE [ARGS...])"
        import importlib.util

        name = ns.module[0]
        sys.path.insert(0, os.getcwd())  # where python -m looks first
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:
            return f"cannot find module {name!r} ({exc})"
        finally:
            sys.path.pop(0)
        if found is None:
            return f"no module named {name!r}"
    elif not ns.program:
        return "nothing to run: give SCRIPT.py [ARGS...] or -m MODULE [ARGS...]"
    elif not os.path.exists(ns.program[0]):
        return f"cannot open file {ns.program[0]!r}: no such file"
    if ns.report is not None and Path(ns.report).is_dir():
        return f"--report {ns.report!r} is a folder; give a file name"
    return None


def _header(label: str, watcher: Any) -> str:
    """What was watched: the program, how many steps, and what a step was."""
    from recheck.watcher.program import UNIT_MEANING

    unit, seen, asked = watcher.unit, watcher.steps_watched, watcher.steps
    if not watcher.started:
        return f"recheck run {label}: not watched (see the notes)"
    if unit is None:
        return f"recheck run {label}: no optimizer step and no backward call was made"
    counted = plural(seen, "step")
    if asked is None:
        what = f"watched the whole program ({counted})"
    elif watcher.window_ended:
        what = f"watched the first {counted}"
    else:
        what = f"watched {counted} of the {asked} asked (the program made no more)"
    return f"recheck run {label}: {what}; {UNIT_MEANING[unit]}"


def _titled(report: Any, label: str, watcher: Any) -> Any:
    """The report with the run's header above the watch block's own title."""
    report.title = "\n".join(t for t in (_header(label, watcher), report.title) if t)
    if not report.stats.get("invocations"):
        note = "no checkpoint call was made while watching (is gradient checkpointing on?)"
        if note not in report.notes:
            report.notes.append(note)
    return report


def _with_twin(report: Any, twin: Any) -> None:
    """The ``--check-step`` twin's findings, notes and statistics added to the run's report."""
    if twin.report is None:
        report.notes.append(f"--check-step: no step was compared with its twin: {twin.reason}")
        return
    found = len(twin.report)
    report.title = (f"{report.title}\n--check-step: the next call of {twin.step_function} was compared "
                    f"with its uncheckpointed twin: {found or 'no'} finding{'s' if found != 1 else ''}")
    report.findings.extend(twin.report.findings)
    report.notes.extend(n for n in twin.report.notes if n not in report.notes)
    report.stats["check_step"] = dict(twin.report.stats, step=twin.step_function)


#: Seconds rank 0 waits for the other ranks' reports: when the watched steps end (the ranks end
#: them within a step of each other), and at exit (a rank may finish its program later).
WINDOW_WAIT, EXIT_WAIT = 10.0, 60.0


def _ranks_merged(report: Any, watcher: Any, stage: str, wait: float) -> Any:
    """Under a launcher: rank 0's view of every rank's report; None on the other ranks once theirs is
    sent to rank 0.  Where the ranks cannot meet, this rank's own report, with a note saying why."""
    place = watcher.place
    if place is None or place.world_size < 2:
        return report
    from recheck.distributed.reports import merge_through_launcher
    from recheck.findings import error_line

    try:
        merged = merge_through_launcher(report, place.rank, place.world_size, stage, wait)
    except Exception as exc:  # each rank reports for itself
        note = f"recheck run: each rank reports for itself: {error_line(exc)}"
        if note not in report.notes:
            report.notes.append(note)
        return report
    if merged is not None and merged.title:  # each rank's run header once, then each rank's watch line
        merged.title = "\n".join(dict.fromkeys(merged.title.splitlines()))
    return merged


def run(ns: argparse.Namespace) -> int:
    """Run the program inside ``watch()``; its status when it failed, else 1 for findings, else 0."""
    problem = _usage_problem(ns)
    if problem:
        return _error(problem)
    from recheck.dependencies import require_torch

    require_torch("recheck run")
    from recheck.commands.check import _watch_options
    from recheck.config import load_config

    options = _watch_options(load_config())  # a bad [tool.recheck] stops here, before the program starts
    from recheck.watcher.program import ProgramWatch, _say, run_program

    module = ns.module is not None
    target, args = (ns.module[0], ns.module[1:]) if module else (ns.program[0], ns.program[1:])
    label = f"-m {target}" if module else target

    def window_ended(watcher: ProgramWatch) -> None:
        if watcher.report is None:
            return
        shown = _ranks_merged(_titled(watcher.report, label, watcher), watcher, "window", WINDOW_WAIT)
        if shown is not None:
            # on a line of its own: a progress bar (tqdm's, Trainer's) leaves the cursor at the end of its line
            _say("\n" + paint(f"recheck run: the first {watcher.steps} step(s) ended; the rest of the program "
                              "runs unwatched", "bold", sys.stderr))
            _say(_text(shown, ns.verbose, sys.stderr))

    report_path = Path(ns.report).absolute() if ns.report is not None else None  # before the program's chdir
    steps = 1 if ns.check_step and ns.steps is None else ns.steps
    from recheck.checker.twin import check_step_report

    watcher = ProgramWatch(steps, options, on_window_end=window_ended,
                           check_step=check_step_report if ns.check_step else None)
    status = run_program(target, list(args), module=module, before=watcher.start, after=watcher.stop)
    report = watcher.report
    if report is None:  # never started (the program could not be loaded)
        return status
    if not watcher.window_ended:
        _titled(report, label, watcher)
    if watcher.twin is not None:
        _with_twin(report, watcher.twin)
    from recheck.output.json import dumps, run_document

    document = run_document(label, module, [target, *args], watcher, status, report)
    merged_path = None
    if watcher.place is not None:  # under a launcher: one report file per rank, as pytest --recheck writes
        from recheck.distributed.reports import rank_report_path

        document.update(rank=watcher.place.rank, world_size=watcher.place.world_size)
        if report_path is not None:
            merged_path, report_path = report_path, rank_report_path(report_path, watcher.place.rank)
    shown = _ranks_merged(report, watcher, "exit", EXIT_WAIT)
    written = [(report_path, report, document)]
    if shown is None:  # rank 0 reports this rank's findings; this rank exits with its program's status
        _say(f"{_summary(report, status)} (rank {watcher.place.rank}: its report is in rank 0's)")
    elif shown is not report:  # rank 0: the merged report, also written to PATH itself
        merged = run_document(label, module, [target, *args], watcher, status, shown)
        written.append((merged_path, shown, merged))
    if shown is not None:
        if ns.format == "json" and ns.report is None:
            _say(dumps(written[-1][2]))
        else:
            _say(paint("recheck run: summary", "bold", sys.stderr))
            closing = paint(_summary(shown, status), "red" if not shown.ok else "green", sys.stderr)
            _say(f"{_text(shown, ns.verbose, sys.stderr)}\n\n{closing}")
    for path, content, doc in written:
        if path is None:
            continue
        rendered = dumps(doc) if ns.format == "json" else f"{_text(content, ns.verbose)}\n\n{_summary(content, status)}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(rendered + "\n", encoding="utf-8")
        except OSError as exc:
            _say(f"recheck run: error: could not write the report to {str(path)!r}: {exc.strerror or exc}")
            return status or 2
    if status or shown is None:
        return status
    return 1 if not shown.ok and not ns.exit_zero else 0


def _text(report: Any, verbose: bool, stream: Any = None) -> str:
    """The report as text: painted and wrapped on a terminal ``stream`` (:func:`recheck.progress.terminal_report`)."""
    return terminal_report(report, verbose=verbose, stream=stream)


def _summary(report: Any, status: int) -> str:
    findings = 0 if report.ok else len(report)
    outcome = plural(findings, "finding") if findings else "no finding"
    return f"recheck run: {outcome}; the program exited with status {status}"
