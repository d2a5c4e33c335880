"""``recheck run --steps 2``: do the steps after the watched ones run at plain speed?

The issue's measure: steps 3-10 of a training loop run within 3% of the same loop without
recheck.  A plain loop (an MLP whose blocks are checkpointed) times each of its steps itself
(the main thread's CPU time, ``time.thread_time``: with one torch thread every kernel runs
there, and it is steadier than the wall clock on a shared machine) and prints the times; it runs as ``python loop.py`` and as ``python -m recheck run --steps 2
loop.py`` in turn (the order alternating), ``--rounds`` times each, one torch thread.  Printed: for each, the least and
the median over the rounds of the sum of steps 3-10, and their ratios (recheck / plain).

Both run with glibc's mmap and trim thresholds fixed (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``): with the default dynamic threshold, a process that freed large
blocks earlier (recheck's watched steps do) serves later ones from its heap, while the plain
run maps and faults fresh pages every step, so the plain loop read 17-25% slower than the one
after recheck.  ``--default-malloc`` shows that comparison.

    python benchmarks/run_overhead.py --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LOOP = """
import json, time, torch
from torch import nn
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)
torch.manual_seed(0)
WIDTH, BLOCKS = {width}, {blocks}
blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.LayerNorm(WIDTH)) for _ in range(BLOCKS))
head = nn.Linear(WIDTH, 1)
opt = torch.optim.AdamW([*blocks.parameters(), *head.parameters()], lr=1e-3)
x, y = torch.randn({batch}, WIDTH), torch.randn({batch}, 1)
times = []
for step in range({steps}):
    start = time.thread_time()
    h = x
    for block in blocks:
        h = checkpoint(block, h, use_reentrant=False)
    loss = nn.functional.mse_loss(head(h), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    times.append(time.thread_time() - start)
print(json.dumps(times))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--default-malloc", action="store_true", help="leave glibc's thresholds dynamic")
    args = parser.parse_args()
    env = dict(os.environ)
    if not args.default_malloc:
        env.update(MALLOC_MMAP_THRESHOLD_=str(1 << 27), MALLOC_TRIM_THRESHOLD_=str(1 << 30))
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as folder:
        loop = Path(folder) / "loop.py"
        loop.write_text(LOOP.format(width=args.width, blocks=args.blocks, batch=args.batch, steps=10))
        commands = {"plain": [sys.executable, str(loop)],
                    "recheck run --steps 2": [sys.executable, "-m", "recheck", "run", "--steps", "2", str(loop)]}
        after: dict[str, list[float]] = {mode: [] for mode in commands}
        watched: dict[str, list[float]] = {mode: [] for mode in commands}
        for round_ in range(args.rounds):
            for mode, command in (list if round_ % 2 == 0 else reversed)(list(commands.items())):
                out = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
                times = json.loads(out.stdout.strip().splitlines()[-1])
                watched[mode].append(sum(times[:2]))
                after[mode].append(sum(times[2:]))
    plain, ours = after["plain"], after["recheck run --steps 2"]
    for mode in commands:
        print(f"{mode:24} steps 3-10: least {min(after[mode]) * 1e3:8.1f} ms, median "
              f"{statistics.median(after[mode]) * 1e3:8.1f} ms; steps 1-2 median "
              f"{statistics.median(watched[mode]) * 1e3:8.1f} ms")
    print(f"ratio steps 3-10 (recheck / plain): least {min(ours) / min(plain):.3f}, "
          f"median {statistics.median(ours) / statistics.median(plain):.3f}  ({args.rounds} rounds, one torch thread"
          f"{', default malloc' if args.default_malloc else ''})")


if __name__ == "__main__":
    main()
