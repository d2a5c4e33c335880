"""Where ``recheck lint`` spends its time: CPU seconds per phase, in one process.

Runs one cold lint of a tree (no cache, one job, so that every phase runs here and can
be timed) with timers around each phase, and prints a table:

- read: walking the folders and reading every file;
- pre-filter: the text scan that picks the files that can hold a region;
- parse: ``ast.parse`` of the files phase one reads;
- facts: the rest of phase one (scopes, names, references, attributes), rules excluded;
- rules: the body rules of phase one (RC101-RC108, RC003), measured as the difference
  between phase one with and without them, over the same files, back to back;
- syntax check: the files phase one never reads, parse-checked;
- transfer: handing facts between processes (pickled and unpickled once, as a pool does);
- regions: the index, entry-point discovery, the region finder and what it reads next;
- region rules: walking every region and turning hazards into findings (phase two);
- findings: rule selection and suppression comments;
- output: rendering the findings as text and as JSON.

    python benchmarks/lint_profile.py TREE [--repeat N]

CPU time (``time.process_time``) is used, not wall time: the machines this runs on are
shared.  Nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recheck.lint import engine, extract  # noqa: E402
from recheck.lint.settings import LintOptions  # noqa: E402

PHASES = ("read", "pre-filter", "parse", "facts", "rules", "syntax check", "transfer", "regions",
          "region rules", "findings", "output")


class Clock:
    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.stack: list[str] = []

    @contextmanager
    def phase(self, name: str):
        """Time ``name``; time spent in a nested phase is not counted twice."""
        start = time.process_time()
        self.stack.append(name)
        try:
            yield
        finally:
            self.stack.pop()
            spent = time.process_time() - start
            self.spent[name] += spent
            if self.stack:
                self.spent[self.stack[-1]] -= spent

    def wrap(self, owner, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)


def _no_rules():
    """Phase one with the rules' body, class and function hooks turned off."""
    saved = (dict(extract._DISPATCH), list(extract._CLASS_RULES), list(extract._FUNCTION_RULES))
    extract._DISPATCH.clear()
    extract._CLASS_RULES.clear()
    extract._FUNCTION_RULES.clear()
    return saved


def _restore(saved) -> None:
    extract._DISPATCH.clear()
    extract._DISPATCH.update(saved[0])
    extract._CLASS_RULES[:] = saved[1]
    extract._FUNCTION_RULES[:] = saved[2]


def profile(tree: Path) -> dict[str, float]:
    clock = Clock()
    options = LintOptions(cache_dir=None, jobs=1)
    run_jobs: list[tuple] = []
    original_phase_one = engine._phase_one

    def phase_one(job):
        run_jobs.append(job)
        with clock.phase("facts"):
            display, facts = original_phase_one(job)
        with clock.phase("transfer"):
            facts = pickle.loads(pickle.dumps(facts, pickle.HIGHEST_PROTOCOL))
        return display, facts

    saved = {name: getattr(engine, name) for name in ("_phase_one", "_read", "Index", "find_regions", "region_hits",
                                                       "_syntax_check", "_findings")}
    saved_candidate, saved_discover, saved_wanted = engine._Run.is_candidate, engine._Run.discover, engine._Run.wanted
    saved_parse = extract.parse
    try:
        engine._phase_one = phase_one
        clock.wrap(engine, "_read", "read")
        clock.wrap(extract, "parse", "parse")
        clock.wrap(engine, "Index", "regions")
        clock.wrap(engine, "find_regions", "regions")
        clock.wrap(engine, "region_hits", "region rules")
        clock.wrap(engine, "_syntax_check", "syntax check")
        clock.wrap(engine._Run, "is_candidate", "pre-filter")
        clock.wrap(engine._Run, "discover", "regions")
        clock.wrap(engine._Run, "wanted", "regions")
        original_findings = engine._findings

        def findings(hits, run):
            with clock.phase("findings"):
                return list(original_findings(hits, run))

        engine._findings = findings
        gc.collect()
        result = engine.lint_paths([tree], options)
        from recheck.output import render

        with clock.phase("output"):
            render("text", result.findings, result.errors, root=Path.cwd(), version="profile")
            render("json", result.findings, result.errors, root=Path.cwd(), version="profile")
    finally:
        for name, value in saved.items():
            setattr(engine, name, value)
        engine._Run.is_candidate, engine._Run.discover, engine._Run.wanted = saved_candidate, saved_discover, saved_wanted
        extract.parse = saved_parse
    # rules: phase one over the same files again, with and without them, back to back
    with_rules = without = 0.0
    enabled = gc.isenabled()
    gc.disable()
    try:
        for job in run_jobs:
            start = time.process_time()
            engine._phase_one(job)
            with_rules += time.process_time() - start
            saved_rules = _no_rules()
            try:
                start = time.process_time()
                engine._phase_one(job)
                without += time.process_time() - start
            finally:
                _restore(saved_rules)
    finally:
        if enabled:
            gc.enable()
    rules = min(max(with_rules - without, 0.0), clock.spent["facts"])
    clock.spent["facts"] -= rules
    clock.spent["rules"] = rules
    clock.spent["_files"] = result.stats.get("files", 0)
    clock.spent["_parsed"] = len(run_jobs)
    clock.spent["_findings"] = len(result.findings)
    return clock.spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree", type=Path)
    parser.add_argument("--repeat", type=int, default=1, help="profile this many times; the table shows the minimum")
    args = parser.parse_args()
    os.chdir(args.tree.resolve().parent)
    runs = [profile(Path(args.tree.resolve().name)) for _ in range(args.repeat)]
    best = {phase: min(run.get(phase, 0.0) for run in runs) for phase in PHASES}
    total = sum(best.values())
    print(f"{args.tree}: {int(runs[0]['_files'])} files, {int(runs[0]['_parsed'])} read by phase one, "
          f"{int(runs[0]['_findings'])} findings; load average {os.getloadavg()[0]:.1f}")
    print(f"{'phase':14} {'CPU s':>7} {'share':>6}")
    for phase in PHASES:
        print(f"{phase:14} {best[phase]:>7.2f} {100 * best[phase] / total:>5.1f}%")
    print(f"{'total':14} {total:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
