"""Fuzzing the linter's input: generated Python, random bytes, random cache files (issue 17).

Whatever a file holds, ``lint_paths`` returns: no exception, no hang (every walk is
bounded; nothing here is timed), and a file that cannot be linted is exactly one
per-file error while the rest of the tree is still linted.  The example counts are fixed
and small enough for CI (``FUZZ_EXAMPLES`` below); ``RECHECK_FUZZ_EXAMPLES`` raises them
for a longer run by hand.
"""

from __future__ import annotations

import ast
import json
import os
import tempfile
import warnings
from pathlib import Path

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recheck.lint.cache import FORMAT_VERSION
from recheck.lint.engine import lint_paths
from recheck.lint.settings import LintOptions

pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")  # hypothesmith compiles what it generates

FUZZ_EXAMPLES = int(os.environ.get("RECHECK_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])

GOOD = '''
from torch import nn
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def forward(self, x):
        print("block")
        return x

def run(x):
    return checkpoint(Block(), x, use_reentrant=False)
'''


def _harness(source: str) -> str:
    """``source`` plus a checkpointed region that calls every top-level def and class of it,
    so that the region rules walk the generated bodies too."""
    try:
        names = [n.name for n in ast.parse(source).body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        names = []
    calls = "".join(f"    {name}(x)\n" for name in names)
    targets = "".join(f"checkpoint({name}, x, use_reentrant=False)\n" for name in names)
    return (f"{source}\n\nfrom torch.utils.checkpoint import checkpoint\n\n"
            f"def fuzz_region(x):\n{calls}    return x\n\ncheckpoint(fuzz_region, x)\n{targets}")


def _parses(data: bytes) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(data.decode("utf-8"))
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
        return False
    return True


def _lint(files: dict[str, bytes], cache: bool = False):
    """Lint ``files`` in a fresh folder; also return the cache files the run wrote."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for name, data in files.items():
            (root / name).write_bytes(data)
        cwd = os.getcwd()
        os.chdir(root)
        try:
            result = lint_paths([Path(".")], LintOptions(root=root, cache_dir=root / ".cache" if cache else None, jobs=1))
        finally:
            os.chdir(cwd)
        written = root / ".cache" / f"lint-v{FORMAT_VERSION}"
        stored = {p.name: p.read_bytes() for p in written.iterdir()} if written.is_dir() else {}
    return result, stored


def _check(data: bytes, name: str = "fuzzed.py") -> None:
    result, _ = _lint({name: data, "good.py": GOOD.encode()})
    errors = [e for e in result.errors if e.path == name]
    assert [e.path for e in result.errors] == [e.path for e in errors], result.errors  # only the fuzzed file
    assert len(errors) <= 1
    if b"\x00" not in data and _parses(data):
        # it parses: linted, or (deep nesting) one "cannot be analysed" line, never "does not parse"
        assert not any("does not parse" in e.reason for e in errors), errors
    elif not data.strip(b" \t\r\n\x0c") == b"":
        assert errors or _parses(data), f"a file that does not parse passed silently: {data[:80]!r}"
    codes = {(f.path, f.code) for f in result.findings}
    assert ("good.py", "RC103") in codes  # the rest of the tree is still linted


@pytest.mark.slow
@FUZZ
@given(hypothesmith.from_grammar())
def test_generated_modules(source):
    _check(source.encode("utf-8"))


@pytest.mark.slow
@FUZZ
@given(hypothesmith.from_grammar())
def test_generated_modules_inside_a_checkpointed_region(source):
    _check(_harness(source).encode("utf-8"))


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes(data):
    _check(data)


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_after_checkpoint_text(data):
    _check(b"from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n" + data)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@pytest.mark.slow
@FUZZ
@given(st.one_of(st.binary(max_size=1024).map(lambda b: ("bytes", b)), JSON.map(lambda v: ("json", v))))
def test_random_cache_files_are_ignored_with_one_warning(damage):
    kind, value = damage
    result, stored = _lint({"good.py": GOOD.encode()}, cache=True)
    expected = sorted((f.path, f.line, f.code) for f in result.findings)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "good.py").write_text(GOOD)
        cache = root / ".cache" / f"lint-v{FORMAT_VERSION}"
        cache.mkdir(parents=True)
        for name, original in stored.items():
            if kind == "bytes":
                data = value
            else:  # a well-formed header around a random body: the validator's turn
                document = json.loads(original)
                document["body"] = value
                data = json.dumps(document).encode()
            (cache / name).write_bytes(data)
        cwd = os.getcwd()
        os.chdir(root)
        try:
            again = lint_paths([Path(".")], LintOptions(root=root, cache_dir=root / ".cache", jobs=1))
        finally:
            os.chdir(cwd)
    assert sorted((f.path, f.line, f.code) for f in again.findings) == expected
    assert len(again.warnings) <= 1
