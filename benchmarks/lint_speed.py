"""Time ``recheck lint`` on real code (transformers latest, 5.24.0 and 4.46.3, and timm) beside ruff.

Downloads the wheels with ``pip download --no-deps`` into a temporary folder (or
``--workdir``), unpacks them, and per package runs, one after the other so that they see
the same load: ``ruff check`` (default rules, ``--no-cache``), ``recheck lint --no-cache``,
``recheck lint`` with an empty cache (cold, writing it) and again (warm: every file a
cache hit).  Prints wall and CPU seconds (user + system of the child process) of each,
the ratios to ruff, the size of each tree, the findings per rule and the load average;
writes the findings JSON next to the sources for triage.  ``--compare`` also times
TorchFix and Fixit when they are on PATH.

    python benchmarks/lint_speed.py [--workdir DIR] [--jobs N] [--corpus NAME] [--compare]

This is a measurement, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

CORPORA = {
    "transformers-latest": ("transformers", "transformers"),
    "transformers-5.24.0": ("transformers==5.24.0", "transformers"),  # issue 17's before/after corpus
    "transformers-4.46.3": ("transformers==4.46.3", "transformers"),
    "timm-latest": ("timm", "timm"),
}
ROOT = Path(__file__).resolve().parents[1]


def fetch(requirement: str, package: str, into: Path) -> Path:
    """Download and unpack one wheel; return the package folder."""
    into.mkdir(parents=True, exist_ok=True)
    wheels = list(into.glob("*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), requirement], check=True)
        wheels = list(into.glob("*.whl"))
    source = into / "src"
    if not (source / package).is_dir():
        with zipfile.ZipFile(wheels[0]) as archive:
            archive.extractall(source)
    return source / package


def timed(command: list[str], cwd: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds, CPU seconds (user+sys of the child processes) and the result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def ruff(tree: Path) -> tuple[float, float] | None:
    """Wall and CPU seconds of ``ruff check`` (its default rules, no cache) on the tree."""
    if not shutil.which("ruff"):
        return None
    wall, cpu, _ = timed(["ruff", "check", "--no-cache", "--isolated", "--exit-zero", "--quiet", tree.name], tree.parent)
    return wall, cpu


def lint(tree: Path, jobs: int, label: str) -> dict:
    cache = tree.parent / ".recheck_cache"
    shutil.rmtree(cache, ignore_errors=True)
    command = [sys.executable, "-m", "recheck", "lint", "--format", "json", "--exit-zero", "--jobs", str(jobs), tree.name]
    load = os.getloadavg()[0]
    ruff_times = ruff(tree)
    bare_wall, bare_cpu, bare = timed([*command, "--no-cache"], tree.parent)
    cold_wall, cold_cpu, cold = timed(command, tree.parent)
    warm_wall, warm_cpu, warm = timed(command, tree.parent)
    for proc in (bare, cold, warm):
        if proc.returncode != 0:
            raise SystemExit(f"{label}: recheck lint failed:\n{proc.stderr}")
    findings = json.loads(cold.stdout)
    if json.loads(warm.stdout) != findings or json.loads(bare.stdout) != findings:
        print(f"{label}: warning: the runs' findings differ (--no-cache, cold, warm)", file=sys.stderr)
    (tree.parent / "recheck-findings.json").write_text(cold.stdout)
    files = list(tree.rglob("*.py"))
    return {
        "corpus": label, "files": len(files), "mb": sum(f.stat().st_size for f in files) / 1e6,
        "ruff_wall": ruff_times[0] if ruff_times else None, "ruff_cpu": ruff_times[1] if ruff_times else None,
        "nocache_wall": bare_wall, "nocache_cpu": bare_cpu,
        "cold_wall": cold_wall, "cold_cpu": cold_cpu, "warm_wall": warm_wall, "warm_cpu": warm_cpu,
        "findings": len(findings), "per_rule": dict(sorted(Counter(f["code"] for f in findings).items())),
        "file_errors": cold.stderr.count(": error: "), "load": (load + os.getloadavg()[0]) / 2,
    }


def _ratio(value: float, ruff_value: float | None) -> str:
    return f"{value / ruff_value:.1f}x" if ruff_value else "-"


def compare(tree: Path) -> dict[str, float]:
    """Wall seconds of TorchFix and Fixit on the same tree, for those installed."""
    times = {}
    for tool, command in (("torchfix", ["torchfix", str(tree)]), ("fixit", ["fixit", "lint", str(tree)])):
        if shutil.which(command[0]):
            wall, _, _ = timed(command, tree.parent)
            times[tool] = wall
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, help="keep downloads here (default: a temporary folder)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--compare", action="store_true", help="also time TorchFix and Fixit if installed")
    parser.add_argument("--corpus", action="append", choices=sorted(CORPORA), help="only these corpora")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="recheck-lint-bench-"))
    print(f"corpora in {workdir}; {args.jobs} job(s); {os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.1f}")
    if not shutil.which("ruff"):
        print("ruff is not on PATH (pip install ruff): no ratios")
    print("seconds wall / CPU; ratios to ruff's cold run in the same row (wall, CPU)")
    print(f"{'corpus':20} {'files':>5} {'MB':>5} {'ruff':>11} {'--no-cache':>11} {'x ruff':>11} {'cold':>11} "
          f"{'warm':>11} {'x ruff':>11} {'load':>4} {'finds':>5}  per rule")
    for label in args.corpus or CORPORA:
        requirement, package = CORPORA[label]
        tree = fetch(requirement, package, workdir / label)
        row = lint(tree, args.jobs, label)
        rw, rc = row["ruff_wall"], row["ruff_cpu"]
        pair = lambda wall, cpu: f"{wall:.2f}/{cpu:.2f}"  # noqa: E731
        print(f"{label:20} {row['files']:>5} {row['mb']:>5.1f} {pair(rw, rc) if rw else '-':>11} "
              f"{pair(row['nocache_wall'], row['nocache_cpu']):>11} "
              f"{_ratio(row['nocache_wall'], rw) + '/' + _ratio(row['nocache_cpu'], rc):>11} "
              f"{pair(row['cold_wall'], row['cold_cpu']):>11} {pair(row['warm_wall'], row['warm_cpu']):>11} "
              f"{_ratio(row['warm_wall'], rw) + '/' + _ratio(row['warm_cpu'], rc):>11} {row['load']:>4.1f} "
              f"{row['findings']:>5}  {row['per_rule']}", flush=True)
        if args.compare:
            print(f"{'':22} compare: {compare(tree) or 'TorchFix/Fixit not installed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
