"""recheck.checker.check on small regions: one test per hazard kind, both variants, bad input."""

from __future__ import annotations

import functools
import logging
import random

import numpy as np
import pytest
import torch
from torch import nn

from recheck.checker import RegionError, assert_recompute_equal, check
from recheck.findings import FIRST_LINE, RecomputeMismatch

VARIANTS = pytest.mark.parametrize("use_reentrant", [False, True], ids=["nonreentrant", "reentrant"])
COUNTER = 0
FLAG = 1.0
LOG = logging.getLogger("recheck.tests.engine")


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))


@VARIANTS
def test_mlp_is_clean(use_reentrant):
    torch.manual_seed(0)
    report = check(_mlp(), _x(3, 4), use_reentrant=use_reentrant)
    assert report.ok, str(report)
    assert str(report).startswith("recheck: no difference found")


@VARIANTS
def test_dropout_with_default_rng_is_clean(use_reentrant):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 4))
    assert check(model, _x(3, 4), use_reentrant=use_reentrant).ok


@VARIANTS
def test_dropout_without_preserved_rng_is_found(use_reentrant):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 4))
    report = check(model, _x(3, 4), use_reentrant=use_reentrant, preserve_rng_state=False)
    assert {"rng", "recompute", "gradient"} <= report.kinds, str(report)
    rng = report.by_kind("rng")[0]
    assert rng.subject == "cpu RNG" and "RC002" in (rng.hint or "")
    grad = next(f for f in report.by_kind("gradient") if f.subject == "grad of `0.weight`")
    assert "elements differ bitwise" in grad.detail and "first difference at index" in grad.detail


def test_a_saved_tensor_that_differs_shows_its_first_differing_element():
    # the forward's saved tensors are held and compared byte for byte: the detail names the element
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 4))
    report = check(model, _x(3, 4), preserve_rng_state=False)
    [saved] = [f for f in report.by_kind("recompute") if f.subject == "saved tensors"]
    assert saved.detail.startswith("saved tensor #") and "first difference at index" in saved.detail, saved.detail
    assert "also differ: saved tensor #" in saved.detail, saved.detail
    # checkpointed (digests), again keeping copies for the detail, plain, full replay
    assert report.stats["runs"] == 4


def test_a_clean_check_runs_twice():
    torch.manual_seed(0)
    report = check(_mlp(), _x(3, 4))
    assert report.ok and report.stats["runs"] == 2 and report.stats["saved_tensors_compared"] > 0


def test_a_tolerance_compares_the_saved_tensors_by_value():
    # the saved tensors are compared within the tolerance, not bit for bit
    torch.manual_seed(0)
    scale = {"calls": 0}

    def region(x):
        scale["calls"] += 1
        return (x * (1 + 1e-7 * (scale["calls"] % 2))).sin()

    exact = check(region, _x(3, 4), early_stop=False)
    loose = check(region, _x(3, 4), early_stop=False, atol=1e-5, rtol=1e-5)
    saved = [f for f in exact.by_kind("recompute") if f.subject == "saved tensors"]
    assert saved and "first difference at index" in saved[0].detail, str(exact)
    assert "recompute" not in loose.kinds, str(loose)


@VARIANTS
def test_batchnorm_in_training_mode_is_a_buffer_finding(use_reentrant):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6))
    report = check(model, _x(5, 4), use_reentrant=use_reentrant)
    assert report.kinds == {"buffer"}, str(report)
    subjects = {f.subject for f in report.by_kind("buffer")}
    assert "buffer `1.running_mean`" in subjects and "buffer `1.num_batches_tracked`" in subjects
    assert all("RC106" in f.hint for f in report.by_kind("buffer"))
    assert check(model.eval(), _x(5, 4), use_reentrant=use_reentrant).ok


