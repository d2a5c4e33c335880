"""The imitations of DeepSpeed, Megatron-core and fairscale in ``fixtures/implementations/``,
loaded under the real libraries' module names, and the model the tests checkpoint with them
(shared test helper).

``with imitation("deepspeed") as ds:`` registers the fixture as
``deepspeed.runtime.activation_checkpointing.checkpointing`` (and its parent packages, whose
``__file__`` is the fixture's folder, as a real package's is its own), so that recheck finds
and patches it exactly as it patches the real library; on exit ``sys.modules`` is as before
(a real library installed beside stays untouched).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "fixtures" / "implementations"
FILES = {"deepspeed": "deepspeed_checkpointing.py", "megatron": "megatron_random.py",
         "fairscale": "fairscale_checkpointing.py"}


@contextlib.contextmanager
def imitation(library: str) -> Iterator[types.ModuleType]:
    path = FOLDER / FILES[library]
    spec = importlib.util.spec_from_file_location(f"recheck_imitation_{library}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    name = module.IMITATES
    parts = name.split(".")
    saved = {n: sys.modules.get(n) for n in (".".join(parts[:i]) for i in range(1, len(parts) + 1))}
    try:
        for package in list(saved)[:-1]:
            stub = types.ModuleType(package)
            stub.__file__ = str(FOLDER / "__init__.py")
            stub.__path__ = [str(FOLDER)]
            sys.modules[package] = stub
        module.__name__ = name
        sys.modules[name] = module
        yield module
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


# -- the model every imitation test checkpoints -------------------------------------------------

class block(nn.Module):
    """A residual MLP block with dropout: what each library checkpoints in these tests."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.fc2(self.drop(torch.nn.functional.gelu(self.fc1(x))))


def dropout_model() -> tuple[nn.Module, torch.Tensor]:
    """``(model, x)``: a linear layer and two :class:`block`s, made from seed 0."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), block(), block()), torch.randn(4, 8)


def run_blocks(model: nn.Module, x: torch.Tensor, run: Callable, autocast: torch.dtype | None = None) -> None:
    """Forward with each block through ``run(block, h)`` (under CPU autocast if given), and backward."""
    with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
        h = model[0](x)
        for b in model[1:]:
            h = run(b, h.float())
    h.float().pow(2).mean().backward()


def without_output(mg: types.ModuleType) -> Callable:
    """Megatron's ``CheckpointWithoutOutput``: checkpoint, use the output, discard it and
    register its recompute."""
    def run(b, h):
        ckpt = mg.CheckpointWithoutOutput(fp8=None)
        y = ckpt.checkpoint(b, h) * 1.0
        ckpt.discard_output_and_register_recompute(y)
        return y
    return run


#: imitated library, and how a block is checkpointed with it
CHECKPOINTING: dict[str, tuple[str, Callable]] = {
    "deepspeed": ("deepspeed", lambda ds: ds.checkpoint),
    "deepspeed-non-reentrant": ("deepspeed", lambda ds: ds.non_reentrant_checkpoint),
    "megatron": ("megatron", lambda mg: lambda b, h: mg.checkpoint(b, False, h)),
    "megatron-without-output": ("megatron", without_output),
    "fairscale": ("fairscale", lambda fs: lambda b, h: fs.checkpoint_wrapper(b)(h)),
}
