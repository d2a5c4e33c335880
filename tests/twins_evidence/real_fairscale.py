"""fairscale's ``checkpoint_wrapper`` on CPU: what runs, what it restores, how to bypass it.

Run in a venv with ``pip install fairscale`` (0.4.13 here) and torch:
``python tests/twins_evidence/real_fairscale.py``.  Each line printed is a measured fact.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings

import torch
from torch import nn

import fairscale  # noqa: E402
from fairscale.nn.checkpoint import checkpoint_activations as fsa  # noqa: E402
from fairscale.nn.checkpoint import checkpoint_wrapper  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.cuda.amp.autocast / is_autocast_enabled() deprecations
print(f"fairscale {fairscale.__version__}, torch {torch.__version__}")
print("fairscale.nn.checkpoint_wrapper is fairscale.nn.checkpoint.checkpoint_activations.checkpoint_wrapper:",
      __import__("fairscale.nn", fromlist=["checkpoint_wrapper"]).checkpoint_wrapper is fsa.checkpoint_wrapper)
print("its CheckpointFunction is its own autograd.Function (not torch's):",
      issubclass(fsa.CheckpointFunction, torch.autograd.Function)
      and fsa.CheckpointFunction is not torch.utils.checkpoint.CheckpointFunction)


class block(nn.Module):
    def __init__(self, dim=16, batchnorm=False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.5)
        self.norm = nn.BatchNorm1d(4 * dim) if batchnorm else nn.Identity()

    def forward(self, x):
        return x + self.fc2(self.drop(self.norm(torch.nn.functional.gelu(self.fc1(x)))))


def build(wrap, batchnorm=False, seed=0):
    torch.manual_seed(seed)
    blocks = [block(batchnorm=batchnorm) for _ in range(2)]
    if wrap:
        blocks = [checkpoint_wrapper(b) for b in blocks]
    return nn.Sequential(nn.Linear(16, 16), *blocks)


def run(wrap, *, autocast_dtype=None, float_inputs=False, batchnorm=False, bypass=None):
    model = build(wrap, batchnorm)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(1)
    ctx = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with bypass() if bypass else contextlib.nullcontext(), ctx:
        h = model[0](x)
        for b in model[1:]:
            h = b(h.float() if float_inputs else h)
    h.float().pow(2).mean().backward()
    return model, torch.get_rng_state()


def differ(a, b):
    (ma, ra), (mb, rb) = a, b
    ga = [p.grad for p in ma.parameters()]
    gb = [p.grad for p in mb.parameters()]
    n = sum(int((x != y).sum()) for x, y in zip(ga, gb))
    rel = max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(ga, gb))
    bufs = [(n_, x, y) for (n_, x), (_, y) in zip(ma.named_buffers(), mb.named_buffers()) if not torch.equal(x, y)]
    return (f"{n} of {sum(x.numel() for x in ga)} grad elements differ (max {100 * rel:.3g}% of a tensor's max), "
            f"RNG state after the step {'equal' if torch.equal(ra, rb) else 'differs'}, "
            f"{len(bufs)} buffer(s) differ{': ' + ', '.join(n_ for n_, _, _ in bufs) if bufs else ''}")


wrapped = build(True)[1]
print("checkpoint_wrapper sets an instance attribute forward = functools.partial(_checkpointed_forward, "
      "type(module).forward, weakref(module), offload_to_cpu):",
      isinstance(wrapped.__dict__.get("forward"), functools.partial)
      and wrapped.forward.func is fsa._checkpointed_forward)

print("dropout, wrapped vs plain:", differ(run(True), run(False)))
print("BatchNorm1d in train mode, wrapped vs plain:", differ(run(True, batchnorm=True), run(False, batchnorm=True)))
for float_inputs in (False, True):
    label = f"autocast(cpu, bfloat16), {'float32' if float_inputs else 'bfloat16'} block inputs, wrapped vs plain"
    try:
        print(f"{label}:", differ(run(True, autocast_dtype=torch.bfloat16, float_inputs=float_inputs),
                                  run(False, autocast_dtype=torch.bfloat16, float_inputs=float_inputs)))
    except Exception as exc:  # noqa: BLE001 (a measured fact, printed)
        frames = "".join(__import__("traceback").format_tb(exc.__traceback__))
        where = "in backward (the recompute)" if ".backward()" in frames else "in forward"
        print(f"{label}: raised {where} {type(exc).__name__}: {exc}")
with torch.autocast("cpu", dtype=torch.bfloat16):
    print("under autocast(cpu): torch.is_autocast_enabled() (what fairscale stashes) =", torch.is_autocast_enabled(),
          "; torch.is_autocast_enabled('cpu') =", torch.is_autocast_enabled("cpu"))

print("bypass with fairscale's own disable_checkpointing(), wrapped vs plain:",
      differ(run(True, bypass=fsa.disable_checkpointing), run(False)))


@contextlib.contextmanager
def bypass_apply():
    """fairscale.CheckpointFunction.apply -> a direct call that fills parent_ctx_dict as forward does."""
    def direct(dummy, run_function, parent_ctx_dict, kwarg_keys, *flat_args):
        args, kwargs = fsa.unpack_kwargs(kwarg_keys, flat_args)
        outputs = run_function(*args, **kwargs)
        parent_ctx_dict["output_requires_grad"] = True
        if not isinstance(outputs, torch.Tensor):
            outputs, parent_ctx_dict["packed_non_tensor_outputs"] = fsa.split_non_tensors(outputs)
        return outputs

    fsa.CheckpointFunction.apply = staticmethod(direct)
    try:
        yield
    finally:
        del fsa.CheckpointFunction.apply


print("bypass by patching CheckpointFunction.apply, wrapped vs plain:", differ(run(True, bypass=bypass_apply), run(False)))
ac = dict(autocast_dtype=torch.bfloat16, float_inputs=True)  # the checkpoint itself differs here
print("both bypasses under autocast (float32 inputs), wrapped vs plain:",
      differ(run(True, bypass=fsa.disable_checkpointing, **ac), run(False, **ac)), "|",
      differ(run(True, bypass=bypass_apply, **ac), run(False, **ac)))
state = copy.deepcopy(build(True).state_dict())
print("state_dict keys of a wrapped model are the plain model's:", list(state) == list(build(False).state_dict()))

# The unknown-implementation prototype on fairscale (recompute_probe.py beside this file).
from recompute_probe import Probe  # noqa: E402


def probed(autocast_dtype=None):
    model = build(True)
    x = torch.randn(8, 16)
    probe = Probe(model)
    ctx = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with probe.watching():
        with ctx:
            h = model[0](x)
            for b in model[1:]:
                h = b(h.float())
        h.float().pow(2).mean().backward()
    return f"{probe.summary()}; differences: {sorted({d.what for d in probe.differences()}) or 'none'}"


print("recompute_probe on checkpoint_wrapper:", probed())
print("recompute_probe on checkpoint_wrapper under autocast (float32 inputs):", probed(torch.bfloat16))