def test_a_module_with_a_wrapper_subclass_buffer_and_parameter_is_checked():
    """A tensor subclass without a storage of its own (FSDP2's DTensor; here torch's
    TwoTensor) as a parameter and a buffer: before, asking for the buffer's storage raised."""
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    torch.manual_seed(0)
    layer = nn.Linear(3, 3)
    layer.weight = nn.Parameter(two_tensor.TwoTensor(torch.randn(3, 3), torch.randn(3, 3)))
    layer.register_buffer("scale", two_tensor.TwoTensor(torch.ones(3), torch.ones(3)))

    def region(x):
        return (layer(x) * layer.scale).relu()

    x = two_tensor.TwoTensor(torch.randn(2, 3), torch.randn(2, 3)).requires_grad_()
    assert check(region, x).ok


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.lin(x))


@VARIANTS
def test_counter_is_a_state_finding(use_reentrant):
    model = Counter()
    report = check(model, _x(2, 4), use_reentrant=use_reentrant)
    assert report.kinds == {"state"}, str(report)
    finding = report.by_kind("state")[0]
    assert finding.subject == "attribute `self.calls`"
    assert "updated again by the recompute: 1 -> 2" in finding.message
    assert model.calls == 0


def _flips_global(x):
    global FLAG
    scale = FLAG
    FLAG = -FLAG
    return torch.sin(x * scale)


@VARIANTS
def test_global_flipped_by_the_region(use_reentrant):
    report = check(_flips_global, _x(3), use_reentrant=use_reentrant)
    assert {"global", "state"} <= report.kinds, str(report)
    glob = report.by_kind("global")[0]
    assert glob.subject.endswith(".FLAG`") and "RC101" in glob.hint
    assert "was 1.0 at forward and -1.0 at recompute" in glob.message
    assert FLAG == 1.0


def _prints(x):
    y = torch.exp(x)
    print("region ran")
    return y


def test_print_is_a_side_effect_in_reentrant_and_latent_under_early_stop(capsys):
    report = check(_prints, _x(3), use_reentrant=True)
    assert report.kinds == {"side_effect"} and not report.findings[0].latent
    assert "region ran" in report.findings[0].detail
    report = check(_prints, _x(3), use_reentrant=False)
    assert report.kinds == {"side_effect"}
    assert report.findings[0].latent and "(latent)" in str(report)
    assert check(_prints, _x(3), use_reentrant=False, early_stop=False).findings[0].latent is False
    assert capsys.readouterr().out.count("region ran") == 3  # the plain runs only


def _logs(x):
    LOG.debug("a record only where the level lets it through")
    return torch.sin(x)


@VARIANTS
def test_logging_is_a_side_effect_where_the_logger_makes_the_record(use_reentrant):
    # below the logger's level the call makes no record, at forward as at recompute: nothing repeats
    assert check(_logs, _x(3), use_reentrant=use_reentrant).ok
    LOG.setLevel(logging.DEBUG)
    try:
        report = check(_logs, _x(3), use_reentrant=use_reentrant)
    finally:
        LOG.setLevel(logging.NOTSET)
    assert "side_effect" in report.kinds, str(report)
    assert "a record only where the level" in report.by_kind("side_effect")[0].detail


def _mutates_mask(x, mask):
    mask.mul_(2.0)
    return torch.tanh(x * mask)


@VARIANTS
def test_input_mutation(use_reentrant):
    mask = torch.rand(3)
    before = mask.clone()
    version = mask._version
    report = check(_mutates_mask, _x(3), mask, use_reentrant=use_reentrant)
    mutation = report.by_kind("input_mutation")
    assert mutation and mutation[0].subject == "args[1]", str(report)
    assert torch.equal(mask, before) and mask._version == version


class GeneratorNoise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gen = torch.Generator().manual_seed(3)

    def forward(self, x):
        return torch.tanh(self.lin(x) * torch.rand(x.shape, generator=self.gen))


