"""The lint run: discover, pre-filter, phase one (pool + cache), regions, findings.

Only files whose text can hold a checkpoint call or a ``GradientCheckpointingLayer``
are parsed at first; files that define what those regions call are parsed on demand,
round by round, until every reference the tree can answer is answered: each round walks
the regions' calls for what they miss, and the rules run once the walks miss nothing the
tree could answer (a rule's own lookups can still send the run round again).  Inside a parsed
file, phase one analyses the bodies of the top-level definitions that can matter and
outlines the rest (:mod:`recheck.lint.outline`); phase two reading an outlined body has it
analysed here, from the file's text, on the spot (:meth:`_Run.analyse_outlined`).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import multiprocessing
import multiprocessing.pool
import os
import re
import signal
import symtable
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

from recheck.collector import collector_paused
from recheck.findings import LINT, Finding
from recheck.lint.cache import FactsCache
from recheck.lint.extract import FileExtraction, extract, parse
from recheck.lint.facts import Deferred, FileFacts
from recheck.lint.files import FileError, discover, read_source, resolve
from recheck.lint.imports import module_name
from recheck.lint.index import Index
from recheck.lint.regions import Hit, SiteReport, discovered_entries, find_regions, region_hits, walk_regions
from recheck.lint.rules import RULES
from recheck.lint.wrappers import installed_class, unchanged
from recheck.lint.settings import LintOptions
from recheck.lint.suppress import file_ignored, line_suppressions, suppressed
from recheck.lint.targets import CHECKPOINTING_BASES, ENTRY_ATTRIBUTES, ENTRY_POINTS

__all__ = ["LintResult", "lint_paths", "lint_sources"]

#: A call of checkpoint, checkpoint_seq/_sequential/_wrapper or _gradient_checkpointing_func,
#: or an import of one under another name (``import checkpoint as ckpt``).
#: It starts with a literal so that the regex engine scans for it quickly.
PREFILTER = r"heckpoint(?:_seq|_sequential|_wrapper|ing_func)?(?:\s*\(|\s+as\s)"
#: Text that makes a file worth reading without a checkpoint call in it: a rule's class or
#: function hook judges code no region contains (a hand-written checkpoint, a temporary hook).
RULE_TEXT = [rule.FILE_TEXT for rule in RULES if rule.FILE_TEXT]
#: A line that may carry a suppression comment (a noqa or a recheck-ignore comment).
MARKER = re.compile(r"noqa|recheck:", re.I)
SUBCLASS = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*\(([^)]*)\)", re.M)
MAX_ROUNDS = 12
#: files parsed, at most, to find the classes that assign one attribute (see ``Index.holders``)
MAX_HOLDER_FILES = 8
POOL_THRESHOLD = 16  # fewer files than this are parsed in-process
#: Files kept parsed in this process for analysing their outlined units (most recent first).
KEPT_PARSED = 8


@dataclass
class LintResult:
    """Findings (sorted), files that could not be linted, and counters for the summary."""

    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict, repr=False)  # display path -> text
    warnings: list[str] = field(default_factory=list)  # e.g. a cache file that was ignored
    sites: list[SiteReport] = field(default_factory=list)  # every checkpoint call site and its regions
    #: what was assumed of a checkpointing base class whose source was found nowhere (``--statistics``)
    assumed: list[str] = field(default_factory=list)


@dataclass
class _StoredResult:
    """What the cache keeps of a run, to reuse when not one file of the tree changed."""

    hits: list[Hit]
    errors: list[FileError]
    stats: dict[str, int]
    sites: list[SiteReport]
    assumed: list[str]
    #: stamps of the installed files read for checkpointing base classes: changed, the result is stale
    read: dict[str, list[str]]


@dataclass
class _Source:
    path: Path
    display: str
    text: str
    data: bytes
    module: str
    is_package: bool
    #: the path per-file-ignores match: relative to the project root, symbolic links followed
    relative: str = ""
    _bases: dict[str, set[str]] | None = None

    def base_names(self) -> set[str]:
        """Last components of every class base written in the file (a text scan, cached)."""
        return set(self.subclasses())

    def subclasses(self) -> dict[str, set[str]]:
        """Base (last component) -> names of the classes the file writes with that base."""
        if self._bases is None:
            self._bases = {}
            if "class" in self.text:
                for match in SUBCLASS.finditer(self.text):
                    for base in match.group(2).split(","):
                        self._bases.setdefault(base.strip().rsplit(".", 1)[-1], set()).add(match.group(1))
        return self._bases


_CLASS_LINE = re.compile(r"^class[ \t]+(\w+)", re.M)


def _assigning_classes(attribute: str, sources: Iterable[_Source]) -> set[tuple[str, str]]:
    """``(file, top-level class)`` for every assignment to ``self.<attribute>`` in a class body
    (a text scan: the classes are parsed to see what they assign)."""
    text = f"self.{attribute}"
    assigned = re.compile(rf"\bself\.{re.escape(attribute)}[ \t]*(?::[^=\n]*)?=[^=]")
    found: set[tuple[str, str]] = set()
    for source in sources:
        if text not in source.text:
            continue
        classes = [(m.start(), m.group(1)) for m in _CLASS_LINE.finditer(source.text)]
        for match in assigned.finditer(source.text):
            at = bisect.bisect(classes, (match.start(), "")) - 1
            if at >= 0:
                found.add((source.display, classes[at][1]))
    return found


def _display(path: Path) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative


def _unparsable(display: str, exc: BaseException) -> FileError:
    if isinstance(exc, SyntaxError):
        where = f" (line {exc.lineno}, column {exc.offset})" if exc.lineno else ""
        return FileError(display, f"does not parse: {exc.msg}{where}")
    if isinstance(exc, (RecursionError, MemoryError)):  # what the parser raises on deep nesting
        return FileError(display, f"too deeply nested to parse ({type(exc).__name__})")
    detail = f": {exc}" if str(exc) else ""
    return FileError(display, f"cannot be analysed: {type(exc).__name__}{detail}")


R = TypeVar("R", bound=Deferred)


def _take(table: dict[str, R], made: R) -> None:
    """Fill the deferred record of ``made``'s definition in ``table`` (or add ``made``: a
    definition an outline does not list, such as a function nested in an outlined one)."""
    record = table.get(made.qualname)
    if record is None:
        table[made.qualname] = made
    elif record.deferred:
        record.fill(made)


#: What a file's analysis may raise that makes it a file error rather than a crash.
UNANALYSABLE = (SyntaxError, RecursionError, ValueError, MemoryError)


def _phase_one(job: tuple[str, str, str, bool, dict[str, tuple[int, str]], tuple[str, ...]]) -> tuple[str, FileFacts | FileError]:
    display, text, module, is_package, extra, demand = job
    try:
        return display, extract(text, display, module, is_package, extra, demand=demand)
    except UNANALYSABLE as exc:
        return display, _unparsable(display, exc)


def _syntax_check(job: tuple[str, str]) -> tuple[str, FileError | None]:
    """Does a file that holds no region and nothing a region reaches parse?  The compiler's
    symbol table pass parses it without building Python AST objects (about a quarter
    cheaper than ``ast.parse``); only a file it rejects is parsed with ``ast`` to decide."""
    display, text = job
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            symtable.symtable(text, display, "exec")
    except (SyntaxError, RecursionError, ValueError, MemoryError):
        try:  # the same verdict as phase one's: a symbol-table error alone (nonlocal at module level) parses
            parse(text, display)
        except (SyntaxError, RecursionError, ValueError, MemoryError) as exc:
            return display, _unparsable(display, exc)
    return display, None




def _ignore_interrupts() -> None:
    """In a pool worker: Ctrl-C (SIGINT, sent to the whole foreground process group) is the
    parent's to handle; it stops the pool and says so once, where every worker would
    otherwise print its own KeyboardInterrupt traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _Workers:
    """The run's worker processes: one fork pool, made when a phase first has enough files
    for it and kept until the run ends, so that later rounds do not fork again and files
    no region reaches can be parse-checked while this process works alone.

    Note:
        Phase two (regions and their rules) runs in this process between rounds of phase
        one; meanwhile one worker parse-checks a slice of the files no region is known to
        reach (:meth:`lend`), a slice at a time, so that a worker is never held for long
        when the next round's files arrive.  Whatever is left is checked at the end, on
        every worker (``_Run.check_syntax``).
    """

    #: bytes of source a lent slice holds (a fraction of a second's parse-check)
    SLICE = 1 << 21

    def __init__(self, count: int) -> None:
        self.count = count
        self._pool: multiprocessing.pool.Pool | None = None
        self._lent: list[multiprocessing.pool.AsyncResult] = []

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def pool(self) -> multiprocessing.pool.Pool:
        if self._pool is None:
            method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
            self._pool = multiprocessing.get_context(method).Pool(self.count, initializer=_ignore_interrupts)
        return self._pool

    def map(self, work: Callable[[tuple], tuple], jobs: list[tuple]) -> Iterator[tuple]:
        """``work`` over ``jobs``, each result as it is done (the caller consumes them all), on
        the workers when there are enough jobs, the garbage collector paused meanwhile."""
        with collector_paused():  # as in lint_paths
            if self.count <= 1 or len(jobs) < POOL_THRESHOLD:
                yield from map(work, jobs)
            else:
                yield from self.pool().imap_unordered(work, jobs, chunksize=8)

    def lend(self, jobs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Hand one worker a slice of ``jobs`` to parse-check, unless one is still at it; the
        jobs not handed out are returned.  Only a run with a pool already made lends."""
        if self._pool is None or self.count <= 1 or not jobs or any(not r.ready() for r in self._lent):
            return jobs
        size, cut = 0, 0
        while cut < len(jobs) and size < self.SLICE:
            size += len(jobs[cut][1])
            cut += 1
        self._lent.append(self._pool.apply_async(_syntax_checks, (jobs[:cut],)))
        return jobs[cut:]

    def returned(self) -> Iterator[tuple[str, FileError | None]]:
        """The verdicts of every slice lent, waiting for those still running."""
        for result in self._lent:
            yield from result.get()
        self._lent = []


def _syntax_checks(jobs: list[tuple[str, str]]) -> list[tuple[str, FileError | None]]:
    return [_syntax_check(job) for job in jobs]


#: ``progress(parsed, to_parse)``: files parsed so far of those known to need parsing (the
#: second number grows when a round finds more files that regions reach).
ProgressCallback = Callable[[int, int], None]


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Run:
    def __init__(self, options: LintOptions, progress: ProgressCallback | None = None) -> None:
        self.options = options
        self.progress = progress
        #: entry points beyond the known ones: configured, then found in the tree (wrappers),
        #: each with the position of its region argument
        self.extra: dict[str, tuple[int, str]] = dict.fromkeys(options.checkpoint_functions, (0, ""))
        self.patterns = [re.compile(PREFILTER), *map(re.compile, RULE_TEXT)] + [
            re.compile(re.escape(n.rsplit(".", 1)[-1]) + r"\s*\(") for n in self.extra]
        self.cache = FactsCache(options.cache_dir, ",".join(sorted(self.extra)), options.cache_root)
        self.salt = ""  # the discovered entry points the facts were extracted with
        cpus = available_cpus()
        self.workers = _Workers(min(options.jobs, cpus) if options.jobs > 0 else cpus)
        #: files to parse-check that no worker has been lent yet (see :meth:`lend_syntax_check`)
        self.unchecked: list[tuple[str, str]] | None = None
        self.checked_keys: dict[str, str] = {}
        #: notes for stderr besides the cache's (see LintResult.warnings)
        self.notes: list[str] = []
        if options.jobs > cpus:
            self.notes.append(f"recheck lint: note: -j {options.jobs} is more than the {cpus} CPUs available; "
                              f"using {cpus} worker processes")
        self.sources: dict[str, _Source] = {}
        self.facts: dict[str, FileFacts] = {}
        #: files (and folders) that could not be linted, one error each: a file parsed again
        #: (found to call a wrapper, or its outlined body analysed later) is reported once
        self.errors: dict[str, FileError] = {}
        self.parsed = 0
        #: attribute name -> (file, top-level class) that assign ``self.<attribute>`` (see ``Index.holders``)
        self.assigners: dict[str, set[tuple[str, str]]] = {}
        #: files parsed again here to analyse outlined units, by (path, salt)
        self.kept: OrderedDict[tuple[str, str], FileExtraction] = OrderedDict()
        #: every file's facts this run has deferred bodies of (see :meth:`close`)
        self.adopted: list[FileFacts] = []
        self.analysed_here = 0  # outlined units analysed in this process
        #: files of installed packages read for classes outside the tree (never linted: their
        #: facts are looked up by name, their hazards reported nowhere), by path
        self.installed: dict[str, _Source] = {}
        self.installed_facts: dict[str, FileFacts] = {}
        #: class outside the tree -> its qualified name where installed ("": found nowhere)
        self.installed_names: dict[str, str] = {}
        #: stamps of the installed files read for them (see ``_StoredResult.read``)
        self.read: dict[str, list[str]] = {}

    def parse(self, sources: list[_Source], demand: dict[str, set[str]] | None = None) -> None:
        """Phase one for ``sources``; ``demand``: for some, names of top-level definitions a
        region reaches (analysed there and then rather than outlined)."""
        jobs = []
        keys: dict[str, str] = {}  # each file's bytes hashed once, for the lookup and the store
        for source in sources:
            key = keys[source.display] = self.cache.key(source.data, source.module, self.salt)
            cached = self.cache.get(key)
            wanted = sorted((demand or {}).get(source.display, ()))
            if cached is not None:
                cached.path = source.display
                (self.facts if source.display in self.sources else self.installed_facts)[source.display] = self.adopt(cached)
            else:
                jobs.append((source.display, source.text, source.module, source.is_package, dict(self.extra),
                             tuple(wanted)))
        done, self.parsed = self.parsed, self.parsed + len(jobs)
        if self.progress is not None and jobs:
            self.progress(done, self.parsed)
        for display, result in self.workers.map(_phase_one, jobs):
            if self.progress is not None:
                done += 1
                self.progress(done, self.parsed)
            source = self.source(display)
            table = self.facts if display in self.sources else self.installed_facts
            if isinstance(result, FileError):
                if table is self.facts:  # an installed file that does not parse is no file of the user's
                    self.report(result)
                table[display] = FileFacts(display, source.module)
            else:
                self.cache.put(keys[display], result)
                table[display] = self.adopt(result)

    def source(self, display: str) -> _Source:
        """A linted file, or an installed one read for a class outside the tree."""
        return self.sources.get(display) or self.installed[display]

    def report(self, error: FileError) -> None:
        """Record that a file could not be linted (the first reason given for it is kept)."""
        self.errors.setdefault(error.path, error)

    def adopt(self, facts: FileFacts) -> FileFacts:
        """Defer the outlined units' classes and functions: the first read of a body has the
        unit analysed (:meth:`analyse_outlined`)."""
        self.adopted.append(facts)
        for name, qualnames in facts.outlined.items():
            load = functools.partial(self.analyse_outlined, facts, name)
            for qualname in qualnames:
                for table in (facts.classes, facts.functions):
                    record = table.get(qualname)
                    if record is not None and not record.deferred:
                        record.defer(load)
        return facts

    def close(self) -> None:
        """The run is over and no body is read after it: drop the deferred records' loaders,
        which hold the run (a cycle that would keep every fact alive until the cyclic
        collector, paused meanwhile, walks them all), so that the facts go with the run."""
        for facts in self.adopted:
            for record in (*facts.classes.values(), *facts.functions.values()):
                record.__dict__.pop("_load", None)

    def analyse_outlined(self, facts: FileFacts, name: str) -> None:
        """Analyse outlined unit ``name`` of ``facts`` (and what it reaches in its file) from
        the file's text, and fill its deferred classes and functions in place."""
        source = self.source(facts.path)
        key = (facts.path, self.salt)
        extraction = self.kept.pop(key, None)
        try:
            if extraction is None:
                extraction = FileExtraction(source.text, facts.path, source.module, source.is_package, self.extra)
            analysed_there = set(extraction.facts.outlined) - set(facts.outlined)
            done = extraction.analyse_needed([name], regions=False, skip=analysed_there)
        except UNANALYSABLE as exc:  # as phase one would have: a file error, and the rest still runs
            self.give_up(facts, exc)
            return
        self.kept[key] = extraction
        while len(self.kept) > KEPT_PARSED:
            self.kept.popitem(last=False)
        for unit in [name, *(n for n in done if n != name)]:
            if unit not in facts.outlined:
                continue
            for kind, qualname in extraction.created(unit):
                if kind == "class":
                    _take(facts.classes, extraction.facts.classes[qualname])
                else:
                    _take(facts.functions, extraction.facts.functions[qualname])
            for qualname in facts.outlined.pop(unit):
                for table in (facts.classes, facts.functions):
                    record = table.get(qualname)
                    if record is not None and record.deferred:
                        raise RuntimeError(f"{facts.path}: analysing `{unit}` did not fill `{qualname}`")
            self.analysed_here += 1

    def give_up(self, facts: FileFacts, exc: BaseException) -> None:
        """A file whose outlined body cannot be analysed: its error, and every outlined body
        of it filled as empty (what phase two sees of a file phase one could not read)."""
        self.report(_unparsable(facts.path, exc))
        for qualnames in facts.outlined.values():
            for qualname in qualnames:
                for table in (facts.classes, facts.functions):
                    record: Deferred | None = table.get(qualname)
                    if record is not None and record.deferred:
                        record.fill(type(record)(qualname, record.span))  # type: ignore[call-arg]
        facts.outlined.clear()

    def discover(self, index: Index) -> list[_Source]:
        """Add the entry points the tree defines (wrappers, attributes holding one); return
        the files that mention a new one by name, to extract again with it known."""
        new = {name: position for name, position in discovered_entries(index).items()
               if name not in ENTRY_POINTS and self.extra.get(name) != position}
        if not new:
            return []
        self.extra.update(new)
        self.salt = hashlib.sha256(repr(sorted(self.extra.items())).encode()).hexdigest()[:16]
        again: dict[str, _Source] = {}
        names = set()
        for name in new:
            facts, qualname = None, ""
            for candidate in index.files:  # the last file that defines it (a few names, no table of every function)
                if name.startswith(candidate.module + ".") and name[len(candidate.module) + 1:] in candidate.functions:
                    facts, qualname = candidate, name[len(candidate.module) + 1:]
            if facts is not None and qualname.rpartition(".")[0] in facts.functions:
                again[facts.path] = self.sources[facts.path]  # a nested function: called in its own file only
            elif name.rsplit(".", 1)[-1] not in ENTRY_ATTRIBUTES:
                names.add(name.rsplit(".", 1)[-1])
        if names:
            mention = re.compile(r"\b(?:" + "|".join(re.escape(n) for n in sorted(names)) + r")\s*\(")
            self.patterns.append(mention)
            again.update((s.display, s) for s in self.sources.values() if mention.search(s.text))
        return list(again.values())

    def lend_syntax_check(self) -> None:
        """While this process works alone, have a worker parse-check a slice of the files no
        round has read so far (those a later round reads are parsed there, and their
        verdicts here are dropped)."""
        if self.unchecked is None:
            self.unchecked = [(s.display, s.text) for s in self.sources.values()
                              if s.display not in self.facts and self.cache.get_checked(self.checked_key(s)) is None]
        self.unchecked = self.workers.lend(self.unchecked)

    def checked_key(self, source: _Source) -> str:
        """A file's key for its parse-check verdict (its bytes hashed once a run, when cached)."""
        key = self.checked_keys.get(source.display)
        if key is None:
            key = self.checked_keys[source.display] = self.cache.key(source.data, source.module) if self.cache.folder else ""
        return key

    def check_syntax(self, sources: list[_Source]) -> int:
        """Parse-check files phase one never read, so a broken file is never silently passed."""
        lent = dict(self.workers.returned())
        jobs = []
        verdicts: list[tuple[str, FileError | None]] = []
        for source in sources:
            if source.display in lent:
                verdicts.append((source.display, lent[source.display]))
                continue
            verdict = self.cache.get_checked(self.checked_key(source))
            if verdict is None:
                jobs.append((source.display, source.text))
            elif verdict:
                self.report(FileError(source.display, verdict))
        for display, error in itertools.chain(verdicts, self.workers.map(_syntax_check, jobs)):
            if error is not None:
                self.report(error)
            self.cache.put_checked(self.checked_key(self.sources[display]), error.reason if error else "")
        return len(jobs) + len(verdicts)

    def wanted(self, index: Index, by_module: dict[str, _Source],
               regions: list) -> tuple[list[_Source], dict[str, set[str]]]:
        """Unparsed files that define what the regions reference, or subclass region classes,
        and in each the names of the top-level definitions wanted (to analyse at once); none
        when there is no region and no lookup missed."""
        if not (regions or index.misses or index.installed_misses):
            return [], {}
        wanted: dict[str, _Source] = {}
        demand: dict[str, set[str]] = {}
        for miss in index.misses:
            parts = miss.split(".")
            for cut in range(len(parts) - 1, 0, -1):
                source = by_module.get(".".join(parts[:cut]))
                if source is not None and source.display not in self.facts:
                    wanted[source.display] = source
                    demand.setdefault(source.display, set()).add(parts[cut])
                    break
        for attribute in sorted(index.attribute_misses - self.assigners.keys()):
            # the classes that assign an attribute a region reads through an object of unknown
            # class: found in the text, their files parsed with those classes analysed at once
            holders = _assigning_classes(attribute, self.sources.values())
            self.assigners[attribute] = holders if len({p for p, _ in holders}) <= MAX_HOLDER_FILES else set()
            for display, name in self.assigners[attribute]:
                if display not in self.facts:
                    wanted[display] = self.sources[display]
                    demand.setdefault(display, set()).add(name)
        for qualified in sorted(index.installed_misses - self.installed_names.keys()):
            # a class outside the tree that a region's parameter is annotated with: the
            # installed package's file that defines it, read as text, parsed like the tree's
            found = installed_class(qualified, self.read)
            self.installed_names[qualified] = found[2] if found is not None else ""
            if found is None or found[0] in self.installed:
                continue
            origin, module, defined = found
            read = read_source(Path(origin), origin, self.options.max_file_size)
            if isinstance(read, FileError):
                self.installed_names[qualified] = ""
                continue
            self.installed[origin] = _Source(Path(origin), origin, read[0], read[1], module,
                                             os.path.basename(origin) == "__init__.py", origin)
            wanted[origin] = self.installed[origin]
            demand.setdefault(origin, set()).add(defined.rsplit(".", 1)[-1])
        region_classes = set(CHECKPOINTING_BASES)
        for file in index.files:
            for cls in file.classes.values():
                if any(b.rsplit(".", 1)[-1] in region_classes for b in index.base_names(file, cls)):
                    region_classes.add(cls.qualname.rsplit(".", 1)[-1])
        for source in self.sources.values():
            if source.display in self.facts:
                continue
            subclasses = source.subclasses()
            classes = {name for base in region_classes & subclasses.keys() for name in subclasses[base]}
            if classes:
                wanted[source.display] = source
                demand.setdefault(source.display, set()).update(classes)
        return list(wanted.values()), demand

    def source_text(self, display: str) -> str | None:
        """The text of a linted file, by its display path (None when it is not one)."""
        source = self.sources.get(display)
        return source.text if source is not None else None

    def is_candidate(self, text: str) -> bool:
        """The text pre-filter: can this file hold a checkpoint call or an implicit region?"""
        return any(base in text for base in CHECKPOINTING_BASES) or any(p.search(text) for p in self.patterns)


def _read(named: Iterable[Path], run: _Run) -> _Run:
    """Find and read the Python files under ``named`` into ``run``."""
    def unreadable(folder: Path, reason: str) -> None:
        run.report(FileError(_display(folder), reason, "folder"))

    packages: dict[Path, str] = {}  # folder -> its dotted package ("" outside packages)
    seen: set[str] = set()
    root = resolve(run.options.root)
    for path in list(discover([Path(p) for p in named], run.options.root, run.options.exclude, unreadable)):
        display = _display(path)
        if display in seen:  # named twice, or named and found in a folder named too
            continue
        seen.add(display)
        result = read_source(path, display, run.options.max_file_size)
        if isinstance(result, FileError):
            run.report(result)
            continue
        text, data = result
        where = resolve(path)  # once, here: a path that cannot be resolved is this file's error
        if isinstance(where, str):
            run.report(FileError(display, where))
            continue
        relative = os.path.relpath(where, root) if isinstance(root, Path) else str(where)
        folder = path.parent
        if folder not in packages:
            package, _ = module_name(folder / "__init__.py") if (folder / "__init__.py").is_file() else ("", False)
            packages[folder] = package
        is_package = path.name == "__init__.py"
        module = packages[folder] if is_package else ".".join(p for p in (packages[folder], path.stem) if p)
        run.sources[display] = _Source(path, display, text, data, module or path.stem, is_package, relative)
    return run


def lint_paths(paths: Iterable[Path], options: LintOptions | None = None,
               progress: ProgressCallback | None = None) -> LintResult:
    """Lint every Python file under ``paths``; ``progress`` hears of each file parsed."""
    # syntax trees and facts hold no cycles (the run drops the one its loaders make when it
    # ends), and every collection of the oldest generation would walk every fact built (a third
    # of a cold run's time on transformers): the run is freed as _lint returns, before the
    # collector runs again, which then walks none of it
    with collector_paused():
        return _lint(_read(paths, _Run(options or LintOptions(), progress)))


def lint_sources(sources: dict[str, str], options: LintOptions | None = None) -> LintResult:
    """Lint in-memory sources keyed by a display path (module name = file stem)."""
    run = _Run(options or LintOptions(cache_dir=None, jobs=1))
    for display, text in sources.items():
        stem = Path(display).stem
        run.sources[display] = _Source(Path(display), display, text, text.encode(), stem, False, display)
    with collector_paused():  # as in lint_paths
        return _lint(run)


def _lint(run: _Run) -> LintResult:
    tree_key = hashlib.sha256("\0".join(
        f"{d}\0{run.cache.key(s.data, s.module)}" for d, s in sorted(run.sources.items())).encode()).hexdigest()
    stored = run.cache.get_result(tree_key, _StoredResult)
    if stored is not None and not unchanged(stored.read):  # an installed wrapper was upgraded
        stored = None
    if stored is not None:  # not one file changed since the last run: reuse its regions
        hits, sites, assumed = stored.hits, stored.sites, stored.assumed
        for error in stored.errors:
            run.report(error)
        stats = {**stored.stats, "parsed": 0, "cached": stored.stats.get("indexed", 0)}
    else:
        with run.workers:
            hits, sites, stats, assumed, read = _analyse(run)
        run.cache.put_result(tree_key, _StoredResult(hits, [e for e in run.errors.values() if e.path in run.sources],
                                                     stats, sites, assumed, read))
    used = {site.entry for site in sites}
    unmatched = [name for name in run.options.checkpoint_functions if name not in used]
    if unmatched:  # a misspelt name is otherwise silently ignored
        run.notes.append(f"recheck lint: warning: checkpoint-functions: {', '.join(map(repr, unmatched))} "
                         "matched no call in the files linted (misspelt, or not called here?)")
    result = LintResult(errors=sorted(run.errors.values(), key=lambda e: e.path), warnings=[*run.notes, *run.cache.warnings],
                        sites=sorted(sites, key=lambda r: (r.path, r.line, r.column)), assumed=assumed)
    result.findings = sorted(_findings(hits, run), key=lambda f: (f.path, f.line, f.column, f.code))
    result.sources = {d: s.text for d, s in run.sources.items()}
    unread = sum(error.kind == "file" and error.path not in run.sources for error in run.errors.values())  # parse failures are sources
    result.stats = {"files": len(run.sources) + unread, **stats}
    run.close()
    return result


def _analyse(run: _Run) -> tuple[list[Hit], list[SiteReport], dict[str, int], list[str], dict[str, list[str]]]:
    """Phase one for the candidates and what their regions reach, then phase two."""
    by_module: dict[str, _Source] = {}
    for source in run.sources.values():
        by_module.setdefault(source.module, source)
    pending = [s for s in run.sources.values() if run.is_candidate(s.text)]
    candidates = len(pending)
    hits: list[Hit] = []
    regions: list = []
    reports: list[SiteReport] = []
    walked: set[tuple[str, str]] = set()
    assumed: list[str] = []
    read: dict[str, list[str]] = {}
    index = Index(())
    analysed = False
    demand: dict[str, set[str]] = {}
    for _ in range(MAX_ROUNDS):
        run.parse(pending, demand)
        run.lend_syntax_check()
        index = Index(run.facts.values(), run.assigners, run.installed_facts.values(), run.installed_names)
        analysed = False
        pending = run.discover(index)
        if pending:  # wrappers found: their callers are call sites, extract them again first
            continue
        reports, walked, assumed, read = [], set(), [], {}
        regions = find_regions(index, reports, run.source_text, assumed, read)
        run.lend_syntax_check()
        walk_regions(index, regions)
        pending, demand = run.wanted(index, by_module, regions)
        if pending:  # the rules wait for the last round
            continue
        hits = region_hits(index, regions, walked)
        run.lend_syntax_check()
        analysed = True
        pending, demand = run.wanted(index, by_module, regions)
        if not pending:
            break
    if not analysed:  # the rounds ran out after parsing more: analyse what was parsed
        reports, walked, assumed, read = [], set(), [], {}
        regions = find_regions(index, reports, run.source_text, assumed, read)
        hits = region_hits(index, regions, walked)
    hits = [hit for hit in hits if hit.path not in run.installed]  # the installed library's own code: not linted
    read.update(run.read)
    checked = run.check_syntax([s for s in run.sources.values() if s.display not in run.facts])
    run.cache.flush()
    sites = [r for r in reports if r.kind == "site"]
    return hits, reports, {
        "candidates": candidates, "indexed": len(run.facts), "parsed": run.parsed,
        "cached": run.cache.hits, "regions": len(regions), "syntax_checked": checked,
        "syntax_only": len(run.sources) - len(run.facts), "call_sites": len(sites),
        "resolved_sites": sum(1 for r in sites if r.regions), "wrapper_sites": len(reports) - len(sites),
        "functions_walked": len(walked), "outlined_analysed_later": run.analysed_here,
    }, assumed, read


def _findings(hits: list[Hit], run: _Run) -> Iterable[Finding]:
    tables: dict[str, dict[int, set[str]]] = {}
    ignored_files: dict[str, bool] = {}
    lines: dict[str, list[str]] = {}
    for hit in hits:
        code, span = hit.hazard.code, hit.hazard.span
        source = run.sources.get(hit.path)
        if not run.options.enabled(code, source.relative if source else hit.path):
            continue
        if source is not None:
            if hit.path not in ignored_files:
                ignored_files[hit.path] = file_ignored(source.text)
                lines[hit.path] = source.text.splitlines()
            if ignored_files[hit.path]:
                continue
            text = lines[hit.path]
            marked = any(0 < n <= len(text) and MARKER.search(text[n - 1]) for n in (span.line, span.end_line))
            if marked:  # tokenize the file (once) only where a comment may suppress the finding
                if hit.path not in tables:
                    tables[hit.path] = line_suppressions(source.text)
                if suppressed(code, (span.line, span.end_line), tables[hit.path]):
                    continue
        where = f" inside checkpointed region `{hit.region}` ({hit.origin})" if hit.origin else ""
        yield Finding(
            kind=LINT, code=code, message=f"{hit.hazard.what}{where}; {hit.hazard.then}",
            path=hit.path, line=span.line, column=span.column, end_line=span.end_line,
            end_column=span.end_column, region=hit.region,
        )
