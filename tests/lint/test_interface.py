"""``recheck lint``: output formats, exit codes, selection, configuration."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recheck.catalogue import all_rules
from recheck.findings import Finding
from recheck.lint.rules import ALL_CODES


def test_text_output_is_sorted_with_summary(lint, write, region_source):
    write("b.py", region_source)
    write("a.py", region_source)
    run = lint()
    assert run.code == 1
    assert [line.split(" ")[0] for line in run.lines[:4]] == ["a.py:14:9:", "a.py:15:9:", "b.py:14:9:", "b.py:15:9:"]
    assert run.lines[0].startswith("a.py:14:9: RC104 `self.calls` is incremented inside checkpointed region `Block.forward` (checkpointed at a.py:25)")
    assert run.lines[-1] == "Found 4 findings."


def test_clean_tree_exits_zero(lint, write):
    write("ok.py", "import torch\nprint('no checkpoint here')\n")
    run = lint()
    assert (run.code, run.out) == (0, "All checks passed!\n")


def test_exit_zero(lint, write, region_source):
    write("m.py", region_source)
    assert lint("--exit-zero").code == 0


def test_json_format(lint, write, region_source):
    write("m.py", region_source)
    run = lint("--format", "json")
    records = json.loads(run.out)
    assert run.code == 1
    # one finding record for every face: the fields of recheck.findings.Finding
    assert [set(r) for r in records] == [{f.name for f in dataclasses.fields(Finding)}] * 2
    assert {r["kind"] for r in records} == {"lint"}
    assert (records[0]["code"], records[0]["line"], records[0]["column"], records[0]["region"]) == ("RC104", 14, 9, "Block.forward")


def test_json_empty_is_a_list(lint, write):
    write("ok.py", "x = 1\n")
    assert json.loads(lint("--format", "json").out) == []


def test_sarif_format(lint, write, region_source, tmp_path):
    write("src/m.py", region_source)
    run = lint("--format", "sarif", "src")
    sarif = json.loads(run.out)
    assert sarif["version"] == "2.1.0"
    driver = sarif["runs"][0]["tool"]["driver"]
    assert driver["name"] == "recheck"
    assert {r["id"] for r in driver["rules"]} == {rule.code for rule in all_rules()} >= set(ALL_CODES)
    result = sarif["runs"][0]["results"][0]
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "src/m.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"]["startLine"] == 14
    assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"] == "RC104"


def test_github_format(lint, write, region_source):
    write("m.py", region_source)
    first = lint("--format", "github").lines[0]
    assert first.startswith("::warning file=m.py,line=14,col=9,endLine=14,endColumn=19,title=recheck (RC104)::RC104 ")


def test_github_format_gives_file_errors_as_error_annotations(lint, write):
    write("bad.py", "from torch.utils.checkpoint import checkpoint\ny = checkpoint(f, x\n")
    run = lint("--format", "github")
    assert run.code == 2
    errors = [line for line in run.lines if line.startswith("::error ")]
    assert len(errors) == 1 and errors[0].startswith("::error file=bad.py,title=recheck%3A file not linted::")


def test_statistics_as_json(lint, write, region_source):
    write("m.py", region_source)
    run = lint("--statistics", "--format", "json")
    rows = json.loads(run.out)["rules"]  # ruff's rows, beside what the run read and resolved
    assert rows == [{"code": "RC103", "name": "side-effect-in-region", "count": 1, "fixable": False},
                    {"code": "RC104", "name": "external-state-mutation", "count": 1, "fixable": False}]


def test_statistics(lint, write, region_source):
    write("m.py", region_source)
    run = lint("--statistics")
    assert run.lines[0].split("\t") == ["    1", "RC103", "   ", "side-effect-in-region"]
    assert run.lines[-1] == "Found 2 findings."


def test_statistics_count_the_files_only_parse_checked(lint, write, region_source):
    write("m.py", region_source)
    write("plain.py", "def f():\n    return 1\n")
    text = lint("--statistics")
    assert "files: 2 linted; 1 analysed, 1 only parse-checked" in text.out
    run = lint("--statistics", "--format", "json")
    document = json.loads(run.out)  # JSON only: no text table, no summary line
    assert run.code == 1
    assert document["rules"][0] == {"code": "RC103", "name": "side-effect-in-region", "count": 1, "fixable": False}
    assert (document["files"], document["files_analysed"], document["files_parse_checked_only"]) == (2, 1, 1)


def test_select_and_ignore(lint, write, region_source):
    write("m.py", region_source)
    assert {line.split()[1] for line in lint("--select", "RC103").lines[:-1]} == {"RC103"}
    assert {line.split()[1] for line in lint("--ignore", "RC103").lines[:-1]} == {"RC104"}
    assert lint("--select", "RC1", "--ignore", "RC10").out == "All checks passed!\n"
    assert {line.split()[1] for line in lint("--select", "RC1", "--ignore", "RC10", "--extend-select", "RC103").lines[:-1]} == {"RC103"}


def test_unknown_selector_is_a_usage_error(lint, write, region_source):
    write("m.py", region_source)
    run = lint("--select", "XY1")
    assert run.code == 2 and "unknown rule selector 'XY1'" in run.err


def test_unknown_selector_on_the_command_line_names_the_flag(lint, write, region_source):
    write("m.py", region_source)
    run = lint("--ignore", "RC999")
    assert run.code == 2 and "recheck lint: error: --ignore: unknown rule selector 'RC999'" in run.err


@pytest.mark.parametrize("line, where", [
    ('ignore = ["RC999"]', "pyproject.toml: [tool.recheck] ignore"),
    ('extend-select = ["RC999"]', "pyproject.toml: [tool.recheck] extend-select"),
    ('per-file-ignores = { "tests/*" = ["RC999"] }', "pyproject.toml: [tool.recheck] per-file-ignores['tests/*']"),
])
def test_unknown_selector_in_pyproject_names_the_file_and_key(lint, write, region_source, line, where):
    write("m.py", region_source)
    write("pyproject.toml", f"[tool.recheck]\n{line}\n")
    run = lint()
    assert run.code == 2 and f"recheck lint: error: {where}: unknown rule selector 'RC999'" in run.err, run.err


def test_missing_path_is_a_usage_error(lint):
    run = lint("nope")
    assert run.code == 2 and "nope: no such file or directory" in run.err


def test_config_select_per_file_ignores_and_cli_override(lint, write, region_source):
    write("pkg/a.py", region_source)
    write("pkg/b.py", region_source)
    write("pyproject.toml", """
        [tool.recheck]
        select = ["RC104"]
        per-file-ignores = {"pkg/b.py" = ["RC1"]}
        """)
    assert [line.split()[0:2] for line in lint().lines[:-1]] == [["pkg/a.py:14:9:", "RC104"]]
    assert {line.split()[1] for line in lint("--select", "RC103").lines[:-1]} == {"RC103"}


def test_config_exclude_and_checkpoint_functions(lint, write):
    write("keep.py", """
        from mylib import remat
        from torch import nn

        class Block(nn.Module):
            def forward(self, x):
                print("hi")
                return x

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.block = Block()

            def forward(self, x):
                return remat(self.block, x)
        """)
    write("generated/skip.py", "from torch.utils.checkpoint import checkpoint\ncheckpoint(print, 1)\n")
    write("pyproject.toml", """
        [tool.recheck]
        exclude = ["generated"]
        checkpoint-functions = ["mylib.remat"]
        """)
    run = lint()
    assert [line.split()[0:2] for line in run.lines[:-1]] == [["keep.py:7:9:", "RC103"]]


def test_bad_config_key_exits_2(lint, write):
    write("pyproject.toml", "[tool.recheck]\nselct = ['RC1']\n")
    write("m.py", "x = 1\n")
    run = lint()
    assert run.code == 2 and "pyproject.toml: selct: unknown key" in run.err


def test_gitignore_is_respected(lint, write, region_source, tmp_path):
    (tmp_path / ".git").mkdir()
    write(".gitignore", "ignored/\n*_gen.py\n!keep_gen.py\n")
    write("ignored/m.py", region_source)
    write("x_gen.py", region_source)
    write("keep_gen.py", region_source)
    write("sub/.gitignore", "local.py\n")
    write("sub/local.py", region_source)
    assert sorted({line.split(":")[0] for line in lint().lines[:-1]}) == ["keep_gen.py"]


def test_lint_never_imports_torch(tmp_path, region_source):
    (tmp_path / "m.py").write_text(region_source)
    code = (
        "import sys; from recheck.cli import main; rc = main(['lint', '--no-cache', sys.argv[1]]);"
        "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "RC104" in proc.stdout


def test_command_module_is_cheap_to_import():
    root = Path(__file__).resolve().parents[2]
    code = "import sys, recheck.commands.lint; assert not {'torch', 'libcst'} & set(sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


@pytest.mark.parametrize("value", ["-5", "-1", "x"])
def test_jobs_must_be_a_count(lint, write, capsys, value):
    write("m.py", "x = 1\n")
    with pytest.raises(SystemExit) as exited:
        lint("-j", value)
    assert exited.value.code == 2 and "argument --jobs/-j: " in capsys.readouterr().err


def test_jobs_are_bounded_by_the_cpus_and_it_says_so(lint, write, region_source, monkeypatch):
    from recheck.lint import engine

    cpus = engine.available_cpus() if hasattr(engine, "available_cpus") else os.cpu_count()
    started = []
    pool = engine._Workers.pool

    def spy(self):
        started.append(self.count)
        return pool(self)

    monkeypatch.setattr(engine._Workers, "pool", spy)
    for n in range(20):
        write(f"m{n}.py", region_source)
    run = lint("-j", "1000")
    assert run.code != 0 and "m0.py:15:9: RC103" in run.out
    assert f"-j 1000 is more than the {cpus} CPUs available; using {cpus} worker processes" in run.err
    assert started and max(started) == cpus
    assert "more than" not in lint("-j", str(cpus)).err


@pytest.mark.parametrize("cache", [False, True])
def test_a_checkpoint_function_that_matches_no_call_is_named(lint, write, cache):
    write("pyproject.toml", '[tool.recheck]\ncheckpoint-functions = ["mylib.ckpt", "mylib.ckpot", "self.ck"]\n')
    write("m.py", """\
        from mylib import ckpt

        def f(x):
            print(x)
            return x

        def g(x):
            return ckpt(f, x)
        """)
    for _ in range(2 if cache else 1):
        run = lint(cache=cache)
        assert run.code != 0 and "m.py:4:5: RC103" in run.out
        warnings = [line for line in run.err.splitlines() if "warning" in line]
        assert warnings == ["recheck lint: warning: checkpoint-functions: 'mylib.ckpot', 'self.ck' matched no "
                            "call in the files linted (misspelt, or not called here?)"], run.err