@VARIANTS
def test_explicit_generator(use_reentrant):
    model = GeneratorNoise()
    state = model.gen.get_state()
    report = check(model, _x(2, 4), use_reentrant=use_reentrant)
    assert {"rng", "gradient"} <= report.kinds, str(report)
    assert any(f.subject == "generator `self.gen`" for f in report.by_kind("rng"))
    assert torch.equal(model.gen.get_state(), state)


def _python_random(x):
    return torch.sin(x * random.random())


def _numpy_random(x):
    return torch.sin(x * float(np.random.rand()))


@VARIANTS
@pytest.mark.parametrize("region,subject", [(_python_random, "Python random"),
                                            (_numpy_random, "numpy global RNG")])
def test_host_rng(region, subject, use_reentrant):
    random.seed(1)
    np.random.seed(1)
    random.random(), np.random.rand()  # past the first twist: one draw moves only the position
    before = (random.getstate(), np.random.get_state()[1].copy())
    report = check(region, _x(3), use_reentrant=use_reentrant)
    assert {"rng", "gradient"} <= report.kinds, str(report)
    assert any(f.subject == subject for f in report.by_kind("rng"))
    assert random.getstate() == before[0] and (np.random.get_state()[1] == before[1]).all()


class AfterLastSave(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.tail_calls = 0

    def forward(self, x):
        y = torch.sin(self.lin(x))
        self.tail_calls += 1  # after the last op that saves a tensor
        return y * 2


def test_latent_state_under_early_stop_and_executed_without_it():
    report = check(AfterLastSave(), _x(2, 3))
    assert report.kinds == {"state"} and all(f.latent for f in report), str(report)
    assert "early stop ended the recompute" in report.findings[0].detail
    report = check(AfterLastSave(), _x(2, 3), early_stop=False)
    assert report.kinds == {"state"} and not any(f.latent for f in report)
    assert check(AfterLastSave(), _x(2, 3), use_reentrant=True).by_kind("state")[0].latent is False


class Raises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.bn = nn.BatchNorm1d(3)
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        self.bn(self.lin(x))
        random.random()
        raise KeyError("boom from the region")


def test_region_raising_restores_state_and_reraises_the_users_error():
    model = Raises()
    x = _x(4, 3)
    random.seed(5)
    python_state = random.getstate()
    cpu_state = torch.get_rng_state()
    stats = model.bn.running_mean.clone()
    with pytest.raises(KeyError, match="boom from the region") as info:
        check(model, x)
    assert info.traceback[-1].name == "forward"  # the user's frame is where it points
    assert model.steps == 0 and torch.equal(model.bn.running_mean, stats)
    assert model.bn.num_batches_tracked.item() == 0
    assert random.getstate() == python_state and torch.equal(torch.get_rng_state(), cpu_state)


def test_check_leaves_parameters_grads_and_inputs_untouched():
    torch.manual_seed(0)
    model = _mlp()
    x = _x(3, 4)
    model[0].weight.grad = torch.ones_like(model[0].weight)
    grad = model[0].weight.grad
    versions = [p._version for p in model.parameters()]
    check(model, x)
    assert model[0].weight.grad is grad and torch.equal(grad, torch.ones_like(grad))
    assert model[2].weight.grad is None and x.grad is None
    assert [p._version for p in model.parameters()] == versions


def test_reentrant_without_input_grad_loses_parameter_gradients():
    torch.manual_seed(0)
    report = check(_mlp(), torch.randn(3, 4), use_reentrant=True)
    assert {"output", "gradient"} <= report.kinds, str(report)
    assert any("never computed" in f.message for f in report.by_kind("gradient"))
    assert check(_mlp(), torch.randn(3, 4), use_reentrant=False).ok


def test_nested_outputs_kwargs_partial_and_lambda():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)

    def region(x, *, scale, extra):
        h = lin(x) * scale
        return {"h": h, "parts": (h.sum(), [h.mean(), "tag"]), "n": extra}

    assert check(region, _x(2, 4), kwargs={"scale": 0.5, "extra": 3}).ok
    assert check(functools.partial(region, scale=2.0, extra=1), _x(2, 4)).ok
    assert check(lambda x: lin(x).relu(), _x(2, 4)).ok
    assert check(Counter().lin.forward, _x(2, 4)).ok


