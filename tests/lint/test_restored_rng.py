"""RC105 on torch seeding and RC103 on warnings, judged by what the checkpoint and the warning
filters do at run time (the entry-point table says what each checkpoint restores)."""

from __future__ import annotations

import textwrap

from recheck.lint.engine import lint_sources

#: DeepSpeed's shape: its own ``CheckpointFunction`` saves torch's CPU and CUDA RNG states in
#: forward, sets them for the recompute and puts the backward's states back after it; the
#: pipeline's layer function reseeds every RNG when ``seed_layers`` is on
DEEPSPEED = {
    "deepspeed/__init__.py": "",
    "deepspeed/runtime/__init__.py": "",
    "deepspeed/runtime/activation_checkpointing/__init__.py": "",
    "deepspeed/runtime/activation_checkpointing/checkpointing.py": '''
import torch


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, *args):
        ctx.run_function = run_function
        ctx.fwd_cpu_rng_state = torch.get_rng_state()
        ctx.fwd_cuda_rng_state = torch.cuda.get_rng_state()
        ctx.save_for_backward(*args)
        with torch.no_grad():
            return run_function(*args)

    @staticmethod
    def backward(ctx, *grads):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        bwd_cpu_rng_state = torch.get_rng_state()
        bwd_cuda_rng_state = torch.cuda.get_rng_state()
        torch.set_rng_state(ctx.fwd_cpu_rng_state)
        torch.cuda.set_rng_state(ctx.fwd_cuda_rng_state)
        with torch.enable_grad(), torch.autocast("cuda", enabled=torch.is_autocast_enabled()):
            outputs = ctx.run_function(*inputs)
        torch.set_rng_state(bwd_cpu_rng_state)
        torch.cuda.set_rng_state(bwd_cuda_rng_state)
        torch.autograd.backward(outputs, grads)
        return (None, *(t.grad for t in inputs))


def checkpoint(function, *args):
    return CheckpointFunction.apply(function, *args)
''',
    "pipe.py": '''
import random
import torch
from torch import nn
from deepspeed.runtime.activation_checkpointing import checkpointing


def set_random_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)


class PipelineModule(nn.Module):
    def __init__(self, layers, seed_layers=True):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.seed_layers = seed_layers

    def forward(self, x):
        def exec_func(*inputs):
            for index, layer in enumerate(self.layers):
                if self.seed_layers:
                    set_random_seed(1234 + index)
                inputs = layer(*inputs)
            return inputs

        return checkpointing.checkpoint(exec_func, x)
''',
}


def _findings(sources: dict[str, str], code: str) -> list[tuple[str, int, str]]:
    result = lint_sources({path: textwrap.dedent(text) for path, text in sources.items()})
    assert not result.errors, result.errors
    return [(f.path, f.line, f.message) for f in result.findings if f.code == code]


def test_torch_seeding_in_a_checkpoint_that_restores_torch_rng_is_not_reported():
    # the recompute reseeds torch, then CheckpointFunction.backward sets the backward's state
    # back: nothing outside the region sees the reseed; Python's RNG is restored by no one
    assert [(path, line) for path, line, _ in _findings(DEEPSPEED, "RC105")] == [("pipe.py", 9)]


REGION = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def forward(self, x):
        torch.manual_seed(0)
        return x * torch.rand_like(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False{extra})
'''


def test_torch_seeding_is_reported_where_the_call_turns_rng_restoring_off():
    assert _findings({"m.py": REGION.format(extra="")}, "RC105") == []
    (finding,) = _findings({"m.py": REGION.format(extra=", preserve_rng_state=False")}, "RC105")
    assert finding[1] == 9 and "does not restore torch's RNG" in finding[2]


def test_a_fresh_seed_in_a_region_is_reported_whatever_the_checkpoint_restores():
    source = REGION.format(extra="").replace("torch.manual_seed(0)", "torch.seed()")
    (finding,) = _findings({"m.py": source}, "RC105")
    assert finding[1] == 9 and "fresh seed" in finding[2]


WARNING = '''
import warnings
import torch
from torch.utils.checkpoint import checkpoint


def deprecate(name):
    warnings.warn(f"{name} is deprecated", FutureWarning, stacklevel=2)  # diffusers' deprecate() shape


def region(x):
    deprecate("scale")
    warnings.warn("direct", UserWarning, stacklevel=2)
    return x.sin()


def run(x):
    return checkpoint(region, x, use_reentrant=False)
'''


def test_a_warning_is_reported_only_where_the_recompute_shows_it_again():
    # deprecate()'s stacklevel names its caller's line, inside the region: once per location;
    # the region's own stacklevel=2 names torch's line calling it, another one in the recompute
    found = _findings({"m.py": WARNING}, "RC103")
    assert [(line, "stacklevel=2" in message) for _, line, message in found] == [(13, True)]
