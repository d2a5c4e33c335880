"""Modules built the ways model zoos build them are resolved to their classes.

Each imitation (written here in the style of timm's models, not copied) builds its stages a
way the linter once could not follow, then checkpoints them; the block's BatchNorm is
updated again on the recompute, so a resolved region reports RC106 at its line and an
unresolved one reports nothing (and lists the site as unresolved).
"""

from __future__ import annotations

import pytest

from recheck.lint.engine import lint_sources

HEAD = '''
from collections import OrderedDict
from typing import Tuple, Type, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_seq(functions, x):
    for function in functions:
        x = checkpoint(function, x, use_reentrant=False)
    return x


class Block(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, 3)
        self.bn = nn.BatchNorm2d(dim)

    def forward(self, x):
        return self.bn(self.conv(x))

    def forward_with_tap(self, x):
        x = self.bn(self.conv(x))
        return x, x


class PostNormBlock(Block):
    pass
'''

AUGMENTED_LIST = HEAD + '''

class Levit(nn.Module):
    def __init__(self, depths=(2, 2)):
        super().__init__()
        stages = []
        for depth in depths:
            stages += [Block(8)]
        self.stages = nn.Sequential(*stages)

    def forward(self, x):
        return checkpoint_seq(self.stages, x)
'''

CLASS_ALIAS = HEAD + '''

class Eva(nn.Module):
    def __init__(self, depth=2, post_norm=False):
        super().__init__()
        block_fn = PostNormBlock if post_norm else Block
        self.blocks = nn.ModuleList([block_fn(8) for _ in range(depth)])

    def forward(self, x):
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False)
        return x
'''

ADDED_TO_CONTAINER = HEAD + '''

class Xception(nn.Module):
    def __init__(self, cfgs=({}, {}), preact=False):
        super().__init__()
        self.blocks = nn.Sequential()
        module_fn = PostNormBlock if preact else Block
        for i, cfg in enumerate(cfgs):
            self.blocks.add_module(str(i), module_fn(**cfg))

    def forward(self, x):
        for i, blk in enumerate(self.blocks):
            if i == 0:
                x, tap = checkpoint(blk.forward_with_tap, x, use_reentrant=False)
            else:
                x = checkpoint(blk, x, use_reentrant=False)
        return x
'''

CALLABLE_BUILDER = HEAD + '''

class StageBuilder:
    def __init__(self, dim):
        self.dim = dim

    def _make_block(self, cfg):
        block = Block(self.dim)
        return block

    def __call__(self, stage_cfgs):
        stages = []
        for stage_cfg in stage_cfgs:
            blocks = []
            for cfg in stage_cfg:
                blocks.append(self._make_block(cfg))
            stages.append(nn.Sequential(*blocks))
        return stages


class EfficientNet(nn.Module):
    def __init__(self, block_args=((1, 1), (1,))):
        super().__init__()
        builder = StageBuilder(8)
        self.blocks = nn.Sequential(*builder(block_args))

    def forward(self, x):
        return checkpoint_seq(self.blocks, x)
'''

ANNOTATED_BUILDER = HEAD + '''

def make_blocks(block_fns: Tuple[Union[Type[Block], Type[PostNormBlock]], ...], channels=(8, 8)):
    stages = []
    feature_info = []
    for stage_idx, (block_fn, planes) in enumerate(zip(block_fns, channels)):
        stage_name = f"layer{stage_idx + 1}"
        blocks = []
        for _ in range(2):
            blocks.append(block_fn(planes))
        stages.append((stage_name, nn.Sequential(*blocks)))
        feature_info.append(dict(module=stage_name))
    return stages, feature_info


class ResNet(nn.Module):
    def __init__(self, block=Block):
        super().__init__()
        stage_modules, stage_feature_info = make_blocks([block] * 2)
        for stage in stage_modules:
            self.add_module(*stage)

    def forward_intermediates(self, x):
        for n in ("layer1", "layer2"):
            layer = getattr(self, n)
            x = checkpoint_seq(layer, x)
        return x

    def forward(self, x):
        return checkpoint_seq([self.layer1, self.layer2], x)
'''

ORDERED_DICTS = HEAD + '''

class DPN(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        blocks = OrderedDict()
        for i in range(depth):
            blocks[f"conv{i}"] = Block(8)
        self.features = nn.Sequential(blocks)
        self.body = nn.Sequential(OrderedDict([("layer1", Block(8)), ("layer2", Block(8))]))

    def forward(self, x):
        for layer in self.features:
            x = checkpoint(layer, x, use_reentrant=False)
        for stage in self.body:
            x = checkpoint(stage, x, use_reentrant=False)
        return x
'''