def test_assert_recompute_equal_raises_with_the_report():
    torch.manual_seed(0)
    assert assert_recompute_equal(_mlp(), _x(3, 4)) is None
    with pytest.raises(RecomputeMismatch) as info:
        assert_recompute_equal(Counter(), _x(2, 4))
    text = str(info.value)
    assert text.splitlines()[0] == f"{FIRST_LINE} (1 difference)"
    assert "region         Counter.forward (" in text and "test_engine_check.py:" in text
    assert "configuration  use_reentrant=False, preserve_rng_state=True, early_stop=True" in text
    assert "[1] state: attribute `self.calls` updated again by the recompute: 1 -> 2" in text
    assert "checkpointed at" not in text  # the region's one call is the check's own, named by the title
    assert "hint: " in text and "RC104" in text


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="needs a callable"):
        check(3, _x(2))
    with pytest.raises(RegionError, match="returned no tensor"):
        check(lambda x: 3, _x(2))
    with pytest.raises(RegionError, match="no output of the region requires grad"):
        check(lambda x: x * 2, torch.randn(2))
    with pytest.raises(TypeError, match="use_reentrant"):
        check(torch.sin, _x(2), use_reentrant=None)
    with pytest.raises(ValueError, match="either max_ulp or atol"):
        check(torch.sin, _x(2), atol=1e-3, max_ulp=2)
    with pytest.raises(RegionError, match="grad_outputs"):
        check(torch.sin, _x(2), grad_outputs=[torch.ones(2), torch.ones(2)])


def _in_place_param_change(model, x):
    with torch.no_grad():
        model.weight.add_(0.5)
    return model(x)


@VARIANTS
def test_parameter_changed_inside_region_is_param_version(use_reentrant):
    model = nn.Linear(3, 3)
    weight, version = model.weight.detach().clone(), model.weight._version
    report = check(functools.partial(_in_place_param_change, model), _x(2, 3),
                   use_reentrant=use_reentrant)
    assert {"param_version", "gradient"} <= report.kinds, str(report)
    finding = report.by_kind("param_version")[0]
    assert finding.subject == "parameter `weight`" and "RC201" in finding.hint
    assert torch.equal(model.weight, weight) and model.weight._version == version


def test_grad_outputs_and_tolerance_options():
    torch.manual_seed(0)
    model = _mlp()
    assert check(model, _x(3, 4), grad_outputs=torch.ones(3, 4)).ok
    assert check(model, _x(3, 4), max_ulp=0).ok
    assert "tolerance: up to 0 ulp" in check(model, _x(3, 4), max_ulp=0).title


def _grows(model, x):
    model.width += 1
    return torch.tanh(model(x)[..., : model.width])  # tanh saves a tensor of that width


def test_torch_error_in_backward_becomes_a_finding_with_torchs_message():
    model = nn.Linear(4, 6)
    model.width = 2
    report = check(functools.partial(_grows, model), _x(3, 4))
    failed = [f for f in report.by_kind("recompute") if "CheckpointError" in f.message]
    assert failed and "different metadata" in failed[0].message, str(report)
    assert model.width == 2


class LazyCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        self.seen = getattr(self, "seen", 0) + 1  # created by the first call
        return torch.sigmoid(self.lin(x))


@VARIANTS
def test_attribute_created_by_the_region_is_compared_and_removed(use_reentrant):
    model = LazyCounter()
    report = check(model, _x(2, 3), use_reentrant=use_reentrant)
    assert [f.subject for f in report.by_kind("state")] == ["attribute `self.seen`"], str(report)
    assert not hasattr(model, "seen")
