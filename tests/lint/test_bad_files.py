"""Files that cannot be linted: one ``path: error: ...`` line each, the rest still linted, exit 1."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def tree(write, region_source):
    write("good.py", region_source)


def _check(run, path, reason):
    assert run.code == 1
    assert f"{path}: error: {reason}" in run.err
    assert any(line.startswith("good.py:15:9: RC103") for line in run.lines), run.out  # the rest is linted
    assert run.lines[-1].endswith("1 file could not be linted.")


def test_syntax_error(lint, write, tree):
    write("broken.py", "from torch.utils.checkpoint import checkpoint\ndef f(:\n    checkpoint(f)\n")
    _check(lint(), "broken.py", "does not parse: invalid syntax (line 2, column 7)")


def test_syntax_error_without_checkpoint_text_is_not_parsed(lint, write, tree):
    # The pre-filter rules the file out: it can hold no region, so it is not parsed at all.
    write("broken.py", "def f(:\n")
    run = lint()
    assert run.code == 1 and run.err == ""


def test_not_utf8(lint, write, tree):
    write("latin.py", b"x = '\xe9t\xe9'\n")
    _check(lint(), "latin.py", "not valid UTF-8 (invalid byte 0xe9 at offset 5)")


def test_nul_bytes(lint, write, tree):
    write("nul.py", b"x = 1\x00\n")
    _check(lint(), "nul.py", "contains a NUL byte at offset 5; not Python source")


def test_huge_file(lint, write, tree):
    write("pyproject.toml", "[tool.recheck]\nmax-file-size = 1000\n")
    write("huge.py", "x = 1\n" * 400)
    _check(lint(), "huge.py", "file is 2400 bytes, larger than the 1000-byte limit (max-file-size); skipped")


def test_unreadable_file(lint, write, tree, tmp_path):
    os.symlink(tmp_path / "missing-target.py", tmp_path / "dangling.py")
    _check(lint(), "dangling.py", "cannot read file: No such file or directory")


def test_declared_encoding_is_honoured(lint, write, tree):
    write("latin.py", b"# -*- coding: latin-1 -*-\nx = '\xe9t\xe9'\n")
    run = lint()
    assert "latin.py" not in run.err and run.code == 1


def test_errors_and_json_keep_stdout_parseable(lint, write, tree):
    import json

    write("broken.py", "checkpoint(\n")
    run = lint("--format", "json")
    assert run.code == 1
    assert {r["path"] for r in json.loads(run.out)} == {"good.py"}
    assert "broken.py: error: does not parse" in run.err
