"""Region resolution on real code shapes (issue 13): what each call site resolves to, and why not.

The golden fixtures check the findings; these check the regions behind them: every call
site of the fixtures written in the style of diffusers, DeepSpeed, Megatron, xformers,
torchtitan, accelerate and friends resolves, to the right class, and a site that cannot
resolve says why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recheck.lint.engine import lint_paths, lint_sources
from recheck.lint.settings import LintOptions

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lint"


def _lint(case: str):
    folder = FIXTURES / case
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return lint_paths([Path(".")], LintOptions(root=folder, cache_dir=None, jobs=1))
    finally:
        os.chdir(cwd)


def _regions(result) -> dict[tuple[str, int], list[str]]:
    return {(s.path, s.line): [r.split(" (")[0] for r in s.regions] for s in result.sites if s.kind == "site"}


@pytest.mark.parametrize("case", ["wrappers_found", "containers", "policies", "known_libraries", "constant_flags"])
def test_every_call_site_of_the_real_code_shapes_resolves(case):
    result = _lint(case)
    unresolved = [(s.path, s.line, s.reason) for s in result.sites if s.kind == "site" and not s.regions]
    assert unresolved == []
    assert result.stats["resolved_sites"] == result.stats["call_sites"] > 0


def test_wrappers_are_found_not_listed():
    result = _lint("wrappers_found")
    wrappers = sorted((s.path, s.caller) for s in result.sites if s.kind == "wrapper")
    assert wrappers == [("pkg/ckpt.py", "apply_ckpt"), ("pkg/ckpt.py", "maybe_checkpoint"),
                        ("pkg/model.py", "Net._run"), ("pkg/model.py", "Net.forward.checkpoint_handler")]
    assert _regions(result) == {
        ("pkg/model.py", 67): ["mlp_block.forward"],   # self._run(block, x): a method wrapper's parameter
        ("pkg/model.py", 70): ["attn_block.forward"],  # a function-local import alias of a wrapper of a wrapper
        ("pkg/model.py", 71): ["norm_block.forward"],  # self.activation_checkpoint_func: a parameter defaulting to one
        ("pkg/model.py", 76): ["gate_block.forward"],  # a nested wrapper over self.ckpt = partial(checkpoint, ...)
    }


def test_containers_through_nesting_factories_aliases_and_isinstance():
    regions = _regions(_lint("containers"))
    assert regions[("vae.py", 41)] == ["ResnetBlock.forward"]     # enumerate(list(zip(...))) with a nested tuple
    assert regions[("vae.py", 83)] == ["ResnetBlock.forward"]     # self.down[i].block[j], down = nn.Module()
    assert regions[("vae.py", 84)] == ["MidResnet.forward"]       # self.mid.block_1
    assert sorted(regions[("vae.py", 87)]) == ["DownBlock.forward", "ResnetBlock.forward"]  # append(factory())
    assert regions[("vae.py", 89)] == ["UpBlock.forward"]         # the same loop variable, its own loop
    assert regions[("vae.py", 106)] == ["ResnetBlock.forward"]    # isinstance narrows a loop variable
    assert regions[("vae.py", 108)] == ["AttnBlock.forward"]
    assert regions[("vae.py", 114)] == ["UpBlock.forward"]        # an alias set in both branches, a slice


def test_layers_borrowed_from_another_class_resolve_by_the_attribute_that_holds_them():
    # diffusers' Z-Image controlnet loops over self.noise_refiner, which only from_transformer
    # fills (from a transformer's); torchtune/torchtitan wrap model.<attr> with model: nn.Module
    regions = _regions(_lint("borrowed_layers"))
    assert regions == {("pkg/activations.py", 10): ["refiner_block.forward"],
                       ("pkg/controlnet_refiner.py", 26): ["refiner_block.forward"]}


def test_a_finding_names_a_region_that_reaches_it():
    result = _lint("containers")
    (count,) = [f for f in result.findings if f.line == 52]
    assert count.region == "UpBlock.forward" and "checkpointed at vae.py:89" in count.message


def test_policies_pick_the_classes_they_test():
    regions = _regions(_lint("policies"))
    assert regions == {
        ("train.py", 47): ["DecoderLayer.forward"],  # check_fn=lambda m: isinstance(m, DecoderLayer)
        ("train.py", 48): ["EncoderLayer.forward"],  # check_fn=is_encoder
        ("train.py", 49): ["CrossLayer.forward"],    # auto_wrap_policy=ModuleWrapPolicy({CrossLayer})
        ("train.py", 51): ["DecoderLayer.forward"],  # policy = partial(transformer_auto_wrap_policy, ...)
        ("train.py", 57): ["DecoderLayer.forward"],  # model.layers.named_children(), model: Transformer
    }


def test_known_libraries_and_their_reentrant_defaults():
    result = _lint("known_libraries")
    assert len(_regions(result)) == 7
    rc001 = sorted((f.line, f.message.split("; ")[1].split("'")[0]) for f in result.findings if f.code == "RC001")
    assert rc001 == [(42, "Transformer Engine"), (44, "colossalai")]


def test_constant_flags_count_as_false():
    result = _lint("constant_flags")
    assert [(f.line, f.code) for f in result.findings] == [(23, "RC002"), (24, "RC002")]
    assert all("F.dropout" in f.message for f in result.findings)


UNRESOLVED = '''
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaDecoderLayer
from mylib import build_layer

def wrap_forward(forward):
    def wrapper(*args):
        return checkpoint(forward, *args, use_reentrant=False)
    return wrapper

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = LlamaDecoderLayer()
        self.other = build_layer()

    def forward(self, x, model: nn.Module):
        x = checkpoint(self.layer, x, use_reentrant=False)
        x = checkpoint(self.missing, x, use_reentrant=False)
        for block in model.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return checkpoint(getattr(self, "dyn"), x, use_reentrant=False)
'''


def test_an_unresolved_site_says_why():
    result = lint_sources({"m.py": UNRESOLVED})
    reasons = {s.line: s.reason for s in result.sites if s.kind == "site"}
    assert reasons == {
        19: "`self.layer` is a `transformers.LlamaDecoderLayer`, defined outside the linted tree",
        20: "`self.missing` is never assigned a module the linter can see in `Model`",
        22: "`block` comes from `model.blocks`, parameter `model` of `Model.forward` "
            "(annotated `torch.nn.Module`, which as the installed `torch` defines it assigns no module to `blocks`)",
        23: "`self.dyn` is never assigned a module the linter can see in `Model`",
    }
    assert [(s.line, s.kind) for s in result.sites if s.kind == "wrapper"] == [(9, "wrapper")]


def test_statistics_list_the_unresolved_sites(lint, write):
    write("m.py", UNRESOLVED)
    document = json.loads(lint("--statistics", "--format", "json").out)
    assert (document["call_sites"], document["resolved_sites"], document["wrapper_sites"]) == (4, 0, 1)
    assert [u["line"] for u in document["unresolved"]] == [19, 20, 22, 23]
    text = lint("--statistics").out
    assert "checkpoint call sites: 4 found, 0 resolved to a region; 1 more inside wrappers" in text
    assert "  m.py:20:13: `checkpoint`: `self.missing` is never assigned a module" in text


def test_show_regions(lint, write):
    write("m.py", UNRESOLVED)
    lines = lint("--show-regions", "m.py").lines
    assert lines[0] == ("m.py:9:16: checkpoint(forward) -> a wrapper: `wrap_forward` passes its parameter `forward` on: "
                        "its callers name the region")
    assert lines[1].startswith("m.py:19:13: checkpoint(self.layer) -> unresolved: `self.layer` is a `transformers")
    assert lint("--show-regions", "elsewhere").lines == ["no checkpoint call sites under elsewhere"]


def test_namespace_packages_resolve_across_files(lint, write):
    # megatron/ has no __init__.py: its modules are core.*, its imports say megatron.core.*
    write("megatron/core/__init__.py", "")
    write("megatron/core/layers.py", "from torch import nn\nclass Block(nn.Module):\n    def forward(self, x):\n        print(x)\n        return x\n")
    write("megatron/core/model.py", "from torch.utils.checkpoint import checkpoint\nfrom megatron.core.layers import Block\n"
          "def run(x):\n    return checkpoint(Block(), x, use_reentrant=False)\n")
    run = lint("megatron")
    assert run.lines[0].startswith("megatron/core/layers.py:4:9: RC103 `print(...)` prints inside checkpointed region `Block.forward`")


REACHABILITY = '''
import logging
from torch import nn
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)


class Attention(nn.Module):
    def forward(self, x, mask=None, **kwargs):
        unused = [k for k, _ in kwargs.items() if k != "scale"]
        if len(unused) > 0:
            logger.warning("unexpected %s", unused)
        return x


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()

    def forward(self, x, attention_kwargs=None, **kwargs):
        attention_kwargs = attention_kwargs if attention_kwargs is not None else {}
        if attention_kwargs.get("scale", None) is not None:
            logger.warning("scale is deprecated")
        if kwargs:
            print("extra", kwargs)
        return self.attn(x, **attention_kwargs)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.other = Block()

    def forward(self, x, kw):
        x = checkpoint(self.block, x, use_reentrant=False)
        return checkpoint(self.other, x, kw, use_reentrant=False)
'''


def test_a_side_effect_is_reported_only_where_a_region_can_reach_it():
    # self.block gets no attention_kwargs and no **kwargs: neither warning can run from it;
    # self.other gets attention_kwargs (kw), so the warnings it can reach are reported, once
    result = lint_sources({"m.py": REACHABILITY})
    found = sorted((f.line, f.region, f.message.split("checkpointed at ")[1].split(")")[0]) for f in result.findings)
    assert found == [(13, "Block.forward", "m.py:39"), (25, "Block.forward", "m.py:39")]


def test_a_region_called_without_what_unlocks_a_warning_reports_nothing():
    source = REACHABILITY.replace("        return checkpoint(self.other, x, kw, use_reentrant=False)",
                                  "        return checkpoint(self.other, x, use_reentrant=False)")
    assert lint_sources({"m.py": source}).findings == []
    splat = REACHABILITY.replace("checkpoint(self.block, x, use_reentrant=False)",
                                 "checkpoint(self.block, x, use_reentrant=False, **kw)")
    assert {f.line for f in lint_sources({"m.py": splat}).findings} == {13, 25, 27}  # **kw: anything may arrive


CONSTRUCTOR = '''
from torch import nn
from torch.utils.checkpoint import checkpoint


class CheckpointWrapper(nn.Module):  # torch's and xformers' shape
    def __init__(self, mod, policy=None):
        super().__init__()
        self._checkpoint_wrapped_module = mod

    def forward(self, *args):
        return checkpoint(self._checkpoint_wrapped_module, *args, use_reentrant=False)


class Block(nn.Module):
    def forward(self, x):
        print("block")
        return x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = CheckpointWrapper(Block())
'''


def test_a_wrapper_class_is_found_by_what_its_constructor_keeps():
    result = lint_sources({"m.py": CONSTRUCTOR})
    assert [(s.line, s.kind) for s in result.sites] == [(12, "wrapper"), (24, "site")]
    assert [(f.line, f.code, f.region) for f in result.findings] == [(17, "RC103", "Block.forward")]


def test_a_subclass_of_torchs_activation_wrapper_is_a_wrapper():
    source = CONSTRUCTOR.replace(
        "class CheckpointWrapper(nn.Module):  # torch's and xformers' shape\n    def __init__(self, mod, policy=None):\n"
        "        super().__init__()\n        self._checkpoint_wrapped_module = mod\n",
        "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper\n\n\n"
        "class CheckpointWrapper(ActivationWrapper):  # xformers' SelectiveCheckpointWrapper\n"
        "    def __init__(self, mod, policy=None):\n        super().__init__(mod)\n")
    result = lint_sources({"m.py": source})
    assert [s.kind for s in result.sites] == ["wrapper", "site"]
    assert [(f.code, f.region) for f in result.findings] == [("RC103", "Block.forward")]


DEPRECATION = '''
import warnings
from torch import nn
from torch.utils.checkpoint import checkpoint


def deprecate(name):
    print(f"{name} is deprecated")


class Resnet(nn.Module):
    def forward(self, x, *args, **kwargs):
        if len(args) > 0 or kwargs.get("scale", None) is not None:
            deprecate("scale")  # diffusers' ResnetBlock2D shape
        return x


class Down(nn.Module):
    def __init__(self):
        super().__init__()
        self.resnet = Resnet()

    def forward(self, x, scale=None):
        return self.resnet(x, scale=scale)


def run(down, x, s):
    return checkpoint(down, x, use_reentrant=False), checkpoint(Down(), x, s, use_reentrant=False)
'''


def test_a_function_called_only_from_a_branch_that_cannot_run_is_not_walked():
    # Down() called with x alone: scale stays None, Resnet gets scale=None, the deprecate()
    # call cannot run; called with (x, s) it can, so the warning is reported once, from there
    result = lint_sources({"m.py": DEPRECATION})
    assert [(f.line, f.code, f.message.split("checkpointed at ")[1][:8]) for f in result.findings] == [(8, "RC103", "m.py:28)")]
    only_x = DEPRECATION.replace(", checkpoint(Down(), x, s, use_reentrant=False)", "")
    only_x = only_x.replace("checkpoint(down, x, use_reentrant=False)", "checkpoint(Down(), x, use_reentrant=False)")
    assert lint_sources({"m.py": only_x}).findings == []


BUG_SHAPES = {
    # the shapes of publicly reported recomputation bugs that issue 13 lists, each once
    "batchnorm in a lowercase class": ('''
from torch import nn
from torch.utils.checkpoint import checkpoint
class conv_bn(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4)
    def forward(self, x):
        return self.bn(x)
class net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = conv_bn()
    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)
''', "RC106"),
    "a module passed as a parameter": ('''
from torch import nn
from torch.utils.checkpoint import checkpoint
def run_block(block, x):
    return checkpoint(block, x, use_reentrant=False)
class Block(nn.Module):
    def forward(self, x):
        print("again")
        return x
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
    def forward(self, x):
        return run_block(self.block, x)
''', "RC103"),
    "named_children()": ('''
from torch import nn
from torch.utils.checkpoint import checkpoint
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n = 0
    def forward(self, x):
        self.n += 1
        return x
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block()
    def forward(self, x):
        for name, child in self.named_children():
            x = checkpoint(child, x, use_reentrant=False)
        return x
''', "RC104"),
    "a function-local import alias": ('''
from torch import nn
class Block(nn.Module):
    def forward(self, x):
        import logging
        logging.info("block")
        return x
def run(x):
    from torch.utils.checkpoint import checkpoint as ckpt
    return ckpt(Block(), x, use_reentrant=False)
''', "RC103"),
    "preserve_rng_state=flag with flag = False": ('''
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
class Drop(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.1, self.training)
def run(x):
    flag = False
    return checkpoint(Drop(), x, use_reentrant=False, preserve_rng_state=flag)
''', "RC002"),
    "a cache argument mutated with .update()": ('''
from torch import nn
from torch.utils.checkpoint import checkpoint
class Layer(nn.Module):
    def forward(self, x, cache):
        cache.update({"k": x})
        return x
def run(x, cache):
    return checkpoint(Layer(), x, cache, use_reentrant=False)
''', "RC104"),
}


@pytest.mark.parametrize("shape", sorted(BUG_SHAPES))
def test_the_reported_bug_shapes_are_caught(shape):
    source, code = BUG_SHAPES[shape]
    assert code in {f.code for f in lint_sources({"m.py": source}).findings}


def test_a_long_chain_of_reassignments_stays_small():
    # x = f(x) sixty times: each binding used to hold every earlier one twice over (2**60 refs)
    body = "".join("    x = F.gelu(x)\n" for _ in range(60))
    source = ("import torch.nn.functional as F\nfrom torch.utils.checkpoint import checkpoint\n\n"
              f"def block(x):\n{body}    print(x)\n    return x\n\n"
              "def run(x):\n    return checkpoint(block, x, use_reentrant=False)\n")
    result = lint_sources({"m.py": source})
    assert [(f.line, f.code) for f in result.findings] == [(65, "RC103")]


def test_an_attribute_many_classes_hold_says_nothing_of_the_class():
    classes = "".join(f'''
class Block{i}(nn.Module):
    def forward(self, x):
        return x


class Model{i}(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block{i}()])
''' for i in range(4))
    source = f'''
from torch import nn
from torch.utils.checkpoint import checkpoint
{classes}

def apply_ac(model: nn.Module, x):
    for layer in model.layers:
        x = checkpoint(layer, x, use_reentrant=False)
    return x
'''
    result = lint_sources({"m.py": source})
    site, = [s for s in result.sites if s.kind == "site"]
    assert site.regions == [] and "`model.layers`" in site.reason


CACHED_LAYER = '''
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer


class Attention(nn.Module):  # transformers 5.24's attention: writes the KV cache it is given
    def forward(self, hidden_states, attention_mask=None, cache=None, **kwargs):
        key_states, value_states = self.k(hidden_states), self.v(hidden_states)
        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)
        return hidden_states


class DecoderLayer(GradientCheckpointingLayer):
    def __init__(self):
        super().__init__()
        self.self_attn = Attention()

    def forward(self, hidden_states, attention_mask=None, cache=None, use_cache=False, **kwargs):
        return self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask, cache=cache, **kwargs)
'''


def test_a_layer_whose_wrapper_takes_the_cache_away_writes_no_cache():
    # GradientCheckpointingLayer sets `cache` (and `layer_past`) to None before it
    # checkpoints forward, so `if cache is not None: cache.update(...)` cannot run in the
    # region, through the attention's `**kwargs` too
    assert lint_sources({"m.py": CACHED_LAYER}).findings == []


@pytest.mark.parametrize("change", [
    # a layer that keeps its cache under checkpointing writes it again on the recompute
    ("class DecoderLayer(GradientCheckpointingLayer):\n",
     "class DecoderLayer(GradientCheckpointingLayer):\n    _can_checkpoint_with_cache = True\n"),
    # a cache under another name is not taken away
    ("cache=cache, **kwargs)\n", "cache=past, **kwargs)\n"),
    # the layer's own checkpoint call passes what it is given
    ("class DecoderLayer(GradientCheckpointingLayer):", "class DecoderLayer(nn.Module):"),
])
def test_a_cache_the_region_is_given_is_a_state_write(change):
    old, new = change
    source = CACHED_LAYER.replace(old, new)
    if "nn.Module):" in new and "Decoder" in new:
        source = source.replace("import GradientCheckpointingLayer", "import GradientCheckpointingLayer\n"
                                "from torch.utils.checkpoint import checkpoint") + (
            "\n\nclass Model(nn.Module):\n    def forward(self, x, cache):\n"
            "        return checkpoint(self.layer, x, cache=cache, use_reentrant=False)\n"
            "\n    def __init__(self):\n        super().__init__()\n        self.layer = DecoderLayer()\n")
    if "past" in new:
        source = source.replace("use_cache=False, **kwargs)", "use_cache=False, past=None, **kwargs)")
    findings = lint_sources({"m.py": source}).findings
    line = next(n for n, text in enumerate(source.splitlines(), 1) if "cache.update(" in text)
    assert [(f.code, f.line) for f in findings] == [("RC104", line)]
    assert "argument `cache` is mutated by `.update()`" in findings[0].message
