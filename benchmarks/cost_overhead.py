"""How much a ``recheck.measure`` costs: the traced run against the plain step, and the total.

Run from the repository root: ``python benchmarks/cost_overhead.py [--repeats N]``.
Prints, per mode, the traced run's wall time, the median untraced step and their ratio,
and the wall time of the whole measurement.  Numbers only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recheck.cost import measure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("recheck_cost_demo", ROOT / "fixtures" / "models" / "cost_demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.step()  # warm up torch (first-call imports) outside the figures
    started = time.perf_counter()
    cmp = measure(demo.step, repeats=args.repeats)
    total = time.perf_counter() - started
    for name, mode in cmp.modes.items():
        ratio = mode.traced_seconds / mode.median_seconds
        print(f"{name:<13} traced run {mode.traced_seconds * 1e3:8.1f} ms   plain step {mode.median_seconds * 1e3:8.1f} ms   x{ratio:.1f}")
    print(f"whole measurement ({args.repeats} repeats per mode): {total:.1f} s")


if __name__ == "__main__":
    main()
