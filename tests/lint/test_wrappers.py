"""A checkpointing base class is read from its source, not from a list of one release's names.

The fixtures imitate the shapes transformers' ``GradientCheckpointingLayer`` took over its
releases (written here, not copied): 4.5x clears ``past_key_value``/``past_key_values``/
``layer_past`` and checkpoints ``partial(super().__call__, **kwargs)``; 5.1x gates the same
under ``if not self._can_checkpoint_with_cache``; 5.2x wraps ``forward`` from
``__init_subclass__`` and clears ``cache``.  The wrapper is found in the linted tree, or in a
package on the import path (read, never imported), and a decoder layer that updates the
cache the wrapper clears has no RC104; one that updates a cache it does not clear has.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from recheck.lint.engine import lint_sources
from recheck.lint.statistics import run_statistics

CALL_SHAPE = '''
from functools import partial
from torch import nn


class GradientCheckpointingLayer(nn.Module):
    gradient_checkpointing = False

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training:
            if "use_cache" in kwargs and kwargs["use_cache"]:
                kwargs["use_cache"] = False
            if "past_key_value" in kwargs and kwargs["past_key_value"] is not None:
                kwargs["past_key_value"] = None
            if "past_key_values" in kwargs and kwargs["past_key_values"] is not None:
                kwargs["past_key_values"] = None
            if "layer_past" in kwargs and kwargs["layer_past"] is not None:
                kwargs["layer_past"] = None
            return self._gradient_checkpointing_func(partial(super().__call__, **kwargs), *args)
        return super().__call__(*args, **kwargs)
'''

GATED_SHAPE = '''
from functools import partial
from torch import nn


class GradientCheckpointingLayer(nn.Module):
    gradient_checkpointing = False
    _can_checkpoint_with_cache = False

    def __call__(self, *args, **kwargs):
        if self.gradient_checkpointing and self.training:
            if not self._can_checkpoint_with_cache:
                for name in ("past_key_value", "past_key_values", "layer_past"):
                    if name in kwargs:
                        kwargs[name] = None
            return self._gradient_checkpointing_func(partial(super().__call__, **kwargs), *args)
        return super().__call__(*args, **kwargs)
'''

SUBCLASS_HOOK_SHAPE = '''
from functools import partial, wraps
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class GradientCheckpointingLayer(nn.Module):
    gradient_checkpointing = False
    _can_checkpoint_with_cache = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        forward = cls.forward

        @wraps(forward)
        def checkpointed(self, *args, **kwargs):
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                kwargs.pop("use_cache", None)
                if not self._can_checkpoint_with_cache:
                    if kwargs.get("cache") is not None:
                        kwargs["cache"] = None
                    kwargs.update(layer_past=None)
                return checkpoint(partial(forward, self, **kwargs), *args, use_reentrant=False)
            return forward(self, *args, **kwargs)

        cls.forward = checkpointed
'''

SHAPES = {"call": CALL_SHAPE, "gated": GATED_SHAPE, "subclass_hook": SUBCLASS_HOOK_SHAPE}

LAYER = '''
from torch import nn
from {module} import GradientCheckpointingLayer


class Attention(nn.Module):
    def forward(self, hidden_states, {cache}=None, **kwargs):
        key, value = self.k(hidden_states), self.v(hidden_states)
        if {cache} is not None:
            key, value = {cache}.update(key, value, self.layer_idx)
        return hidden_states


class DecoderLayer(GradientCheckpointingLayer):
    def __init__(self):
        super().__init__()
        self.self_attn = Attention()

    def forward(self, hidden_states, attention_mask=None, {cache}=None, use_cache=False, **kwargs):
        return self.self_attn(hidden_states, {cache}={cache}, **kwargs)
'''

CLEARED = {"call": ["past_key_value", "past_key_values", "layer_past"],
           "gated": ["past_key_value", "past_key_values", "layer_past"],
           "subclass_hook": ["cache", "layer_past"]}
KEPT = {"call": ["cache"], "gated": ["cache"], "subclass_hook": ["past_key_values"]}


def _rc104(result) -> list[int]:
    return [f.line for f in result.findings if f.code == "RC104"]


def _cases(table):
    return [(shape, name) for shape, names in table.items() for name in names]


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """``installed(shape)``: a package ``fakelib`` on ``sys.path`` whose ``layers`` module
    defines the wrapper, re-exported by ``fakelib/__init__.py`` lazily (never importable:
    its ``__init__`` raises, so reading it by importing would fail the test)."""

    def put(shape: str) -> None:
        package = tmp_path / "site" / "fakelib"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text('raise RuntimeError("imported")\n'
                                             '_import_structure = {}\n_import_structure["layers"] = ["GradientCheckpointingLayer"]\n')
        (package / "layers.py").write_text(SHAPES[shape])
        monkeypatch.syspath_prepend(str(tmp_path / "site"))

    return put


@pytest.mark.parametrize("shape,cache", _cases(CLEARED))
def test_a_cache_the_tree_wrapper_clears_is_not_written(shape, cache):
    result = lint_sources({"wrap.py": SHAPES[shape], "layer.py": LAYER.format(module="wrap", cache=cache)})
    assert _rc104(result) == []
    assert run_statistics(result)["assumed"] == []


@pytest.mark.parametrize("shape,cache", _cases(KEPT))
def test_a_cache_the_tree_wrapper_does_not_clear_is_written(shape, cache):
    source = LAYER.format(module="wrap", cache=cache)
    result = lint_sources({"wrap.py": SHAPES[shape], "layer.py": source})
    line = next(n for n, text in enumerate(source.splitlines(), 1) if ".update(" in text)
    assert _rc104(result) == [line]


@pytest.mark.parametrize("shape", ["gated", "subclass_hook"])
def test_a_layer_that_keeps_its_cache_by_the_wrappers_flag_writes_it(shape):
    source = LAYER.format(module="wrap", cache="layer_past").replace(
        "class DecoderLayer(GradientCheckpointingLayer):\n", "class DecoderLayer(GradientCheckpointingLayer):\n"
        "    _can_checkpoint_with_cache = True\n")
    assert len(_rc104(lint_sources({"wrap.py": SHAPES[shape], "layer.py": source}))) == 1


@pytest.mark.parametrize("shape,cache", _cases(CLEARED))
def test_an_installed_wrapper_is_read_through_its_lazy_export(installed, shape, cache):
    installed(shape)
    result = lint_sources({"layer.py": LAYER.format(module="fakelib", cache=cache)})
    assert _rc104(result) == []
    assert run_statistics(result)["assumed"] == []
    assert "fakelib" not in sys.modules


@pytest.mark.parametrize("shape,cache", _cases(KEPT))
def test_an_installed_wrapper_that_does_not_clear_a_cache_leaves_its_finding(installed, shape, cache):
    installed(shape)
    assert len(_rc104(lint_sources({"layer.py": LAYER.format(module="fakelib", cache=cache)}))) == 1


def test_a_wrapper_found_nowhere_is_assumed_and_said():
    layer = LAYER.format(module="transformers.modeling_layers", cache="past_key_values")
    result = lint_sources({"layer.py": layer})
    assert _rc104(result) == []  # the built-in assumption: every release's spelling
    [note] = run_statistics(result)["assumed"]
    assert note.startswith("wrapper `transformers.modeling_layers.GradientCheckpointingLayer` not found in the tree "
                           "or installed; assumed")


def test_the_statistics_text_names_the_assumption(lint, write):
    write("layer.py", textwrap.dedent(LAYER.format(module="transformers", cache="cache")))
    out = lint("--statistics").out
    assert "note: wrapper `transformers.GradientCheckpointingLayer` not found in the tree or installed" in out


def test_an_upgraded_installed_wrapper_is_read_again_through_the_cache(installed, lint, write, tmp_path):
    installed("call")
    write("layer.py", textwrap.dedent(LAYER.format(module="fakelib", cache="past_key_values")))
    assert lint("layer.py", cache=True).code == 0
    assert lint("layer.py", cache=True).code == 0  # the cached result
    layers = tmp_path / "site" / "fakelib" / "layers.py"
    layers.write_text(SHAPES["call"].replace('kwargs["past_key_values"] = None', "pass") + "\n# upgraded\n")
    run = lint("layer.py", cache=True)
    assert run.code == 1 and "RC104" in run.out


KWARGS_LAYER = '''
from torch import nn
from wrap import GradientCheckpointingLayer


class Attention(nn.Module):
    def forward(self, hidden_states, attention_mask=None, {cache}=None, **kwargs):
        key, value = self.k(hidden_states), self.v(hidden_states)
        if {cache} is not None:
            key, value = {cache}.update(key, value, self.layer_idx)
        return hidden_states


class DecoderLayer(GradientCheckpointingLayer):
    def __init__(self):
        super().__init__()
        self.self_attn = Attention()

    def forward(self, hidden_states, attention_mask=None, use_cache=False, **kwargs):
        return self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
'''


@pytest.mark.parametrize("shape,cache", _cases(CLEARED))
def test_a_cleared_cache_that_reaches_the_attention_through_kwargs_is_not_written(shape, cache):
    # gpt_neox: the layer takes the cache in **kwargs only and splats it into the attention
    result = lint_sources({"wrap.py": SHAPES[shape], "layer.py": KWARGS_LAYER.format(cache=cache)})
    assert _rc104(result) == []


@pytest.mark.parametrize("shape,cache", _cases(KEPT))
def test_a_kept_cache_that_reaches_the_attention_through_kwargs_is_written(shape, cache):
    result = lint_sources({"wrap.py": SHAPES[shape], "layer.py": KWARGS_LAYER.format(cache=cache)})
    assert len(_rc104(result)) == 1


COPY_LAYER = '''
from torch import nn
from wrap import GradientCheckpointingLayer


class Attention(nn.Module):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, {cache}=None, **kwargs):
        key, value = self.k(hidden_states), self.v(hidden_states)
        if {cache} is not None:
            key, value = {cache}.update(key, value, self.layer_idx)
        return hidden_states, None


class EncoderDecoderCache:
    pass


class DecoderLayer(GradientCheckpointingLayer):
    def __init__(self):
        super().__init__()
        self.self_attention = Attention()
        self.cross_attention = Attention()

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, {cache}=None, **kwargs):
        self_attn_cache = {cache}
        if isinstance(self_attn_cache, EncoderDecoderCache):
            self_attn_cache = self_attn_cache.self_attention_cache
        output, _ = self.self_attention(hidden_states, position_embeddings, attention_mask, self_attn_cache, **kwargs)
        output, _ = self.cross_attention(output, {cache}=None, **kwargs)
        return output
'''


def _copy_layer_rc104(shape: str, cache: str, layer: str = COPY_LAYER) -> list[int]:
    return _rc104(lint_sources({"wrap.py": SHAPES[shape], "layer.py": layer.format(cache=cache)}))


@pytest.mark.parametrize("shape,cache", _cases(CLEARED))
def test_a_cleared_cache_copied_to_a_local_and_passed_positionally_is_not_written(shape, cache):
    # dia (5.2x): `self_attn_cache = cache` handed to the attention as its fourth argument
    assert _copy_layer_rc104(shape, cache) == []


@pytest.mark.parametrize("shape,cache", _cases(KEPT))
def test_a_kept_cache_copied_to_a_local_and_passed_positionally_is_written(shape, cache):
    source = COPY_LAYER.format(cache=cache)
    line = next(n for n, text in enumerate(source.splitlines(), 1) if ".update(" in text)
    assert _copy_layer_rc104(shape, cache) == [line]


@pytest.mark.parametrize("shape,cache", _cases(CLEARED))
def test_a_cleared_cache_rebound_to_module_state_is_written(shape, cache):
    # `cache = self.shared_cache` when the wrapper cleared it: the region writes the module's cache
    layer = COPY_LAYER.replace("        self_attn_cache = {cache}\n",
                               "        if {cache} is None:\n            {cache} = self.shared_cache\n"
                               "        self_attn_cache = {cache}\n")
    assert len(_copy_layer_rc104(shape, cache, layer)) == 1


@pytest.mark.parametrize("shape,cache", _cases(CLEARED))
def test_a_cleared_cache_in_another_positional_slot_leaves_the_callees_cache_written(shape, cache):
    # the argument binds to the callee's parameter at its position: the attention's cache here is the module's
    layer = COPY_LAYER.replace("hidden_states, position_embeddings, attention_mask, self_attn_cache, **kwargs",
                               "hidden_states, self_attn_cache, None, self.shared_cache, **kwargs")
    assert len(_copy_layer_rc104(shape, cache, layer)) == 1


@pytest.mark.parametrize("shape,cache", _cases(CLEARED))
def test_a_cleared_cache_passed_as_its_part_or_none_is_not_written(shape, cache):
    # t5gemma (5.2x): `cache=cache.self_attention_cache if cache is not None else None`
    layer = COPY_LAYER.replace("self.cross_attention(output, {cache}=None, **kwargs)",
                               "self.cross_attention(output, {cache}={cache}.cross_attention_cache "
                               "if {cache} is not None else None, **kwargs)")
    assert _copy_layer_rc104(shape, cache, layer) == []


SPARSE_LAYER = '''
from torch import nn
from wrap import GradientCheckpointingLayer


class SelfAttention(nn.Module):
    def forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None, {cache}=None, **kwargs):
        key, value = self.k(hidden_states), self.v(hidden_states)
        if {cache} is not None:
            key, value = {cache}.update(key, value, self.layer_idx)
        return hidden_states, None


class BlockSparseAttention(nn.Module):
    def forward(self, hidden_states, band_mask=None, from_mask=None, to_mask=None, from_blocked_mask=None,
                to_blocked_mask=None, **kwargs):
        return hidden_states, None


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = SelfAttention() if config.attention_type == "original_full" else BlockSparseAttention()

    def forward(self, hidden_states, attention_mask=None, {cache}=None, band_mask=None, from_mask=None,
                to_mask=None, from_blocked_mask=None, to_blocked_mask=None, **kwargs):
        if self.attention_type == "original_full":
            return self.self(hidden_states, attention_mask=attention_mask, {cache}={cache}, **kwargs)
        return self.self(hidden_states, band_mask, from_mask, to_mask, from_blocked_mask, to_blocked_mask, **kwargs)


class Layer(GradientCheckpointingLayer):
    def __init__(self, config):
        super().__init__()
        self.attention = Attention(config)

    def forward(self, hidden_states, attention_mask=None, band_mask=None, from_mask=None, to_mask=None,
                blocked_encoder_mask=None, {cache}=None, **kwargs):
        output, _ = self.attention(hidden_states, attention_mask=attention_mask, {cache}={cache}, band_mask=band_mask,
                                   from_mask=from_mask, to_mask=to_mask, from_blocked_mask=blocked_encoder_mask,
                                   to_blocked_mask=blocked_encoder_mask, **kwargs)
        return output
'''


@pytest.mark.parametrize("shape,cache", _cases(CLEARED))
def test_a_call_with_more_arguments_than_a_candidate_takes_does_not_reach_it(shape, cache):
    # big_bird: `self.self` is either attention; the block-sparse call's six positional
    # arguments cannot bind to the full attention's five parameters, so its cache stays None
    assert _copy_layer_rc104(shape, cache, SPARSE_LAYER) == []


@pytest.mark.parametrize("shape,cache", _cases(KEPT))
def test_a_kept_cache_reaching_the_full_attention_by_keyword_is_written(shape, cache):
    assert len(_copy_layer_rc104(shape, cache, SPARSE_LAYER)) == 1


@pytest.mark.parametrize("shape,cache", _cases(KEPT))
def test_a_layers_own_cache_parameter_is_never_in_its_splatted_kwargs(shape, cache):
    # idefics: the layer names `cache` and splats only `**kwargs` into the attention, which
    # cannot hold `cache`: the attention's cache is None whatever the wrapper keeps
    layer = COPY_LAYER.replace("self.self_attention(hidden_states, position_embeddings, attention_mask, "
                               "self_attn_cache, **kwargs)", "self.self_attention(hidden_states, **kwargs)")
    layer = layer.replace("self.cross_attention(output, {cache}=None, **kwargs)",
                          "self.cross_attention(hidden_states=output, attention_mask=attention_mask, **kwargs)")
    assert _copy_layer_rc104(shape, cache, layer) == []


CHECKPOINT_NONE = '''
import torch
from torch import nn


class DecoderLayer(nn.Module):
    def forward(self, hidden_states, past_key_values=None, attention_mask=None, position_ids=None):
        key, value = self.k(hidden_states), self.v(hidden_states)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
        return hidden_states


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer() for _ in range(2)])

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, position_ids=None):
        for block in self.layers:
            hidden_states = torch.utils.checkpoint.checkpoint(
                block.__call__, hidden_states, {cache}, attention_mask, position_ids, use_reentrant=False)
        return hidden_states
'''


def test_a_checkpoint_call_passing_none_for_the_cache_position_is_not_written():
    # clvp (4.5x): `checkpoint(block.__call__, hidden_states, None, attention_mask, ...)`
    assert _rc104(lint_sources({"model.py": CHECKPOINT_NONE.format(cache="None")})) == []


def test_a_checkpoint_call_passing_the_cache_by_position_is_written():
    assert len(_rc104(lint_sources({"model.py": CHECKPOINT_NONE.format(cache="past_key_values")}))) == 1
