"""DeepSpeed's activation checkpointing on CPU: what runs, what it restores, how to bypass it.

Run in a venv with ``DS_BUILD_OPS=0 pip install deepspeed`` (0.19.8 here) and torch:
``python tests/twins_evidence/real_deepspeed.py``.  Each line printed is a measured fact.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # otherwise DeepSpeed guesses and logs it

import deepspeed  # noqa: E402
from deepspeed.runtime.activation_checkpointing import checkpointing  # noqa: E402

print(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}")
print("deepspeed.checkpointing is deepspeed.runtime.activation_checkpointing.checkpointing:",
      deepspeed.checkpointing is checkpointing)
print("CheckpointFunction is an autograd.Function:", issubclass(checkpointing.CheckpointFunction, torch.autograd.Function))


class block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.fc2(self.drop(torch.nn.functional.gelu(self.fc1(x))))


@contextlib.contextmanager
def bypass():
    """Every reentrant DeepSpeed checkpoint runs its function directly (under the caller's grad mode).

    ``checkpoint(function, *args)`` calls ``CheckpointFunction.apply(function, all_outputs, *args)``
    and returns what forward appended to ``all_outputs``; patched there, every binding of
    ``checkpoint`` (PipelineModule's default argument, ``from ... import checkpoint``) is covered.
    """
    def direct(function, all_outputs, *args):
        outputs = function(*args)
        all_outputs += [outputs] if torch.is_tensor(outputs) else list(outputs)
        return outputs

    original = checkpointing.CheckpointFunction.__dict__.get("apply")
    checkpointing.CheckpointFunction.apply = staticmethod(direct)
    try:
        yield
    finally:
        if original is None:
            del checkpointing.CheckpointFunction.apply
        else:
            checkpointing.CheckpointFunction.apply = original


@contextlib.contextmanager
def bypass_by_code(function):
    """Swap a plain function's ``__code__`` for a direct call: every reference to the object is covered."""
    def direct(function, *args):
        return function(*args)

    original = function.__code__
    function.__code__ = direct.__code__
    try:
        yield
    finally:
        function.__code__ = original


def grads(run, *, autocast_dtype=None, float_inputs=False, seed=0):
    """Gradients and the RNG state after a step of two checkpointed dropout blocks.

    ``float_inputs``: each block gets a float32 input (under autocast a Linear's output is
    bfloat16; a recompute outside autocast then multiplies bfloat16 by float32 weights and raises).
    """
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 16), block(), block())
    x = torch.randn(8, 16)
    torch.manual_seed(1)
    ctx = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with ctx:
        h = model[0](x)
        for b in model[1:]:
            h = run(b, h.float() if float_inputs else h)
    h.float().pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()], torch.get_rng_state()


def differ(a, b):
    ga, ra = a
    gb, rb = b
    n = sum(int((x != y).sum()) for x, y in zip(ga, gb))
    rel = max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(ga, gb))
    return f"{n} of {sum(x.numel() for x in ga)} grad elements differ (max {100 * rel:.3g}% of a tensor's max), " \
           f"RNG state after the step {'equal' if torch.equal(ra, rb) else 'differs'}"


direct_call = lambda f, *a: f(*a)  # noqa: E731
print("configured before use:", checkpointing.is_configured())
for name, fn in (("checkpoint (reentrant CheckpointFunction)", checkpointing.checkpoint),
                 ("non_reentrant_checkpoint (saved_tensors_hooks)", checkpointing.non_reentrant_checkpoint)):
    try:
        print(f"{name}, no configure(), dropout: vs direct call:", differ(grads(fn), grads(direct_call)))
    except Exception as exc:  # noqa: BLE001 (a measured fact, printed)
        print(f"{name}: raised {type(exc).__name__}: {exc}")
    for float_inputs in (False, True):
        label = f"{name}, under autocast(cpu, bfloat16), {'float32' if float_inputs else 'bfloat16'} block inputs"
        try:
            print(f"{label}: vs direct call:",
                  differ(grads(fn, autocast_dtype=torch.bfloat16, float_inputs=float_inputs),
                         grads(direct_call, autocast_dtype=torch.bfloat16, float_inputs=float_inputs)))
        except Exception as exc:  # noqa: BLE001 (a measured fact, printed)
            where = "in backward (the recompute)" if "backward" in "".join(
                __import__("traceback").format_tb(exc.__traceback__)) else "in forward"
            print(f"{label}: raised {where} {type(exc).__name__}: {exc}")

with bypass():
    print("bypass (CheckpointFunction.apply -> direct) vs direct call:", differ(grads(checkpointing.checkpoint), grads(direct_call)))
    ac = dict(autocast_dtype=torch.bfloat16, float_inputs=True)  # where the checkpoint itself differs: proof of the bypass
    print("bypass, under autocast (float32 inputs), vs direct call:", differ(grads(checkpointing.checkpoint, **ac), grads(direct_call, **ac)))
with bypass_by_code(checkpointing.non_reentrant_checkpoint):
    print("bypass (non_reentrant_checkpoint.__code__ swapped) vs direct call:",
          differ(grads(checkpointing.non_reentrant_checkpoint), grads(direct_call)))
    print("bypass (__code__ swapped), under autocast (float32 inputs; raises when checkpointed), vs direct call:",
          differ(grads(checkpointing.non_reentrant_checkpoint, autocast_dtype=torch.bfloat16, float_inputs=True),
                 grads(direct_call, autocast_dtype=torch.bfloat16, float_inputs=True)))
print("checkpoint is wrapped by", type(checkpointing.checkpoint).__name__,
      "with __wrapped__:", hasattr(checkpointing.checkpoint, "__wrapped__"))

# configure() needs torch.distributed: without a process group it fails; a gloo group of one works.
try:
    checkpointing.configure(None, partition_activations=False)
    print("configure(None) without a process group: ok")
except Exception as exc:  # noqa: BLE001
    print(f"configure(None) without a process group: {type(exc).__name__}: {str(exc)[:120]}")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, rank=0, world_size=1)
try:
    checkpointing.configure(None, partition_activations=False)
    print("configure(None) with a gloo group of one: ok; is_configured():", checkpointing.is_configured())
    print("after configure, checkpoint vs direct call:", differ(grads(checkpointing.checkpoint), grads(direct_call)))
finally:
    torch.distributed.destroy_process_group()

# The unknown-implementation prototype on DeepSpeed's two functions (recompute_probe.py beside this file).
from recompute_probe import Probe  # noqa: E402


def probed(run, autocast_dtype=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), block(), block())
    x = torch.randn(8, 16)
    probe = Probe(model)
    ctx = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with probe.watching():
        with ctx:
            h = model[0](x)
            for b in model[1:]:
                h = run(b, h.float())
        h.float().pow(2).mean().backward()
    return f"{probe.summary()}; differences: {sorted({d.what for d in probe.differences()}) or 'none'}"


for name, fn in (("checkpoint", checkpointing.checkpoint), ("non_reentrant_checkpoint", checkpointing.non_reentrant_checkpoint)):
    print(f"recompute_probe on {name}:", probed(fn))
print("recompute_probe on checkpoint under autocast (float32 inputs):", probed(checkpointing.checkpoint, torch.bfloat16))
