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
