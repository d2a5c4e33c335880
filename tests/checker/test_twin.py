"""``recheck.check_step()``: a whole step against its uncheckpointed twin (fixtures/twins/)."""

from __future__ import annotations

import functools
from pathlib import Path
import os
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck
from source_modules import load_file

ROOT = Path(__file__).resolve().parents[2]


TWINS = ROOT / "fixtures" / "twins"


@functools.lru_cache(maxsize=None)
def twin(name: str):
    """A fixture module of fixtures/twins/, imported once (its folder importable while it loads)."""
    import sys

    sys.path.insert(0, str(TWINS))
    try:
        return load_file(TWINS / f"{name}.py", f"recheck_twin_{name}")
    finally:
        sys.path.remove(str(TWINS))


def _check(step, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return recheck.check_step(step, **options)


def _state(model: nn.Module, optimizer=None):
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    values = [t.detach().clone() for t in model.state_dict().values()]
    versions = [p._version for p in model.parameters()]
    return grads, values, versions, torch.get_rng_state(), optimizer.state_dict() if optimizer else None


def _same(a, b) -> bool:
    (ga, va, na, ra, _), (gb, vb, nb, rb, _) = a, b
    return (na == nb and torch.equal(ra, rb) and all(torch.equal(x, y) for x, y in zip(va, vb))
            and all((x is None) == (y is None) and (x is None or torch.equal(x, y)) for x, y in zip(ga, gb)))


@pytest.mark.slow
def test_a_step_whose_parameters_wrap_other_tensors_is_checked_and_put_back():
    """FSDP2's parameters are DTensors, which wrap a local shard (here torch's TwoTensor): the
    step's state is read through the tensors they wrap."""
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    torch.manual_seed(0)
    layer = nn.Linear(3, 3)
    layer.weight = nn.Parameter(two_tensor.TwoTensor(torch.randn(3, 3), torch.randn(3, 3)))
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = two_tensor.TwoTensor(torch.randn(2, 3), torch.randn(2, 3)).requires_grad_()

    def step(preserve_rng_state):
        optimizer.zero_grad()
        out = checkpoint(lambda t: nn.functional.dropout(layer(t), 0.5).relu(), x, use_reentrant=False,
                         preserve_rng_state=preserve_rng_state)
        out.sum().backward()
        optimizer.step()

    before = (layer.weight.a.clone(), layer.weight.b.clone())
    assert recheck.check_step(functools.partial(step, True), modules=[layer], optimizers=[optimizer]).ok
    found = recheck.check_step(functools.partial(step, False), modules=[layer], optimizers=[optimizer])
    found_in = {(f.kind, f.subject) for f in found.findings}
    assert {("gradient", "grad of `layer.weight`"), ("state", "parameter `layer.weight`")} <= found_in, str(found)
    assert torch.equal(layer.weight.a, before[0]) and torch.equal(layer.weight.b, before[1])


def test_moe_router_under_reentrant_checkpoint_trains_a_different_gate():
    module = twin("moe_router")
    step, model = module.make_step()
    before = _state(model)
    report = _check(step)
    gates = [f for f in report.by_kind("gradient") if f.subject.endswith("block_sparse_moe.gate.weight`")]
    assert len(gates) == 2, str(report)
    assert "differs from the uncheckpointed step's" in gates[0].message
    assert _same(before, _state(model))  # a check leaves no trace
    fixed, _ = module.make_step(fixed=True)
    assert _check(fixed).ok


@pytest.mark.slow
def test_levit_eval_cache_filled_under_no_grad_leaves_the_biases_without_gradient():
    module = twin("levit_cache")
    report = _check(module.step)
    missing = [f for f in report.by_kind("gradient") if "is missing under checkpoint" in f.message]
    assert missing and all("attention_biases" in f.subject for f in missing), str(report)
    assert _check(module.fixed_step).ok


@pytest.mark.slow
def test_aux_loss_tracker_in_another_module_is_state_of_the_step():
    report = _check(twin("moe_tracker").step)
    assert any("_TRACKER" in (f.subject or "") for f in report.by_kind("state")), str(report)
    assert _check(twin("moe_tracker").fixed_step).ok


@pytest.mark.slow
def test_accumulation_order_is_a_note_with_its_size_not_a_finding():
    report = _check(twin("encoder_decoder").step)
    assert report.ok, str(report)
    (note,) = [n for n in report.notes if "only by rounding" in n]
    assert "ulp" in note and "rerun in float64" in note


@pytest.mark.slow
def test_a_compiled_step_is_compared_with_its_eager_twin():
    module = twin("compiled_budget")
    report = _check(module.step)
    assert report.by_kind("gradient"), str(report)
    assert any('set_stance("force_eager")' in n for n in report.notes)
    assert _check(module.fixed_step).ok


@pytest.mark.slow
def test_a_tolerance_is_applied_as_given_and_says_so():
    report = _check(twin("encoder_decoder").step, atol=1e-6, rtol=0)
    assert report.ok and "tolerance: up to atol=1e-06, rtol=0 allowed" in report.title


class _block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.fc(x))


