"""recheck's pytest plugin: ``pytest --recheck`` runs each test inside ``recheck.watch()``.

Registered as the ``pytest11`` entry point ``recheck`` (disable with ``-p no:recheck``); the
options, ini keys, markers and precedence are in docs/pytest.md.  This module imports only pytest,
the standard library and recheck's configuration: torch is imported when the first watched test
runs.  The summary and the JSON report are built on the controller from the test reports, so they
are complete under pytest-xdist.  A watched test's child processes (``torch.multiprocessing.spawn``,
``multiprocessing.Process``) each run their target inside a ``watch()`` of their own, whose
reports join the test's; under torch.distributed each rank reports for itself."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from recheck.config import TOLERANCES

__all__ = ["PROPERTY"]

#: the ``user_properties`` key carrying a test's watch report to the controller
PROPERTY = "recheck"
#: what ``@pytest.mark.recheck`` and the settings pass to ``recheck.watch()``
_MARKER_OPTIONS = ("early_stop", "store", "atol", "rtol", "max_ulp", "strict")
_STORES = ("digest", "copy")
_SWITCH = {"on": True, "off": False}


@dataclass
class _Settings:
    enabled: bool
    report_path: str | None = None
    #: ``recheck.watch()`` keyword arguments from the command line, ini and ``[tool.recheck]``
    watch_options: dict[str, Any] = field(default_factory=dict)
    #: their validated form (``recheck.watcher.options.WatchOptions``), once read
    options: Any = None
    results: list[dict[str, Any]] = field(default_factory=list)
    #: ``recheck.distributed.world.Place`` of this process, once a watched test has seen one
    place: Any = None


_SETTINGS = pytest.StashKey[_Settings]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("recheck", "recheck: verify activation-checkpoint recomputation")
    group.addoption("--recheck", action="store_true", default=None, dest="recheck",
                    help="run every test inside recheck.watch(): fail tests whose checkpoint "
                         "recomputation differs from the forward")
    group.addoption("--recheck-early-stop", choices=tuple(_SWITCH), default=None, dest="recheck_early_stop",
                    help="off: replay every non-reentrant recomputation fully (latent side effects show); "
                         "on: force early stop (default: as each checkpoint call says)")
    group.addoption("--recheck-strict", action="store_true", default=None, dest="recheck_strict",
                    help="the old name of --recheck-early-stop=off")
    group.addoption("--recheck-store", choices=_STORES, default=None, dest="recheck_store",
                    help="keep digests (default) or full copies of each forward's tensors")
    group.addoption("--recheck-atol", type=float, default=None, dest="recheck_atol", metavar="X",
                    help="absolute tolerance for floating-point values, with --recheck-rtol (default: exact)")
    group.addoption("--recheck-rtol", type=float, default=None, dest="recheck_rtol", metavar="Y",
                    help="relative tolerance, with --recheck-atol (default: exact)")
    group.addoption("--recheck-max-ulp", type=int, default=None, dest="recheck_max_ulp", metavar="N",
                    help="tolerance in units in the last place, instead of --recheck-atol/--recheck-rtol")
    group.addoption("--recheck-report", default=None, metavar="PATH", dest="recheck_report",
                    help="write a JSON report of the whole run to PATH")
    parser.addini("recheck", "run every test inside recheck.watch() (like --recheck)", type="bool", default=None)
    parser.addini("recheck_early_stop", "like --recheck-early-stop: on or off", type="string", default="")
    parser.addini("recheck_strict", "the old name of recheck_early_stop = off", type="bool", default=None)
    parser.addini("recheck_store", "like --recheck-store: digest or copy", type="string", default="")
    parser.addini("recheck_atol", "like --recheck-atol", type="string", default="")
    parser.addini("recheck_rtol", "like --recheck-rtol", type="string", default="")
    parser.addini("recheck_max_ulp", "like --recheck-max-ulp", type="string", default="")
    parser.addini("recheck_report", "like --recheck-report: a path for the JSON report", type="string", default="")


def _first(*values: Any) -> Any:
    return next((v for v in values if v not in (None, "")), None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "recheck(early_stop=None, store='digest', atol=None, rtol=None, max_ulp=None): "
                   "run this test inside recheck.watch() with these options")
    config.addinivalue_line("markers", "no_recheck(reason=None): do not watch this test even with --recheck")
    enabled = bool(_first(config.getoption("recheck"), config.getini("recheck"), False))
    settings = config.stash[_SETTINGS] = _Settings(enabled=enabled)
    if enabled:
        _resolve(config, settings)
    config.pluginmanager.register(_Collector(settings), "recheck-collector")


def _ini_number(config: pytest.Config, name: str, kind: type) -> Any:
    text = config.getini(name)
    if text in (None, ""):
        return None
    try:
        return kind(text)
    except ValueError:
        raise pytest.UsageError(f"recheck: {name} must be a number, got {text!r}") from None


def _resolve(config: pytest.Config, settings: _Settings) -> _Settings:
    """Read and validate the options (command line > ini > ``[tool.recheck]``) once, when needed.

    Nothing is read unless recheck is enabled or a test carries ``@pytest.mark.recheck``, so a
    ``[tool.recheck]`` table that only the linter uses (or a typo in it) never affects a plain
    ``pytest`` run.
    """
    if settings.options is not None:
        return settings
    from recheck.config import ConfigError, load_config, watch_options

    try:
        table = load_config(config.rootpath).values
    except ConfigError as exc:
        raise pytest.UsageError(f"recheck: {exc}") from None
    flag = config.getoption("recheck_early_stop") or config.getini("recheck_early_stop") or None
    if flag is not None and flag not in _SWITCH:
        raise pytest.UsageError(f"recheck: recheck_early_stop must be 'on' or 'off', got {flag!r}")
    settings.watch_options = watch_options(
        table, early_stop=_SWITCH.get(flag or ""), strict=bool(config.getoption("recheck_strict") or config.getini("recheck_strict")),
        tolerance={name: _first(config.getoption(f"recheck_{name}"), _ini_number(config, f"recheck_{name}", kind))
                   for name, kind in zip(TOLERANCES, (float, float, int))})
    settings.options = _validated(settings.watch_options, "recheck")
    settings.report_path = _first(config.getoption("recheck_report"), config.getini("recheck_report"),
                                  table.get("report"))
    if settings.report_path:
        _check_report_path(_report_file(config, settings.report_path))
    return settings


def _report_file(config: pytest.Config, given: str) -> Path:
    """The JSON report's path: as given, relative to the root directory."""
    path = Path(given)
    return path if path.is_absolute() else config.rootpath / path


