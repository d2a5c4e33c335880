"""``recheck lint`` on 15 real trees it was never tuned on, against ruff in the same run.

Downloads each package with ``pip download --no-deps`` (the wheel, or the sdist where the
index has no wheel: colossalai, deepspeed, fairscale) into ``--workdir``, unpacks it and
lints its package folders.  torchtitan is on the package index too (``torchtitan``, a
wheel).  Per tree it prints the files linted, the checkpoint call sites the linter found,
how many resolved to at least one region, the findings per rule, and the cold and warm
wall times of ``recheck lint`` beside a cold ``ruff check`` of the same folders (ruff's
default rules, ``--no-cache``), run one after the other so that they see the same load.

    python benchmarks/lint_real.py [--workdir DIR] [--jobs N] [--tree NAME ...] [--json OUT]

The JSON of every run's findings is written to ``<workdir>/<tree>/recheck-findings.json``
and its statistics to ``recheck-statistics.json`` (with each unresolved call site and its
reason), for triage.  This is a measurement, not a test: nothing here asserts a figure.

The lint runs under this interpreter and reads classes outside a tree (colossalai's
transformers models) from its import path: run it with one where those packages are
installed (transformers, for colossalai), else their sites stay unresolved.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

#: tree -> (requirement, package folders to lint inside the unpacked distribution)
TREES = {
    "accelerate": ("accelerate==1.15.0", ["accelerate"]),
    "colossalai": ("colossalai==0.5.0", ["colossalai"]),
    "deepspeed": ("deepspeed==0.19.8", ["deepspeed"]),
    "diffusers": ("diffusers==0.42.1", ["diffusers"]),
    "fairscale": ("fairscale==0.4.13", ["fairscale"]),
    "lightning": ("lightning==2.6.6", ["lightning"]),
    "megatron-core": ("megatron-core==0.16.1", ["megatron"]),
    "mmengine": ("mmengine==0.10.7", ["mmengine"]),
    "open_clip": ("open_clip_torch==3.3.0", ["open_clip", "open_clip_train"]),
    "peft": ("peft==0.21.2", ["peft"]),
    "sentence-transformers": ("sentence-transformers==6.2.0", ["sentence_transformers"]),
    "torchtune": ("torchtune==0.6.1", ["torchtune", "recipes"]),
    "xformers": ("xformers==0.0.35", ["xformers"]),
    "torchtitan": ("torchtitan==0.3.0", ["torchtitan", "torchtitan_recipes"]),
    "timm": ("timm==1.0.31", ["timm"]),  # ResNet/Xception stages added by computed names
}
ROOT = Path(__file__).resolve().parents[1]


def fetch(requirement: str, into: Path) -> Path:
    """Download and unpack one distribution; return the folder that holds its packages."""
    into.mkdir(parents=True, exist_ok=True)
    archives = [p for p in into.iterdir() if p.suffix == ".whl" or p.name.endswith(".tar.gz")]
    if not archives:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), requirement],
                       check=True)
        archives = [p for p in into.iterdir() if p.suffix == ".whl" or p.name.endswith(".tar.gz")]
    source = into / "src"
    if not source.is_dir():
        archive = archives[0]
        if archive.suffix == ".whl":
            with zipfile.ZipFile(archive) as wheel:
                wheel.extractall(source)
        else:
            with tarfile.open(archive) as sdist:
                sdist.extractall(into / "sdist", filter="data")
            (top,) = (into / "sdist").iterdir()
            top.rename(source)
    return source


def timed(command: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start, proc


def lint_tree(name: str, source: Path, packages: list[str], jobs: int) -> dict:
    folders = [p for p in packages if (source / p).is_dir()]
    cache = source / ".recheck_cache"
    shutil.rmtree(cache, ignore_errors=True)
    base = [sys.executable, "-m", "recheck", "lint", "--exit-zero", "--jobs", str(jobs)]
    cold, proc = timed([*base, "--format", "json", *folders], source)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: recheck lint failed:\n{proc.stderr[-3000:]}")
    findings = json.loads(proc.stdout)
    warm, again = timed([*base, "--format", "json", *folders], source)
    if json.loads(again.stdout) != findings:
        print(f"{name}: warning: the warm run's findings differ from the cold run's", file=sys.stderr)
    _, stats_proc = timed([*base, "--statistics", "--format", "json", *folders], source)
    try:
        stats = json.loads(stats_proc.stdout)
    except json.JSONDecodeError:
        stats = {}
    ruff_time = None
    if shutil.which("ruff"):
        ruff_time, _ = timed(["ruff", "check", "--no-cache", "--isolated", "--exit-zero", "--quiet", *folders], source)
    (source.parent / "recheck-findings.json").write_text(proc.stdout)
    (source.parent / "recheck-statistics.json").write_text(json.dumps(stats, indent=2))
    files = sum(1 for folder in folders for _ in (source / folder).rglob("*.py"))
    return {
        "tree": name, "files": files, "call_sites": stats.get("call_sites"), "resolved": stats.get("resolved_sites"),
        "functions": stats.get("functions_walked"), "findings": len(findings),
        "per_rule": dict(sorted(Counter(f["code"] for f in findings).items())),
        "file_errors": proc.stderr.count(": error: "), "cold": cold, "warm": warm, "ruff": ruff_time,
    }


def _figure(value) -> str:
    return "-" if value is None else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, help="keep downloads here (default: a temporary folder)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tree", action="append", choices=sorted(TREES), help="only these trees")
    parser.add_argument("--json", type=Path, help="also write the table as JSON here")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="recheck-lint-real-"))
    print(f"trees in {workdir}; interpreter {sys.executable}; {args.jobs} job(s); {os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.1f}")
    if not shutil.which("ruff"):
        print("ruff is not on PATH (pip install ruff): its column stays empty")
    header = f"{'tree':22} {'files':>5} {'sites':>5} {'resolved':>8} {'finds':>5} {'cold s':>6} {'warm s':>6} {'ruff s':>6} {'x ruff':>6}  per rule"
    print(header)
    rows = []
    for name in args.tree or TREES:
        requirement, packages = TREES[name]
        source = fetch(requirement, workdir / name)
        row = lint_tree(name, source, packages, args.jobs)
        rows.append(row)
        ratio = f"{row['cold'] / row['ruff']:.1f}" if row["ruff"] else "-"
        print(f"{name:22} {row['files']:>5} {_figure(row['call_sites']):>5} {_figure(row['resolved']):>8} "
              f"{row['findings']:>5} {row['cold']:>6.2f} {row['warm']:>6.2f} {_figure(row['ruff'] and round(row['ruff'], 2)):>6} "
              f"{ratio:>6}  {row['per_rule']}", flush=True)
    sites = sum(r["call_sites"] or 0 for r in rows)
    resolved = sum(r["resolved"] or 0 for r in rows)
    cold, warm = sum(r["cold"] for r in rows), sum(r["warm"] for r in rows)
    ruff = sum(r["ruff"] or 0 for r in rows)
    rules = Counter()
    for row in rows:
        rules.update(row["per_rule"])
    print(f"{'total':22} {sum(r['files'] for r in rows):>5} {sites:>5} {resolved:>8} {sum(r['findings'] for r in rows):>5} "
          f"{cold:>6.2f} {warm:>6.2f} {ruff:>6.2f} {(cold / ruff if ruff else 0):>6.1f}  {dict(sorted(rules.items()))}")
    if sites:
        print(f"resolved {resolved}/{sites} call sites ({100 * resolved / sites:.0f}%); trees with a region: "
              f"{sum(1 for r in rows if r['resolved'])}/{len(rows)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