def test_the_step_raising_restores_everything_and_propagates():
    torch.manual_seed(0)
    model = _block()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4, requires_grad=True)

    def step():
        checkpoint(model, x, use_reentrant=False).sum().backward()
        optimizer.step()
        raise ValueError("boom")

    before = _state(model)
    with pytest.raises(ValueError, match="boom"):
        _check(step)
    assert _same(before, _state(model))


def test_a_step_that_differs_from_run_to_run_is_not_blamed_on_checkpointing(tmp_path):
    torch.manual_seed(0)
    model = _block()
    x = torch.randn(2, 4, requires_grad=True)

    factors = tmp_path / "factors"
    factors.write_bytes(bytes([0, 2, 0, 2, 1]))  # each run's jitter: the twin's between the step's own
    source = os.open(factors, os.O_RDONLY)  # a descriptor, whose position no check puts back

    def step():
        jitter = 1.0 + 0.1 * int.from_bytes(os.read(source, 1) or b"\x00", "little")
        return (checkpoint(model, x, use_reentrant=False).sum() * jitter).detach()

    try:
        report = _check(step, repeats=2)
    finally:
        os.close(source)
    assert report.ok, str(report)
    assert any("not deterministic from run to run" in n for n in report.notes)


def test_bad_options_and_nesting_are_refused():
    with pytest.raises(TypeError, match="zero-argument callable"):
        recheck.check_step(3)
    with pytest.raises(ValueError, match="repeats"):
        recheck.check_step(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="atol was given without rtol"):
        recheck.check_step(lambda: None, atol=1e-3)
    from recheck.intercept.bypass import bypassing

    with bypassing():  # another check's interception (a bypassed twin, measure()): refused
        with pytest.raises(RuntimeError, match="already intercepted"):
            recheck.check_step(lambda: None)
    with recheck.watch() as w:  # a watch() block sets itself aside for the check (issue 40)
        assert recheck.check_step(lambda: None).ok
    assert any("recheck.check_step() ran inside this block" in note for note in w.report.notes)


def test_assert_step_equal_raises_with_the_report():
    with pytest.raises(recheck.RecomputeMismatch) as info:
        recheck.assert_step_equal(twin("levit_cache").step)
    assert "is missing under checkpoint" in str(info.value)


@pytest.mark.parametrize(("name", "kinds"), [("diffusion_checkpoint", {"rng", "recompute"}),
                                              ("amp_checkpoint", {"context", "recompute"})])
def test_a_hand_written_checkpoint_nothing_names_is_still_seen(name, kinds):
    module = twin(name)
    report = _check(module.step)
    assert kinds <= report.kinds, str(report)
    assert any("recomputed by CheckpointFunction" in (f.region or "") for f in report), str(report)
    assert _check(module.fixed_step).ok


def test_declared_checkpoint_functions_are_bypassed_in_the_twin():
    calls = []

    def my_checkpoint(function, *args):  # a project's own checkpoint, declared by name
        calls.append(function)
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=True)

    import sys
    import types

    holder = types.ModuleType("recheck_test_declared")
    holder.my_checkpoint = my_checkpoint
    sys.modules["recheck_test_declared"] = holder
    torch.manual_seed(0)
    model = _block()
    x = torch.randn(2, 4, requires_grad=True)

    def step():
        out = holder.my_checkpoint(model, x)
        out.sum().backward()
        return out.detach()

    try:
        report = _check(step, checkpoint_functions=["recheck_test_declared.my_checkpoint"])
    finally:
        del sys.modules["recheck_test_declared"]
    assert report.ok, str(report)
    assert not any("not bypassed" in n or "not intercepted" in n for n in report.notes), report.notes


