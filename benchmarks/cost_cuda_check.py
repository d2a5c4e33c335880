"""Check ``recheck.measure`` on a CUDA device: the allocator figures and the tracer's agree.

Run from the repository root: ``python benchmarks/cost_cuda_check.py``.  Without CUDA it
says so and exits 0.  It builds the demo model on the GPU (``torch.set_default_device``),
measures it, and prints:

* the comparison table (with the CUDA rows: max_memory_allocated / max_memory_reserved);
* the tracer's observed peak against ``torch.cuda.max_memory_allocated`` and against
  MemTracker (CUDA sizes rounded to 512 B there, exact bytes in recheck's ledger);
* the retained saved-state peak against the analytic value from the shapes (as in
  ``tests/cost/test_cost_accuracy.py``), non-reentrant and reentrant.

Exit status 1 when a figure is off by more than the stated tolerance.  ``--cpu`` rehearses the
checks on the CPU (no CUDA rows); ``--small`` uses a tiny model and one mode.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recheck.cost import measure  # noqa: E402
from recheck.cost.router import Router, routing  # noqa: E402


def load_demo():
    spec = importlib.util.spec_from_file_location("recheck_cost_demo", ROOT / "fixtures" / "models" / "cost_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def analytic(batch: int, seq: int, dim: int, heads: int, hidden: int, layers: int) -> tuple[int, int]:
    n = batch * seq
    block = 4 * (2 * (n * dim + 2 * n) + 6 * n * dim + batch * heads * seq * seq + 2 * n * hidden)
    x = 4 * n * dim
    checkpointed = max(x + layers * x + x, x + layers * x + block - x)
    return checkpointed, x + layers * block + x


def memtracker_peak(step, model, opt) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, opt)
    router = Router()
    with routing(router), tracker:
        step()
    return sum(v["Total"] for v in tracker.get_tracker_snapshot("peak").values())


def restore_check(demo, shape: dict) -> bool:
    """measure() leaves a trained model (grads, Adam state) bit-for-bit as it found it."""
    step, model, opt = demo.make_step(**shape, blocks=2, mlp_layers=1, default_batch=4)
    step()
    model["embed"](torch.randn(4, shape["seq"], shape["dim"])).sum().backward()  # live grads too
    bits = lambda t: t.detach().clone().contiguous().view(torch.int32)  # noqa: E731
    before = [bits(p) for p in model.parameters()] + [bits(p.grad) for p in model.parameters() if p.grad is not None]
    before += [bits(v) for s in opt.state.values() for v in s.values() if v.dim()]
    measure(step, repeats=1)
    after = [bits(p) for p in model.parameters()] + [bits(p.grad) for p in model.parameters() if p.grad is not None]
    after += [bits(v) for s in opt.state.values() for v in s.values() if v.dim()]
    return len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))


def main(argv: list[str]) -> int:
    device = "cpu" if "--cpu" in argv else "cuda"  # --cpu: rehearse the same checks on the CPU
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
    demo = load_demo()
    failures = 0
    torch.set_default_device(device)
    try:
        shape = dict(seq=128, dim=256, heads=4, hidden=1024)
        if "--small" in argv:  # a quick rehearsal
            shape = dict(seq=16, dim=32, heads=4, hidden=64)
        for reentrant in (False, True):
            kwargs = dict(**shape, blocks=4, mlp_layers=0, poor_region=False, block_reentrant=reentrant, default_batch=16)
            step, model, opt = demo.make_step(**kwargs)
            cmp = measure(step, repeats=3)
            label = "reentrant" if reentrant else "non-reentrant"
            if not reentrant:
                print(cmp)
            expected_ckpt, expected_plain = analytic(16, shape["seq"], shape["dim"], shape["heads"], shape["hidden"], 4)
            c, b = cmp.checkpointed, cmp.bypassed
            rows = [
                ("retained peak, checkpointed", c.retained_peak, expected_ckpt, 0.01),
                ("retained peak, bypassed", b.retained_peak, expected_plain, 0.01),
            ]
            for mode in (c, b) if device == "cuda" else ():
                if mode.cuda is None:
                    print(f"{label}: FAIL no CUDA figures for {mode.name}")
                    failures += 1
                    continue
                # max_memory_allocated is absolute (snapshot copies and earlier models count):
                # compare what the step added, in 512 B blocks there, exact bytes here
                added = mode.cuda["max_memory_allocated"] - mode.cuda["allocated_before_step"]
                rows.append((f"step's increase: observed vs max_memory_allocated, {mode.name}", mode.observed_peak - mode.observed_at_start, added, 0.01))
            fresh = demo.make_step(**kwargs)
            rows.append(("observed vs MemTracker, checkpointed", c.observed_peak, memtracker_peak(*fresh), 0.01))
            for name, measured, reference, tolerance in rows:
                ok = abs(measured - reference) <= tolerance * reference
                failures += not ok
                print(f"{label}: {'ok  ' if ok else 'FAIL'} {name}: {measured} vs {reference} ({measured / reference:.4f})")
            print(f"{label}: cuda {c.cuda} / {b.cuda}; time ratio {cmp.time_ratio:.2f}")
            if "--small" in argv:
                break
        ok = restore_check(demo, shape)
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} state restored bit-for-bit after measure (params, grads, Adam state)")
    finally:
        torch.set_default_device("cpu")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
