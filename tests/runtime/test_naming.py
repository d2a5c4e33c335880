"""Naming a region: its key, its definition and the call site."""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys

import torch

from recheck.runtime.naming import RegionKey, describe, region_name, relative


def test_region_keys_are_equal_and_hash_alike_by_their_three_parts() -> None:
    key = RegionKey("Block.forward", "model.py:10", "train.py:3")
    assert key == RegionKey("Block.forward", "model.py:10", "train.py:3")
    assert hash(key) == hash(RegionKey("Block.forward", "model.py:10", "train.py:3"))
    assert key != RegionKey("Block.forward", "model.py:10", "train.py:4")
    assert {key: 1}[RegionKey("Block.forward", "model.py:10", "train.py:3")] == 1
    assert str(key) == "Block.forward (model.py:10)"


def test_a_region_key_unpickled_in_another_process_hashes_as_that_process_does() -> None:
    """The hash is made once per key; a pickled key must not carry its maker's (string hashes
    are salted per process)."""
    key = RegionKey("Block.forward", "model.py:10", None)
    code = ("import pickle, sys\n"
            "from recheck.runtime.naming import RegionKey\n"
            "key = pickle.loads(sys.stdin.buffer.read())\n"
            "assert hash(key) == hash(RegionKey('Block.forward', 'model.py:10', None))\n"
            "assert {RegionKey('Block.forward', 'model.py:10', None): 1}[key] == 1\n")
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(key), env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


