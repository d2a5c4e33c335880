"""``recheck lint [PATHS]``: find recomputation hazards inside checkpointed regions.

Exit codes (docs/exit-codes.md, the contract for every face): 0 clean, 1 findings, 2 usage, configuration
or input error, including a file or folder that could not be linted, which wins over 1 (the
findings are still all printed); ``--exit-zero`` turns 1 into 0, never 2.  Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from recheck.commands.arguments import count
from recheck.output import FORMATS

NAME = "lint"
HELP = "lint checkpointed regions for recomputation hazards (static, never imports torch)"


def _codes(value: str) -> list[str]:
    return [c.strip() for c in value.split(",") if c.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or folders to lint (default: .)")
    parser.add_argument("--format", "--output-format", dest="format", choices=FORMATS, default="text",
                        help="output format (default: text)")
    parser.add_argument("--select", type=_codes, metavar="CODES", help="comma-separated rule codes or prefixes to report")
    parser.add_argument("--ignore", type=_codes, metavar="CODES", help="comma-separated rule codes or prefixes to skip")
    parser.add_argument("--extend-select", type=_codes, metavar="CODES", help="rules to add to the selection")
    parser.add_argument("--statistics", action="store_true",
                        help="print a count per rule, what was analysed and every unresolved checkpoint call")
    parser.add_argument("--show-regions", metavar="PATH",
                        help="print every checkpoint call under PATH with the regions it resolved to")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    parser.add_argument("--fix", action="store_true", help="add use_reentrant=False where RC001 flags it")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="keep the cache in DIR, any folder (default: $RECHECK_CACHE_DIR, else cache-dir "
                             "of [tool.recheck], a folder inside the project, else .recheck_cache)")
    parser.add_argument("--jobs", "-j", type=count(0, meaning="0 (one per CPU)"), default=0, metavar="N",
                        help="worker processes, at most one per CPU (default: 0, one per CPU)")
    parser.add_argument("--config", metavar="PYPROJECT", help="read [tool.recheck] from this file")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bar (one is drawn on stderr only when it is a terminal)")


def run(ns: argparse.Namespace) -> int:
    from recheck import __version__
    from recheck.config import load_config
    from recheck.lint.engine import lint_paths
    from recheck.lint.settings import LintOptions, SelectorError
    from recheck.catalogue import FIXABLE
    from recheck.output import render
    from recheck.lint.statistics import unresolved_sites
    from recheck.output.text import lint_summary, unresolved_summary

    paths = [Path(p) for p in (ns.paths or ["."])]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        for path in missing:
            print(f"recheck lint: error: {path}: no such file or directory", file=sys.stderr)
        return 2
    config = load_config(paths[0], path=ns.config)
    flags = {"select": ns.select, "ignore": ns.ignore, "extend_select": ns.extend_select}
    values = config.merged(flags).values
    table = f"{_shown(config.path)}: [tool.recheck]" if config.path else "[tool.recheck]"
    origins = {key: f"--{key.replace('_', '-')}" if flags.get(key) is not None else f"{table} {key.replace('_', '-')}"
               for key in (*flags, "per_file_ignores")}
    try:
        options = LintOptions.from_values(values, config.root, use_cache=not ns.no_cache, jobs=ns.jobs,
                                          origins=origins, cache_dir=_user_cache_dir(ns),
                                          source=config.path or "[tool.recheck]")
    except SelectorError as exc:
        print(f"recheck lint: error: {exc}", file=sys.stderr)
        return 2
    from recheck.progress import progress

    with progress("parsing", unit="file", quiet=ns.quiet) as bar:
        result = lint_paths(paths, options, progress=bar.count if bar.shown else None)
    findings = result.findings
    fixed = 0
    if ns.fix:
        from recheck.lint.fix import fix_use_reentrant

        outcome = fix_use_reentrant(findings, result.sources, within=paths)
        for line in outcome.skipped:
            print(line, file=sys.stderr)
        done = outcome.fixed
        fixed = len(done)
        findings = [f for f in findings if (f.path, f.line, f.column) not in done or f.code != "RC001"]
    for line in result.warnings:
        print(line, file=sys.stderr)
    if ns.format != "github":  # github gets them as ::error annotations on stdout
        for error in result.errors:
            print(error, file=sys.stderr)
    if ns.show_regions is not None:
        from recheck.lint.statistics import show_regions

        print(show_regions(result, _shown(Path(ns.show_regions))))
        return _status(findings, result.errors, ns.exit_zero)
    if ns.statistics:
        _print_statistics(ns.format, findings, result)
        if ns.format != "text":
            return _status(findings, result.errors, ns.exit_zero)
    unresolved = unresolved_sites(result)
    if not ns.statistics:  # --statistics lists them itself
        text = render(ns.format, findings, result.errors, root=config.root, version=__version__, unresolved=unresolved)
        if text:
            print(text)
        if ns.format == "json" and unresolved:  # stdout stays ruff's list
            print(f"recheck lint: note: {unresolved_summary(len(unresolved))}", file=sys.stderr)
    if ns.format == "text":
        print(lint_summary(findings, result.errors, fixed, FIXABLE, 0 if ns.statistics else len(unresolved)))
    return _status(findings, result.errors, ns.exit_zero)


def _status(findings: list, errors: list, exit_zero: bool) -> int:
    """2 when a file or folder could not be linted (over findings), 1 for findings, else 0."""
    if errors:
        return 2
    return 1 if findings and not exit_zero else 0


def _print_statistics(fmt: str, findings: list, result) -> None:
    """``--statistics``: a count per rule (ruff's table or rows), then what the run read and
    resolved (:mod:`recheck.lint.statistics`); with ``--format json`` one object holding both."""
    from recheck.catalogue import FIXABLE, all_rules
    from recheck.lint.statistics import run_statistics, run_statistics_text
    from recheck.output.json import dumps, statistics_list
    from recheck.output.text import lint_statistics

    names = {rule.code: rule.name for rule in all_rules()}
    if fmt == "json":
        print(dumps({"rules": statistics_list(findings, names, FIXABLE), **run_statistics(result)}))
        return
    if findings:
        print(lint_statistics(findings, names, FIXABLE))
    print(run_statistics_text(result))


def _user_cache_dir(ns: argparse.Namespace) -> Path | None:
    """The cache folder the user chose (``--cache-dir``, else ``RECHECK_CACHE_DIR``), or None."""
    import os

    chosen = ns.cache_dir or os.environ.get("RECHECK_CACHE_DIR")
    return Path(chosen).absolute() if chosen else None


def _shown(path: Path) -> str:
    """``path`` relative to the current folder when it is below it (a path that cannot be
    resolved, such as a symbolic link loop, is shown as given)."""
    from recheck.lint.files import resolve

    where = resolve(path)
    try:
        return str(where.relative_to(Path.cwd().resolve())) if isinstance(where, Path) else str(path)
    except ValueError:
        return str(path)
