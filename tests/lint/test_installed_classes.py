"""A region reached through a parameter annotated with an installed library's class.

ColossalAI's shardformer replaces transformers' model forwards with its own functions,
``def llama_model_forward(self: LlamaModel, ...)``, which checkpoint ``decoder_layer.__call__``
for each ``decoder_layer`` in ``self.layers``: the layer classes are in transformers, outside
the linted tree.  The linter reads the annotated class from the installed package's source
on the import path (as it reads a checkpointing base class, never importing it) and
follows its ``self.layers`` to the layer class it builds.  The imitations below are written
here, in the style of that code; the "installed" package raises if imported.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from recheck.lint.engine import lint_sources
from recheck.lint.statistics import run_statistics

MODELING = '''
from torch import nn


class FakeDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.mlp = nn.Linear(config.hidden_size, config.hidden_size)
        self.calls = 0

    def forward(self, hidden_states, attention_mask=None, past_key_values=None):
        self.calls += 1
        return self.mlp(hidden_states)


class FakePreTrainedModel(nn.Module):
    supports_gradient_checkpointing = True


class FakeModel(FakePreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([FakeDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.gradient_checkpointing = False
'''

FORWARDS = '''
from typing import List, Optional

import torch
from fakelm.models.fake.modeling_fake import {annotation}


class FakePipelineForwards:
    @staticmethod
    def fake_model_forward(
        self: {annotation},
        hidden_states: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        stage_index: Optional[List[int]] = None,
    ):
        start_idx, end_idx = stage_index[0], stage_index[1]
        for idx, decoder_layer in enumerate(self.layers[start_idx:end_idx], start=start_idx):
            if self.gradient_checkpointing and self.training:
                layer_outputs = self._gradient_checkpointing_func(
                    decoder_layer.__call__,
                    hidden_states,
                    attention_mask,
                    None,
                )
            else:
                layer_outputs = decoder_layer(hidden_states, attention_mask=attention_mask)
            hidden_states = layer_outputs
        return hidden_states
'''


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A package ``fakelm`` on ``sys.path`` (never importable: its ``__init__`` raises)."""
    site = tmp_path / "site"
    for folder, star in (("fakelm", ".models"), ("fakelm/models", ".fake.modeling_fake"), ("fakelm/models/fake", "")):
        (site / folder).mkdir(parents=True)
        (site / folder / "__init__.py").write_text('raise RuntimeError("imported")\n'
                                                   + (f"from {star} import *  # noqa: F403\n" if star else ""))
    (site / "fakelm/models/fake/modeling_fake.py").write_text(MODELING)
    monkeypatch.syspath_prepend(str(site))
    return site


def _site(result):
    [site] = result.sites
    return site


def test_a_layer_of_an_installed_model_class_is_the_region(installed):
    result = lint_sources({"fake.py": FORWARDS.format(annotation="FakeModel")})
    site = _site(result)
    assert site.reason == ""
    [region] = site.regions
    assert region.startswith("FakeDecoderLayer.forward (") and "modeling_fake.py" in region
    assert run_statistics(result)["resolved_sites"] == 1
    assert "fakelm" not in sys.modules
    # the installed layer's own state write is the library's, not the linted tree's: no finding there
    assert [f.path for f in result.findings if f.path != "fake.py"] == []


def test_an_installed_class_is_found_through_star_reexports(installed):
    forwards = FORWARDS.format(annotation="FakeModel").replace("fakelm.models.fake.modeling_fake", "fakelm")
    [region] = _site(lint_sources({"fake.py": forwards})).regions
    assert region.startswith("FakeDecoderLayer.forward (")


def test_an_annotated_class_the_installed_package_lacks_is_said(installed):
    result = lint_sources({"fake.py": FORWARDS.format(annotation="FakeEncoder")})
    reason = _site(result).reason
    assert "`fakelm.models.fake.modeling_fake.FakeEncoder`" in reason
    assert "neither the linted tree nor the installed `fakelm` defines" in reason


def test_an_annotated_class_of_a_package_not_installed_is_said():
    result = lint_sources({"fake.py": FORWARDS.format(annotation="FakeModel")})
    assert _site(result).reason.endswith("`fakelm` is not installed where recheck runs)")


def test_an_installed_package_is_read_again_when_installed_after_a_cached_run(tmp_path, monkeypatch, lint, write):
    write("fake.py", FORWARDS.format(annotation="FakeModel"))
    assert "1 checkpoint call site was not resolved" in lint("fake.py", cache=True).out
    site = tmp_path / "site"
    (site / "fakelm/models/fake").mkdir(parents=True)
    for folder in ("fakelm", "fakelm/models", "fakelm/models/fake"):
        (site / folder / "__init__.py").write_text("")
    (site / "fakelm/models/fake/modeling_fake.py").write_text(textwrap.dedent(MODELING))
    monkeypatch.syspath_prepend(str(site))
    assert "not resolved" not in lint("fake.py", cache=True).out


