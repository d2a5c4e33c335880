"""The recompute probe sees recomputations no entry point reports: hand-written checkpoints.

guided-diffusion's ``CheckpointFunction`` (no RNG restore) and a torch-1.10-style amp checkpoint
(autocast dtype not restored) are caught; their fixed variants, torch's own checkpoint (both
variants, nested too) and the DeepSpeed, Megatron and fairscale imitations give no finding.
Under ``watch()`` the probe leaves the recomputes recheck intercepts to it.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from imitations import CHECKPOINTING, dropout_model, imitation, run_blocks
from source_modules import load_file
from torch.nn.modules import module as module_hooks

import recheck
from recheck.watcher.probe import RecomputeProbe

TWINS = Path(__file__).resolve().parents[2] / "fixtures" / "twins"


def twin(name):
    return load_file(TWINS / f"{name}.py", f"recheck_twins_{name}")


def probed(build, *, watching=True):
    step, _model = build()[:2]
    torch.manual_seed(1234)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with recheck.watch(raise_on_finding=False) if watching else contextlib.nullcontext(), \
                RecomputeProbe() as probe:
            step()
    return probe


@pytest.mark.parametrize("watching", [True, False])
def test_a_hand_written_checkpoint_without_rng_restore_is_caught(watching):
    probe = probed(twin("diffusion_checkpoint").make_step, watching=watching)
    assert probe.stats["recomputes"] == probe.stats["matched"] == 6, probe.stats
    by_module = {(f.kind, f.subject, f.region.split(" ")[0]) for f in probe.findings}
    assert by_module == {(kind, subject, f"`blocks.{i}.out_layers`")
                         for kind, subject in (("rng", "cpu RNG"), ("recompute", "output")) for i in (0, 1)}
    finding = probe.findings[0]
    assert "recomputed by CheckpointFunction (fixtures/twins/diffusion_checkpoint.py:33)" in finding.region
    assert finding.code == "RC003" and finding.invocation.callsite == "fixtures/twins/diffusion_checkpoint.py:33"
    assert all(f.code == "RC003" for f in probe.findings)  # the output difference points at its cause


def test_a_hand_written_checkpoint_losing_the_autocast_dtype_is_caught():
    probe = probed(twin("amp_checkpoint").make_step)
    context = [f for f in probe.findings if f.kind == "context"]
    assert {f.region.split(" ")[0] for f in context} == {"`1.module`", "`2.module`"}, probe.findings
    assert context[0].message == "autocast `cpu` was enabled (float16) at forward and enabled (bfloat16) at recompute"
    assert {f.kind for f in probe.findings} == {"context", "recompute"}


@pytest.mark.parametrize("fixture", ["diffusion_checkpoint", "amp_checkpoint"])
def test_their_fixed_variants_are_clean(fixture):
    probe = probed(lambda: twin(fixture).make_step(fixed=True))
    assert probe.stats["matched"] == probe.stats["recomputes"] > 0
    assert probe.findings == [], probe.findings


TORCH_STEPS = {
    "reentrant": lambda: twin("moe_router").make_step(),
    "non-reentrant": lambda: twin("moe_router").make_step(fixed=True),
    "reentrant closures": lambda: twin("levit_cache").make_step(),
    "non-reentrant, BatchNorm outside": lambda: twin("batchnorm_outside").make_step("closure"),
    "nested reentrant": lambda: twin("nested_checkpoint").make_step(True, True),
    "nested non-reentrant": lambda: twin("nested_checkpoint").make_step(False, False),
}


@pytest.mark.parametrize("case", TORCH_STEPS)
def test_torch_s_checkpoint_is_left_to_watch_and_clean_without_it(case):
    under_watch = probed(TORCH_STEPS[case])
    assert under_watch.stats["recomputes"] == under_watch.stats["module_forwards"] == 0, under_watch.stats
    alone = probed(TORCH_STEPS[case], watching=False)
    assert alone.stats["recomputes"] > 0
    assert alone.findings == [], alone.findings


def library_step(run, autocast=None):
    model, x = dropout_model()

    def step():
        run_blocks(model, x, run, autocast)

    return step, model


#: what runs each library's recompute (the probe names it)
DRIVERS = {"deepspeed": "CheckpointFunction", "deepspeed-non-reentrant": "checkpoint_unpack",
           "megatron": "CheckpointFunction", "megatron-without-output": "CheckpointWithoutOutput._recompute",
           "fairscale": "CheckpointFunction"}
LIBRARIES = {case: (*CHECKPOINTING[case], driver) for case, driver in DRIVERS.items()}


@pytest.mark.parametrize("case", LIBRARIES)
def test_other_implementations_give_no_false_finding(case):
    library, make, driver = LIBRARIES[case]
    with imitation(library) as lib:
        under_watch = probed(lambda: library_step(make(lib)))
        alone = probed(lambda: library_step(make(lib)), watching=False)
    assert under_watch.stats["recomputes"] == 0, under_watch.stats  # intercepted: watch verifies them
    assert alone.findings == [], alone.findings
    # fairscale calls type(block).forward itself: the block's children are what is seen
    assert alone.stats["recomputes"] == alone.stats["matched"] == (6 if case == "fairscale" else 2), alone.stats
    assert all(driver in name for name in alone.stats["by"]), alone.stats


@pytest.mark.parametrize("case", [c for c in LIBRARIES if c != "deepspeed-non-reentrant"])
def test_other_implementations_recomputing_outside_autocast_are_caught(case):
    library, make, _ = LIBRARIES[case]
    with imitation(library) as lib:
        alone = probed(lambda: library_step(make(lib), torch.bfloat16), watching=False)
    assert {f.subject for f in alone.findings if f.kind == "context"} == {"autocast `cpu`"}, alone.findings
    assert any(f.kind == "recompute" for f in alone.findings)


def test_nothing_is_registered_outside_the_block():
    before = (dict(module_hooks._global_forward_pre_hooks), dict(module_hooks._global_forward_hooks))
    probe = RecomputeProbe()
    assert (dict(module_hooks._global_forward_pre_hooks), dict(module_hooks._global_forward_hooks)) == before
    with probe:
        assert len(module_hooks._global_forward_pre_hooks) == len(before[0]) + 1
        with pytest.raises(RuntimeError, match="only once"):
            probe.__enter__()
    assert (dict(module_hooks._global_forward_pre_hooks), dict(module_hooks._global_forward_hooks)) == before


def test_a_module_called_twice_meets_each_of_its_forwards():
    # one block instance run twice through the fixed Function: each recompute must meet its own
    # forward (by the saved inputs' storage, else by order), or the outputs would differ
    fixture = twin("diffusion_checkpoint")
    torch.manual_seed(0)
    shared = fixture.res_block(16, 8, dropout=0.1, use_checkpoint=True, checkpoint_fn=fixture.rng_checkpoint)
    x, emb = torch.randn(4, 16), torch.randn(4, 8)
    with RecomputeProbe(shared) as probe:
        shared(shared(x, emb), emb).sum().backward()
    assert probe.stats["matched"] == probe.stats["recomputes"] == 6, probe.stats
    assert probe.findings == [], probe.findings


class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, block, x):
        ctx.block = block
        ctx.save_for_backward(x)
        with torch.no_grad():
            return block(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            torch.autograd.backward(ctx.block(x), grad)
        return None, x.grad


def test_a_batchnorm_in_a_hand_written_checkpoint_is_told_as_watch_tells_it():
    """The probe compares state with the invocation record's comparison: one wording."""
    block = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with RecomputeProbe() as probe:
        Recompute.apply(block, torch.randn(8, 4, requires_grad=True)).sum().backward()
    assert {(f.message, f.code) for f in probe.findings if f.kind == "buffer"} == {
        (f"BatchNorm statistics `1.{name}` updated again by the recompute", "RC106")
        for name in ("running_mean", "running_var", "num_batches_tracked")}, probe.findings


