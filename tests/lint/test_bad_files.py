"""Files that cannot be linted: one ``path: error: ...`` line each, the rest still linted, exit 2."""

from __future__ import annotations

import os
import warnings

import pytest


@pytest.fixture
def tree(write, region_source):
    write("good.py", region_source)


def _check(run, path, reason):
    assert run.code == 2  # an input error wins over the findings, which are still all printed
    assert f"{path}: error: {reason}" in run.err
    assert any(line.startswith("good.py:15:9: RC103") for line in run.lines), run.out  # the rest is linted
    assert "1 file could not be linted." in run.lines  # the count of unresolved sites may follow


def test_syntax_error(lint, write, tree):
    write("broken.py", "from torch.utils.checkpoint import checkpoint\ndef f(:\n    checkpoint(f)\n")
    _check(lint(), "broken.py", "does not parse: invalid syntax (line 2, column 7)")


def test_syntax_error_without_checkpoint_text_is_still_reported(lint, write, tree):
    # The pre-filter rules the file out of analysis, but every file is parse-checked (issue 14).
    write("broken.py", "def f(:\n")
    _check(lint(), "broken.py", "does not parse: invalid syntax (line 1, column 7)")


def test_syntax_check_verdicts_are_cached(lint, write, tree):
    write("broken.py", "def f(:\n")
    write("fine.py", "x = 1\n")
    lint(cache=True)
    again = lint("--statistics", "--format", "json", cache=True)
    assert "broken.py: error: does not parse" in again.err and again.code == 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("jobs", ["0", "1"])
def test_a_fifo_in_a_folder_is_an_error_not_a_hang(lint, write, tree, tmp_path, jobs):
    os.mkfifo(tmp_path / "pipe.py")
    _check(lint("-j", jobs), "pipe.py", "is a FIFO, not a regular file; skipped")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_named_directly_is_an_error(lint, write, tree, tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    _check(lint(".", "pipe.py"), "pipe.py", "is a FIFO, not a regular file; skipped")
    alone = lint("pipe.py")
    assert alone.code == 2 and "pipe.py: error: is a FIFO" in alone.err


def test_a_device_named_directly_is_an_error(lint, tree):
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null")
    run = lint("/dev/null")
    assert run.code == 2 and "/dev/null: error: is a character device, not a regular file; skipped" in run.err


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
    assert run.code == 2
    assert {r["path"] for r in json.loads(run.out)} == {"good.py"}
    assert "broken.py: error: does not parse" in run.err


def test_warnings_about_the_linted_code_are_not_printed(lint, write, tree):
    write("odd.py", 'from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\nx = "\\d"\nz = 1 is 1\n')
    write("plain.py", 'y = "s"()\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = lint("-j", "1")
    assert "Warning" not in run.err and [str(w.message) for w in caught] == []


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="no /proc")
@pytest.mark.parametrize("limit", [1 << 30, 1 << 62])
def test_a_file_whose_size_reads_as_0_is_read_within_the_limit(limit):
    # /proc files say st_size 0; reading "up to the limit" must not allocate the limit (issue 40)
    from pathlib import Path

    from recheck.lint.files import read_source

    text, data = read_source(Path("/proc/self/status"), "status.py", limit)
    assert text.startswith("Name:") and len(data) < 1 << 20


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="no /proc")
def test_a_file_over_the_limit_is_never_read_past_it(tmp_path):
    from pathlib import Path

    from recheck.lint.files import read_source

    error = read_source(Path("/proc/self/status"), "status.py", 10)
    assert error.reason == "file is over the 10-byte limit (max-file-size); skipped"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_gitignore_that_never_ends_is_not_read(lint, tree, tmp_path):
    (tmp_path / ".gitignore").symlink_to("/dev/zero")
    run = lint()
    assert run.code == 1 and any(line.startswith("good.py:15:9: RC103") for line in run.lines)


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
def test_a_symbolic_link_loop_is_a_file_error_in_every_format(lint, tree, tmp_path, fmt):
    import json

    os.symlink("loop.py", tmp_path / "loop.py")
    run = lint("--format", fmt)
    assert "Traceback" not in run.err and run.code == 2
    reason = "cannot read file: Too many levels of symbolic links"
    if fmt == "sarif":
        invocation = json.loads(run.out)["runs"][0]["invocations"][0]
        [note] = invocation["toolExecutionNotifications"]
        assert note["message"]["text"] == reason
        assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "loop.py"
    elif fmt == "github":
        assert f"::error file=loop.py,title=recheck%3A file not linted::{reason}" in run.lines
    else:
        assert f"loop.py: error: {reason}" in run.err