SHADOWED = '''
from torch.utils.checkpoint import checkpoint

from blocks import Model


def model_forward(self: Model, x):
    for layer in self.layers:
        x = checkpoint(layer, x, use_reentrant=False)
    return x


def build_forward():
    from elsewhere import Model

    def forward(self, x):
        return Model.forward(self, x)

    return forward
'''

BLOCKS = '''
from torch import nn


class Block(nn.Module):
    def forward(self, x):
        return x * 2


class OtherBlock(nn.Module):
    def forward(self, x):
        return x * 3


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(4)])


class Other(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([OtherBlock() for _ in range(4)])
'''


def test_a_function_local_import_does_not_rebind_the_modules_name_elsewhere():
    result = lint_sources({"forwards.py": SHADOWED, "blocks.py": BLOCKS})
    [site] = result.sites
    assert [region.split(" ")[0] for region in site.regions] == ["Block.forward"]


ALIASED = '''
from torch.utils.checkpoint import checkpoint

from blocks import Model


def model_forward(self: Model, x, stage_index):
    decoder = self.decoder
    for idx in range(stage_index[0], stage_index[1]):
        decoder_layer = decoder.layers[idx]
        x = checkpoint(decoder_layer.__call__, x, use_reentrant=False)
    return x
'''

NESTED = '''
from torch import nn


class Block(nn.Module):
    def forward(self, x):
        return x * 2


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(4)])


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = Decoder()
'''


def test_a_local_alias_of_a_parameters_attribute_is_followed():
    # OPT's pipeline forward: decoder = self.decoder, then decoder.layers[idx]
    [site] = lint_sources({"forwards.py": ALIASED, "blocks.py": NESTED}).sites
    assert [region.split(" ")[0] for region in site.regions] == ["Block.forward"]


CHILDREN = '''
from enum import Enum

import torch.nn as nn
from torch.utils.checkpoint import checkpoint


class Format(str, Enum):
    NCHW = "NCHW"
    NHWC = "NHWC"


class FeatureDictNet(nn.ModuleDict):
    def __init__(self, model, output_fmt="NCHW"):
        super().__init__()
        self.output_fmt = Format(output_fmt)
        self.grad_checkpointing = False
        self.update(dict(model.named_children()))

    def forward(self, x):
        for i, (name, module) in enumerate(self.items()):
            x = checkpoint(module, x, use_reentrant=False) if self.grad_checkpointing else module(x)
        return x
'''


def test_children_added_at_run_time_are_said_so_not_named_by_a_non_module_attribute():
    # timm's FeatureDictNet: its children are the model's passed in; `output_fmt` is an Enum
    [site] = lint_sources({"features.py": CHILDREN}).sites
    assert site.regions == []
    assert site.reason == ("`module` is a child module of `FeatureDictNet`, and no module of the linted tree is "
                           "assigned to it (its children are added at run time)")


SPEC = '''
import types
from dataclasses import dataclass, field
from typing import Tuple, Union


@dataclass
class ModuleSpec:
    module: Union[Tuple, type]
    params: dict = field(default_factory=lambda: {})
    submodules: object = None


def build_module(spec_or_module: Union[ModuleSpec, type], *args, **kwargs):
    if isinstance(spec_or_module, types.FunctionType):
        return spec_or_module
    if isinstance(spec_or_module, ModuleSpec) and isinstance(spec_or_module.module, types.FunctionType):
        return spec_or_module.module  # a function given as the spec's module is used as it is
    if isinstance(spec_or_module, type):
        module = spec_or_module
    else:
        module = spec_or_module.module
    return module(*args, **spec_or_module.params, **kwargs)
'''

SPEC_LAYER = '''
from torch import nn
from torch.utils.checkpoint import checkpoint

from spec_utils import build_module


class TransformerLayer(nn.Module):
    def __init__(self, config, submodules):
        super().__init__()
        self.mlp = build_module(submodules.mlp, config=config)

    def forward(self, hidden_states):
        return checkpoint(self.mlp, hidden_states, use_reentrant=False)
'''


def test_a_module_built_from_a_spec_field_is_said_to_be_chosen_at_run_time():
    # Megatron: self.mlp = build_module(submodules.mlp, ...), the class a ModuleSpec's field
    [site] = lint_sources({"spec_utils.py": SPEC, "layer.py": SPEC_LAYER}).sites
    assert site.regions == []
    assert site.reason == ("`self.mlp` is built from `ModuleSpec.module`, a field of `spec_utils.ModuleSpec` set at "
                           "run time (the module class is chosen by configuration)")