def _check_report_path(path: Path) -> None:
    """Refuse, before any test runs, a report path that cannot be written as a file: a folder,
    or a path below something that is not a folder (pytest would end with an internal error at
    the end of the run)."""
    where = "(--recheck-report, the recheck_report ini key or [tool.recheck] report)"
    if path.is_dir():
        raise pytest.UsageError(f"recheck: the JSON report path {str(path)!r} is a folder; give a file name {where}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise pytest.UsageError(f"recheck: the JSON report path {str(path)!r} lies below {str(parent)!r}, "
                                        f"which is not a folder {where}")
            break


def _validated(options: dict[str, Any], where: str) -> Any:
    from recheck.dependencies import MissingDependency, require_torch

    try:
        require_torch("pytest --recheck")
    except MissingDependency as exc:
        raise pytest.UsageError(f"recheck: {exc}") from None
    from recheck.watcher.options import WatchOptions

    try:
        return WatchOptions.of(**options, where=where)
    except (TypeError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config: pytest.Config) -> str | None:
    settings = config.stash.get(_SETTINGS, None)
    if settings is None or not settings.enabled:
        return None
    return f"recheck: watching every test ({settings.options.describe()})"


def _options_for(item: pytest.Item, settings: _Settings) -> dict[str, Any] | None:
    """The ``watch()`` options for one test, or None when it is not watched."""
    if item.get_closest_marker("no_recheck") is not None:
        return None
    marker = item.get_closest_marker("recheck")
    if marker is None and not settings.enabled:
        return None
    _resolve(item.config, settings)
    options = dict(settings.watch_options)
    if marker is not None:
        unknown = sorted(set(marker.kwargs) - set(_MARKER_OPTIONS))
        if marker.args or unknown:
            given = ", ".join([*map(repr, marker.args), *unknown])
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.recheck takes only the keywords "
                f"{', '.join(_MARKER_OPTIONS[:-1])}; got {given}")
        if any(k in marker.kwargs for k in TOLERANCES):
            for name in TOLERANCES:  # the marker's tolerance replaces the run's
                options.pop(name, None)
        options.update(marker.kwargs)
        _validated(options, f"{item.nodeid}: @pytest.mark.recheck")
    return options


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    settings = item.config.stash[_SETTINGS]
    options = _options_for(item, settings)
    if options is None:
        return (yield)
    from recheck.watcher import watch

    watcher = watch(raise_on_finding=False, **options)
    children = _Children(options)
    try:
        with watcher, children:
            result = yield
    finally:
        if settings.place is None:
            settings.place = watcher.place
        report, regions = children.merged(watcher.report, _regions(watcher))
        item.user_properties.append((PROPERTY, {**report.to_dict(), "regions": regions}))
        if report.ok and (report.stats.get("invocations") or report.notes):
            # a failing test shows the report as its failure message; a passing one here (-rP)
            item.add_report_section("call", "recheck", _text(report, item.config))
    if not report.ok:
        pytest.fail(_text(report, item.config), pytrace=False)
    return result


