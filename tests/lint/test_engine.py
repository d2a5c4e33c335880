"""Engine mechanics: the cache, the process pool, on-demand parsing, discovery."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recheck.lint.cache import FORMAT_VERSION
from recheck.lint.engine import POOL_THRESHOLD, lint_paths
from recheck.lint.settings import LintOptions


def _findings(result):
    return [(f.path, f.line, f.column, f.code, f.message) for f in result.findings]


def test_cache_is_used_and_invalidated_by_content(write, region_source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write("m.py", region_source)
    options = LintOptions(root=tmp_path, cache_dir=tmp_path / "cache", jobs=1)
    cold = lint_paths([Path(".")], options)
    assert (cold.stats["parsed"], cold.stats["cached"]) == (1, 0)
    warm = lint_paths([Path(".")], options)
    assert (warm.stats["parsed"], warm.stats["cached"]) == (0, 1)
    assert _findings(warm) == _findings(cold)
    path.write_text(region_source.replace('print("block")', "pass"))
    changed = lint_paths([Path(".")], options)
    assert (changed.stats["parsed"], changed.stats["cached"]) == (1, 0)
    assert [f.code for f in changed.findings] == ["RC104"]


def test_corrupt_cache_entry_is_ignored(write, region_source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write("m.py", region_source)
    options = LintOptions(root=tmp_path, cache_dir=tmp_path / "cache", jobs=1)
    cold = lint_paths([Path(".")], options)
    entries = list((tmp_path / "cache" / f"lint-v{FORMAT_VERSION}").glob("*.json"))
    assert len(entries) == 2
    for entry in entries:
        entry.write_bytes(b"not json")
    again = lint_paths([Path(".")], options)
    assert again.stats["parsed"] == 1 and _findings(again) == _findings(cold)
    assert len(again.warnings) == 1 and again.warnings[0].endswith("; it was rewritten")
    third = lint_paths([Path(".")], options)  # rewritten: read again without a warning
    assert third.stats["parsed"] == 0 and third.warnings == [] and _findings(third) == _findings(cold)


def test_pool_gives_the_same_findings(write, region_source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i in range(POOL_THRESHOLD + 2):
        write(f"m{i:02}.py", region_source)
    serial = lint_paths([Path(".")], LintOptions(root=tmp_path, cache_dir=None, jobs=1))
    pooled = lint_paths([Path(".")], LintOptions(root=tmp_path, cache_dir=None, jobs=2))
    assert len(serial.findings) == 2 * (POOL_THRESHOLD + 2)
    assert _findings(pooled) == _findings(serial)


def test_prefilter_skips_files_without_checkpoint_text(write, region_source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write("m.py", region_source)
    write("other.py", "def f():\n    print('not reached')\n")
    result = lint_paths([Path(".")], LintOptions(root=tmp_path, cache_dir=None, jobs=1))
    assert (result.stats["files"], result.stats["candidates"], result.stats["parsed"]) == (2, 1, 1)


def test_files_sharing_a_module_name_are_all_linted(write, region_source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write("one/model.py", region_source)
    write("two/model.py", region_source)
    result = lint_paths([Path(".")], LintOptions(root=tmp_path, cache_dir=None, jobs=1))
    assert sorted({f.path for f in result.findings}) == ["one/model.py", "two/model.py"]


def test_a_cache_holding_only_a_result_is_tagged_and_ignored_by_git(write, tmp_path, monkeypatch):
    # a tree with no checkpoint text parses nothing, so only the phase-two result is
    # written: its folder must still carry CACHEDIR.TAG and a .gitignore
    monkeypatch.chdir(tmp_path)
    write("a.py", "x = 1\n")
    options = LintOptions(root=tmp_path, cache_dir=tmp_path / "cache", jobs=1)
    assert lint_paths([Path(".")], options).stats["parsed"] == 0
    assert (tmp_path / "cache" / f"lint-v{FORMAT_VERSION}" / "result.json").exists()
    assert (tmp_path / "cache" / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    assert (tmp_path / "cache" / ".gitignore").read_text() == "*\n"


def test_a_file_that_does_not_parse_is_counted_once(write, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write("broken.py", "from torch.utils.checkpoint import checkpoint\ncheckpoint(\n")
    write("fine.py", "from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n")
    result = lint_paths([Path(".")], LintOptions(root=tmp_path, cache_dir=None, jobs=1))
    assert [e.path for e in result.errors] == ["broken.py"]
    assert result.stats["files"] == 2


INTERRUPTED = """
import sys, time
from recheck.lint import engine

