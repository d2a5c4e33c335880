"""Submodules added by name at run time are seen: ``add_module``, ``register_module``,
``setattr(self, name, m)`` and ``get_submodule("a.b")``.

The fixtures imitate timm's ResNet and Xception (written here, not copied): stages made by a
helper that returns ``(name, nn.Sequential(...))`` pairs, added with ``self.add_module(*stage)``
or ``setattr(self, name, stage)``, then checkpointed by name (``checkpoint(self.layer1, x)``,
``checkpoint_seq([self.layer1, ...], x)``).  Their BatchNorm statistics are updated again on
the recompute (RC106), which the linter could not report while ``self.layer1`` looked unassigned.
"""

from __future__ import annotations

import pytest

from recheck.lint.engine import lint_sources

BLOCK = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Bottleneck(nn.Module):
    def __init__(self, planes):
        super().__init__()
        self.conv1 = nn.Conv2d(planes, planes, 1)
        self.bn1 = nn.BatchNorm2d(planes)

    def forward(self, x):
        return self.bn1(self.conv1(x))


def make_blocks(channels):
    stages = []
    for index, planes in enumerate(channels):
        stage_name = f"layer{index + 1}"
        blocks = [Bottleneck(planes) for _ in range(2)]
        stages.append((stage_name, nn.Sequential(*blocks)))
    return stages
'''

ADD_MODULE_STAR = BLOCK + '''

class ResNet(nn.Module):
    def __init__(self, channels=(64, 128)):
        super().__init__()
        stage_modules = make_blocks(channels)
        for stage in stage_modules:
            self.add_module(*stage)

    def forward(self, x):
        x = checkpoint(self.layer1, x, use_reentrant=False)
        return checkpoint(self.layer2, x, use_reentrant=False)
'''

SETATTR_NAME = BLOCK + '''

class Xception(nn.Module):
    def __init__(self, channels=(64, 128)):
        super().__init__()
        for name, stage in make_blocks(channels):
            setattr(self, name, stage)

    def forward(self, x):
        x = checkpoint(self.layer1, x, use_reentrant=False)
        return checkpoint(self.layer2, x, use_reentrant=False)
'''

CONSTANT_NAMES = BLOCK + '''

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module("layer1", nn.Sequential(Bottleneck(8)))
        setattr(self, "layer2", Bottleneck(8))
        self.register_module("layer3", Bottleneck(8))

    def forward(self, x):
        x = checkpoint(self.layer1, x, use_reentrant=False)
        x = checkpoint(self.layer2, x, use_reentrant=False)
        return checkpoint(self.layer3, x, use_reentrant=False)
'''

CHECKPOINT_SEQ = ADD_MODULE_STAR.replace(
    "from torch.utils.checkpoint import checkpoint",
    "from torch.utils.checkpoint import checkpoint\nfrom timm.models._manipulate import checkpoint_seq").replace(
    '''        x = checkpoint(self.layer1, x, use_reentrant=False)
        return checkpoint(self.layer2, x, use_reentrant=False)''',
    '''        return checkpoint_seq([self.layer1, self.layer2], x, flatten=True)''')

GET_SUBMODULE = BLOCK + '''

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Bottleneck(8) for _ in range(2)])


def apply_ac(model: Model, x):
    layers = model.get_submodule("layers")
    for layer in layers:
        x = checkpoint(layer, x, use_reentrant=False)
    return x
'''


@pytest.mark.parametrize("source", [ADD_MODULE_STAR, SETATTR_NAME, CONSTANT_NAMES, CHECKPOINT_SEQ, GET_SUBMODULE],
                         ids=["add_module_star", "setattr_name", "constant_names", "checkpoint_seq", "get_submodule"])
def test_stages_added_by_name_resolve_and_their_batchnorm_is_reported(source):
    result = lint_sources({"model.py": source})
    unresolved = [(s.line, s.reason) for s in result.sites if s.kind == "site" and not s.regions]
    assert unresolved == []
    line = next(n for n, text in enumerate(source.splitlines(), 1) if "self.bn1(" in text)
    assert [(f.code, f.line) for f in result.findings] == [("RC106", line)]


def test_a_dynamic_name_does_not_fill_an_attribute_assigned_otherwise():
    # `self.head` is assigned a Linear: the stages added by a computed name are not its candidates
    source = ADD_MODULE_STAR.replace(
        "            self.add_module(*stage)\n",
        "            self.add_module(*stage)\n        self.head = nn.Linear(8, 8)\n").replace(
        "return checkpoint(self.layer2, x, use_reentrant=False)", "return checkpoint(self.head, x, use_reentrant=False)")
    result = lint_sources({"model.py": source})
    [head] = [s for s in result.sites if s.region_source == "self.head"]
    assert head.regions == [] and "torch.nn.Linear" in head.reason
