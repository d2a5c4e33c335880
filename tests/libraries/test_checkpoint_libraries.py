"""The real DeepSpeed, fairscale and Megatron-core checkpoints on CPU: watched, bypassed, probed.

The main suite runs the same checks on imitations (fixtures/implementations); here the real
libraries show that recheck patches what they really call.  DeepSpeed needs no setup for its two
functions (``DS_ACCELERATOR=cpu`` keeps it from guessing an accelerator); Megatron's RNG helpers
call CUDA unconditionally, so its two module-level helpers get CPU stand-ins (as
tests/twins_evidence/real_megatron.py measured); fairscale needs nothing.
"""

from __future__ import annotations

import contextlib
import os
import warnings

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
from library_env import require  # noqa: E402

torch = require("torch")
deepspeed_checkpointing = require("deepspeed.runtime.activation_checkpointing.checkpointing")
fairscale_checkpointing = require("fairscale.nn.checkpoint.checkpoint_activations")
megatron_random = require("megatron.core.tensor_parallel.random")
megatron_parallel = require("megatron.core.tensor_parallel")

from torch import nn  # noqa: E402

import recheck  # noqa: E402
from recheck.intercept import patches  # noqa: E402
from recheck.intercept.hooks import Interceptor  # noqa: E402
from recheck.watcher.probe import RecomputeProbe  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(autouse=True)
def megatron_on_cpu(monkeypatch):
    monkeypatch.setattr(megatron_random, "_get_cuda_rng_state", lambda *a, **k: torch.zeros(1, dtype=torch.uint8))
    monkeypatch.setattr(megatron_random, "_set_cuda_rng_state", lambda *a, **k: None)


class block(nn.Module):
    def __init__(self, dim=16, batchnorm=False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.5)
        self.norm = nn.BatchNorm1d(4 * dim) if batchnorm else nn.Identity()

    def forward(self, x):
        return x + self.fc2(self.drop(self.norm(torch.nn.functional.gelu(self.fc1(x)))))


def without_output(f, x):
    ckpt = megatron_parallel.CheckpointWithoutOutput(fp8=None)  # fp8=False would need Transformer Engine
    y = ckpt.checkpoint(f, x) * 1.0
    ckpt.discard_output_and_register_recompute(y)
    return y


RUNS = {
    "deepspeed": lambda b, h: deepspeed_checkpointing.checkpoint(b, h),
    "deepspeed-non-reentrant": lambda b, h: deepspeed_checkpointing.non_reentrant_checkpoint(b, h),
    "megatron": lambda b, h: megatron_parallel.checkpoint(b, False, h),
    "megatron-without-output": without_output,
    "fairscale": lambda b, h: fairscale_checkpointing.checkpoint_wrapper(b)(h),
}


def step(run, *, autocast=None, batchnorm=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), block(batchnorm=batchnorm), block(batchnorm=batchnorm))
    x = torch.randn(8, 16)
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
        h = model[0](x)
        for b in model[1:]:
            h = run(b, h.float())
    h.float().pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()], [b.clone() for b in model.buffers()], torch.get_rng_state()


@pytest.mark.parametrize("name", RUNS)
def test_watch_verifies_every_recompute(name):
    with recheck.watch(raise_on_finding=False) as w:
        step(RUNS[name])
    assert w.report.ok, str(w.report)
    assert w.report.stats["invocations"] == w.report.stats["verified"] == 2, w.report.stats


@pytest.mark.parametrize("name", [n for n in RUNS if n != "deepspeed-non-reentrant"])
def test_none_restores_cpu_autocast_and_watch_says_so(name):
    with recheck.watch(raise_on_finding=False) as w:
        step(RUNS[name], autocast=torch.bfloat16)
    context = w.report.by_kind("context")
    assert {f.subject for f in context} == {"autocast `cpu`"} and context[0].code == "RC003", str(w.report)


def test_fairscale_s_patched_batchnorm_updates_once_and_is_no_finding():
    with recheck.watch(raise_on_finding=False) as w:
        step(RUNS["fairscale"], batchnorm=True)
    assert w.report.ok, str(w.report)


class Bypassing(Interceptor):
    def __init__(self):
        self.calls = []

    def bypass(self, call):
        self.calls.append(call.entry)
        return True


@pytest.mark.parametrize("name", RUNS)
def test_a_bypass_is_the_uncheckpointed_step(name):
    plain = step(lambda b, h: b(h), autocast=torch.bfloat16)
    bypass = Bypassing()
    patches.acquire(bypass)
    try:
        bypassed = step(RUNS[name], autocast=torch.bfloat16)
    finally:
        patches.release()
    assert bypass.calls == [name, name]
    for a, b in zip(plain, bypassed):
        a, b = (a, b) if isinstance(a, list) else ([a], [b])
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_every_patched_entry_point_is_the_original_again():
    targets = [(deepspeed_checkpointing.CheckpointFunction, "apply"),
               (megatron_random.CheckpointFunction, "apply"),
               (megatron_parallel.CheckpointWithoutOutput, "checkpoint"),
               (megatron_parallel.CheckpointWithoutOutput, "discard_output_and_register_recompute"),
               (fairscale_checkpointing.CheckpointFunction, "apply")]
    before = [vars(o).get(n) for o, n in targets] + [deepspeed_checkpointing.non_reentrant_checkpoint.__code__]
    with recheck.watch():
        during = [vars(o).get(n) for o, n in targets] + [deepspeed_checkpointing.non_reentrant_checkpoint.__code__]
    after = [vars(o).get(n) for o, n in targets] + [deepspeed_checkpointing.non_reentrant_checkpoint.__code__]
    assert all(a is not b for a, b in zip(before, during))
    assert all(a is b for a, b in zip(before, after))


@pytest.mark.parametrize("name", RUNS)
def test_the_probe_alone_gives_no_false_finding(name):
    with warnings.catch_warnings(), RecomputeProbe() as probe:
        warnings.simplefilter("ignore")
        step(RUNS[name])
    assert probe.stats["recomputes"] == probe.stats["matched"] > 0, probe.stats
    assert probe.findings == [], probe.findings
