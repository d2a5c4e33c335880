"""watch() verifies every checkpoint implementation's recomputes, and compares their context.

DeepSpeed, Megatron-core and fairscale (their imitations in ``fixtures/implementations``, loaded
under the real module names) restore the CPU RNG but not autocast: a dropout block is clean,
the same block under CPU autocast recomputes in float32, which watch() reports as ``context``.
torch's own checkpoint restores autocast (no finding) but not the default dtype.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from imitations import CHECKPOINTING, block, dropout_model, imitation, run_blocks
from source_modules import load_file
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck

PROJECT = Path(__file__).resolve().parents[2] / "fixtures" / "implementations" / "project_checkpointing.py"


def watched(run, autocast=None, **options):
    options.setdefault("raise_on_finding", False)
    model, x = dropout_model()
    with recheck.watch(**options) as w:
        run_blocks(model, x, run, autocast)
    return w.report


CASES = CHECKPOINTING


@pytest.mark.parametrize("case", CASES)
def test_every_recompute_of_another_implementation_is_verified(case):
    library, make = CASES[case]
    with imitation(library) as lib:
        report = watched(make(lib))
    assert report.ok, str(report)
    assert report.stats["invocations"] == report.stats["verified"] == 2, report.stats
    assert all(f.region for f in report)


@pytest.mark.parametrize("case", [c for c in CASES if c != "deepspeed-non-reentrant"])
def test_a_recompute_outside_the_forward_s_autocast_is_a_context_finding(case):
    library, make = CASES[case]
    with imitation(library) as lib:
        report = watched(make(lib), torch.bfloat16)
    context = report.by_kind("context")
    assert {f.subject for f in context} == {"autocast `cpu`"}, str(report)
    assert "was enabled (bfloat16) at forward and disabled at recompute" in context[0].message
    assert "block.forward" in context[0].region
    assert report.by_kind("recompute"), str(report)  # the float32 recompute's output differs


def test_deepspeed_s_non_reentrant_recompute_under_autocast_raises_and_is_seen():
    with imitation("deepspeed") as ds, pytest.raises(RuntimeError, match="dtype"):
        with recheck.watch(raise_on_finding=False) as w:
            torch.manual_seed(0)
            model = block()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = ds.non_reentrant_checkpoint(model, nn.Linear(8, 8)(torch.randn(4, 8)).float())
            h.float().sum().backward()
    assert "autocast `cpu`" in {f.subject for f in w.report.by_kind("context")}, str(w.report)


@pytest.mark.parametrize("reentrant", [False, True])
def test_torch_s_checkpoint_restores_autocast_and_the_grad_mode_is_the_call_s(reentrant):
    report = watched(lambda b, h: checkpoint(b, h, use_reentrant=reentrant), torch.bfloat16)
    assert report.ok, str(report)  # the reentrant forward ran under no_grad by design: no finding
    assert report.stats["verified"] == 2


def test_a_default_dtype_changed_before_backward_is_a_context_finding():
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    try:
        with recheck.watch(raise_on_finding=False) as w:
            out = checkpoint(lambda x: model(x) + torch.ones(8), torch.randn(4, 8, requires_grad=True),
                             use_reentrant=False)
            torch.set_default_dtype(torch.float64)  # e.g. an evaluation helper run between
            out.sum().backward()
    finally:
        torch.set_default_dtype(torch.float32)
    finding = w.report.by_kind("context")[0]
    assert finding.subject == "default dtype" and finding.code == "RC101", str(w.report)
    assert finding.message == "default dtype was float32 at forward and float64 at recompute"


def test_a_declared_hand_written_checkpoint_is_verified_and_its_rng_reported():
    project = load_file(PROJECT, "project_checkpointing")
    report = watched(lambda b, h: project.checkpoint_without_rng(b, h),
                     checkpoint_functions=["project_checkpointing.checkpoint_without_rng", "elsewhere.ckpt"])
    assert report.stats["verified"] == 2, report.stats
    assert {f.subject for f in report.by_kind("rng")} == {"cpu RNG"}, str(report)
    assert any("elsewhere.ckpt: not imported" in note for note in report.notes), report.notes


def test_checkpoint_functions_must_be_dotted_names():
    with pytest.raises(TypeError, match="dotted names"):
        recheck.watch(checkpoint_functions="project.ckpt")
    with pytest.raises(TypeError, match="dotted names"):
        recheck.watch(checkpoint_functions=["ckpt"])