def _regions(watcher: Any) -> list[str]:
    return sorted({str(r.region) for r in watcher.records if r.forward is not None})


class _Children:
    """The processes a watched test starts (``torch.multiprocessing.spawn``, ``start_processes``,
    ``multiprocessing.Process``): each runs its target inside a ``watch()`` of its own and writes
    its report to a folder of this test, and :meth:`merged` gives one report for the test.

    ``multiprocessing``'s ``Process.start`` is wrapped for the length of the test only: it puts
    the target in a :class:`_WatchedChild`, which a forked child runs as it is and a spawned
    child receives pickled, so both start methods are covered, and a forked child's own
    children as well.  A process whose ``run`` is its own (no target) is not watched.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.started: list[tuple[Any, str]] = []
        self.folder: str | None = None

    def __enter__(self) -> _Children:
        import tempfile
        from multiprocessing.process import BaseProcess

        self._original = original = BaseProcess.start

        def start(process: Any) -> None:
            target = getattr(process, "_target", None)
            if target is None or isinstance(target, _WatchedChild) or _machinery(target):
                return original(process)
            self.folder = self.folder or tempfile.mkdtemp(prefix="recheck-children-")
            label, process._target = _label(process), _WatchedChild(target, self.folder, self.options)
            try:
                original(process)
            except BaseException:
                process._target = target
                raise
            self.started.append((process, label))

        BaseProcess.start = start  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: Any) -> None:
        from multiprocessing.process import BaseProcess

        BaseProcess.start = self._original  # type: ignore[method-assign]

    def merged(self, report: Any, regions: list[str]) -> tuple[Any, list[str]]:
        """The test's own report merged with its children's, and the regions of them all; a
        child that wrote no report is named in a note (its calls were not verified).  recheck's
        own failure here is a note in the test's report."""
        import shutil

        from recheck.findings import could_not

        if self.folder is None:
            return report, regions
        try:
            return self._merged(Path(self.folder), report, regions)
        except Exception as exc:  # noqa: BLE001
            report.notes.append(could_not("collect the reports of the test's child processes", exc))
            return report, regions
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _merged(self, folder: Path, report: Any, regions: list[str]) -> tuple[Any, list[str]]:
        from recheck.findings import Report

        labels = {str(process.pid): label for process, label in self.started}
        children, names, notes = [], [], []
        for path in sorted(folder.glob("*.json")):
            name = labels.pop(path.stem, f"child process {path.stem}")
            try:
                document = json.loads(path.read_text(encoding="utf-8"))
                child = Report.from_dict(document)
            except (OSError, ValueError) as exc:
                notes.append(f"recheck: the report of {name} could not be read ({exc})")
                continue
            if isinstance(child.stats.get("rank"), int):
                name = f"rank {child.stats['rank']}"
            if child.findings or child.notes or child.stats.get("invocations"):
                children.append(child)
                names.append(name)
                regions = sorted({*regions, *document.get("regions", ())})
        for process, name in self.started:
            if str(process.pid) in labels:
                how = "is still running" if process.exitcode is None else f"ended with exit code {process.exitcode}"
                notes.append(f"{name} (child process {process.pid}) {how} and wrote no report: "
                             "its checkpoint calls were not verified")
        if not children and not notes:
            return report, regions
        merged = Report.merge([report, *children])
        stats = merged.stats
        merged.title = (f"watch: {stats.get('invocations', 0)} checkpoint invocation(s) of {len(regions)} region(s), "
                        f"{stats.get('verified', 0)} verified against their recomputation, in the test"
                        + (f" and its child process(es) {', '.join(names)}" if names else ""))
        merged.notes.extend(n for n in notes if n not in merged.notes)
        return merged, regions


#: modules whose processes run library machinery (pool, executor and DataLoader workers), not a
#: test's own code: they are not watched (a pool's workers are ended by a signal, never report)
_MACHINERY = ("multiprocessing.", "concurrent.futures.", "torch.utils.data.")


def _machinery(target: Any) -> bool:
    return str(getattr(target, "__module__", None)).startswith(_MACHINERY)


def _label(process: Any) -> str:
    """``rank N`` for the N-th process of ``torch.multiprocessing.spawn`` (its ``_wrap(fn, N, ...)``
    target; the rank, as tests use it), else the process's name."""
    target, args = process._target, process._args
    if getattr(target, "__module__", None) == "torch.multiprocessing.spawn" and len(args) > 1:
        return f"rank {args[1]}"
    return str(process.name)


