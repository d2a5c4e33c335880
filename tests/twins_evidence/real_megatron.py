"""Megatron-core's activation checkpointing on CPU: what runs, what it restores, how to bypass it.

Run in a venv with torch and ``pip install --no-deps megatron-core`` (0.16.1 here; the wheel
imports without its optional dependencies): ``python tests/twins_evidence/real_megatron.py``.
Each line printed is a measured fact.  Megatron's RNG helpers call CUDA unconditionally; on
CPU the two module-level helpers ``_get_cuda_rng_state``/``_set_cuda_rng_state`` are replaced
by CPU stand-ins (they are looked up as globals of ``megatron.core.tensor_parallel.random``).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

warnings.filterwarnings("ignore")
from megatron.core import tensor_parallel  # noqa: E402
from megatron.core.tensor_parallel import random as mrandom  # noqa: E402

from recompute_probe import Probe  # noqa: E402

print(f"megatron-core {__import__('megatron.core').core.package_info.__version__}, torch {torch.__version__}")
print("tensor_parallel.checkpoint is tensor_parallel.random.checkpoint:", tensor_parallel.checkpoint is mrandom.checkpoint)
print("CheckpointFunction (random.py) is an autograd.Function:", issubclass(mrandom.CheckpointFunction, torch.autograd.Function))


class block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.fc2(self.drop(torch.nn.functional.gelu(self.fc1(x))))


def step(run, *, autocast_dtype=None, float_inputs=False, seed=0, probe=False):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 16), block(), block())
    x = torch.randn(8, 16)
    torch.manual_seed(1)
    ctx = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    watcher = Probe(model)
    with watcher.watching() if probe else contextlib.nullcontext():
        with ctx:
            h = model[0](x)
            for b in model[1:]:
                h = run(b, h.float() if float_inputs else h)
        h.float().pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()], torch.get_rng_state(), watcher


def differ(a, b):
    ga, ra, _ = a
    gb, rb, _ = b
    n = sum(int((x != y).sum()) for x, y in zip(ga, gb))
    rel = max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(ga, gb))
    return f"{n} of {sum(x.numel() for x in ga)} grad elements differ (max {100 * rel:.3g}% of a tensor's max), " \
           f"RNG state after the step {'equal' if torch.equal(ra, rb) else 'differs'}"


megatron_checkpoint = lambda f, x: tensor_parallel.checkpoint(f, False, x)  # noqa: E731 (Megatron's call shape)
direct_call = lambda f, x: f(x)  # noqa: E731

try:
    step(megatron_checkpoint)
    print("tensor_parallel.checkpoint on CPU, unpatched: ok")
except Exception as exc:  # noqa: BLE001 (a measured fact, printed)
    print(f"tensor_parallel.checkpoint on CPU, unpatched: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def cpu_rng_helpers():
    saved = mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.zeros(1, dtype=torch.uint8)  # no CUDA generator here
    mrandom._set_cuda_rng_state = lambda *a, **k: None
    try:
        yield
    finally:
        mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = saved


@contextlib.contextmanager
def bypass():
    """``CheckpointFunction.apply(run_function, distribute_saved_activations, *args)`` -> a direct call."""
    mrandom.CheckpointFunction.apply = staticmethod(lambda run_function, _distribute, *args: run_function(*args))
    try:
        yield
    finally:
        del mrandom.CheckpointFunction.apply


@contextlib.contextmanager
def bypass_without_output():
    """CheckpointWithoutOutput: run the function directly and keep its output (no discard, no hook)."""
    cls = tensor_parallel.CheckpointWithoutOutput
    saved = cls.checkpoint, cls.discard_output_and_register_recompute
    cls.checkpoint = lambda self, run_function, *args: run_function(*args)
    cls.discard_output_and_register_recompute = lambda self, hook_tensor: None
    try:
        yield
    finally:
        cls.checkpoint, cls.discard_output_and_register_recompute = saved


def without_output(f, x):
    """Megatron's CheckpointWithoutOutput shape: the output is freed and rebuilt by a grad hook of a later tensor."""
    ckpt = tensor_parallel.CheckpointWithoutOutput(fp8=None)  # the default fp8=False sets self.fp8 = True (needs Transformer Engine)
    out = ckpt.checkpoint(f, x)
    y = out * 1.0  # the consumer that saves ``out`` for its backward (Megatron: the next linear)
    ckpt.discard_output_and_register_recompute(y)
    return y


with cpu_rng_helpers():
    print("checkpoint with CPU RNG helpers, dropout, vs direct call:", differ(step(megatron_checkpoint), step(direct_call)))
    for float_inputs in (False, True):
        label = f"under autocast(cpu, bfloat16), {'float32' if float_inputs else 'bfloat16'} block inputs"
        try:
            print(f"checkpoint {label}: vs direct call:",
                  differ(step(megatron_checkpoint, autocast_dtype=torch.bfloat16, float_inputs=float_inputs),
                         step(direct_call, autocast_dtype=torch.bfloat16, float_inputs=float_inputs)))
        except Exception as exc:  # noqa: BLE001
            print(f"checkpoint {label}: raised in backward (the recompute) {type(exc).__name__}: {exc}")
    with bypass():
        print("bypass (CheckpointFunction.apply -> direct) vs direct call:",
              differ(step(megatron_checkpoint), step(direct_call)))
        ac = dict(autocast_dtype=torch.bfloat16, float_inputs=True)  # the checkpoint itself differs here
        print("bypass, under autocast (float32 inputs), vs direct call:",
              differ(step(megatron_checkpoint, **ac), step(direct_call, **ac)))
    print("CheckpointWithoutOutput, dropout, vs direct call:", differ(step(without_output), step(direct_call)))
    with bypass_without_output():
        print("bypass (CheckpointWithoutOutput.checkpoint -> direct, discard_... -> no-op) vs direct call:",
              differ(step(without_output), step(direct_call)))

    for label, run in (("tensor_parallel.checkpoint", megatron_checkpoint), ("CheckpointWithoutOutput", without_output)):
        probe = step(run, probe=True)[2]
        diffs = probe.differences()
        print(f"recompute_probe on {label}: {probe.summary()}; {len(diffs)} difference(s)", sorted({d.what for d in diffs}))
    probe = step(megatron_checkpoint, autocast_dtype=torch.bfloat16, float_inputs=True, probe=True)[2]
    print("recompute_probe on tensor_parallel.checkpoint under autocast (float32 inputs):",
          sorted({d.what for d in probe.differences()}))