class Block(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_describe_names_a_module_partial_and_bound_method_by_the_forward_they_run() -> None:
    block = Block()
    keys = {describe(f, "train.py:1") for f in (block, block.forward, functools.partial(Block.forward, block))}
    (key,) = keys
    assert key.qualname == "Block.forward"
    assert key.defined_at == f"{relative(__file__)}:{Block.forward.__code__.co_firstlineno}"
    assert region_name(block).startswith("Block.forward")


def test_a_replaced_forward_is_named_anew() -> None:
    class Layer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    layer = Layer()
    assert describe(layer, None).qualname.endswith("Layer.forward")

    def other(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x

    Layer.forward = other  # type: ignore[method-assign]
    assert describe(layer, None).qualname.endswith("other")
    assert describe(layer.forward, None).qualname.endswith("other")


def _segment_of(index: int):
    """A closure per call, as timm's ``checkpoint_seq`` makes one per segment."""
    def segment(x: torch.Tensor) -> torch.Tensor:
        return x + index
    return segment


def _other_segment(index: int):
    def segment(x: torch.Tensor) -> torch.Tensor:  # the same qualified name, defined elsewhere
        return x - index
    segment.__qualname__ = "_segment_of.<locals>.segment"
    return segment


def test_a_plain_function_is_named_by_its_code_and_qualified_name_however_it_is_made() -> None:
    first, again = describe(_segment_of(0), "train.py:1"), describe(_segment_of(1), "train.py:1")
    assert first == again and first.qualname == "_segment_of.<locals>.segment"
    assert first.defined_at == f"{relative(__file__)}:{_segment_of(0).__code__.co_firstlineno}"

    renamed = _segment_of(2)
    renamed.__qualname__ = "renamed"
    assert describe(renamed, None).qualname == "renamed"

    @functools.wraps(_segment_of(3))
    def wrapper(x: torch.Tensor) -> torch.Tensor:
        return x

    # a decorated function is named by what it wraps (transformers decorates forwards so),
    # though the decorator's wrapper has one code for every function it wraps
    assert describe(wrapper, None).qualname == "_segment_of.<locals>.segment"

    def decorated(function):
        @functools.wraps(function)
        def wrapper(*args):
            return function(*args)
        return wrapper

    one, other = _segment_of(5), _other_segment(6)
    assert (describe(decorated(one), None).defined_at, describe(decorated(other), None).defined_at) == (
        f"{relative(__file__)}:{one.__code__.co_firstlineno}", f"{relative(__file__)}:{other.__code__.co_firstlineno}")


def test_a_held_working_directory_names_paths_until_its_last_release(tmp_path, monkeypatch) -> None:
    from recheck.runtime.naming import hold_cwd, release_cwd

    here = os.getcwd()
    path = os.path.join(here, "model.py")
    hold_cwd()
    hold_cwd()
    try:
        monkeypatch.chdir(tmp_path)  # a program that changes directory inside a watch() block
        assert relative(path) == "model.py"  # its call sites keep the names they had
        release_cwd()
        assert relative(path) == "model.py"
    finally:
        release_cwd()
    assert relative(path) == os.path.relpath(path, str(tmp_path)) or relative(path) == path
    assert relative(path) != "model.py"


def test_a_deleted_working_directory_leaves_paths_absolute(tmp_path, monkeypatch) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert relative(__file__) == __file__


def _deprecating(function):
    """transformers' ``deprecate_kwarg``: a wrapper made per decorated function, whose name is its target's."""
    @functools.wraps(function)
    def wrapped_func(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapped_func


def _plain_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x


def test_a_partial_of_a_decorated_function_is_named_by_its_target_and_its_module_class() -> None:
    """transformers' layers checkpoint ``partial(forward, self, **kwargs)``, a new partial per
    call over one decorated function: named as the first, whatever was named in between."""
    first, second = _deprecating(Block.forward), _deprecating(_plain_forward)
    block = Block()

    class Other(torch.nn.Module):
        pass

    for _ in range(2):  # the second round answers from what the first kept
        assert describe(functools.partial(first, block, flag=True), None).qualname == "Block.forward"
        assert describe(functools.partial(second, block), None).qualname == "Block._plain_forward"
        assert describe(functools.partial(second, Other()), None).qualname.endswith("Other._plain_forward")
        assert describe(functools.partial(second, torch.ones(1)), None).qualname == "_plain_forward"
        key = describe(functools.partial(second, block), "train.py:9")
        assert key.callsite == "train.py:9"
        assert key.defined_at == f"{relative(__file__)}:{_plain_forward.__code__.co_firstlineno}"


def test_a_library_file_is_named_from_its_import_root_wherever_the_program_runs(tmp_path, monkeypatch) -> None:
    # torch's own files (site-packages) are named as Python imports them, not as a path from the
    # working directory ("../venv/lib/python3.11/site-packages/...") or an absolute one
    import sysconfig

    library = os.path.join(sysconfig.get_paths()["purelib"], "somelib", "layers.py")
    monkeypatch.chdir(tmp_path)
    assert relative(library) == os.path.join("somelib", "layers.py")
    assert relative(torch.nn.modules.module.__file__) == os.path.join("torch", "nn", "modules", "module.py")
    assert relative(str(tmp_path / "model.py")) == "model.py"  # the program's own files as before


class _Block(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _run_function(start: int, end: int, functions):
    """timm's ``checkpoint_seq`` (and torch's ``checkpoint_sequential``): a closure per segment."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        for j in range(start, end + 1):
            x = functions[j](x)
        return x
    return forward


def _create_custom_forward(module: torch.nn.Module):
    """The pattern transformers < 4.35 and diffusers write around a layer."""
    def custom_forward(*inputs: torch.Tensor) -> torch.Tensor:
        return module(*inputs)
    return custom_forward


def test_a_closure_over_layers_of_one_class_is_named_by_that_layer() -> None:
    blocks = tuple(_Block() for _ in range(4))
    block_forward = f"{relative(__file__)}:{_Block.forward.__code__.co_firstlineno}"
    for function in (_run_function(0, 1, blocks), _run_function(2, 3, torch.nn.ModuleList(blocks)),
                     _create_custom_forward(blocks[0])):
        key = describe(function, "train.py:1")
        assert (key.qualname, key.defined_at) == ("_Block.forward", block_forward)


def test_a_closure_over_the_enclosing_module_or_mixed_layers_keeps_its_own_name() -> None:
    class Parent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            def part(y: torch.Tensor) -> torch.Tensor:  # a part of Parent.forward, not all of it
                return self.__class__.__name__ and y
            return part(x)

        def part(self):
            def part(y: torch.Tensor) -> torch.Tensor:
                return self.__class__.__name__ and y
            return part

    assert describe(Parent().part(), None).qualname.endswith("<locals>.part")
    mixed = (_Block(), torch.nn.ReLU())
    assert describe(_run_function(0, 1, mixed), None).qualname == "_run_function.<locals>.forward"
