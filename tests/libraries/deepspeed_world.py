"""DeepSpeed ZeRO-1/2/3 engines on every rank of a gloo world (CPU): run by ``run_world`` for
tests/libraries/test_deepspeed_zero.py, which the spawned ranks import this module from.

:func:`zero_world` builds, for one ZeRO stage, an engine per case and runs it under ``watch()``
and under ``check_step``:

* ``clean``: two blocks checkpointed with torch's non-reentrant checkpoint, and one with
  DeepSpeed's own (reentrant) ``deepspeed.checkpointing.checkpoint``; no hazard;
* ``dropout``: on :data:`HAZARD_RANK` only, the first block drops out inside a checkpoint run
  with ``preserve_rng_state=False`` (the recompute draws another mask);
* ``counter``: on :data:`HAZARD_RANK` only, the first block counts its calls in a module
  attribute inside its region (the recompute counts again);
* ``batchnorm``: the first block normalises with a BatchNorm on every rank, in training mode on
  :data:`HAZARD_RANK` only (the recompute updates its running statistics again; in eval mode
  elsewhere, so every rank calls the same modules);
* ``global``: the first block's region reads a module global, which :data:`HAZARD_RANK` flips
  between its forward and its backward.

Every rank builds the same modules (ZeRO-3 gathers parameters with collectives, so the ranks
must run the same code); only the hazard's switch differs.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # otherwise DeepSpeed guesses an accelerator and logs it

import deepspeed  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import recheck  # noqa: E402

#: DeepSpeed's CPU backend compiles a shared-memory op for inference all-reduces on its first
#: engine (minutes, a C++ toolchain); training on gloo never calls it
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None

#: the rank the planted hazards run on
HAZARD_RANK = 1
WIDTH = 16
CASES = ("clean", "dropout", "counter", "batchnorm", "global")
#: what the first block's region multiplies by: ``global`` flips it on one rank before the backward
SCALE = 1.0
#: watched steps per case (each a plain step before it)
WATCHED_STEPS = 3


class Block(nn.Module):
    """Linear and tanh in a checkpointed region; ``hazard`` plants one on this rank."""

    def __init__(self, hazard: str = "", deepspeed_checkpoint: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.hazard, self.deepspeed_checkpoint = hazard, deepspeed_checkpoint
        self.norm = nn.BatchNorm1d(WIDTH) if hazard == "batchnorm" else None
        self.calls = 0

    def region(self, x: torch.Tensor) -> torch.Tensor:
        if self.hazard == "counter":  # (before the last saved tensor: torch's early stop ends the recompute there)
            self.calls += 1
        h = torch.tanh(self.linear(x))
        if self.norm is not None:
            h = self.norm(h)
        if self.hazard == "global":
            h = h * SCALE
        if self.hazard == "dropout":
            h = torch.nn.functional.dropout(h, p=0.5, training=True)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.deepspeed_checkpoint:
            return x + deepspeed.checkpointing.checkpoint(self.region, x)
        return x + checkpoint(self.region, x, use_reentrant=False, preserve_rng_state=self.hazard != "dropout")


def model(hazard: str) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(Block(hazard), Block(), Block(deepspeed_checkpoint=True))


def engine_for(stage: int, hazard: str) -> Any:
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
    }
    net = model(hazard)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    return engine


def batch(rank: int) -> torch.Tensor:
    return torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(100 + rank))


def training_state(engine: Any) -> list[tuple[str, torch.Tensor | float | int]]:
    """Every tensor the engine's optimizer keeps (the fp32 master partitions, the inner
    optimizer's moments, gradient partitions), the module's parameters (ZeRO-3: the local
    partitions), the loss scaler's scale and the step counters, named and copied."""
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()

    def walk(name: str, value: Any, depth: int) -> None:
        if id(value) in seen or depth > 4:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            if value.device.type != "meta":  # (a placeholder without data)
                found.append((name, value.detach().clone()))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(f"{name}[{i}]", item, depth + 1)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{name}[{key!r}]", item, depth + 1)
        elif isinstance(value, torch.optim.Optimizer):
            walk(f"{name}.state", list(value.state.values()), depth + 1)
            walk(f"{name}.param_groups", [g["params"] for g in value.param_groups], depth + 1)

    optimizer = engine.optimizer
    for key, value in sorted(vars(optimizer).items()):
        walk(f"optimizer.{key}", value, 0)
    for name, param in engine.module.named_parameters():
        walk(f"module.{name}", param, 0)
        if hasattr(param, "ds_tensor"):
            walk(f"module.{name}.ds_tensor", param.ds_tensor, 0)
    scaler = getattr(optimizer, "loss_scaler", None)
    if scaler is not None:
        found.append(("loss_scaler.cur_scale", float(getattr(scaler, "cur_scale", getattr(scaler, "loss_scale", 0)))))
    found += [("global_steps", engine.global_steps), ("micro_steps", engine.micro_steps)]
    return found


def differences(before: list[tuple[str, Any]], after: list[tuple[str, Any]]) -> list[str]:
    names = [name for name, _ in before]
    if names != [name for name, _ in after]:
        return [f"the tensors held changed: {sorted(set(names) ^ {n for n, _ in after})}"]
    differ = []
    for (name, a), (_, b) in zip(before, after):
        same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        if not same:
            differ.append(name)
    return differ


def zero_world(rank: int, world_size: int, stage: int, cases: tuple[str, ...] = CASES) -> dict[str, Any]:
    """Each case under ``watch()`` and ``check_step`` on this rank: the findings' kinds and
    subjects, whether check_step refused (and its message), the training state it changed,
    and the seconds of a plain step, a watched one and a check."""
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    outcome: dict[str, Any] = {}
    for case in cases:
        # every rank builds the same modules (ZeRO-3 gathers each one's parameters with collectives)
        shared = case in ("batchnorm", "global")
        engine = engine_for(stage, case if rank == HAZARD_RANK or shared else "")
        if case == "batchnorm" and rank != HAZARD_RANK:
            engine.module[0].norm.eval()
        data = batch(rank)
        flips = case == "global" and rank == HAZARD_RANK

        def step() -> torch.Tensor:
            global SCALE
            loss = engine(data).pow(2).mean()
            SCALE = 2.0 if flips else 1.0  # after the forward, before the recompute
            try:
                engine.backward(loss)
            finally:
                SCALE = 1.0
            engine.step()
            return loss.detach()

        step()  # the optimizer's state exists
        plain = watch_seconds = float("inf")
        watched: list[tuple[str, str]] = []
        for _ in range(WATCHED_STEPS):  # timed: the fastest of each (the ranks share the machine's cores)
            start = time.perf_counter()
            step()
            plain = min(plain, time.perf_counter() - start)
            start = time.perf_counter()
            with recheck.watch(raise_on_finding=False) as watch:
                step()
            watch_seconds = min(watch_seconds, time.perf_counter() - start)
            watched += [(f.kind, str(f.subject)) for f in watch.report.findings]
        before = training_state(engine)
        refused = None
        start = time.perf_counter()
        try:
            report = recheck.check_step(step)
        except RuntimeError as exc:
            refused, report = str(exc), None
        check_seconds = time.perf_counter() - start
        changed = differences(before, training_state(engine))
        step()  # training goes on after the check
        outcome[case] = {
            "watch": watched,
            "check_step": None if report is None else [(f.kind, str(f.subject)) for f in report.findings],
            "check_notes": None if report is None else list(report.notes),
            "refused": refused,
            "changed": changed,
            "seconds": {"plain": plain, "watch": watch_seconds, "check_step": check_seconds},
        }
        engine.destroy()
    return outcome
