"""The lint cache is data, validated on load: nothing read from the linted tree can run (issue 17)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recheck.lint.cache import FORMAT, FORMAT_VERSION, FactsCache
from recheck.lint.engine import lint_paths
from recheck.lint.facts import CallSite, ClassFacts, FileFacts, FunctionFacts, Hazard, Ref, Span
from recheck.lint.settings import LintOptions
from recheck.lint.typed_json import InvalidData, decoder, dumps

MARKER = "pwned.txt"


class _Payload:
    """Unpickling this writes the marker file (the reproduction of issue 17)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"echo PWNED > {self.marker}",))


def _options(tmp_path: Path) -> LintOptions:
    return LintOptions(root=tmp_path, cache_dir=tmp_path / ".recheck_cache", jobs=1)


def _findings(result):
    return [(f.path, f.line, f.column, f.code, f.message) for f in result.findings]


def _facts() -> FileFacts:
    span = Span(1, 2, 3, 4)
    function = FunctionFacts("Block.forward", span, "Block", hazards=[Hazard("RC104", span, "w", "t", "root")],
                             calls=[Ref("self", "lin", span), Ref("path", "a.b", span)],
                             returns_local=["Block.forward.inner"],
                             memoized=True, params=["x"], annotations={"x": "torch.Tensor"})
    return FileFacts("m.py", "m", {"cp": "torch.utils.checkpoint"},
                     {"Block": ClassFacts("Block", span, ["torch.nn.Module"], {"forward": "Block.forward"}, {"lin": ["torch.nn.Linear"]})},
                     {"Block.forward": function},
                     [CallSite(span, "torch.utils.checkpoint.checkpoint", "<module>", (Ref("name", "m.Block", span),), "missing", span)])


def test_facts_round_trip_through_json():
    facts = _facts()
    assert decoder(FileFacts)(json.loads(dumps(facts))) == facts


@pytest.mark.parametrize("mangle", [
    lambda v: v[:-1],                                   # a field missing
    lambda v: [*v[:3], {"Block": 7}, *v[4:]],           # a class that is not a record
    lambda v: [v[0], 12, *v[2:]],                       # a number where a string belongs
    lambda v: [*v[:5], [[[1, 2, 3], "e", "c", [], "missing", None, None, ""]], *v[6:]],  # a span of three
    lambda v: [*v[:2], {"x": ["__reduce__"]}, *v[3:]],  # a list where a string belongs
])
def test_values_of_the_wrong_type_do_not_validate(mangle):
    value = json.loads(dumps(_facts()))
    with pytest.raises(InvalidData):
        decoder(FileFacts)(mangle(value))