class _WatchedChild:
    """A child process's target run inside ``recheck.watch()``; its report goes to ``folder``
    as ``<pid>.json``.  Picklable (a spawned child receives it); recheck's own failure to watch
    or to write the report never changes what the target does."""

    def __init__(self, target: Any, folder: str | None, options: dict[str, Any]) -> None:
        self.target, self.folder, self.options = target, folder, options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            from recheck.watcher import watch

            watcher = watch(raise_on_finding=False, **self.options)
        except Exception:  # noqa: BLE001 - the child runs unwatched, and the parent says so
            return self.target(*args, **kwargs)
        try:
            with watcher:
                return self.target(*args, **kwargs)
        finally:
            document = {**watcher.report.to_dict(), "regions": _regions(watcher)}
            ranks = {r.tags.get("rank") for r in watcher.records} - {None}
            if "rank" not in document["stats"] and len(ranks) == 1:  # the group was gone by the block's end
                document["stats"]["rank"] = ranks.pop()
            self._write(document)

    def _write(self, document: dict[str, Any]) -> None:
        path = Path(str(self.folder)) / f"{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(document, default=repr), encoding="utf-8")
            tmp.replace(path)


class _Collector:
    """Collects each test's watch report from the test reports (on the xdist controller too)."""

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == PROPERTY and isinstance(value, dict):
                self.settings.results.append({"nodeid": report.nodeid, **value})


#: Where a report shown by pytest says the entries it leaves out are.
_MORE = "pytest -v / --recheck-report"


def _text(report: Any, config: pytest.Config, colour: bool = False) -> str:
    """A report as text, the one renderer of every face: every entry under ``pytest -v``."""
    from recheck.output.text import format_report

    return format_report(report, verbose=config.get_verbosity() > 0, colour=colour, more=_MORE)


def _merged(results: list[dict[str, Any]]) -> Any:
    """Every watched test's findings in one report (a result that does not load is left out)."""
    from recheck.findings import Report

    merged = Report()
    for result in results:
        try:
            merged.findings.extend(Report.from_dict({"findings": result.get("findings", [])}).findings)
        except ValueError:
            continue
    return merged


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    settings = config.stash.get(_SETTINGS, None)
    if settings is None or _is_worker(config) or not (settings.enabled or settings.results):
        return
    results = settings.results
    regions = {r for result in results for r in result.get("regions", ())}
    stats = [result.get("stats", {}) for result in results]
    failing = [result["nodeid"] for result in results if result.get("findings")]
    silent = [result["nodeid"] for result in results if not result.get("stats", {}).get("invocations")]
    place = _place(settings)
    where = f" ({place})" if place is not None else ""
    terminalreporter.write_sep("=", f"recheck summary{where}")
    terminalreporter.write_line(
        f"recheck{where}: {len(results)} test(s) watched; {len(regions)} region(s), "
        f"{sum(s.get('invocations', 0) for s in stats)} invocation(s), "
        f"{sum(s.get('verified', 0) for s in stats)} recomputation(s) verified, "
        f"{sum(len(result.get('findings', ())) for result in results)} finding(s) in {len(failing)} test(s)")
    everything = _merged(results)
    if everything.findings:  # the run's entries, most severe first, as every face shows a report
        colour = bool(getattr(terminalreporter, "hasmarkup", False))  # pytest's own say (a terminal, NO_COLOR)
        terminalreporter.write_line(_text(everything, config, colour=colour))
    for nodeid in failing:
        terminalreporter.write_line(f"  findings: {nodeid}")
    if silent:
        terminalreporter.write_line(f"tests that made no checkpoint call: {len(silent)}")
        for nodeid in silent[:10]:
            terminalreporter.write_line(f"  {nodeid}")
        if len(silent) > 10:
            terminalreporter.write_line(f"  ... and {len(silent) - 10} more")


def _place(settings: _Settings) -> Any:
    """This process's rank as a watched test saw it, else as the launcher's variables say."""
    if settings.place is not None:
        return settings.place
    from recheck.distributed.world import current_place

    return current_place()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    settings = config.stash.get(_SETTINGS, None)
    if settings is None or _is_worker(config) or not settings.report_path:
        return
    from recheck.distributed.reports import rank_report_path

    path = _report_file(config, settings.report_path)
    options = settings.options.as_kwargs() if settings.options is not None else {}
    document: dict[str, Any] = {"tests": settings.results, "options": options}
    place = _place(settings)
    if place is not None:
        path = rank_report_path(path, place.rank)
        document.update(rank=place.rank, world_size=place.world_size)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(document, indent=2, default=repr), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:  # the path changed during the run (checked when it began), a full disk ...
        with contextlib.suppress(OSError):
            tmp.unlink()
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        message = f"recheck: could not write the JSON report to {str(path)!r}: {exc.strerror or exc}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:
            print(message, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
