"""--suggest on a model that does not checkpoint yet: its repeated blocks are the candidates, the plan is
verified, and the line a user writes to keep it is printed (and does what the plan did)."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
import torch
from source_modules import load_file

import recheck
from recheck.cli import main
from recheck.cost.planner.candidates import NoRepeatedUnit, find_candidates
from recheck.cost.planner.keeping import change_for
from recheck.cost.planner.plans import Plan
from recheck.cost.planner.suggest import suggest
from recheck.runtime.steps import discover_state

GPT = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, 2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, c))

    class Block(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(dim), Attention(dim, heads), nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, vocab=64, dim=32, heads=4, layers=4, context=32):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
            self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
            self.ln_f, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    torch.manual_seed(0)
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        idx = torch.randint(0, 64, (4, 32))
        logits = model(idx)
        F.cross_entropy(logits[:, :-1].reshape(-1, 64), idx[:, 1:].reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad()
    """
)

CNN = textwrap.dedent(
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    def group_norm(channels):
        return nn.GroupNorm(2, channels)

    class BasicBlock(nn.Module):
        def __init__(self, inp, out, stride=1, norm_layer=nn.BatchNorm2d):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False), norm_layer(out)
            self.conv2, self.bn2 = nn.Conv2d(out, out, 3, 1, 1, bias=False), norm_layer(out)
            self.downsample = None
            if stride != 1 or inp != out:
                self.downsample = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), norm_layer(out))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = F.relu(self.bn1(self.conv1(x)))
            return F.relu(self.bn2(self.conv2(out)) + identity)

    class ResNet(nn.Module):
        def __init__(self, widths=(8, 16), classes=10, norm_layer=nn.BatchNorm2d):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), norm_layer(widths[0]), nn.ReLU())
            stages, inp = [], widths[0]
            for i, width in enumerate(widths):
                stages.append(nn.Sequential(BasicBlock(inp, width, 1 if i == 0 else 2, norm_layer),
                                            BasicBlock(width, width, 1, norm_layer)))
                inp = width
            self.stages = nn.Sequential(*stages)
            self.fc = nn.Linear(inp, classes)

        def forward(self, x):
            x = self.stages(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    torch.manual_seed(0)
    model = ResNet(norm_layer=group_norm)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step():
        images, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
    """
)

PLAIN = textwrap.dedent(
    """
    import torch
    from torch import nn

    mlp = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 8))
    layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
    single = nn.Linear(8, 8)

    def mlp_step():
        mlp(torch.randn(4, 8)).sum().backward()

    def layers_step():
        h = torch.randn(4, 8)
        for layer in layers:
            h = torch.tanh(layer(h))
        h.sum().backward()

    def single_step():
        single(torch.randn(4, 8)).sum().backward()
    """
)

_COUNT = [0]


def load(tmp_path, source: str, name: str):
    _COUNT[0] += 1
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path, load_file(path, f"recheck_blocks_{name}_{_COUNT[0]}")


def candidates_of(step):
    state = discover_state(step)
    return find_candidates(step, state, state.snapshot())


def wrapped_left(model) -> list[str]:
    return [name for name, m in model.named_modules() if "forward" in m.__dict__]


def test_the_repeated_blocks_of_a_loop_over_a_module_list_are_the_candidates(tmp_path):
    _, gpt = load(tmp_path, GPT, "gpt")
    found = candidates_of(gpt.step)
    assert [(c.name, c.kind, c.written) for c in found.items] == [(f"blocks.{i}", "unit", False) for i in range(4)]
    assert found.root is gpt.model
    assert any("makes no checkpoint call" in n and "Block" in n for n in found.notes), found.notes


def test_the_blocks_of_sequential_stages_are_the_candidates_not_the_stages_or_their_layers(tmp_path):
    _, cnn = load(tmp_path, CNN, "cnn")
    found = candidates_of(cnn.step)
    assert [c.name for c in found.items] == ["stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1"]


@pytest.mark.parametrize(("name", "why"), [
    ("mlp_step", "the step's Sequential runs Linear, Tanh, Linear"),
    ("layers_step", "the step's ModuleList runs 3 Linear.*no submodule"),
    ("single_step", "calls no module of a ModuleList or Sequential"),
])
def test_a_forward_without_a_repeated_block_says_why(tmp_path, name, why):
    _, plain = load(tmp_path, PLAIN, "plain")
    with pytest.raises(NoRepeatedUnit, match="no repeated block") as error:
        candidates_of(getattr(plain, name))
    assert re.search(why, str(error.value)), str(error.value)


def test_the_change_for_a_loop_checkpoints_the_call_in_that_line(tmp_path):
    path, gpt = load(tmp_path, GPT, "gpt")
    found = candidates_of(gpt.step)
    every = change_for(found, Plan(tuple((f"blocks.{i}", "full") for i in range(4)), root="GPT"))
    line = next(n for n, text in enumerate(GPT.splitlines(), 1) if text.strip() == "x = block(x)")
    assert every.where == f"{path}:{line}" and every.before == "x = block(x)"
    assert every.code == "x = checkpoint(block, x, use_reentrant=False)"
    assert every.imports == "from torch.utils.checkpoint import checkpoint"
    some = change_for(found, Plan((("blocks.0", "full"), ("blocks.2", "full")), root="GPT"))
    assert some.code == "x = (checkpoint(block, x, use_reentrant=False) if block in self.blocks[0:3:2] else block(x))"
    one = change_for(found, Plan((("blocks.3", "full"),), root="GPT"))
    assert one.code == "x = (checkpoint(block, x, use_reentrant=False) if block in self.blocks[3:4] else block(x))"
    spread = change_for(found, Plan((("blocks.0", "full"), ("blocks.1", "full"), ("blocks.3", "full")), root="GPT"))
    assert "if block in (self.blocks[0], self.blocks[1], self.blocks[3]) else" in spread.code
    for change, planned in ((some, [0, 2]), (one, [3]), (spread, [0, 1, 3])):  # the line runs as the plan says
        _, kept = load(tmp_path, f"{change.imports}\n{path.read_text().replace(change.before, change.code)}", "kept")
        seen = []
        kept.checkpoint = lambda function, *args, use_reentrant: seen.append(function) or function(*args)
        kept.model(torch.zeros(1, 4, dtype=torch.long))
        assert seen == [kept.model.blocks[i] for i in planned]
    selective = change_for(found, Plan((("blocks.1", "selective"),), root="GPT"))
    assert selective.code == 'recheck.apply_plan(model, "plan.json")' and "selective" in selective.how
    assert change_for(found, Plan(root="GPT")).code == ""


@pytest.mark.parametrize(("loop", "code"), [
    ("for i in range(len(self.blocks)):\n            x = self.blocks[i](x)",
     "x = checkpoint(self.blocks[i], x, use_reentrant=False)"),
    ("for block in self.blocks:\n            x = block(\n                x)",
     "apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))"),
])
def test_the_change_follows_how_the_line_calls_the_blocks(tmp_path, loop, code):
    source = GPT.replace("for block in self.blocks:\n            x = block(x)", loop)
    assert source != GPT
    _, gpt = load(tmp_path, source, "gpt_loop")
    change = change_for(candidates_of(gpt.step), Plan(tuple((f"blocks.{i}", "full") for i in range(4)), root="GPT"))
    assert change.code == code
    if code.startswith("apply"):
        assert "gpt_loop.py:" in change.how and "is not one line a checkpoint can wrap" in change.how


def test_the_change_for_blocks_a_sequential_runs_wraps_them_by_class_or_by_module(tmp_path):
    _, cnn = load(tmp_path, CNN, "cnn")
    found = candidates_of(cnn.step)
    every = change_for(found, Plan(tuple((c.name, "full") for c in found.units), root="ResNet"))
    assert every.code == "apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, BasicBlock))"
    assert "Sequential.forward" in every.how and "apply_activation_checkpointing" in every.imports
    some = change_for(found, Plan((("stages.0.1", "full"), ("stages.1.0", "full")), root="ResNet"))
    assert some.code == ("apply_activation_checkpointing(model, check_fn=lambda m: m in "
                         "{model.stages[0][1], model.stages[1][0]})")
    namespace = {"model": cnn.model}
    exec(f"{some.imports}\n{some.code}", namespace)  # what the user types does what the plan names
    try:
        wrapped = sorted(n for n, m in cnn.model.named_modules() if type(m).__name__ == "CheckpointWrapper")
        assert wrapped == ["stages.0.1", "stages.1.0"]
    finally:
        for stage in cnn.model.stages:
            for i, block in enumerate(stage):
                stage[i] = getattr(block, "_checkpoint_wrapped_module", block)


def _budget(step) -> int:
    from recheck.cost.planner.census import mode_config, trace_config

    state = discover_state(step)
    restore = state.snapshot()
    found = find_candidates(step, state, restore)
    low, high = (trace_config(step, state, restore, found, mode_config(m, found)).observed_peak for m in ("full", "none"))
    assert low < high
    return (low + high) // 2


@pytest.mark.slow
def test_a_suggestion_for_a_loop_is_verified_undone_and_its_line_keeps_the_measured_peak(tmp_path):
    path, gpt = load(tmp_path, GPT, "gpt")
    s = suggest(gpt.step, budget=_budget(gpt.step), repeats=1)
    assert s.suggested.verified and s.suggested.fits(s.budget), str(s)
    assert [a.name for a in s.anchors] == ["no checkpointing", "every layer", "every other layer",
                                           "selective, every layer"]  # nothing "as written" to compare
    assert wrapped_left(gpt.model) == []
    assert s.to_dict()["change"]["code"] == s.change.code
    assert f"keep it in your code: {s.change.how}\n" in str(s) and s.change.code in str(s)
    if s.change.imports.startswith("from torch.utils.checkpoint"):  # the line, written into the file, keeps the plan
        source = path.read_text().replace(s.change.before, s.change.code)
        _, kept = load(tmp_path, f"{s.change.imports}\n{source}", "gpt_kept")
        assert recheck.measure(kept.step, repeats=1).checkpointed.observed_peak == s.suggested.measured_peak
    else:
        assert s.change.code == 'recheck.apply_plan(model, "plan.json")'


@pytest.mark.slow
def test_the_command_wraps_blocks_a_sequential_runs_and_the_printed_call_keeps_the_measured_peak(tmp_path, capsys):
    path, cnn = load(tmp_path, CNN, "cnn")
    budget = _budget(cnn.step)
    assert main(["cost", "--suggest", "--budget", str(budget), f"{path}:step", "--repeats", "1", "-q",
                 "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    change, planned = document["change"], [m["path"] for m in document["plan"]["modules"]]
    assert [a["name"] for a in document["anchors"]][-1] == "selective, every layer"  # no "as written"
    assert wrapped_left(cnn.model) == []
    assert change["how"].startswith("the blocks run inside torch's Sequential.forward, not a line of your code")
    assert change["code"].startswith("apply_activation_checkpointing(model, check_fn=lambda m: ")
    exec(f"{change['imports']}\n{change['code']}", {"model": cnn.model})  # what the user types
    wrapped = sorted(n for n, m in cnn.model.named_modules() if type(m).__name__ == "CheckpointWrapper")
    assert wrapped == sorted(planned)
    assert recheck.measure(cnn.step, repeats=1).checkpointed.observed_peak == document["suggested"]["measured_peak_bytes"]


@pytest.mark.slow
def test_a_plan_over_blocks_with_batch_norm_exits_1_with_what_check_step_found(tmp_path, capsys):
    path, cnn = load(tmp_path, CNN.replace("ResNet(norm_layer=group_norm)", "ResNet()"), "cnn_bn")
    budget = _budget(cnn.step)
    assert main(["cost", "--suggest", "--budget", str(budget), f"{path}:step", "--repeats", "1", "-q"]) == 1
    out = capsys.readouterr().out
    assert "check_step of suggested:" in out and "RC106" in out
    assert wrapped_left(cnn.model) == []


def test_the_command_says_why_a_model_has_no_block_to_plan(tmp_path, capsys):
    path, _ = load(tmp_path, PLAIN, "plain")
    assert main(["cost", "--suggest", "--budget", "1GiB", f"{path}:layers_step", "--repeats", "1", "-q"]) == 2
    err = capsys.readouterr().err
    assert "no repeated block" in err and "the step's ModuleList runs 3 Linear" in err


def test_a_model_that_checkpoints_has_no_change_printed(tmp_path):
    source = GPT.replace("x = block(x)", "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)")
    _, gpt = load(tmp_path, "import torch.utils.checkpoint\n" + source, "gpt_checkpointed")
    found = candidates_of(gpt.step)
    assert all(c.written for c in found.units)
    assert change_for(found, Plan((("blocks.0", "full"),), root="GPT")) is None


def test_a_selective_variant_that_keeps_nothing_more_than_the_full_one_is_not_a_choice(tmp_path):
    from recheck.cost.planner.suggestion import census

    _, cnn = load(tmp_path, CNN, "cnn")
    _, gpt = load(tmp_path, GPT, "gpt")
    for module, selective in ((cnn, False), (gpt, True)):  # convolutions are not saved selectively; mm is
        state = discover_state(module.step)
        found, _, model = census(module.step, state, state.snapshot(), 1, lambda what: None)
        assert {c.variants for c in found.units} == {("none", "full", "selective") if selective else ("none", "full")}
        assert model.problem().variants == [c.variants for c in found.items]
