"""Accuracy of recheck.measure against values written down from the shapes.

The models are small copies of ``fixtures/models/cost_demo.py``.  Every analytic value
below follows from the autograd formulas of the operators the demo uses (listed in the
demo's docstring), in float32 (4 bytes), with parameters excluded:

* a transformer block saves: ln1 and ln2 each their input plus per-row mean and rstd
  (N·D + 2N), the qkv input (N·D), q and k heads (2·N·D), the softmax result (B·H·S·S),
  v heads (N·D), the merged heads (N·D), the fc1 input (N·D), the GELU input and the fc2
  input (2·N·FF), where N = B·S;
* an MLP layer (Linear then GELU) saves the Linear input and the GELU input;
* the embedding Linear saves the random data (N·D); ``pow`` in the loss saves the output.

The observed peak is compared with torch's MemTracker, an independent tracker.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed._tools.mem_tracker import MemTracker

from recheck.cost import measure
from recheck.cost.router import Router, routing

F32 = 4
B, S, D, H, FF = 2, 8, 16, 2, 32
N = B * S
SMALL = dict(seq=S, dim=D, heads=H, hidden=FF, default_batch=B)


def block_saved_bytes() -> int:
    layer_norm = N * D + 2 * N
    return F32 * (2 * layer_norm + N * D + 2 * N * D + B * H * S * S + N * D + N * D + N * D + 2 * N * FF)


def block_forward_flops() -> int:
    gemm = 2 * N * D * 3 * D + 2 * N * D * D + 2 * N * D * FF + 2 * N * FF * D
    attention = 2 * (2 * (B * H) * S * S * (D // H))
    return gemm + attention


def retained_peaks(data: int, inputs: list[int], saved: list[int], out: int) -> tuple[int, int, int]:
    """(checkpointed peak, checkpointed at end of forward, bypassed peak) for a chain of regions.

    Checkpointed: at the end of forward autograd holds the data (saved by the embedding),
    every region's input and the loss's saved output.  Backward frees the output first,
    then region k (last to first) is recomputed while the inputs of regions 0..k are kept:
    its full saved set is alive, its own input counted once.  Bypassed: every region's
    saved set is alive at the end of forward (a region's input is saved by its first op).
    """
    end_of_forward = data + sum(inputs) + out
    during_recompute = [data + sum(inputs[: k + 1]) + saved[k] - inputs[k] for k in range(len(inputs))]
    return max([end_of_forward, *during_recompute]), end_of_forward, data + sum(saved) + out


def memtracker_peak(step, model, opt, bypass: bool) -> int:
    tracker = MemTracker()
    tracker.track_external(model, opt)
    router = Router()
    router.reset("bypass" if bypass else "checkpoint")
    with routing(router), tracker:
        step()
    return sum(device["Total"] for device in tracker.get_tracker_snapshot("peak").values())


def close(measured: int, expected: int, tolerance: float = 0.01) -> bool:
    return abs(measured - expected) <= tolerance * expected


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_transformer_stack_retained_state_matches_the_shapes(demo, reentrant):
    layers = 3
    step, model, opt = demo.make_step(**SMALL, blocks=layers, mlp_layers=0, poor_region=False, block_reentrant=reentrant)
    cmp = measure(step, repeats=1)
    per_block = block_saved_bytes()
    peak, end_of_forward, plain = retained_peaks(F32 * N * D, [F32 * N * D] * layers, [per_block] * layers, F32 * N * D)
    c, b = cmp.checkpointed, cmp.bypassed
    assert close(c.retained_peak, peak), (c.retained_peak, peak)
    assert close(c.retained_end_of_forward, end_of_forward), (c.retained_end_of_forward, end_of_forward)
    assert close(b.retained_peak, plain), (b.retained_peak, plain)
    assert close(b.retained_end_of_forward, plain), (b.retained_end_of_forward, plain)
    # the peak is reached while the last block is rebuilt: the recompute is seen, not inferred
    assert c.retained_peak > c.retained_end_of_forward
    assert c.retained_peak_split["recomputed" if not reentrant else "saved"] > 0


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_transformer_stack_observed_peak_agrees_with_memtracker(demo, reentrant):
    kwargs = dict(**SMALL, blocks=3, mlp_layers=0, poor_region=False, block_reentrant=reentrant)
    step, model, opt = demo.make_step(**kwargs)
    cmp = measure(step, repeats=1)
    for mode, bypass in (("checkpointed", False), ("bypassed", True)):
        fresh_step, fresh_model, fresh_opt = demo.make_step(**kwargs)
        independent = memtracker_peak(fresh_step, fresh_model, fresh_opt, bypass)
        observed = cmp.modes[mode].observed_peak
        assert close(observed, independent), (mode, observed, independent)
        assert sum(cmp.modes[mode].peak_breakdown.values()) == observed


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_block_regions_report_saved_kept_and_recompute_work(demo, reentrant):
    layers = 2
    step, model, opt = demo.make_step(**SMALL, blocks=layers, mlp_layers=0, poor_region=False, block_reentrant=reentrant)
    cmp = measure(step, repeats=1)
    (region,) = cmp.regions
    assert region.name == "Block.forward"
    assert region.invocations == layers and region.recomputes == layers
    assert region.saved_bytes == layers * block_saved_bytes()
    assert region.inputs_kept_bytes == layers * F32 * N * D
    # non-reentrant stops the replay once the last saved tensor (fc2's input) is saved again,
    # before fc2's GEMM runs; reentrant replays the whole block
    skipped = 0 if reentrant else 2 * N * FF * D
    assert region.recompute.flops == layers * (block_forward_flops() - skipped)
    assert cmp.recompute.flops == region.recompute.flops
    assert cmp.checkpointed.work["forward"].flops == cmp.bypassed.work["forward"].flops
    assert region.verdict == "ok"


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_mlp_chain_retained_state_matches_the_shapes(demo, reentrant):
    layers = 3
    step, model, opt = demo.make_step(**SMALL, blocks=0, mlp_layers=layers, poor_region=False, mlp_reentrant=reentrant)
    cmp = measure(step, repeats=1)
    inputs = [F32 * N * D] + [F32 * N * FF] * (layers - 1)
    saved = [inp + F32 * N * FF for inp in inputs]
    peak, end_of_forward, plain = retained_peaks(F32 * N * D, inputs, saved, F32 * N * FF)
    assert close(cmp.checkpointed.retained_peak, peak), (cmp.checkpointed.retained_peak, peak)
    assert close(cmp.checkpointed.retained_end_of_forward, end_of_forward)
    assert close(cmp.bypassed.retained_peak, plain), (cmp.bypassed.retained_peak, plain)
    (region,) = cmp.regions
    assert region.saved_bytes == sum(saved) and region.inputs_kept_bytes == sum(inputs)
    fresh = demo.make_step(**SMALL, blocks=0, mlp_layers=layers, poor_region=False, mlp_reentrant=reentrant)
    assert close(cmp.checkpointed.observed_peak, memtracker_peak(*fresh, bypass=False))


def test_region_that_saves_nothing_is_flagged(demo):
    step, model, opt = demo.make_step(**SMALL, blocks=1, mlp_layers=0, poor_region=True)
    cmp = measure(step, repeats=1)
    by_name = {r.name.rsplit(".", 1)[-1]: r for r in cmp.regions}
    tanh, block = by_name["tanh"], by_name["forward"]
    # tanh saves its result, exactly as large as the input its checkpoint keeps
    assert tanh.saved_bytes == F32 * N * D and tanh.inputs_kept_bytes == F32 * N * D
    assert tanh.net_bytes == 0
    assert tanh.verdict.startswith("saves nothing")
    assert block.verdict == "ok"
    assert cmp.regions[-1] is tanh  # ranked last
    assert "saves nothing" in str(cmp)


def test_bypassed_backward_is_twice_the_forward_gemms(demo):
    # without checkpoints every GEMM's backward is two GEMMs, except the embedding's,
    # whose input (the data) needs no gradient: one GEMM
    step, model, opt = demo.make_step(**SMALL, blocks=2, mlp_layers=0, poor_region=False)
    cmp = measure(step, repeats=1)
    embed = 2 * N * D * D
    forward = cmp.bypassed.work["forward"].flops
    assert forward == embed + 2 * block_forward_flops()
    assert cmp.bypassed.work["backward"].flops == 2 * forward - embed
    assert cmp.checkpointed.work["forward"].bytes_moved == cmp.bypassed.work["forward"].bytes_moved
    assert cmp.recompute.bytes_moved > 0  # pointwise replay is counted, not free


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch=st.integers(1, 3),
    seq=st.sampled_from([2, 4, 6]),
    heads=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([2, 4]),
    hidden=st.sampled_from([4, 12]),
    blocks=st.integers(1, 3),
    mlp_layers=st.integers(0, 2),
    reentrant=st.booleans(),
)
def test_any_small_stack_matches_the_shapes(demo, batch, seq, heads, head_dim, hidden, blocks, mlp_layers, reentrant):
    dim = heads * head_dim
    n = batch * seq
    step, _, _ = demo.make_step(
        seq=seq, dim=dim, heads=heads, hidden=hidden, blocks=blocks, mlp_layers=mlp_layers, poor_region=False,
        block_reentrant=reentrant, mlp_reentrant=not reentrant, default_batch=batch, optimizer=False,
    )
    block = F32 * (2 * (n * dim + 2 * n) + 6 * n * dim + batch * heads * seq * seq + 2 * n * hidden)
    inputs = [F32 * n * dim] * blocks + [F32 * n * (dim if i == 0 else hidden) for i in range(mlp_layers)]
    saved = [block] * blocks + [inp + F32 * n * hidden for inp in inputs[blocks:]]
    out = F32 * n * (hidden if mlp_layers else dim)
    peak, end_of_forward, plain = retained_peaks(F32 * n * dim, inputs, saved, out)
    cmp = measure(step, repeats=1)
    assert close(cmp.checkpointed.retained_peak, peak), (cmp.checkpointed.retained_peak, peak)
    assert close(cmp.checkpointed.retained_end_of_forward, end_of_forward)
    assert close(cmp.bypassed.retained_peak, plain), (cmp.bypassed.retained_peak, plain)
