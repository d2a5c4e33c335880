"""Shared helpers for the linter's tests: run ``recheck lint`` in-process."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from recheck.cli import main


@dataclass
class LintRun:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


@pytest.fixture
def lint(capsys, monkeypatch, tmp_path):
    """``lint(*args)`` runs ``recheck lint --no-cache`` inside ``tmp_path``."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str, cache: bool = False) -> LintRun:
        capsys.readouterr()
        code = main(["lint", *([] if cache else ["--no-cache"]), *args])
        captured = capsys.readouterr()
        return LintRun(code, captured.out, captured.err)

    return run


@pytest.fixture
def write(tmp_path):
    """``write("pkg/mod.py", source)`` writes dedented source under ``tmp_path``."""

    def put(relative: str, source: str | bytes) -> Path:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            path.write_bytes(source)
        else:
            path.write_text(textwrap.dedent(source), encoding="utf-8")
        return path

    return put


REGION = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        print("block")
        return self.lin(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)
'''


@pytest.fixture
def region_source() -> str:
    """A module with one region holding an RC104 (line 14) and an RC103 (line 15)."""
    return REGION