def test_a_file_swapped_for_a_symbolic_link_loop_during_the_run(lint, tree, tmp_path, monkeypatch):
    from recheck.lint import engine

    found = engine.find_regions

    def swap_then_find(*args, **kwargs):
        (tmp_path / "good.py").unlink()
        os.symlink("good.py", tmp_path / "good.py")
        return found(*args, **kwargs)

    monkeypatch.setattr(engine, "find_regions", swap_then_find)
    run = lint("--format", "sarif")
    assert "Traceback" not in run.err
    assert any(r["ruleId"] == "RC103" for r in json_results(run.out))


def json_results(out: str) -> list:
    import json

    return json.loads(out)["runs"][0]["results"]


def test_show_regions_of_a_symbolic_link_loop(lint, tree, tmp_path):
    os.symlink("loop.py", tmp_path / "loop.py")
    run = lint("--show-regions", "loop.py", ".")
    assert "Traceback" not in run.err and "loop.py: error: cannot read file" in run.err


@pytest.fixture
def unreadable(tmp_path, monkeypatch):
    """``unreadable(folder)``: a folder that cannot be listed (mode 0; for root, which the
    kernel lets through, os.scandir refuses it as it would for anyone else)."""
    real = os.scandir
    made = []

    def scandir(path="."):
        if not os.stat(path).st_mode & 0o444:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)

    def make(folder):
        made.append(folder)
        folder.chmod(0)

    yield make
    for folder in made:
        folder.chmod(0o755)


@pytest.mark.parametrize("fmt", ["text", "github"])
def test_an_unreadable_sub_folder_is_reported_like_an_unreadable_file(lint, write, tree, tmp_path, unreadable, fmt):
    write("sub/inner.py", "x = 1\n")
    write("sub/deeper/m.py", "x = 1\n")
    unreadable(tmp_path / "sub")
    run = lint("--format", fmt)
    assert run.code == 2 and any(line.startswith("good.py:15:9: RC103") or "line=15" in line for line in run.lines)
    if fmt == "github":
        assert "::error file=sub,title=recheck%3A folder not linted::cannot read folder: Permission denied" in run.lines
    else:
        assert "sub: error: cannot read folder: Permission denied" in run.err
        assert run.lines[-2:] == ["Found 2 findings.", "1 folder could not be linted."]


def test_an_unreadable_folder_named_directly_is_reported(lint, write, tree, tmp_path, unreadable):
    write("sub/inner.py", "x = 1\n")
    unreadable(tmp_path / "sub")
    run = lint("sub")
    assert run.code == 2 and "sub: error: cannot read folder: Permission denied" in run.err
    assert "All checks passed!" not in run.out


@pytest.mark.parametrize("source", [
    "x = " + "-" * 100_000 + "1\n",
    "from torch.utils.checkpoint import checkpoint\nx = " + "-" * 100_000 + "1\n",
    "from torch.utils.checkpoint import checkpoint\nx = " + "1+" * 100_000 + "1\n",
])
def test_a_too_deeply_nested_file_says_so(lint, write, tree, source):
    write("deep.py", source)
    [line] = [line for line in lint().err.splitlines() if line.startswith("deep.py")]
    assert line.startswith("deep.py: error: too deeply nested to parse (") and line.endswith("Error)"), line


@pytest.mark.parametrize("jobs", ["1", "0"])
def test_a_broken_file_parsed_again_for_a_wrapper_is_reported_once(lint, write, tree, jobs):
    # c.py is parsed in the first round (it calls checkpoint) and again once my_ckpt is found
    # to be a wrapper (it calls my_ckpt): one error line, not two
    write("a.py", "from torch.utils.checkpoint import checkpoint\n"
                  "def my_ckpt(fn, x):\n    return checkpoint(fn, x, use_reentrant=False)\n")
    write("c.py", "from torch.utils.checkpoint import checkpoint\nfrom a import my_ckpt\n"
                  "def f(x):\n    checkpoint(g, x)\n    return my_ckpt(g, x)\ndef g(:\n    pass\n")
    for _ in range(20 if jobs == "0" else 0):  # enough files for the pool
        write(f"pad{_}.py", "from torch.utils.checkpoint import checkpoint\ncheckpoint(print, 1)\n")
    run = lint("-j", jobs)
    assert run.err.count("c.py: error: does not parse") == 1, run.err
    assert "1 file could not be linted." in run.lines  # the count of unresolved sites may follow


@pytest.mark.parametrize("fmt", ["text", "json", "sarif", "github"])
@pytest.mark.parametrize("extra", [(), ("--exit-zero",), ("--statistics",)])
def test_an_input_error_exits_2_over_findings_in_every_format(lint, write, tree, fmt, extra):
    # the one contract (docs/exit-codes.md): 0 clean, 1 findings, 2 usage/config/input error (which wins over 1)
    assert lint("--format", fmt, *extra).code == (0 if "--exit-zero" in extra else 1)
    write("broken.py", "def f(:\n")
    run = lint("--format", fmt, *extra)
    assert run.code == 2 and "RC103" in run.out + run.err
    alone = lint("--format", fmt, *extra, "broken.py")
    assert alone.code == 2
