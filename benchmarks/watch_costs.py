"""What ``watch()`` costs, in the two figures a user can reason about.

* **Fixed cost per checkpoint invocation** (µs): a region of one tiny tensor, checkpointed
  ``--calls`` times in one step, watched against plain; the difference divided by the calls.
  It covers recording the forward, the recompute's comparison and the bookkeeping, with next
  to no bytes to digest.
* **Digest throughput** (GB/s of saved tensors, one core): ``print_tensor`` of a large CPU
  tensor, the work that grows with the activations.  Beside it, ``clone()`` of the same bytes
  (the cost of ``store="copy"``).

    python benchmarks/watch_costs.py [--calls 400] [--mib 64]

Targets (issue 15): fixed cost <= 50 µs on CPU; digests >= 5 GB/s per core on CPU.  Process
CPU time is used (``time.process_time``), best of ``--repeats``, so other processes' load
affects the figures less than wall time would.  Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time

from timing import best

CPU = time.process_time  # this process's CPU time: other processes' load counts less


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    ns = parser.parse_args(argv)
    import torch
    from torch.utils.checkpoint import checkpoint

    import recheck
    from recheck.runtime.digests import DIGEST_NAME, print_tensor

    torch.set_num_threads(1)
    x = torch.randn(1, requires_grad=True)

    def region(t):
        return t.sin()

    def step():
        total = x
        for _ in range(ns.calls):
            total = checkpoint(region, total, use_reentrant=False)
        total.sum().backward()

    def watched():
        with recheck.watch(raise_on_finding=False):
            step()

    step(), watched()
    plain, timed = best(step, ns.repeats, CPU), best(watched, ns.repeats, CPU)
    print(f"fixed cost per invocation: {(timed - plain) / ns.calls * 1e6:.1f} us "
          f"(plain {plain / ns.calls * 1e6:.1f} us, watched {timed / ns.calls * 1e6:.1f} us a call)")
    big = torch.randn(ns.mib * 1024 * 1024 // 4)
    print_tensor(big, "digest")
    digest = best(lambda: print_tensor(big, "digest"), ns.repeats, CPU)
    clone = best(lambda: big.clone(), ns.repeats, CPU)
    size = big.numel() * big.element_size() / 1e9
    print(f"digest throughput ({DIGEST_NAME}): {size / digest:.2f} GB/s; clone(): {size / clone:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
