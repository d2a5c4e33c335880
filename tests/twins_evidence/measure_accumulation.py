"""Accumulation order is not a hazard: reentrant vs uncheckpointed in float32 and float64.

For each twin pair: the number of differing elements, the largest difference in ulp and
relative to the largest gradient, and that relative size divided by the dtype's epsilon.
Rounding gives a ratio of order one in both dtypes (the difference shrinks with the
precision); a hazard keeps the same relative size in float64 (ratio ~1e13 there).
"""

import torch
from twin import bypass_apply, bypass_torch_checkpoint, end_state, load_fixture, ulp_distance

shared = load_fixture("encoder_decoder")
diffusion = load_fixture("diffusion_checkpoint")
moe = load_fixture("moe_router")


def grads(state):
    return {k: v for k, v in state.items() if k.startswith("grad ") and v is not None}


def summarize(title, written, bypassed, dtype):
    """Differences relative to the tensor's own largest gradient and to the model's largest one.

    The model-wide scale matters: a gradient that is mathematically zero (the bias of an
    attention key projection: softmax ignores a per-query constant) is pure rounding noise,
    100% of its own largest element whatever the precision.
    """
    eps = torch.finfo(dtype).eps
    scale = max(g.abs().max().item() for g in grads(bypassed).values())
    worst_own, worst_key, worst_global, worst_ulp, worst_ulp_big, differ = 0.0, None, 0.0, 0, 0, 0
    for key, a in grads(written).items():
        b = bypassed[key]
        if torch.equal(a, b):
            continue
        differ += 1
        diff = (a - b).abs().max().item()
        own = diff / b.abs().max().item() if b.abs().max().item() else float("inf")
        if own > worst_own:
            worst_own, worst_key = own, key
        worst_global = max(worst_global, diff / scale)
        ulps = ulp_distance(a, b)
        worst_ulp = max(worst_ulp, int(ulps.max()))
        big = b.abs() >= 1e-3 * scale  # elements not near zero (no sign crossings)
        if big.any():
            worst_ulp_big = max(worst_ulp_big, int(ulps[big].max()))
    total = len(grads(written))
    print(f"  {title:50s} {str(dtype)[6:]:7s} {differ:2d} of {total} grads differ; max {worst_ulp} ulp "
          f"({worst_ulp_big} ulp where |g| >= 1e-3 of the largest |grad|); "
          f"max |diff| / largest |grad| of the model {worst_global:.3g} ({worst_global / eps:.3g} eps); "
          f"/ own largest {worst_own:.3g} ({worst_key})")


def direct(run_function, length, *args):
    return run_function(*args[:length])


print("== rounding: BART-like cross-attention, reentrant layers, tied embedding")
for dtype in (torch.float32, torch.float64):
    build = lambda dtype=dtype: shared.make_step(dtype=dtype)  # noqa: E731
    summarize("encoder_decoder.step (reentrant) vs bypassed", end_state(build), end_state(build, bypass_torch_checkpoint()), dtype)
for dtype in (torch.float32, torch.float64):
    build = lambda dtype=dtype: shared.make_step(dtype=dtype, use_reentrant=False)  # noqa: E731
    summarize("encoder_decoder.nonreentrant_step vs bypassed", end_state(build), end_state(build, bypass_torch_checkpoint()), dtype)



def shared_weight_case(case, dtype, checkpointed):
    """Two small cases beside the fixture: where accumulation order changes and where it does not."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    w = torch.randn(64, 64, dtype=dtype, requires_grad=True)
    x = torch.randn(32, 64, dtype=dtype)
    call = (lambda f, *a: checkpoint(f, *a, use_reentrant=True)) if checkpointed else (lambda f, *a: f(*a))
    h = torch.tanh(x @ w)
    if case == "one weight, twice inside a reentrant region and twice outside":
        h = call(lambda t: torch.tanh(torch.tanh(t @ w) @ w), h)
        loss = (h @ w).sin().sum()
    else:  # ALBERT-like: the weight only inside regions, one region per application
        for _ in range(3):
            h = call(lambda t: torch.tanh(t @ w), h)
        loss = h.sin().sum()
    loss.backward()
    return {"grad w": w.grad}


for case in ("one weight, twice inside a reentrant region and twice outside",
             "one weight applied in 3 reentrant regions only (ALBERT-like)"):
    for dtype in (torch.float32, torch.float64):
        summarize(case[:50], shared_weight_case(case, dtype, True), shared_weight_case(case, dtype, False), dtype)

print("== hazards, the same comparison in float64 (default dtype float64 while building and running)")
for dtype in (torch.float32, torch.float64):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        summarize("diffusion_checkpoint.step (dropout mask redrawn)", end_state(diffusion.make_step),
                  end_state(diffusion.make_step, bypass_apply(diffusion.CheckpointFunction, direct)), dtype)
        summarize("moe_router.step (aux loss trains nothing)", end_state(moe.make_step),
                  end_state(moe.make_step, bypass_torch_checkpoint()), dtype)
    finally:
        torch.set_default_dtype(previous)
