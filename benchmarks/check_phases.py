"""Where ``check()`` spends what it adds to its floor, phase by phase (the small stack).

``check_cost.py`` gives one ratio; this splits a check of ``check_cost.py``'s stack into the
phases of :class:`recheck.checker.run.Runner`, each timed in process CPU time (the median over
``--repeats`` interleaved rounds), beside the parts of the floor it corresponds to:

* the plain run's forward and backward against a plain step's;
* the checkpointed run's forward and backward (the recompute and the bitwise comparison of
  every saved tensor) against a ``checkpoint()`` step's;
* the bookkeeping between them: the Runner's snapshot, the settles, the checks made right
  after each forward, and the copies of saved leaves taken when the checkpointed forward
  returns (``SavedTensorLog.freeze``);
* the bytes the bitwise check compares and copies, with the time of the comparisons, and the
  minor page faults of each phase (fresh memory the kernel had to map).

The phases are timed by wrapping the Runner's methods (nothing else changes); the wrappers add
a few microseconds each.  It is a profile, not a target: to compare two versions of recheck,
run each checkout's own copy of this script (``check_cost.py`` puts its checkout first on
``sys.path``, so ``PYTHONPATH`` does not choose the version).  Nothing here is asserted.

    python benchmarks/check_phases.py [--size small|large] [--repeats 15]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from typing import Any, Callable

import torch

from check_cost import SIZES, build  # this folder's, as timing.py is
from timing import minor_faults

CPU = time.process_time


class Phases:
    """Times and page faults of wrapped callables, by label, in call order."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self.faults: dict[str, list[int]] = collections.defaultdict(list)

    def wrap(self, owner: Any, name: str, label: Callable[[tuple], str] | str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            key = label(args) if callable(label) else label  # before the call: it may set the mode
            faults, start = minor_faults(), CPU()
            try:
                return original(*args, **kwargs)
            finally:
                self.times[key].append(CPU() - start)
                self.faults[key].append(minor_faults() - faults)

        setattr(owner, name, timed)

    def clear(self) -> None:
        self.times.clear()
        self.faults.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--repeats", type=int, default=15)
    ns = parser.parse_args(argv)
    from torch.utils.checkpoint import checkpoint

    import recheck
    from recheck.checker import run as runner_module
    from recheck.runtime import saved_tensors

    torch.set_num_threads(1)
    blocks, x = build(**SIZES[ns.size])
    phases = Phases()
    Runner = runner_module.Runner
    # execute(mode) runs _call (the forward) then _backward: label both by the mode
    mode: list[str] = ["plain"]

    def remember_mode(args: tuple) -> str:
        mode[0] = args[1]
        return f"{args[1]} run (all)"

    phases.wrap(Runner, "execute", remember_mode)
    phases.wrap(Runner, "_call", lambda args: f"{mode[0]} forward")
    phases.wrap(Runner, "_backward", lambda args: f"{mode[0]} backward")
    phases.wrap(Runner, "__init__", "snapshot (Runner)")
    phases.wrap(Runner, "_settle", lambda args: f"{mode[0]} settle")
    phases.wrap(Runner, "_check_plain_forward", "plain: stand-in check")
    phases.wrap(Runner, "_keep_after_forward", "user: state after forward")
    phases.wrap(saved_tensors.SavedTensorLog, "freeze", "user: copies of saved leaves")
    compared = {"bytes": 0, "time": 0.0, "count": 0}
    bits_equal = saved_tensors.bits_equal

    def counted(a: torch.Tensor, b: torch.Tensor) -> bool:
        start = CPU()
        try:
            return bits_equal(a, b)
        finally:
            compared["time"] += CPU() - start
            compared["bytes"] += a.numel() * a.element_size()
            compared["count"] += 1

    saved_tensors.bits_equal = counted
    copied = {"leaves": 0, "bytes": 0, "grad": 0}
    freeze = saved_tensors.SavedTensorLog.freeze

    def sizing(log: Any) -> None:
        for metadata in log.pending:
            if metadata.leaf and metadata.ref is not None:
                copied["leaves"] += 1
                copied["bytes"] += metadata.ref.numel() * metadata.ref.element_size()
                copied["grad"] += bool(metadata.ref.requires_grad)
        freeze(log)

    saved_tensors.SavedTensorLog.freeze = sizing

    def parts(step: Callable[[], torch.Tensor]) -> tuple[float, float, int, int]:
        faults, start = minor_faults(), CPU()
        out = step()
        middle, faults_middle = CPU(), minor_faults()
        out.backward(torch.randn_like(out))
        end = CPU()
        blocks.zero_grad(set_to_none=True)
        x.grad = None
        return middle - start, end - middle, faults_middle - faults, minor_faults() - faults_middle

    floor = {"plain": lambda: parts(lambda: blocks(x)),
             "checkpoint": lambda: parts(lambda: checkpoint(blocks, x, use_reentrant=False))}
    rows: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in floor}
    checks: list[float] = []

    def one_check() -> None:
        start = CPU()
        report = recheck.check(blocks, x)
        checks.append(CPU() - start)
        assert report.ok, "the benchmark's stack must check clean"

    for step in floor.values():
        step()
    one_check()
    phases.clear()
    checks.clear()
    compared.update(bytes=0, time=0.0, count=0)
    copied.update(leaves=0, bytes=0, grad=0)
    for _ in range(ns.repeats):
        for name, step in floor.items():
            rows[name].append(step())
        one_check()

    def median(values: list[float]) -> float:
        return statistics.median(values) * 1e3

    n = ns.repeats
    plain = [r[0] + r[1] for r in rows["plain"]]
    ckpt = [r[0] + r[1] for r in rows["checkpoint"]]
    floor_ms = median(plain) + median(ckpt)
    print(f"{ns.size} stack {SIZES[ns.size]}, medians of {n} interleaved rounds, process CPU time")
    print(f"check() {median(checks):7.2f} ms against its floor {floor_ms:7.2f} ms "
          f"(plain step {median(plain):.2f} + checkpoint step {median(ckpt):.2f}): "
          f"+{median(checks) - floor_ms:.2f} ms, +{(median(checks) - floor_ms) / median(plain):.2f} "
          "of a plain step")
    print(f"{'floor part':24s} {'ms':>8s} {'faults':>7s}")
    for name in floor:
        for index, part in ((0, "forward"), (1, "backward")):
            print(f"  {name + ' ' + part:22s} {median([r[index] for r in rows[name]]):8.2f} "
                  f"{statistics.median(r[index + 2] for r in rows[name]):7.0f}")
    print(f"{'check() phase':24s} {'ms':>8s} {'faults':>7s}")
    order = ["snapshot (Runner)", "plain run (all)", "plain forward", "plain: stand-in check", "plain backward",
             "plain settle", "user run (all)", "user forward", "user: copies of saved leaves",
             "user: state after forward", "user backward", "user settle"]
    for key in sorted(phases.times, key=lambda k: order.index(k) if k in order else len(order)):
        print(f"  {key:22s} {median(phases.times[key]):8.2f} {statistics.median(phases.faults[key]):7.0f}")
    print(f"saved tensors compared bit for bit: {compared['count'] / n:.0f} a check, "
          f"{compared['bytes'] / n / 1e6:.1f} MB, {compared['time'] / n * 1e3:.2f} ms "
          f"({compared['bytes'] / max(compared['time'], 1e-9) / 1e9:.1f} GB/s)")
    print(f"saved leaves copied when the forward returns: {copied['leaves'] / n:.0f} a check "
          f"({copied['grad'] / n:.0f} requiring grad), {copied['bytes'] / n / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
