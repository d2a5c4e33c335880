"""Consequences never drown causes (issue 42): one hazard repeated over modules or calls is one
entry, and the end-of-step differences a reported cause explains are one grouped entry.

The fixtures are plain torch in the style of real code: a ResNet whose stages are checkpointed
(BatchNorm in training mode updates its running statistics again on recompute), dropout blocks
checkpointed without RNG preservation under ``check_step`` (the optimizer then moves every
parameter differently), a layer that counts its calls.  The text shows one entry per hazard;
JSON and ``verbose`` keep every finding.
"""

from __future__ import annotations

import re

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import recheck
from recheck.findings import Finding, Invocation, Report, Subject, report_entries
from recheck.output.text import group


def _entries(text: str) -> list[str]:
    return re.findall(r"^  \[\d+\] .*$", text, re.M)


class ConvBN(nn.Sequential):
    def __init__(self, channels: int) -> None:
        super().__init__(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                         nn.ReLU())


class BasicStage(nn.Module):
    """Four residual conv-BN blocks at one resolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ConvBN(channels) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


class DownStage(BasicStage):
    """A stage that halves the resolution first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(nn.functional.avg_pool2d(x, 2))


class TinyResNet(nn.Module):
    def __init__(self, channels: int = 4, classes: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.layer1 = BasicStage(channels)
        self.layer2 = DownStage(channels)
        self.fc = nn.Linear(channels, classes)
        self.grad_checkpointing = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in (self.layer1, self.layer2):
            x = checkpoint(stage, x, use_reentrant=False) if self.grad_checkpointing else stage(x)
        return self.fc(x.mean((2, 3)))


def _resnet_report() -> Report:
    torch.manual_seed(0)
    model = TinyResNet().train()
    with recheck.watch(raise_on_finding=False) as w:
        model(torch.randn(2, 3, 8, 8)).sum().backward()
    return w.report


def test_batchnorm_statistics_of_eight_modules_in_two_regions_are_one_entry():
    report = _resnet_report()
    assert len(report.findings) == 24  # 8 BatchNorm2d x (running_mean, running_var, num_batches_tracked)
    assert len(group(report.findings)) == 24  # one entry each, folded by invocation only
    (entry,) = report.entries()
    assert entry.form == "modules" and entry.count == 24
    assert entry.family == ("running_mean", "running_var", "num_batches_tracked")
    text = report.format()
    (line,) = _entries(text)
    assert "`running_mean`, `running_var`, `num_batches_tracked`" in line
    assert "in 8 modules of 2 regions" in line and line.endswith("×24")
    assert re.search(r"^ +in BasicStage.forward \(.*\), DownStage.forward \(.*\), call 1$", text, re.M)
    assert "more entr" not in text
    # JSON keeps every finding; verbose lists each one under the entry
    assert len(report.to_dict()["findings"]) == 24
    verbose = report.format(verbose=True)
    assert verbose.count("- BatchNorm statistics `blocks.") == 24



def test_batchnorm_under_check_step_is_the_cause_then_one_entry_of_its_end_state_buffers():
    """The twin's end state differs in every BatchNorm buffer the recompute updated again: those
    differences carry the watched hazard's rule, and are one consequences entry after it."""
    torch.manual_seed(0)
    model = TinyResNet().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 3, 8, 8)

    def step() -> None:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    report = recheck.check_step(step, modules=[model], optimizers=[optimizer])
    end_state = [f for f in report.findings if f.invocation is None]
    assert len(end_state) == 24 and {f.kind for f in end_state} == {"buffer"}
    assert [(e.form, e.count) for e in report.entries()] == [("modules", 24), ("consequences", 24)]
    shown = _entries(report.format())
    assert len(shown) == 2 and "24 buffers differ from the uncheckpointed step as a consequence" in shown[1]


class DropoutBlock(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.dropout = nn.Dropout(0.3)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(torch.relu(self.fc1(x))))


class DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DropoutBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False, preserve_rng_state=False)
        return x


def _dropout_report() -> Report:
    torch.manual_seed(0)
    model = DropoutNet().train()
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(4, 8)

    def step() -> None:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    return recheck.check_step(step, modules=[model], optimizers=[optimizer])