TUPLES_OF_STAGES = HEAD + '''

class Visformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed1 = nn.Identity()
        self.stage1 = nn.Sequential(Block(8))
        self.embed2 = nn.Identity()
        self.stage2 = nn.Sequential(Block(8))
        self.stop_early = False

    def forward(self, x):
        stages = [(self.embed1, self.stage1), (self.embed2, self.stage2)]
        if self.stop_early:
            stages = stages[:1]
        for embed, stage in stages:
            x = embed(x)
            x = checkpoint_seq(stage, x)
        return x
'''

FACTORY_RETURNS_CLASS = HEAD + '''

_block_registry = dict(plain=Block, post=PostNormBlock)


def get_block_fn(cfg):
    block_fn = cfg.block_fn or Block
    return block_fn


def create_block(kind, **kwargs):
    return _block_registry[kind](**kwargs)


def create_stages(cfg):
    stages = []
    for kind in cfg.kinds:
        stages += [nn.Sequential(create_block(kind, dim=8))]
    return nn.Sequential(*stages), []


class NaFlexVit(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.blocks = nn.Sequential(*[get_block_fn(cfg)(8) for _ in range(2)])
        self.stages, self.feature_info = create_stages(cfg)

    def forward(self, x):
        x = checkpoint_seq(self.stages, x)
        return checkpoint_seq(self.blocks, x)
'''

CASES = {
    "augmented_list": AUGMENTED_LIST,
    "class_alias": CLASS_ALIAS,
    "added_to_container": ADDED_TO_CONTAINER,
    "callable_builder": CALLABLE_BUILDER,
    "annotated_builder": ANNOTATED_BUILDER,
    "ordered_dicts": ORDERED_DICTS,
    "tuples_of_stages": TUPLES_OF_STAGES,
    "factory_returns_class": FACTORY_RETURNS_CLASS,
}


@pytest.mark.parametrize("source", list(CASES.values()), ids=list(CASES))
def test_built_stages_resolve_and_their_batchnorm_is_reported(source):
    result = lint_sources({"model.py": source})
    unresolved = [(s.line, s.region_source, s.reason) for s in result.sites if s.kind == "site" and not s.regions]
    assert unresolved == []
    lines = {n for n, text in enumerate(source.splitlines(), 1) if "self.bn(" in text}
    assert {f.line for f in result.findings if f.code == "RC106"} & lines


def test_a_call_on_a_module_instance_is_not_taken_for_a_builder():
    # `self.out = self.block(x)`-like code: an instance called in __init__ holds a tensor, not a module
    source = HEAD + '''

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        probe = Block(8)
        self.shape = probe(torch.zeros(1, 8, 4, 4)).shape
        self.head = nn.Linear(8, 8)

    def forward(self, x):
        return checkpoint(self.head, x, use_reentrant=False)
'''
    result = lint_sources({"model.py": source})
    assert [f.code for f in result.findings] == []
    [site] = [s for s in result.sites if s.region_source == "self.head"]
    assert "torch.nn.Linear" in site.reason


def test_a_block_class_from_a_star_import_is_found():
    # timm's _efficientnet_builder.py: `from ._efficientnet_blocks import *`, then `CondConvResidual(**ba)`
    blocks = HEAD
    model = '''
from torch import nn
from blocks import *


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(8), PostNormBlock(8))

    def forward(self, x):
        return checkpoint_seq(self.blocks, x)
'''
    result = lint_sources({"blocks.py": blocks, "model.py": model})
    assert [s.reason for s in result.sites if s.kind == "site" and not s.regions] == []
    assert {(f.path, f.code) for f in result.findings} == {("blocks.py", "RC106")}


def test_star_imports_that_import_each_other_end():
    # package __init__ files often star-import modules that star-import the package back
    first = "from second import *\nfrom third import *\n"
    second = "from first import *\nfrom third import *\n"
    third = "from first import *\nfrom second import *\n"
    model = HEAD.replace("from torch import nn\n", "from torch import nn\nfrom first import *\n") + '''

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Missing(8), Block(8))

    def forward(self, x):
        return checkpoint_seq(self.blocks, x)
'''
    result = lint_sources({"first.py": first, "second.py": second, "third.py": third, "model.py": model})
    assert [s.reason for s in result.sites if s.kind == "site" and not s.regions] == []
    assert [f.code for f in result.findings] == ["RC106"]
