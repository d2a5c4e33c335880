"""Import-alias resolution and module names (the cheap stand-in for libcst's name providers)."""

from __future__ import annotations

import ast

import pytest

from recheck.lint.imports import import_aliases, module_name


def aliases(source: str, module: str = "pkg.sub.mod", is_package: bool = False) -> dict[str, str]:
    return import_aliases(ast.walk(ast.parse(source)), module, is_package)


@pytest.mark.parametrize(
    "source, name, qualified",
    [
        ("import torch.utils.checkpoint as cp", "cp", "torch.utils.checkpoint"),
        ("import torch.utils.checkpoint", "torch", "torch"),
        ("from torch.utils.checkpoint import checkpoint as ckpt", "ckpt", "torch.utils.checkpoint.checkpoint"),
        ("from . import layers", "layers", "pkg.sub.layers"),
        ("from .layers import Mlp", "Mlp", "pkg.sub.layers.Mlp"),
        ("from ..models._manipulate import checkpoint_seq", "checkpoint_seq", "pkg.models._manipulate.checkpoint_seq"),
        ("def f():\n    from torch.utils.checkpoint import checkpoint\n", "checkpoint", "torch.utils.checkpoint.checkpoint"),
    ],
)
def test_aliases(source, name, qualified):
    assert aliases(source)[name] == qualified


def test_relative_import_in_a_package_init():
    assert aliases("from .mlp import Mlp", module="pkg.layers", is_package=True)["Mlp"] == "pkg.layers.mlp.Mlp"


def test_module_name_follows_init_files(tmp_path):
    (tmp_path / "top" / "inner").mkdir(parents=True)
    (tmp_path / "top" / "__init__.py").write_text("")
    (tmp_path / "top" / "inner" / "__init__.py").write_text("")
    (tmp_path / "top" / "inner" / "mod.py").write_text("")
    assert module_name(tmp_path / "top" / "inner" / "mod.py") == ("top.inner.mod", False)
    assert module_name(tmp_path / "top" / "inner" / "__init__.py") == ("top.inner", True)
    assert module_name(tmp_path / "script.py") == ("script", False)
