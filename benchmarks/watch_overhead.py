"""Overhead of ``recheck.watch()`` on checkpointed training loops: time ratio and extra peak memory.

Modes: ``plain`` (no watch), ``digest`` (``watch()``, the default) and ``copy``
(``watch(store="copy")``).  Times (this process's CPU time on the CPU, wall time on CUDA) come
from one subprocess per model that times the three modes in turn, ``--repeats`` rounds, best
of each (so load from other processes affects them alike), after one warm-up step.  Peak memory (``ru_maxrss`` on CPU,
``torch.cuda.max_memory_allocated`` on CUDA) comes from one fresh subprocess per mode.  Models: a tiny transformers Llama (2 layers, hidden 32) and timm ResNet
and ViT when those libraries import (torch 2.14.1 + torchvision 0.29.1 environment),
and a plain-torch MLP that always runs.

    python benchmarks/watch_overhead.py [--steps 20] [--repeats 3] [--device cpu]

Target (issue 41): ratio <= 1.3x with digests.  Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from typing import Any, Callable, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("mlp", "llama", "resnet", "vit")
MODES = ("plain", "digest", "copy")


def build(model_name: str, device: str, optimizer_name: str = "sgd") -> tuple[Any, Callable[[], Any]]:
    """The model (checkpointing enabled, train mode) and one training step for it, with plain
    SGD (no state of its own) or ``"adamw"`` (two moments a parameter, as most training has)."""
    import torch

    torch.manual_seed(0)
    if model_name == "mlp":
        from torch.utils.checkpoint import checkpoint

        blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Dropout(0.1))
            for _ in range(8)).to(device)

        def forward(x: Any) -> Any:
            for block in blocks:
                x = checkpoint(block, x, use_reentrant=False)
            return x

        model, make_batch = blocks, lambda: torch.randn(64, 256, device=device)
        loss_of = lambda batch: forward(batch).square().mean()  # noqa: E731
    elif model_name == "llama":
        import transformers

        config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(config).to(device)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        make_batch = lambda: torch.randint(0, 128, (4, 32), device=device)  # noqa: E731
        loss_of = lambda ids: model(input_ids=ids, labels=ids).loss  # noqa: E731
    elif model_name in ("resnet", "vit"):
        import timm

        if model_name == "resnet":
            model = timm.create_model("resnet10t", pretrained=False, num_classes=10)
        else:
            model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32,
                                      patch_size=8, embed_dim=64, depth=4, num_heads=2)
        model = model.to(device)
        model.set_grad_checkpointing()
        make_batch = lambda: torch.randn(8, 3, 32, 32, device=device)  # noqa: E731
        loss_of = lambda x: model(x).square().mean()  # noqa: E731
    else:
        raise ValueError(f"unknown model {model_name!r}; choose from {', '.join(MODELS)}")
    model.train()
    if optimizer_name == "sgd":
        optimizer: Any = torch.optim.SGD(model.parameters(), lr=1e-3)
    elif optimizer_name == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        raise ValueError(f"unknown optimizer {optimizer_name!r}; choose from sgd, adamw")

    def step() -> Any:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(make_batch())
        loss.backward()
        optimizer.step()
        return loss

    return model, step


def built(names: str, device: str = "cpu") -> Iterator[tuple[str, Callable[[], Any] | None, str]]:
    """Each model of the comma-separated ``names`` with its training step, or None and why it
    cannot be built (its library is not installed, or it is not one of :data:`MODELS`)."""
    for name in names.split(","):
        try:
            _, step = build(name, device)
        except (ImportError, ValueError) as exc:  # its library is not installed, or no such model
            yield name, None, f"{type(exc).__name__}: {exc}"
            continue
        yield name, step, ""


def print_rows(names: str, measure: Callable[[Callable[[], Any]], str]) -> None:
    """For each model of ``names``: its name and ``measure(step)``, or why it cannot be built
    (the tiny configs' warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, step, why in built(names):
            print(f"{name:8} " + (f"skipped: {why}" if step is None else measure(step)), flush=True)


def run_one(model_name: str, mode: str, steps: int, repeats: int, device: str) -> dict[str, Any]:
    """Time ``steps`` training steps in this process, best of ``repeats`` per mode.

    ``mode`` is one of :data:`MODES`, or ``interleaved``: all three modes timed in turn
    ``repeats`` times on the same model, so that load from other processes on the
    machine affects each mode alike (the ratios come from this run).
    """
    import contextlib

    import torch

    sys.path.insert(0, ROOT)
    import recheck

    _, step = build(model_name, device)
    step()  # warm-up (lazy imports, allocator)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    modes = MODES if mode == "interleaved" else (mode,)
    # this process's CPU time on the CPU (steadier on a shared machine than the wall clock: time
    # taken by other processes does not count); every thread of torch's pool counts, its spin
    # between kernels too, in both modes alike; wall time after a synchronize on CUDA
    clock = time.process_time if device == "cpu" else time.perf_counter
    best = {m: float("inf") for m in modes}
    findings = invocations = 0
    for _ in range(repeats):
        for current in modes:
            context = (contextlib.nullcontext() if current == "plain"
                       else recheck.watch(raise_on_finding=False, store=current))
            if device == "cuda":
                torch.cuda.synchronize()
            start = clock()
            with context as watcher:
                for _ in range(steps):
                    step()
            if device == "cuda":
                torch.cuda.synchronize()
            best[current] = min(best[current], clock() - start)
            if watcher is not None:
                findings, invocations = len(watcher.report), watcher.report.stats["invocations"]
    peak = (torch.cuda.max_memory_allocated() if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    from recheck.runtime.digests import DIGEST_NAME

    return {"model": model_name, "mode": mode, "seconds": best, "peak_bytes": peak,
            "findings": findings, "invocations": invocations, "digest": DIGEST_NAME}


def available(model_name: str) -> str | None:
    """None when the model's library imports, else the reason it does not."""
    module = {"llama": "transformers", "resnet": "timm", "vit": "timm"}.get(model_name)
    if module is None:
        return None
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    return None if probe.returncode == 0 else probe.stderr.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.one:
        print(json.dumps(run_one(ns.one[0], ns.one[1], ns.steps, ns.repeats, ns.device)))
        return 0
    print(f"{'model':8} {'mode':7} {'s/step':>9} {'ratio':>6} {'peak MiB':>9} {'extra MiB':>9} "
          f"{'calls':>6} {'findings':>8}")
    for model_name in ns.models.split(","):
        reason = available(model_name)
        if reason:
            print(f"{model_name:8} skipped: {reason}")
            continue
        results = {}
        for mode in ("interleaved", *MODES):
            out = subprocess.run(
                [sys.executable, __file__, "--one", model_name, mode, "--steps", str(ns.steps),
                 "--repeats", str(ns.repeats if mode == "interleaved" else 1), "--device", ns.device],
                capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"{model_name:8} {mode:7} failed:\n{out.stderr[-2000:]}")
                break
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        else:
            times = results["interleaved"]["seconds"]
            base = results["plain"]["peak_bytes"]
            for mode in MODES:
                result = results[mode]
                print(f"{model_name:8} {mode:7} {times[mode] / ns.steps:9.4f} {times[mode] / times['plain']:6.2f} "
                      f"{result['peak_bytes'] / 2**20:9.1f} {(result['peak_bytes'] - base) / 2**20:9.1f} "
                      f"{result['invocations']:6d} {result['findings']:8d}", flush=True)
            if results["interleaved"]["digest"] != "xxh3-128":  # recheck[torch] installs xxhash
                print(f"{model_name:8} digests by {results['interleaved']['digest']}: xxhash is not installed "
                      f"in {sys.executable}'s environment, every saved tensor is hashed several times slower")
    return 0


if __name__ == "__main__":
    sys.exit(main())
