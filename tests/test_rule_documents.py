"""The rule documents in ``rules/``: their layout, and that their examples do what they say.

The structural tests read the documents only.  The behavioural tests run each example with
torch, plainly and under ``torch.utils.checkpoint.checkpoint``, and compare what a careful
person would look at by hand (gradients, generator states, buffers, attributes, printed
output, the arguments' bytes).  They stand apart from the dynamic checker and the linter on
purpose: they keep the documents honest, whichever engine later reads them.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import types
import warnings
from dataclasses import dataclass, field

import pytest

from recheck.catalogue import REQUIRED_SECTIONS, all_rules, get_rule
from recheck.findings import DYNAMIC_KINDS

KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
TORCH_DOCS = "https://docs.pytorch.org/docs/stable/checkpoint.html"
CHECKPOINT_ENTRY_POINTS = {"checkpoint", "checkpoint_sequential"}

RULES = all_rules()
CODES = [rule.code for rule in RULES]
#: rules about what happens around a region, not inside one: their documents show a wrapper
#: (tested below on its own) and define no region_example()
AROUND_REGION_CODES = {"RC111"}
REGION_CODES = [code for code in CODES if (code.startswith("RC1") or code == "RC002") and code not in AROUND_REGION_CODES]
STEP_CODES = [code for code in CODES if code.startswith("RC2")]
#: rules whose hazard exists only under the reentrant implementation: their Example passes
#: ``use_reentrant=True``, and its ``CHECK_OPTIONS`` says so to the checker
REENTRANT_EXAMPLES = {code for code in CODES
                      if any('{"use_reentrant": True}' in source for source in get_rule(code).examples)}


def _needed_function(code: str) -> str | None:
    if code in REGION_CODES:
        return "region_example"
    if code in STEP_CODES:
        return "step_example"
    return None


def _sources(code: str) -> list[tuple[str, str]]:
    rule = get_rule(code)
    examples = [("Example", s) for s in rule.examples]
    return examples + [("Use instead", s) for s in rule.clean_examples]


ALL_SOURCES = [
    pytest.param(code, label, source, id=f"{code}-{label.replace(' ', '-').lower()}")
    for code in CODES
    for label, source in _sources(code)
]


def _checkpoint_calls(tree: ast.Module) -> list[ast.Call]:
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in CHECKPOINT_ENTRY_POINTS:
                calls.append(node)
    return calls


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


# --------------------------------------------------------------------------- layout


def test_every_rule_is_documented_once_under_its_name():
    from recheck.lint.rules import RULE_MODULES

    # the linter's rules and the static documents are the same codes; RC2xx are run time only
    assert sorted(m.CODE for m in RULE_MODULES) == [rule.code for rule in RULES if rule.static]
    assert all(KEBAB.match(rule.name) for rule in RULES)
    assert len(CODES) == len(set(CODES))
    assert CODES == sorted(CODES)


@pytest.mark.parametrize("code", CODES)
def test_document_layout(code):
    rule = get_rule(code)
    assert KEBAB.match(rule.name)
    assert rule.path.name == f"{code}-{rule.name}.md"
    assert rule.text.splitlines()[0] == f"# {rule.name} ({code})"
    assert set(REQUIRED_SECTIONS) <= set(rule.sections)
    assert all(rule.sections[s].strip() for s in REQUIRED_SECTIONS), "an empty section"
    assert get_rule(rule.name) is rule and get_rule(code.lower()) is rule
    assert rule.static is (code != "RC201")


def test_names_are_unique():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("code", CODES)
def test_summary_is_one_short_sentence(code):
    summary = get_rule(code).summary
    first_paragraph = get_rule(code).sections["What it does"].split("\n\n")[0]
    assert "\n" not in first_paragraph.strip(), "the summary must be written on one line"
    assert 20 < len(summary) < 100, (len(summary), summary)
    assert summary.endswith(".") and summary.count(". ") == 0


@pytest.mark.parametrize("code", CODES)
def test_one_example_and_one_fix(code):
    rule = get_rule(code)
    assert len(rule.examples) == 1
    assert len(rule.clean_examples) == 1
    assert rule.examples[0] != rule.clean_examples[0]


@pytest.mark.parametrize("code", CODES)
def test_runtime_kinds_come_from_the_vocabulary(code):
    kinds = get_rule(code).runtime_kinds
    assert set(kinds) <= set(DYNAMIC_KINDS), set(kinds) - set(DYNAMIC_KINDS)
    if code == "RC001":
        assert kinds == [], "RC001 is a configuration choice; no dynamic kind reveals it"
    else:
        assert kinds, "name the dynamic kinds that reveal this rule"


@pytest.mark.parametrize("code", CODES)
def test_references_cite_the_torch_documentation(code):
    refs = get_rule(code).sections["References"]
    assert TORCH_DOCS in refs
    for url in re.findall(r"https?://\S+", refs):
        assert url.startswith("https://"), url


@pytest.mark.parametrize(("code", "label", "source"), ALL_SOURCES)
def test_example_is_a_complete_module(code, label, source):
    compile(source, f"{code} {label}", "exec")
    tree = ast.parse(source)
    assert any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body)
    calls = _checkpoint_calls(tree)
    assert calls, "the example must contain a real checkpoint call"
    reentrant = [_keyword(call, "use_reentrant") for call in calls]
    if code == "RC001" and label == "Example":
        assert any(value is None for value in reentrant)
    elif code in REENTRANT_EXAMPLES and label == "Example":
        assert all(isinstance(value, ast.Constant) and value.value is True for value in reentrant)
    else:
        for value in reentrant:
            assert isinstance(value, ast.Constant) and value.value is False

    needed = _needed_function(code)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    for name in ("region_example", "step_example"):
        if name != needed:
            assert name not in functions
    if needed:
        assert needed in functions, f"define a module-level {needed}()"
        arguments = functions[needed].args
        assert not (arguments.args or arguments.posonlyargs or arguments.kwonlyargs)
        assert arguments.vararg is None and arguments.kwarg is None
        seed = ast.parse("torch.manual_seed(0)").body[0]
        assert ast.dump(functions[needed].body[0]) == ast.dump(seed)


def test_rng_example_carries_its_option_to_the_checker():
    tree = ast.parse(get_rule("RC002").examples[0])
    (call,) = _checkpoint_calls(tree)
    preserve = _keyword(call, "preserve_rng_state")
    assert isinstance(preserve, ast.Constant) and preserve.value is False
    namespace: dict = {}
    exec(compile(tree, "RC002", "exec"), namespace)
    assert namespace["CHECK_OPTIONS"] == {"region_example": {"preserve_rng_state": False}}
    fixed = ast.parse(get_rule("RC002").clean_examples[0])
    (call,) = _checkpoint_calls(fixed)
    assert _keyword(call, "preserve_rng_state") is None


# --------------------------------------------------------------------------- behaviour


@dataclass
class Observed:
    """What one run of a region example leaves behind."""

    error: str | None
    grads: list
    cpu_rng: object
    generators: list
    buffers: list
    attributes: dict
    stdout: str
    mutated_inputs: list = field(default_factory=list)


def _load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def _run_region(source: str, *, checkpointed: bool, use_reentrant: bool = False) -> Observed:
    import torch
    import torch.utils.checkpoint

    module = _load(source, "rule_example")
    fn, args = module.region_example()
    assert callable(fn) and isinstance(args, tuple)
    options = getattr(module, "CHECK_OPTIONS", {}).get("region_example", {})
    before = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
    stdout = io.StringIO()
    error = None
    torch.manual_seed(1234)
    with contextlib.redirect_stdout(stdout):
        try:
            if checkpointed:
                out = torch.utils.checkpoint.checkpoint(
                    fn, *args, **{"use_reentrant": use_reentrant, **options}
                )
            else:
                out = fn(*args)
            _loss(out).backward()
        except RuntimeError as exc:
            error = str(exc)
    modules = list(fn.modules()) if isinstance(fn, torch.nn.Module) else []
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    params = list(fn.parameters()) if modules else []

    def copy(t):
        return None if t is None else t.detach().clone()

    return Observed(
        error=error,
        grads=[copy(t.grad) for t in tensors if t.requires_grad] + [copy(p.grad) for p in params],
        cpu_rng=torch.get_rng_state(),
        generators=[
            v.get_state()
            for m in modules
            for v in vars(m).values()
            if isinstance(v, torch.Generator)
        ],
        buffers=[copy(b) for b in fn.buffers()] if modules else [],
        attributes={
            f"{i}.{k}": v
            for i, m in enumerate(modules)
            for k, v in vars(m).items()
            if isinstance(v, (bool, int, float, str))
        },
        stdout=stdout.getvalue(),
        mutated_inputs=[
            i
            for i, (old, new) in enumerate(zip(before, args))
            if isinstance(new, torch.Tensor) and not _same(old, new.detach())
        ],
    )


def _loss(out):
    """The sum of every tensor a region returns, directly or in a tuple, list, dict or dataclass."""
    import dataclasses

    import torch

    if isinstance(out, torch.Tensor):
        return out.sum()
    if dataclasses.is_dataclass(out):
        out = [getattr(out, f.name) for f in dataclasses.fields(out)]
    elif isinstance(out, dict):
        out = list(out.values())
    return sum(_loss(item) for item in out if isinstance(item, (torch.Tensor, tuple, list, dict)))


def _same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _differences(plain: Observed, ckpt: Observed) -> set[str]:
    """Kinds (in the checker's vocabulary) under which the two runs differ, plus ``error``."""
    kinds = set()
    if ckpt.error or plain.error:
        kinds.add("error")
    if not _same(plain.grads, ckpt.grads):
        kinds.add("gradient")
    if not _same(plain.cpu_rng, ckpt.cpu_rng) or not _same(plain.generators, ckpt.generators):
        kinds.add("rng")
    if not _same(plain.buffers, ckpt.buffers):
        kinds.add("buffer")
    if plain.attributes != ckpt.attributes:
        kinds.add("state")
    if plain.stdout != ckpt.stdout:
        kinds.add("side_effect")
    if plain.mutated_inputs or ckpt.mutated_inputs:
        kinds.add("input_mutation")
    return kinds


def _accelerator() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("code", REGION_CODES)
def test_fixed_region_recomputes_exactly(code):
    source = get_rule(code).clean_examples[0]
    for use_reentrant in (False, True):
        plain = _run_region(source, checkpointed=False)
        assert plain.error is None, plain.error
        ckpt = _run_region(source, checkpointed=True, use_reentrant=use_reentrant)
        assert _differences(plain, ckpt) == set(), (use_reentrant, ckpt.error)


@pytest.mark.parametrize("code", REGION_CODES)
def test_hazard_region_really_differs(code):
    rule = get_rule(code)
    plain = _run_region(rule.examples[0], checkpointed=False)
    assert plain.error is None, "the plain call must work; the hazard is in recomputation"
    ckpt = _run_region(rule.examples[0], checkpointed=True)
    seen = _differences(plain, ckpt)
    if code == "RC102" and not _accelerator():
        # Documented under Known limits: without an accelerator the move is a no-op.
        assert seen == set()
        return
    if code == "RC101":
        # The global itself is not observed here; its effect on the gradients is.
        assert "gradient" in seen
    assert seen & set(rule.runtime_kinds), (seen, rule.runtime_kinds)


def _steered_gradients(source: str, monkeypatch, checkpointed: bool) -> list:
    import torch
    import torch.utils.checkpoint

    if not checkpointed:
        monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda fn, *args, **kwargs: fn(*args))
    try:
        module = _load(source, "rule_example")
        torch.manual_seed(0)
        steered = module.Steered()
        x = torch.randn(4, 8, requires_grad=True)
        steered(x).pow(2).sum().backward()
        return [x.grad.clone(), *(p.grad.clone() for p in steered.parameters())]
    finally:
        monkeypatch.undo()