def test_dropout_without_rng_preservation_leads_with_the_rng_and_groups_its_consequences():
    report = _dropout_report()
    end_state = [f for f in report.findings if f.invocation is None]
    assert len(end_state) > 30  # every gradient, parameter and Adam moment, and the RNG stream
    entries = report.entries()
    assert entries[0].first.kind == "rng"
    assert [e.form for e in entries].count("consequences") == 1
    consequences = entries[-1]
    assert consequences.form == "consequences" and list(consequences.findings) == end_state
    assert len(entries) <= 4 < len(group(report.findings))
    text = report.format()
    shown = _entries(text)
    assert shown[0].startswith("  [1] rng: cpu RNG state at recompute differs")
    assert "consequences:" in shown[-1]
    assert re.search(r"\d+ gradients, 1 RNG stream, \d+ parameters and \d+ optimizer tensors differ from the "
                     r"uncheckpointed step as a consequence", shown[-1])
    assert "likely cause: cpu RNG state at recompute" in text.split("consequences:")[1]
    assert "more entr" not in text
    # the full list: JSON and verbose
    assert len(report.to_dict()["findings"]) == len(report.findings)
    verbose = report.format(verbose=True)
    assert all(f"- {f.message}" in verbose for f in end_state)


class CountingLayer(nn.Module):
    """A layer that counts its forward calls (a common logging or schedule helper)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.tanh(self.proj(x))


def test_a_counter_bumped_per_call_is_one_entry_with_the_values_of_each_call():
    torch.manual_seed(0)
    layer = CountingLayer()
    x = torch.randn(2, 4, requires_grad=True)
    with recheck.watch(raise_on_finding=False) as w:
        for _ in range(3):
            checkpoint(layer, x, use_reentrant=False).sum().backward()
    report = w.report
    assert len(report.findings) == len(group(report.findings)) == 3
    (entry,) = report.entries()
    assert entry.form == "values" and entry.values == ("1 -> 2", "3 -> 4", "5 -> 6")
    (line,) = _entries(report.format())
    assert line.startswith("  [1] state: attribute `self.calls` updated again by the recompute: "
                           "1 -> 2, 3 -> 4, 5 -> 6 ×3")
    assert "calls 1–3 of 3" in report.format()


# --- the grouping rules on findings alone ---

def _at(kind: str, message: str, subject: str, index: int = 1, region: str = "Block.forward (m.py:8)",
        **extra) -> Finding:
    return Finding(kind, message, subject=subject, region=region,
                   invocation=Invocation(index, 2, {}, "train.py:30"), **extra)


def test_different_hazards_and_different_families_stay_apart():
    found = [_at("buffer", f"BatchNorm statistics `{m}.{a}` updated again by the recompute", Subject("buffer", a, owner=m),
                 code="RC106") for m in ("bn1", "bn2") for a in ("running_mean", "running_var")]
    found += [_at("buffer", "buffer `ema.shadow` updated again by the recompute", Subject("buffer", "shadow", owner="ema"),
                  code="RC106")]
    found += [_at("global", f"global `pkg.SCALE` was 1.0 at forward and 2.0 at recompute in {r}",
                  Subject("global", "SCALE", owner="pkg"), region=f"{r}.forward (m.py:1)") for r in ("A", "B")]
    entries = report_entries(found)
    assert [e.form for e in entries] == ["finding", "finding", "modules", "finding"]
    modules = next(e for e in entries if e.form == "modules")
    assert modules.count == 4 and modules.modules == ("Block.forward (m.py:8): bn1", "Block.forward (m.py:8): bn2")


def test_end_state_differences_without_a_watched_cause_are_not_consequences():
    alone = Finding("gradient", "grad of `w` differs from the uncheckpointed step's (1 of 4 elements)",
                    region="step train", subject=Subject("gradient", "w"))
    assert [e.form for e in report_entries([alone])] == ["finding"]
    # an end-state difference with a rule of its own stays an entry of its own beside a watched cause
    cause = _at("rng", "cpu RNG state at recompute differs", Subject("device RNG", owner="cpu"), code="RC002")
    own = Finding("global", "global `pkg.N` differs from the uncheckpointed step", code="RC101",
                  hint="a global", region="step train", subject=Subject("global", "N", owner="pkg"))
    follows = Finding("gradient", "grad of `w` differs", region="step train", subject=Subject("gradient", "w"),
                      code="RC002", hint="likely cause: cpu RNG state at recompute differs", cause="rng")
    forms = [(e.form, e.count) for e in report_entries([follows, own, cause])]
    assert forms == [("finding", 1), ("finding", 1), ("consequences", 1)]