def test_a_probe_keeps_no_object_after_it_ends():
    """The prints of large objects kept between reads (a config a module holds) go with the
    probe: what it read is not held once it exits."""
    import gc
    import weakref

    class Config:
        def __init__(self) -> None:
            self.width, self.labels = 2, {0: "a"}

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config, self.linear = Config(), nn.Linear(2, 2)

        def forward(self, x):
            return self.linear(x)

    x, block = torch.randn(3, 2, requires_grad=True), Block()
    with RecomputeProbe() as probe:
        Recompute.apply(block, x).sum().backward()
    assert probe.stats["matched"] == 1 and probe.findings == []
    refs = weakref.ref(block), weakref.ref(block.config)
    del block
    gc.collect()
    assert [ref() for ref in refs] == [None, None]  # the module and the config it read are freed


def _dropout_block():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)), torch.randn(8, 4, requires_grad=True)


def test_a_hand_written_checkpoint_s_rng_finding_is_worded_as_watch_words_it():
    """One comparator: the probe's RNG finding is the invocation record's, word for word."""
    from torch.utils.checkpoint import checkpoint

    block, x = _dropout_block()
    with RecomputeProbe() as probe:
        Recompute.apply(block, x).sum().backward()
    with recheck.watch(raise_on_finding=False) as watched:
        checkpoint(block, x, use_reentrant=True, preserve_rng_state=False).sum().backward()
    said = {(f.kind, f.subject, f.message, f.detail) for f in probe.findings if f.kind == "rng"}
    assert said and said == {(f.kind, f.subject, f.message, f.detail) for f in watched.report if f.kind == "rng"}


def test_a_parameter_changed_before_a_hand_written_recompute_is_told():
    """A parameter modified in place between the forward and a hand-written recompute is the
    cause the record names (``param_version``), not only an output that differs."""
    block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    with RecomputeProbe() as probe:
        out = Recompute.apply(block, torch.randn(8, 4, requires_grad=True))
        with torch.no_grad():
            block[0].weight.add_(1)
        out.sum().backward()
    kinds = {f.kind for f in probe.findings}
    assert {"param_version", "recompute"} <= kinds, probe.findings