def test_temporary_hook_example_changes_the_gradients_and_the_fix_does_not(monkeypatch):
    rule = get_rule("RC111")
    for source, differs in ((rule.examples[0], True), (rule.clean_examples[0], False)):
        plain = _steered_gradients(source, monkeypatch, checkpointed=False)
        ckpt = _steered_gradients(source, monkeypatch, checkpointed=True)
        assert (not _same(plain, ckpt)) is differs


def test_input_mutation_example_raises_in_non_reentrant_and_is_silent_in_reentrant():
    source = get_rule("RC107").examples[0]
    plain = _run_region(source, checkpointed=False)
    non_reentrant = _run_region(source, checkpointed=True, use_reentrant=False)
    assert "modified by an inplace operation" in non_reentrant.error
    assert "is at version 2; expected version 0 instead" in non_reentrant.error
    reentrant = _run_region(source, checkpointed=True, use_reentrant=True)
    assert reentrant.error is None
    assert not _same(plain.grads, reentrant.grads)


def test_missing_use_reentrant_example_warns_and_the_fix_does_not():
    import torch

    rule = get_rule("RC001")
    for source, expect_warning in ((rule.examples[0], True), (rule.clean_examples[0], False)):
        module = _load(source, "rc001")
        torch.manual_seed(0)
        model = module.Model()
        x = torch.randn(4, 8, requires_grad=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(x).sum().backward()
        warned = any(
            "use_reentrant parameter should be passed explicitly" in str(w.message) for w in caught
        )
        assert warned is expect_warning
        assert all(p.grad is not None for p in model.parameters())


def _grads_at_each_optimizer_step(source: str, monkeypatch, *, bypass_checkpoint: bool) -> list:
    import torch
    import torch.utils.checkpoint
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    module = _load(source, "rc201")
    if bypass_checkpoint:
        monkeypatch.setattr(
            torch.utils.checkpoint, "checkpoint", lambda fn, *args, **kwargs: fn(*args)
        )
    seen: list = []

    def record(optimizer, args, kwargs):
        seen.append([p.grad.clone() for g in optimizer.param_groups for p in g["params"]])

    handle = register_optimizer_step_pre_hook(record)
    try:
        module.step_example()
    finally:
        handle.remove()
        monkeypatch.undo()
    return seen


def test_parameter_change_example_gives_other_gradients_than_without_checkpoint(monkeypatch):
    rule = get_rule("RC201")
    for source, expect_same in ((rule.examples[0], False), (rule.clean_examples[0], True)):
        with_ckpt = _grads_at_each_optimizer_step(source, monkeypatch, bypass_checkpoint=False)
        without = _grads_at_each_optimizer_step(source, monkeypatch, bypass_checkpoint=True)
        assert with_ckpt and len(with_ckpt) == len(without)
        assert _same(with_ckpt, without) is expect_same
