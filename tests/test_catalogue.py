"""The rule registry: one entry per documented rule, and kind + subject -> rule for every face."""

from __future__ import annotations

import pytest

from recheck.catalogue import FIXABLE, REGISTRY, all_rules, entry, explain, hint
from recheck.findings import DYNAMIC_KINDS, Subject


def test_every_entry_has_a_document_and_every_document_an_entry():
    documented = {r.code for r in all_rules()}
    assert {e.code for e in REGISTRY} <= documented
    # a rule only the linter finds has no registry line: its entry comes from its document
    for rule in all_rules():
        made = entry(rule.code)
        assert made.code == rule.code and made.advice and "\n" not in made.advice
    assert entry("RC108").advice == next(r.summary for r in all_rules() if r.code == "RC108")
    with pytest.raises(KeyError):
        entry("RC999")


@pytest.mark.parametrize("item", REGISTRY, ids=lambda e: e.code)
def test_entry_kinds_are_documented_and_known(item):
    rule = next(r for r in all_rules() if r.code == item.code)
    assert set(item.kinds) <= set(DYNAMIC_KINDS)
    assert set(item.kinds) <= set(rule.runtime_kinds), (
        f"{item.code} explains {item.kinds}; its document lists {rule.runtime_kinds}")
    assert item.advice and "\n" not in item.advice


_CPU, _CUDA0, _CUDA1 = (Subject("device RNG", owner=d) for d in ("cpu", "cuda:0", "cuda:1"))
_PYTHON = Subject("host RNG", "Python random")


@pytest.mark.parametrize(("kind", "subject", "context", "code"), [
    ("rng", _CPU, {"preserve_rng_state": False}, "RC002"),
    ("rng", _CUDA0, {"preserve_rng_state": False}, "RC002"),
    ("rng", _CUDA1, {"preserve_rng_state": True}, "RC102"),
    ("rng", _CUDA1, {}, "RC102"),
    ("rng", _CPU, {"preserve_rng_state": True}, None),
    # the case: Python's RNG with preserve_rng_state on is RC105, never RC002
    ("rng", _PYTHON, {"preserve_rng_state": True}, "RC105"),
    ("rng", _PYTHON, {"preserve_rng_state": False}, "RC105"),
    ("rng", Subject("host RNG", "numpy global RNG"), {}, "RC105"),
    ("rng", Subject("RNG instance", "self.generator", owner="generator"), {"preserve_rng_state": False}, "RC105"),
    ("buffer", Subject("buffer", "running_mean", owner="bn"), {}, "RC106"),
    ("buffer", Subject("buffer", "num_batches_tracked", owner="norm"), {}, "RC106"),
    ("buffer", Subject("buffer", "ema"), {}, "RC104"),
    ("state", Subject("attribute", "calls"), {}, "RC104"),
    ("state", Subject("parameter", "w", owner="fc"), {}, None),  # a step's end state: it follows from a gradient
    ("state", Subject("optimizer state", "exp_avg", owner="adam.0"), {}, None),
    ("global", Subject("global", "X", owner="m"), {}, "RC101"),
    ("side_effect", Subject("channel", "logging"), {}, "RC103"),
    ("param_version", Subject("parameter", "w"), {}, "RC201"),
    ("input_mutation", Subject("input", path="args[0]"), {}, "RC107"),
    ("gradient", Subject("gradient", "w"), {}, None),
    ("output", Subject("output", path="output[0]"), {}, None),
    # another implementation's own hazards: what torch's checkpoint restores and it does not
    ("rng", _CPU, {"implementation": "CheckpointFunction"}, "RC003"),
    ("rng", _CUDA0, {"implementation": "declared"}, "RC003"),
    ("rng", _PYTHON, {"implementation": "deepspeed"}, "RC105"),
    ("rng", _CPU, {"implementation": "torch", "preserve_rng_state": False}, "RC002"),
    ("context", Subject("context", "autocast", owner="cpu"), {"implementation": "fairscale"}, "RC003"),
    ("context", Subject("context", "default dtype"), {"implementation": "megatron"}, "RC003"),
    ("context", Subject("context", "default dtype"), {"implementation": "torch"}, "RC101"),
    ("context", Subject("context", "default dtype"), {}, "RC101"),
    ("context", Subject("context", "autocast", owner="cuda"), {"implementation": "torch"}, None),
])
def test_explain(kind, subject, context, code):
    assert explain(kind, subject, **context) == code


