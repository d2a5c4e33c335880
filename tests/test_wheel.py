"""Fresh installs: the built wheel carries the rule documents (`recheck explain` works), and
the light install a pre-commit hook gets lints without torch."""

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import yaml

#: builds the wheel and fresh virtual environments
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("hatchling", reason="building the wheel needs hatchling (in the test extra)")
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("recheck-*.whl")
    return built


def test_wheel_contains_rules_and_typing_marker(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    rule_docs = sorted(n for n in names if n.startswith("recheck/_rules/"))
    assert "recheck/_rules/RC106-batchnorm-in-region.md" in rule_docs
    assert len(rule_docs) == len(list((ROOT / "rules").glob("RC*.md")))
    assert "recheck/py.typed" in names
    assert not any(n.startswith(("tests/", "fixtures/")) for n in names)


def test_explain_from_a_fresh_virtual_environment(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # --no-deps: `explain` needs neither torch nor libcst, and installing them would take minutes.
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)
    out = subprocess.run(
        [env_dir / "bin" / "recheck", "explain", "RC106"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("# batchnorm-in-region (RC106)")
    assert "## What it does" in out.stdout
    where = subprocess.run(
        [python, "-c", "import recheck.catalogue as c; print(c.rules_dir())"], capture_output=True, text=True, cwd=tmp_path
    )
    assert "site-packages/recheck/_rules" in where.stdout


def test_the_pre_commit_hook_installs_no_torch_and_lints(tmp_path):
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["language"] == "python" and not hook.get("additional_dependencies")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # what pre-commit does for a `language: python` hook: `pip install .` of the repository
    subprocess.run([python, "-m", "pip", "install", "-q", str(ROOT)], check=True, timeout=300)
    assert subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0
    project = tmp_path / "project"
    project.mkdir()
    (project / "model.py").write_text(
        "from torch.utils.checkpoint import checkpoint\n\n\n"
        "def forward(block, x):\n    return checkpoint(block, x)\n")
    entry, *entry_args = hook["entry"].split()
    lint = subprocess.run([env_dir / "bin" / entry, *entry_args, *hook["args"]], cwd=project,
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 1, lint.stderr
    assert "model.py:5:12: RC001" in lint.stdout
    check = subprocess.run([env_dir / "bin" / "recheck", "check", "model.py"], cwd=project,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 2
    assert "recheck check needs PyTorch (torch>=2.4)" in check.stderr
    assert "pip install 'recheck[torch]'" in check.stderr
    assert "Traceback" not in check.stderr