def test_the_twin_keeps_the_values_it_left_alike_as_the_step_as_written_left_them():
    from recheck.checker.twin import Twin

    torch.manual_seed(0)
    model = nn.Sequential(_block(), nn.Dropout(0.5), _block())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(2, 4, requires_grad=True)

    def step():  # two branches; the checkpointed one draws its dropout mask anew in the recompute
        optimizer.zero_grad()
        a = checkpoint(lambda v: model[1](model[0](v)), x, use_reentrant=False, preserve_rng_state=False)
        (a + model[2](x)).sum().backward()
        optimizer.step()

    step()
    before = _state(model, optimizer)
    twin = Twin(step)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            written = twin.run("as written", {})
            bypassed = twin.run("bypassed", {}, reference=written)
    finally:
        twin.restore()
    shared = {key[1] for key, seen in bypassed.post.items()
              if isinstance(seen.value, torch.Tensor) and seen.value is written.post[key].value}
    # the plain branch's parameters and Adam's moments of them are alike: one value for both runs
    assert {"parameter `model.2.fc.weight`", "optimizer state `model.2.fc.weight.exp_avg`"} <= shared
    # the checkpointed branch's differ: each run keeps its own, and the twin says where
    assert not {"parameter `model.0.fc.weight`", "optimizer state `model.0.fc.weight.exp_avg`"} & shared
    assert _same(before, _state(model, optimizer))
    report = _check(step)
    assert "parameter `model.0.fc.weight`" in {f.subject for f in report.by_kind("state")}, str(report)
    assert "parameter `model.2.fc.weight`" not in {f.subject for f in report.by_kind("state")}


def _adam_step(preserve_rng_state: bool):
    """A step of two branches with AdamW; the checkpointed branch's dropout draws its mask anew
    in the recompute unless ``preserve_rng_state``."""
    torch.manual_seed(0)
    model = nn.Sequential(_block(), nn.Dropout(0.5), _block())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)

    def step():
        optimizer.zero_grad()
        a = checkpoint(lambda v: model[1](model[0](v)), x, use_reentrant=False,
                       preserve_rng_state=preserve_rng_state)
        (a + model[2](x)).sum().backward()
        optimizer.step()

    step()
    return step, model, optimizer


@pytest.mark.parametrize(("preserve", "runs"), [(True, 2), (False, 4)])
def test_the_step_as_written_keeps_digests_and_runs_again_with_copies_only_where_its_twin_differs(
        monkeypatch, preserve, runs):
    from recheck.checker.twin import Twin
    from recheck.runtime.snapshot import DigestedTensor

    made = []
    real = Twin.run

    def counted(self, mode, *args, **kwargs):  # noqa: ANN001, ANN202
        made.append((mode, kwargs.get("lean", False)))
        run = real(self, mode, *args, **kwargs)
        made[-1] += (run,)
        return run

    monkeypatch.setattr(Twin, "run", counted)
    step, model, optimizer = _adam_step(preserve)
    before = _state(model, optimizer)
    report = _check(step)
    assert [(mode, lean) for mode, lean, _ in made] == [("as written", True), ("bypassed", False)] + \
        [("as written", False), ("bypassed", False)] * (runs == 4)
    assert report.stats["runs"] == runs
    lean_written = made[0][2]
    # what the run changed is kept as digests: parameters, their gradients and Adam's moments
    kept = [seen.value for seen in lean_written.post.values()] + list(lean_written.grads.values())
    assert sum(type(value) is DigestedTensor for value in kept) >= 3 * len(list(model.parameters()))
    assert _same(before, _state(model, optimizer))
    if preserve:
        assert report.ok, str(report)
        assert all(made[1][2].grads[name] is grad for name, grad in lean_written.grads.items())
    else:  # the findings come from the runs with copies: their first difference is told
        (weight,) = [f for f in report.by_kind("state") if f.subject == "parameter `model.0.fc.weight`"]
        assert "first difference at index" in weight.detail, str(report)


def test_buffers_are_copied_in_the_lean_run_so_batchnorms_statistics_need_no_second_round(monkeypatch):
    from recheck.checker.twin import Twin

    made = []
    real = Twin.run
    monkeypatch.setattr(Twin, "run", lambda self, mode, *a, **k: made.append(mode) or real(self, mode, *a, **k))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)

    def step():  # BatchNorm in the checkpointed region: its statistics are updated again by the recompute
        optimizer.zero_grad()
        checkpoint(model, x, use_reentrant=False).sum().backward()
        optimizer.step()

    step()
    report = _check(step)
    assert made == ["as written", "bypassed"]
    (mean,) = [f for f in report.by_kind("buffer") if f.subject.endswith("running_mean`")
               and "uncheckpointed" in f.message]
    assert "first difference at index" in mean.detail, str(report)


def test_the_check_puts_the_state_back_once_a_run_and_not_again_at_its_end(monkeypatch):
    from recheck.runtime.snapshot import Snapshot

    restores = []
    real = Snapshot.restore
    monkeypatch.setattr(Snapshot, "restore", lambda self, *a, **k: restores.append(a or k) or real(self, *a, **k))
    step, model, optimizer = _adam_step(True)
    before = _state(model, optimizer)
    assert _check(step).ok
    assert len(restores) == 2  # after each run; the state was as captured at the end
    assert _same(before, _state(model, optimizer))