def test_a_rule_is_attributed_from_the_subject_s_parts_never_from_its_wording():
    """Issue 41: changing how a subject reads can never change the rule a finding cites.  A text
    that reads like torch's CPU stream or a BatchNorm buffer is no such thing without its parts,
    and a subject keeps its rule whatever its text."""
    assert explain("rng", "cpu RNG", preserve_rng_state=False) == "RC105"  # a stream recheck knows nothing of
    assert explain("buffer", "buffer `bn.running_mean`") == "RC104"
    assert explain("state", "parameter `fc.w`") == "RC104"
    assert explain("context", "default dtype") is None
    assert str(_CPU) == "cpu RNG" and explain("rng", _CPU, preserve_rng_state=False) == "RC002"


def test_hint_points_at_recheck_explain_not_a_folder():
    text = hint("RC106")
    assert text.endswith("see `recheck explain RC106`")
    assert "rules/" not in text
    assert text.startswith(entry("RC106").advice)
    assert hint("RC105", "likely cause: Python random differs").startswith("likely cause:")
    assert "RC999" in hint("RC999")


def test_fixable_comes_from_the_registry():
    assert FIXABLE == {"RC001"}
    assert entry("rc001").fixable


#: The packages that build or read dynamic findings (the linter and the cost model have kinds of their own).
_DYNAMIC_PACKAGES = ("checker", "watcher", "runtime", "distributed", "output", "findings.py", "catalogue.py")


def _kinds_named_in(path):
    """The string literals ``path`` builds a finding of (``Finding("rng", ...)``, ``_add("buffer", ...)``,
    ``explain("state", ...)``) or compares a ``.kind`` with (``f.kind == "output"``, ``f.kind in (...)``)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called in ("Finding", "_add", "finding", "_finding", "add", "explain"):
                values = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "kind")]
                names |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
        elif isinstance(node, ast.Compare) and getattr(node.left, "attr", None) == "kind":
            for value in node.comparators:
                items = [value] if isinstance(value, ast.Constant) else getattr(value, "elts", [])
                names |= {i.value for i in items if isinstance(i, ast.Constant)}
    return names


def test_a_kind_is_declared_once_and_every_face_reads_the_declaration():
    """Issue 41: a finding kind is one line of ``findings.DECLARED`` (its meaning, its rules, cause or
    consequence, its order); the kinds tables of every face are read from it, and no code builds or
    tests a kind that is not declared there."""
    from pathlib import Path

    from recheck.findings import DECLARED, KINDS
    from recheck.findings import SEVERITY as severity
    from recheck.runtime.explaining import CAUSES, SYMPTOMS

    package = Path(__file__).resolve().parent.parent / "recheck"
    named = {}
    for path in package.rglob("*.py"):
        if path.relative_to(package).parts[0] in _DYNAMIC_PACKAGES:
            for kind in _kinds_named_in(path):
                named.setdefault(kind, []).append(str(path.relative_to(package)))
    undeclared = {k: v for k, v in named.items() if k not in KINDS}
    assert not undeclared, f"kinds used but not declared in findings.DECLARED: {undeclared}"
    assert {k.name for k in DECLARED} <= set(named), "a declared kind no code observes"
    assert len({k.name for k in DECLARED}) == len(DECLARED)
    assert CAUSES + SYMPTOMS == tuple(k.name for k in DECLARED if k.cause) + tuple(k.name for k in DECLARED
                                                                                  if not k.cause)
    assert list(severity) == [k.name for k in DECLARED]
    for kind in DECLARED:
        assert kind.meaning and "\n" not in kind.meaning
        for code in kind.rules:
            assert entry(code).code == code
            assert kind.name in next(r for r in all_rules() if r.code == code).runtime_kinds, (
                f"{code}'s document does not list `{kind.name}` under 'Found at run time as'")
    assert {e.code for e in REGISTRY if e.kinds} == {c for k in DECLARED for c in k.rules}
