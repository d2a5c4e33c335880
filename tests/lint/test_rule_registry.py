"""Rules are objects the engine calls: a new rule is its module and its document, nothing else."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from recheck.lint.rules import RULE_MODULES, RULES, Rule

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "recheck"
RULES_PACKAGE = PACKAGE / "lint" / "rules"


def _named_rule_modules(path: Path) -> list[str]:
    """The rule modules a source file imports by name (``rc104_state_write``, ``...rules.rc104_...``)."""
    named = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        named += [m for m in modules if m.startswith("recheck.lint.rules.rc")]
    return named


def test_no_module_outside_the_rules_package_names_a_rule():
    found = {str(p.relative_to(ROOT)): _named_rule_modules(p) for p in PACKAGE.rglob("*.py")
             if RULES_PACKAGE not in p.parents}
    assert {path: names for path, names in found.items() if names} == {}


def test_every_rule_module_defines_one_rule_object():
    assert [type(rule).__module__ for rule in RULES] == [m.__name__ for m in RULE_MODULES]
    assert all(isinstance(rule, Rule) and rule.CODE == module.CODE for rule, module in zip(RULES, RULE_MODULES))


PROBE = '''
"""RC199: a probe rule, added by the test as a user would add one."""

from __future__ import annotations

import ast
from typing import Iterator

from recheck.lint.facts import Hazard
from recheck.lint.rules.base import Rule, RegionView, RegionHit

CODE = "RC199"


class Probe(Rule):
    CODE = CODE
    NODES = (ast.Call,)

    def visit(self, node, ctx) -> Iterator[Hazard]:
        if ctx.qualify(node.func) == "torch.cuda.mem_get_info":
            yield Hazard(CODE, ctx.span(node), "`torch.cuda.mem_get_info()` is read", "recomputation reads another value")

    def region(self, view: RegionView) -> Iterator[RegionHit]:
        yield view.region.file.path, Hazard(CODE, view.region.function.span, f"region `{view.region.name}` seen",
                                            "a whole-region hook ran")
'''
DOCUMENT = '''# probe-rule (RC199)

## What it does
Flags a probe call inside a checkpointed region, for the registry test.

## Why it breaks recomputation
It does not; the test adds it.

## Example
```python
x = 1
```

## Use instead
```python
x = 1
```

## Found at run time as
Nothing.

## References
- none
'''
SOURCE = '''
import torch
from torch.utils.checkpoint import checkpoint


def block(x):
    free, total = torch.cuda.mem_get_info()
    return x * (free / total)


def run(x):
    return checkpoint(block, x, use_reentrant=False)
'''
LINT = '''
import json
from recheck.lint.engine import lint_sources
result = lint_sources({"m.py": %r})
print(json.dumps([(f.code, f.line, f.column, f.message) for f in result.findings]))
'''


def test_a_new_rule_is_its_module_and_its_document(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "recheck", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "rules", tmp_path / "rules")
    (tmp_path / "recheck" / "lint" / "rules" / "rc199_probe.py").write_text(textwrap.dedent(PROBE), encoding="utf-8")
    (tmp_path / "rules" / "RC199-probe-rule.md").write_text(DOCUMENT, encoding="utf-8")
    done = subprocess.run([sys.executable, "-P", "-c", LINT % SOURCE], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": ""}, timeout=120)
    assert done.returncode == 0, done.stderr
    found = [tuple(f) for f in json.loads(done.stdout) if f[0] == "RC199"]
    assert [(line, column) for _, line, column, _ in found] == [(6, 1), (7, 19)]
    assert "region `block` seen" in found[0][3] and "`torch.cuda.mem_get_info()` is read" in found[1][3]
