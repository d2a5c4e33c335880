"""What ``watch()`` adds to a step, in machine instructions: exact where times are not.

On a shared 2-core machine a ratio of two timings moves by 10-20% between runs of the same
code, more than most single changes to ``watch()``'s bookkeeping save.  Instructions counted by
valgrind's callgrind are the same at every run of the same code (with the hash seed fixed), so
two versions can be told apart by a fraction of a percent.  They are a proxy: a cache miss costs
more than an instruction, and that is what the timed benchmarks measure.

Its own models, plain torch (no other library):

* ``block``: four checkpointed transformer blocks (LayerNorm, attention with a transposed key,
  GELU MLP, dropout; 26 saved tensors an invocation), one training step each;
* ``one-op``: a region of one ``sin`` of a one-element tensor, 50 and 150 invocations a step:
  the fixed cost per invocation, with nothing to digest;
* ``block-each``: ``block`` with each step in a ``watch()`` block of its own, as ``pytest
  --recheck`` watches each test and ``watch_sweep.py`` each step: what a block costs besides
  its invocations (less ``block``'s figure);
* ``mlp``, ``llama``, ``resnet``, ``vit``: ``watch_overhead.py``'s models and training steps, a
  unit being a ``watch()`` block of five steps as ``watch_overhead.py --steps 5`` times them (the
  block's own cost, its regions' static reach included, shared by its steps; ``llama`` needs
  transformers, ``resnet`` and ``vit`` timm: run this script with an interpreter that has them,
  its children use the same one).

Each figure is a slope, so torch's import and the first block's set-up cancel out: instructions
of a run with more steps (or invocations) less a run with fewer, divided by the difference.
Plain and watched runs are separate processes under callgrind, ``PYTHONHASHSEED=0``,
``OMP_NUM_THREADS=1`` and no address randomization (``setarch -R``, where there is ``setarch``:
with it two runs of the same code differ by a few hundred instructions in ten billion, without
it by about 2% of a step), the garbage collector off during the measured part.  A run takes one to
three minutes under callgrind; ``--jobs 2`` runs two at once.

    python benchmarks/watch_instructions.py [--models block,one-op,mlp] [--jobs 2]

To compare two checkouts, run each checkout's own copy of this script (it puts its checkout
first on ``sys.path`` for the children).  Needs ``valgrind`` on ``PATH``.  Nothing here is
asserted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
#: model -> (the two sizes whose difference is measured, invocations a size unit, what a unit is)
MODELS = {"block": ((1, 3), 4, "step"), "block-each": ((1, 3), 4, "step"), "one-op": ((50, 150), 1, "invocation"),
          **{name: ((1, 2), 0, "block of 5 steps") for name in ("mlp", "llama", "resnet", "vit")}}  # 0: counted
#: the steps in a block of watch_overhead.py's models
BLOCK_STEPS = 5


def _child(model: str, mode: str, size: int) -> None:
    """Run ``size`` steps (block), invocations (one-op) or blocks of steps (watch_overhead.py's
    models), watched or plain, after a warm-up."""
    import torch
    from torch.utils.checkpoint import checkpoint

    import recheck

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if MODELS[model][1] == 0:  # watch_overhead.py's model and step
        import warnings

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from watch_overhead import build

        warnings.simplefilter("ignore")
        _, step = build(model, "cpu")

        def run(count: int) -> None:
            for _ in range(count):
                step()
    elif model in ("block", "block-each"):
        block_class = _make_block()
        blocks = torch.nn.ModuleList(block_class(32) for _ in range(4))
        optimizer = torch.optim.SGD(blocks.parameters(), lr=1e-3)
        data = torch.randn(2, 8, 32)

        def run(count: int) -> None:
            for _ in range(count):
                optimizer.zero_grad(set_to_none=True)
                x = data
                for block in blocks:
                    x = checkpoint(block, x, use_reentrant=False)
                x.square().mean().backward()
                optimizer.step()
    else:
        leaf = torch.randn(1, requires_grad=True)

        def run(count: int) -> None:
            total = leaf
            for _ in range(count):
                total = checkpoint(_sine, total, use_reentrant=False)
            total.sum().backward()

    def measured(count: int) -> None:
        if MODELS[model][1] == 0:  # blocks of BLOCK_STEPS steps
            for _ in range(count):
                if mode == "watch":
                    with recheck.watch(raise_on_finding=False) as block:
                        run(BLOCK_STEPS)
                    print(f"invocations {block.report.stats['invocations']}")
                else:
                    run(BLOCK_STEPS)
        elif mode == "watch" and model == "block-each":
            for _ in range(count):  # a block per step
                with recheck.watch(raise_on_finding=False):
                    run(1)
        elif mode == "watch":
            with recheck.watch(raise_on_finding=False):
                run(count)
        else:
            run(count)

    measured(1 if MODELS[model][1] == 0 else 2)
    if MODELS[model][1]:
        measured(2)
    gc.collect()
    gc.disable()
    measured(size)


def _make_block() -> type:
    import torch

    class Block(torch.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
            self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
            self.fc1, self.fc2 = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
            self.act, self.drop = torch.nn.GELU(), torch.nn.Dropout(0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, tokens, width = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, 4, width // 4).permute(2, 0, 3, 1, 4)
            attention = torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1)
            x = x + self.drop(self.proj((attention @ v).transpose(1, 2).reshape(batch, tokens, width)))
            return x + self.drop(self.fc2(self.act(self.fc1(self.norm2(x)))))

    return Block


def _sine(tensor):  # the one-op region: a Python function, as a user's region is
    return tensor.sin()


def _instructions(model: str, mode: str, size: int) -> tuple[int, float]:
    """Instructions callgrind counts for one child run, and the invocations a unit it reports."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")])}
    # without address randomization (``setarch -R``) the count is the same at every run, to the
    # instruction or nearly: object ids, and so the layout of dicts keyed by them, repeat
    fixed = ["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []
    done = subprocess.run([*fixed, "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                           sys.executable, __file__, "--child", model, mode, str(size)],
                          env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{model} {mode} {size}: callgrind run failed: {' | '.join(tail)}")
    invocations = re.findall(r"^invocations ([\d.]+)$", done.stdout, re.M)
    return int(found.group(1)), float(invocations[-1]) if invocations else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="block,one-op",
                        help=f"comma-separated, of: {', '.join(MODELS)} (default: block,one-op)")
    parser.add_argument("--jobs", type=int, default=2, help="callgrind runs at once (default 2)")
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "MODE", "SIZE"), help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        model, mode, size = ns.child
        _child(model, mode, int(size))
        return 0
    models = [m.strip() for m in ns.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        parser.error(f"unknown model(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(MODELS)}")
    if ns.jobs < 1:
        parser.error("--jobs must be at least 1")
    if shutil.which("valgrind") is None:
        print("watch_instructions: valgrind is not on PATH; nothing measured", file=sys.stderr)
        return 1
    runs = [(model, mode, size) for model in models for mode in ("plain", "watch") for size in MODELS[model][0]]
    print(f"{len(runs)} callgrind runs of {CHECKOUT}, {ns.jobs} at once ...", flush=True)
    with concurrent.futures.ThreadPoolExecutor(ns.jobs) as pool:
        results = dict(zip(runs, pool.map(lambda run: _instructions(*run), runs)))
    counts = {run: count for run, (count, _) in results.items()}
    for model in models:
        (small, large), invocations, unit = MODELS[model]
        invocations = invocations or results[(model, "watch", large)][1] or 1
        per = {mode: (counts[(model, mode, large)] - counts[(model, mode, small)]) / (large - small)
               for mode in ("plain", "watch")}
        added = per["watch"] - per["plain"]
        print(f"{model}: plain {per['plain']:,.0f}, watched {per['watch']:,.0f} instructions a {unit}; "
              f"added {added:,.0f} a {unit}, {added / invocations:,.0f} an invocation "
              f"({per['watch'] / per['plain']:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