real = engine._phase_one


def slow(job):  # a worker busy when Ctrl-C comes
    with open(sys.argv[2], "a") as marker:
        marker.write("x")
    time.sleep(60)
    return real(job)


slow.__module__, slow.__qualname__ = "recheck.lint.engine", "_phase_one"
engine._phase_one = slow
from recheck.cli import main

sys.exit(main(["lint", "--no-cache", "-j", "2", sys.argv[1]]))
"""


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="no process groups")
def test_ctrl_c_during_a_pooled_lint_prints_one_line_and_exits_130(tmp_path, region_source):
    import signal
    import subprocess
    import sys
    import time

    tree = tmp_path / "tree"
    tree.mkdir()
    for n in range(20):
        (tree / f"m{n}.py").write_text(region_source)
    marker = tmp_path / "started"
    process = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(tree), str(marker)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (marker.exists() and len(marker.read_text()) >= 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    try:
        out, err = process.communicate(timeout=60)
    finally:  # no lint left running (its workers sleep a minute a file) when the test fails
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 130 and err == "recheck: interrupted\n", err


_BUILDING = '''
import torch
from torch.utils.checkpoint import checkpoint
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, (self.b, _) = torch.nn.Linear(2, 2), (torch.nn.Linear(2, 2), 0)
        layers = []
        for i in range(2):
            layers.append(torch.nn.Linear(2, 2))
        self.add_module("c", layers[0])
    def forward(self, x):
        return self.c(self.b(self.a(x)))
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)
class Unrelated:  # outlined: no region reaches it
    def __init__(self):
        self.table = {}
'''


_NO_CYCLES = """
import gc, sys
from recheck.lint.engine import lint_sources
source = sys.stdin.read()
lint_sources({"m.py": source})
gc.collect()
gc.disable()
result = lint_sources({"m.py": source})
assert not result.errors, result.errors
del result
print(gc.collect())
"""


def test_a_lint_run_leaves_no_reference_cycles():
    """The linter pauses the cyclic collector while it runs (its facts hold no cycles), so a
    cycle would keep a file's whole syntax tree alive until the end; every tree is freed as
    soon as its facts are made.  In a fresh interpreter: what other tests leave installed
    (import hooks) may make cycles of its own."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _NO_CYCLES], input=_BUILDING, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "0"


def test_a_pooled_run_parse_checks_every_file_no_region_reaches(write, region_source, tmp_path, monkeypatch):
    """Files no region reaches are parse-checked on the workers, part of them while this
    process finds regions between rounds: every broken one is reported once, a file a later
    round parses is judged by that parse, and the verdicts match a serial run's."""
    monkeypatch.chdir(tmp_path)
    for i in range(POOL_THRESHOLD + 2):
        write(f"pkg/m{i:02}.py", region_source)
    write("pkg/__init__.py", "")
    for i in range(40):
        write(f"pkg/plain{i:02}.py", f"X{i} = {i}\n" * 200)
    write("pkg/broken_a.py", "def f(:\n    pass\n")
    write("pkg/broken_b.py", "x = (1,\n")
    write("pkg/outputs.py", "from dataclasses import dataclass\n\n@dataclass\nclass Out:\n    y: object\n")
    write("pkg/user.py", """\
        from torch.utils.checkpoint import checkpoint
        from pkg.outputs import Out

        def block(x) -> Out:
            return make(x)

        def make(x):
            return x

        def run(x):
            return checkpoint(block, x, use_reentrant=True)
        """)
    serial = lint_paths([Path("pkg")], LintOptions(root=tmp_path, cache_dir=None, jobs=1))
    pooled = lint_paths([Path("pkg")], LintOptions(root=tmp_path, cache_dir=None, jobs=2))
    for result in (serial, pooled):
        assert sorted(e.path for e in result.errors) == ["pkg/broken_a.py", "pkg/broken_b.py"]
        # the return annotation is looked up by RC110 alone: the round after the walks asks again
        assert [(f.path, f.code) for f in result.findings if f.code == "RC110"] == [("pkg/user.py", "RC110")]
    assert [(e.path, e.reason) for e in pooled.errors] == [(e.path, e.reason) for e in serial.errors]
    assert _findings(pooled) == _findings(serial)
    assert pooled.stats == serial.stats
