"""Architecture: imports only run downward, there are no cycles, and no module is a monolith.

Floors, bottom to top:
  0  recheck.findings, output.text            data types (and the text they render as)
  1  recheck.catalogue, collector, config, dependencies, entry_points, working_set, loading, output,
     progress, safe_files                     foundation services
                                              (no torch, no libcst)
  2  recheck.runtime.*                        torch-facing primitives (bits, digests, trees, rng,
                                              snapshot, reach, effects, naming, tags)
  3  recheck.intercept.*                      patches on every checkpoint entry point, one hooks base
  4  recheck.checker/watcher/cost/lint/distributed.*   engines
  5  recheck.commands.*, cli, _pytest_plugin, integrations, __init__, __main__   faces
A module may import its own floor or lower ones, never a higher one.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "recheck"

FACES = ("recheck.commands", "recheck.cli", "recheck._pytest_plugin", "recheck.__main__",
         "recheck.integrations")
FOUNDATION = ("recheck.catalogue", "recheck.collector", "recheck.config", "recheck.dependencies", "recheck.entry_points",
              "recheck.working_set", "recheck.loading", "recheck.output", "recheck.progress", "recheck.safe_files")
DATA = ("recheck.findings", "recheck.output.text")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(name: str) -> int:
    if name == "recheck" or name.startswith(FACES):
        return 5
    if name in DATA:
        return 0
    if name.startswith(FOUNDATION):
        return 1
    if name.startswith("recheck.runtime"):
        return 2
    if name.startswith("recheck.intercept"):
        return 3
    return 4


def engine(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if layer(name) == 4 and len(parts) > 1 else None


def imports_of(path: Path) -> set[str]:
    """Modules imported at module level or in functions (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def walk(node: ast.AST):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (n for stmt in child.orelse for n in [stmt, *walk(stmt)])
                continue
            yield child
            yield from walk(child)

    for node in walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {m for m in found if m in modules and m != name}


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_run_downward(name):
    upward = sorted(m for m in GRAPH[name] if layer(m) > layer(name))
    assert not upward, f"{name} (layer {layer(name)}) imports higher layers: {upward}"


def test_engines_do_not_import_faces_or_each_others_internals_upward():
    # engines share the runtime and the interception below them, not each other's
    # internals: the watcher and the checker may label ranks (distributed), the checker's
    # check_step drives watch(), the cost planner verifies every plan it runs with check_step;
    # the rank helpers and the linter stand alone
    allowed = {"watcher": {"distributed"}, "checker": {"watcher", "distributed"},
               "cost": {"distributed", "checker"}}
    for name, deps in GRAPH.items():
        mine = engine(name)
        for dep in deps:
            other = engine(dep)
            if mine and other and other != mine:
                assert other in allowed.get(mine, set()), f"{name} imports {dep}"


def test_no_import_cycles():
    # only imports the package makes at import time matter for cycles; function-level
    # lazy imports are included too, which is stricter
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(GRAPH[node]):
            if dep == "recheck" or node == "recheck":
                continue  # the package's lazy re-exports
            if state.get(dep) == 1 and not _same_package_init(node, dep):
                raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(dep) :], dep]))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)


def _same_package_init(node: str, dep: str) -> bool:
    """A package's __init__ re-exporting its own submodules is not a cycle."""
    return node.startswith(dep + ".") or dep.startswith(node + ".")


def test_no_module_is_a_monolith():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()}
    total = sum(sizes.values())
    limit = max(400, int(total * 0.10))
    big = {n: s for n, s in sizes.items() if s > limit}
    assert not big, f"modules over {limit} lines (10% of {total}): {big}"


def test_no_two_modules_share_a_file_name():
    """A traceback's ``compare.py`` or an editor tab's ``options.py`` must say which module it is."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(module_name(path))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def test_no_two_test_modules_share_a_file_name():
    """pytest imports test files by base name here (no packages): a second one fails to collect."""
    tests = Path(__file__).resolve().parent
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
