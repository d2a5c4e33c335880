"""Time ``recheck lint`` on real code: transformers (latest, 5.24.0 and 4.46.3) and timm.

Downloads the wheels with ``pip download --no-deps`` into a temporary folder (or
``--workdir``), unpacks them, and runs ``recheck lint --format json`` on each package,
cold (empty cache) and warm (second run, same cache).  Prints wall and CPU seconds, the
size of each tree, and the findings per rule; writes each run's JSON next to the
sources for triage.  ``--compare`` also times TorchFix and Fixit when they are on PATH.

    python benchmarks/lint_speed.py [--workdir DIR] [--jobs N] [--compare]

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


def lint(tree: Path, jobs: int, label: str) -> dict:
    cache = tree.parent / ".recheck_cache"
    shutil.rmtree(cache, ignore_errors=True)
    command = [sys.executable, "-m", "recheck", "lint", "--format", "json", "--exit-zero", "--jobs", str(jobs), tree.name]
    cold_wall, cold_cpu, cold = timed(command, tree.parent)
    warm_wall, warm_cpu, warm = timed(command, tree.parent)
    if cold.returncode != 0:
        raise SystemExit(f"{label}: recheck lint failed:\n{cold.stderr}")
    findings = json.loads(cold.stdout)
    assert json.loads(warm.stdout) == findings, "warm run differs from cold run"
    (tree.parent / "recheck-findings.json").write_text(cold.stdout)
    files = list(tree.rglob("*.py"))
    return {
        "corpus": label, "files": len(files), "mb": sum(f.stat().st_size for f in files) / 1e6,
        "cold_wall": cold_wall, "cold_cpu": cold_cpu, "warm_wall": warm_wall, "warm_cpu": warm_cpu,
        "findings": len(findings), "per_rule": dict(sorted(Counter(f["code"] for f in findings).items())),
        "file_errors": cold.stderr.count(": error: "),
    }


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
    print(f"{'corpus':22} {'files':>6} {'MB':>6} {'cold s':>7} {'cold cpu':>8} {'warm s':>7} {'warm cpu':>8} {'findings':>8}  per rule")
    for label in args.corpus or CORPORA:
        requirement, package = CORPORA[label]
        tree = fetch(requirement, package, workdir / label)
        row = lint(tree, args.jobs, label)
        print(f"{label:22} {row['files']:>6} {row['mb']:>6.1f} {row['cold_wall']:>7.1f} {row['cold_cpu']:>8.1f} "
              f"{row['warm_wall']:>7.2f} {row['warm_cpu']:>8.2f} {row['findings']:>8}  {row['per_rule']}", flush=True)
        if args.compare:
            print(f"{'':22} compare: {compare(tree) or 'TorchFix/Fixit not installed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
