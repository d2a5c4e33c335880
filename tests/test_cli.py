"""The CLI shell: catalogue commands, exit codes, and no torch on the torch-free paths."""

import json
import subprocess
import sys

import pytest

from recheck.catalogue import all_rules

NO_TORCH = """
import sys
from recheck.cli import main
codes = []
for argv in {argvs!r}:
    try:
        codes.append(main(argv))
    except SystemExit as exc:
        codes.append(exc.code)
loaded = sorted(m for m in ("torch", "libcst") if m in sys.modules)
print(codes, loaded)
"""


def run(*args):
    return subprocess.run([sys.executable, "-m", "recheck", *args], capture_output=True, text=True, timeout=120)


def test_catalogue_and_lab_paths_never_import_torch():
    argvs = [["rules"], ["explain", "RC106"], ["lab", "--capacity", "2", "--stride", "4"], ["--version"]]
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH.format(argvs=argvs)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    codes, loaded = out.stdout.strip().splitlines()[-1].split("] ")
    assert codes == "[0, 0, 0, 0"
    assert loaded == "[]", f"imported {loaded} on a torch-free path"


def test_lint_path_never_imports_torch(tmp_path):
    pytest.importorskip("recheck.commands.lint")
    (tmp_path / "m.py").write_text("print('not checkpointed')\n")
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH.format(argvs=[["lint", str(tmp_path)]])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].endswith("[]")


def test_rules_lists_every_code():
    out = run("rules")
    assert out.returncode == 0
    for rule in all_rules():
        assert f"{rule.code}  {rule.name}" in out.stdout
    data = json.loads(run("rules", "--format", "json").stdout)
    assert [r["code"] for r in data] == [r.code for r in all_rules()]


def test_explain_prints_the_document_and_accepts_names():
    rule = all_rules()[0]
    by_code = run("explain", rule.code.lower())
    by_name = run("explain", rule.name)
    assert by_code.returncode == by_name.returncode == 0
    assert by_code.stdout == by_name.stdout == rule.text


def test_explain_unknown_rule_is_a_usage_error():
    out = run("explain", "RC999")
    assert out.returncode == 2
    assert "unknown rule 'RC999'; known rules: RC001" in out.stderr


def test_no_command_and_bad_command_exit_2():
    assert run().returncode == 2
    assert run("frobnicate").returncode == 2


def test_version():
    import recheck

    out = run("--version")
    assert out.stdout.strip() == f"recheck {recheck.__version__}"