def test_cache_files_are_versioned_json(write, region_source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write("m.py", region_source)
    lint_paths([Path(".")], _options(tmp_path))
    folder = tmp_path / ".recheck_cache" / f"lint-v{FORMAT_VERSION}"
    assert sorted(p.name for p in folder.iterdir()) == ["facts.json", "result.json"]
    for path in folder.iterdir():
        document = json.loads(path.read_text(encoding="utf-8"))
        assert (document["format"], document["version"]) == (FORMAT, FORMAT_VERSION)


@pytest.mark.parametrize("damage", [
    b"", b"{", b"[]", b"\xff\xfe", b"[" * 100_000,
    json.dumps({"format": FORMAT, "version": 1, "kind": "facts", "settings": "", "body": {}}).encode(),
    json.dumps({"format": "other", "version": FORMAT_VERSION, "kind": "facts", "settings": "", "body": {}}).encode(),
])
def test_a_damaged_cache_is_ignored_rewritten_and_warned_about_once(write, region_source, tmp_path, monkeypatch, damage):
    monkeypatch.chdir(tmp_path)
    write("m.py", region_source)
    cold = lint_paths([Path(".")], _options(tmp_path))
    folder = tmp_path / ".recheck_cache" / f"lint-v{FORMAT_VERSION}"
    for path in folder.iterdir():
        path.write_bytes(damage)
    again = lint_paths([Path(".")], _options(tmp_path))
    assert _findings(again) == _findings(cold) and again.stats["parsed"] == 1
    assert len(again.warnings) == 1
    healed = lint_paths([Path(".")], _options(tmp_path))
    assert healed.warnings == [] and healed.stats["parsed"] == 0


def test_a_valid_document_with_a_body_of_the_wrong_shape_is_ignored(write, region_source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write("m.py", region_source)
    lint_paths([Path(".")], _options(tmp_path))
    pack = tmp_path / ".recheck_cache" / f"lint-v{FORMAT_VERSION}" / "facts.json"
    document = json.loads(pack.read_text())
    document["body"][0] = {key: ["os.system", ["echo"]] for key in document["body"][0]}
    pack.write_text(json.dumps(document))
    (pack.parent / "result.json").unlink()
    again = lint_paths([Path(".")], _options(tmp_path))
    assert again.stats["parsed"] == 1 and len(again.warnings) == 1 and "facts.json" in again.warnings[0]


def test_a_planted_symbolic_link_is_replaced_not_written_through(write, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write("m.py", "x = 1\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    cache = tmp_path / ".recheck_cache"
    cache.mkdir()
    (cache / ".gitignore").symlink_to(victim)
    (cache / "CACHEDIR.TAG").symlink_to(tmp_path / "elsewhere.txt")
    lint_paths([Path(".")], _options(tmp_path))
    assert victim.read_text() == "precious\n" and not (tmp_path / "elsewhere.txt").exists()
    assert (cache / "CACHEDIR.TAG").read_text().startswith("Signature: ")


def test_facts_cache_without_a_folder_stores_nothing():
    cache = FactsCache(None)
    cache.put("k", _facts())
    assert cache.get("k") is None and cache.get_result("k", dict[str, int]) is None


# --- the guarantee: `recheck lint` never imports, executes or unpickles the tree it reads ---

HOSTILE = {
    # import side effects in every place Python would run them, and a module that shadows
    # one the linter imports (json) if the tree's folder ever came first on sys.path
    "pkg/__init__.py": "open({marker!r}, 'w').write('pkg/__init__')\n",
    "conftest.py": "open({marker!r}, 'w').write('conftest')\n",
    "json.py": "open({marker!r}, 'w').write('json shadow')\n",
    "sitecustomize.py": "open({marker!r}, 'w').write('sitecustomize')\n",
    "pkg/model.py": textwrap.dedent("""\
        open({marker!r}, 'w').write('model import')
        import torch
        from torch.utils.checkpoint import checkpoint
        from pkg.layers import Block

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.block = Block()

            def forward(self, x):
                return checkpoint(self.block, x)
        """),
    "pkg/layers.py": textwrap.dedent("""\
        open({marker!r}, 'w').write('layers import')
        import torch

        class Block(torch.nn.Module):
            def forward(self, x):
                print("forward")
                return x
        """),
}


def _lint_command() -> list[str]:
    script = Path(sys.executable).with_name("recheck")
    if script.is_file():
        return [str(script)]  # what users and pre-commit run: the folder linted is not on sys.path
    return [sys.executable, "-P", "-m", "recheck"]


def _plant_pickles(cache: Path, marker: Path) -> list[Path]:
    """A pickle payload in every file of the cache, and an old ``lint-v1`` pickle cache."""
    (cache / "lint-v1").mkdir(parents=True, exist_ok=True)
    targets = [cache / "lint-v1" / "facts.pickle", cache / "lint-v1" / "results.pickle", *cache.rglob("*.json")]
    for path in targets:
        path.write_bytes(pickle.dumps(_Payload(marker)))
    return targets


def test_lint_never_runs_anything_from_the_tree(tmp_path):
    marker = tmp_path / MARKER
    for relative, source in HOSTILE.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source.format(marker=str(marker)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    first = subprocess.run([*_lint_command(), "lint", "pkg", "conftest.py", "json.py"], cwd=tmp_path,
                           capture_output=True, text=True, env=env)
    assert first.returncode == 1, first.stderr
    assert "pkg/layers.py:6:9: RC103" in first.stdout and "pkg/model.py:12:16: RC001" in first.stdout
    planted = _plant_pickles(tmp_path / ".recheck_cache", marker)
    assert len(planted) == 4
    second = subprocess.run([*_lint_command(), "lint", "pkg", "conftest.py", "json.py"], cwd=tmp_path,
                            capture_output=True, text=True, env=env)
    assert second.stdout == first.stdout
    assert second.stderr.count("warning: ignored the cache file") == 1
    assert not marker.exists(), marker.read_text()
    third = subprocess.run([*_lint_command(), "lint", "pkg"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert "warning" not in third.stderr and not marker.exists()


def test_the_issue_reproduction_leaves_no_pwned_file(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text(
        "from torch.utils.checkpoint import checkpoint\ndef f(x): return x\n"
        "def g(x): return checkpoint(f, x, use_reentrant=False)\n")
    command = [*_lint_command(), "lint", "src"]
    assert subprocess.run(command, cwd=tmp_path, capture_output=True).returncode == 0
    _plant_pickles(tmp_path / ".recheck_cache", Path(MARKER))
    for path in (tmp_path / ".recheck_cache").glob("*/*.pickle"):  # the issue's own glob
        path.write_bytes(pickle.dumps(_Payload(Path(MARKER))))
    rerun = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert rerun.returncode == 0 and "All checks passed!" in rerun.stdout
    assert not (tmp_path / MARKER).exists()
    shutil.rmtree(tmp_path / ".recheck_cache")


# --- where the cache may live: a linted tree never chooses a folder outside itself (issue 40, item 4) ---

def _project(tmp_path: Path, table: str = "") -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(f"[tool.recheck]\n{table}")
    (project / "m.py").write_text("from torch.utils.checkpoint import checkpoint\n"
                                  "def f(x):\n    print(x)\n    return x\n"
                                  "def g(x):\n    return checkpoint(f, x, use_reentrant=False)\n")
    (tmp_path / "outside").mkdir()
    return project


def _lint_in(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "RECHECK_CACHE_DIR"}
    return subprocess.run([*_lint_command(), "lint", *args], cwd=folder, capture_output=True, text=True,
                          env={**environ, **(env or {})})


@pytest.mark.parametrize("value, reason", [
    ("../outside", "must be a folder inside the project"),
    ("sub/../../outside", "must be a folder inside the project"),
    ("{outside}", "must be a relative path"),
    (".", "must be a folder inside the project"),
])
def test_a_cache_dir_outside_the_project_is_a_config_error(tmp_path, value, reason):
    value = value.format(outside=tmp_path / "outside")
    project = _project(tmp_path, f"cache-dir = {json.dumps(value)}\n")
    run = _lint_in(project, ".")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith(f"recheck: {project / 'pyproject.toml'}: cache-dir: {reason}"), run.stderr
    assert list((tmp_path / "outside").iterdir()) == [] and not (project / ".recheck_cache").exists()


@pytest.mark.parametrize("link", [".recheck_cache", "build"])
def test_a_cache_folder_through_a_symbolic_link_is_not_used(tmp_path, link):
    project = _project(tmp_path, 'cache-dir = "build/cache"\n' if link == "build" else "")
    (project / link).symlink_to(tmp_path / "outside", target_is_directory=True)
    run = _lint_in(project, ".")
    assert run.returncode == 1 and "m.py:3:5: RC103" in run.stdout
    assert run.stderr.count("warning") == 1 and "symbolic link" in run.stderr and "without the cache" in run.stderr
    assert list((tmp_path / "outside").iterdir()) == []


def test_a_cache_dir_inside_the_project_is_used(tmp_path):
    project = _project(tmp_path, 'cache-dir = "build/cache"\n')
    assert _lint_in(project, ".").returncode == 1
    assert (project / "build" / "cache" / "CACHEDIR.TAG").is_file()
    assert (project / "build" / "cache" / f"lint-v{FORMAT_VERSION}" / "facts.json").is_file()


@pytest.mark.parametrize("how", ["flag", "environment", "both"])
def test_the_user_can_choose_a_cache_folder_outside_the_project(tmp_path, how):
    project = _project(tmp_path, 'cache-dir = "../outside"\n' if how == "both" else "")
    chosen, other = tmp_path / "outside" / "cache", tmp_path / "other"
    args = ["--cache-dir", str(chosen)] if how != "environment" else []
    env = {"RECHECK_CACHE_DIR": str(chosen if how == "environment" else other)}
    first, second = _lint_in(project, *args, ".", env=env), _lint_in(project, *args, ".", env=env)
    assert first.returncode == second.returncode == 1 and first.stdout == second.stdout, first.stderr
    assert (chosen / "CACHEDIR.TAG").is_file() and (chosen / f"lint-v{FORMAT_VERSION}" / "facts.json").is_file()
    assert not (project / ".recheck_cache").exists() and not other.exists()


def test_the_warning_says_whether_a_damaged_cache_file_was_rewritten(write, region_source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write("m.py", region_source)
    folder = tmp_path / ".recheck_cache" / f"lint-v{FORMAT_VERSION}"
    folder.mkdir(parents=True)
    (folder / "facts.json").write_bytes(b"{")
    rewritten = lint_paths([Path(".")], LintOptions(root=tmp_path, cache_dir=tmp_path / ".recheck_cache", jobs=1))
    assert len(rewritten.warnings) == 1 and rewritten.warnings[0].endswith("; it was rewritten")
    (folder / "facts.json").unlink()
    (folder / "facts.json").mkdir()  # cannot be read, and cannot be replaced (even by root)
    (folder / "result.json").unlink()
    stuck = lint_paths([Path(".")], LintOptions(root=tmp_path, cache_dir=tmp_path / ".recheck_cache", jobs=1))
    assert len(stuck.warnings) == 1 and "facts.json: it cannot be read" in stuck.warnings[0]
    assert "; it could not be rewritten (" in stuck.warnings[0] and "will be" not in stuck.warnings[0]
