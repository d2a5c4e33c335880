"""Twin evidence for fixtures/twins/compiled_budget.py (the partitioner recomputes dropout).

Twin of a compiled step: the same step recompiled with ``activation_memory_budget = 1.0``
(no partitioner recompute).  The factory compiled the step under its budget; Dynamo does
not guard on functorch's config, so the twin has to drop the compiled graphs
(``torch._dynamo.reset()``) for the new budget to take effect.  A second twin runs the
module uncompiled (eager).
"""

import contextlib

import torch
import torch._functorch.config as functorch_config
from twin import load_fixture, patched, show

fx = load_fixture("compiled_budget")


@contextlib.contextmanager
def recompiled_at_full_budget():
    torch._dynamo.reset()
    try:
        with functorch_config.patch(activation_memory_budget=1.0):
            yield
    finally:
        torch._dynamo.reset()


def uncompiled():
    """Every ``OptimizedModule`` call runs its original module (eager)."""
    from torch._dynamo.eval_frame import OptimizedModule

    def direct(self, *args, **kwargs):
        return self._orig_mod(*args, **kwargs)

    return patched(OptimizedModule, "__call__", direct)


for variant in ("step", "fixed_step"):
    build = (lambda: fx.make_step()) if variant == "step" else (lambda: fx.make_step(fixed=True))
    show(f"compiled_budget: {variant} vs the step recompiled at budget 1.0", build, recompiled_at_full_budget,
         watch=(variant == "step"))
    show(f"compiled_budget: {variant} vs the module run eagerly", build, uncompiled, watch=False)


# --- the facts behind the twin recipe ---------------------------------------------------------
import torch.nn.functional as F  # noqa: E402
from torch._dynamo.backends.debugging import aot_eager  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402


def fresh_backend():
    def backend(gm, example_inputs):
        return aot_eager(gm, example_inputs)
    return backend


print("== smallest cases: x.grad (8 elements) of a compiled function vs eager, per budget")
cases = {"dropout(x).pow(2)": lambda x: F.dropout(x, 0.5).pow(2),
         "dropout(x) * x": lambda x: F.dropout(x, 0.5) * x}
for name, f in cases.items():
    for budget in (1.0, 0.99):
        x = torch.randn(8, requires_grad=True, generator=torch.Generator().manual_seed(0))
        compiled_f = torch.compile(f, backend=fresh_backend())
        with functorch_config.patch(activation_memory_budget=budget):
            torch.manual_seed(1)
            compiled_f(x).sum().backward()
        got, x.grad = x.grad.clone(), None
        torch.manual_seed(1)
        f(x).sum().backward()
        print(f"  {name:20s} budget {budget}: {int((got != x.grad).sum())} of 8 differ")

print("== a budget changed after compiling: recompiled?")
torch._dynamo.reset()
counters.clear()
torch.manual_seed(0)
m = fx.mlp()
c = torch.compile(m, backend="aot_eager")
x = torch.randn(16, 32)


def grads_at(budget):
    for p in m.parameters():
        p.grad = None
    torch.manual_seed(1)
    with functorch_config.patch(activation_memory_budget=budget):
        loss = c(x).pow(2).mean()
    loss.backward()
    return [p.grad.clone() for p in m.parameters()]


def eager_grads():
    for p in m.parameters():
        p.grad = None
    torch.manual_seed(1)
    m(x).pow(2).mean().backward()
    return [p.grad.clone() for p in m.parameters()]


ref = eager_grads()
for label, budget in (("first call, 0.5", 0.5), ("second call, 1.0", 1.0)):
    g = grads_at(budget)
    print(f"  {label}: grads equal eager {[torch.equal(a, b) for a, b in zip(g, ref)]}, "
          f"unique graphs {counters['stats']['unique_graphs']}")
torch._dynamo.reset()
g = grads_at(1.0)
print(f"  after torch._dynamo.reset(), 1.0: grads equal eager {[torch.equal(a, b) for a, b in zip(g, ref)]}")

print("== two instances of one class, string backend 'aot_eager', compiled under 0.5 then 1.0")
torch._dynamo.reset()
counters.clear()
results = []
for budget in (0.5, 1.0):
    torch.manual_seed(0)
    m = fx.mlp()
    c = torch.compile(m, backend="aot_eager")
    with functorch_config.patch(activation_memory_budget=budget):
        c(x)
    torch.manual_seed(1)
    c(x).pow(2).mean().backward()
    g = [p.grad.clone() for p in m.parameters()]
    ref = eager_grads()
    results.append(f"budget {budget}: equal eager {[torch.equal(a, b) for a, b in zip(g, ref)]}")
print("  " + "; ".join(results) + f"; unique graphs {counters['stats']['unique_graphs']}")
torch._dynamo.reset()
