"""Each rule's table of valid and invalid cases (Fixit's style): line, column, message.

Every rule keeps its table in its own module (``INVALID``, ``VALID``), and this file runs
the tables of every rule ``recheck.lint.rules`` finds; a few more cases of the call-site and
class rules follow.  A case is a region body: ``_lint`` puts it in a module whose ``Block.forward`` is
checkpointed, so that every line number below counts from the body's first line (line 1
of the body is line ``FIRST`` of the module).
"""

from __future__ import annotations

import textwrap

import pytest

from recheck.lint.engine import lint_sources
from recheck.lint.rules import RULE_MODULES

HEAD = '''\
import datetime, logging, os, secrets, time, uuid
import random
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

STEP = 0
SCALE = 2.0
logger = logging.getLogger(__name__)


def advance():
    global STEP
    STEP += 1


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.prev = None
        self.count = 0
        self.tokens = torch.zeros(4)
        self.aux = []
        self.scale = 1.0

    def forward(self, x, cache=None, mask=None):
'''
TAIL = '''

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x, cache, mask):
        return checkpoint(self.block, x, cache, mask, use_reentrant=False{extra})
'''
FIRST = HEAD.count("\n") + 1


def _lint(body: str, extra: str = ""):
    source = HEAD + textwrap.indent(textwrap.dedent(body).strip("\n") + "\n", " " * 8) + TAIL.format(extra=extra)
    result = lint_sources({"case.py": source})
    assert not result.errors, result.errors
    return [(f.line - FIRST + 1, f.column, f.code, f.message) for f in result.findings]


def _check(code: str, body: str, expected: list[tuple[int, int, str]], extra: str = "") -> None:
    found = [(line, column, message) for line, column, c, message in _lint(body, extra) if c == code]
    assert [(line, column) for line, column, _ in found] == [(line, column) for line, column, _ in expected], found
    for (_, _, message), (_, _, wanted) in zip(found, expected):
        assert wanted in message, (message, wanted)


# -- the tables of region bodies (``TABLE = "body"``, ``INVALID`` and ``VALID`` in the module) ---

BODY_RULES = [rule for rule in RULE_MODULES if getattr(rule, "TABLE", "") == "body"]


def _cases(table: str):
    for rule in BODY_RULES:
        for number, case in enumerate(getattr(rule, table, ())):
            yield pytest.param(rule.CODE, case, id=f"{rule.CODE}-{number}")


def test_every_rule_but_the_call_site_rules_has_its_table():
    missing = [rule.CODE for rule in RULE_MODULES if not getattr(rule, "INVALID", None) or not getattr(rule, "VALID", None)]
    assert missing == ["RC001", "RC002", "RC003"]  # their cases are below and in tests/lint/test_fix.py


@pytest.mark.parametrize(("code", "case"), list(_cases("INVALID")))
def test_invalid(code, case):
    body, expected = case
    _check(code, body, expected)


@pytest.mark.parametrize(("code", "body"), list(_cases("VALID")))
def test_valid(code, body):
    _check(code, body, [])


# -- the tables of the rules judged outside one body (a class, a whole region): whole modules ---

MODULE_RULES = [rule for rule in RULE_MODULES if rule not in BODY_RULES and hasattr(rule, "INVALID")]


def _module_cases(table: str):
    for rule in MODULE_RULES:
        for number, case in enumerate(getattr(rule, table)):
            yield pytest.param(rule.CODE, case, id=f"{rule.CODE}-{number}")


def test_the_new_region_and_class_rules_have_tables():
    assert {"RC109", "RC110", "RC111"} <= {rule.CODE for rule in MODULE_RULES}
    assert all(getattr(rule, "VALID", None) for rule in MODULE_RULES)


@pytest.mark.parametrize(("code", "case"), list(_module_cases("INVALID")))
def test_module_invalid(code, case):
    source, expected = case
    result = lint_sources({"case.py": source})
    assert not result.errors, result.errors
    found = [(f.line, f.column, f.message) for f in result.findings if f.code == code]
    assert [(line, column) for line, column, _ in found] == [(line, column) for line, column, _ in expected], found
    for (_, _, message), (_, _, wanted) in zip(found, expected):
        assert wanted in message, (message, wanted)


@pytest.mark.parametrize(("code", "source"), list(_module_cases("VALID")))
def test_module_valid(code, source):
    result = lint_sources({"case.py": source})
    assert not result.errors, result.errors
    assert [f.format() for f in result.findings if f.code == code] == []


RC002_INVALID = [
    "return F.dropout(x, p=0.1, training=self.training)",
    "return F.scaled_dot_product_attention(x, x, x, dropout_p=0.1)",
    "return F.scaled_dot_product_attention(x, x, x, None, self.scale)",
    "return x * torch.bernoulli(torch.full_like(x, 0.5))",
    "return torch.nn.init.normal_(torch.empty_like(x))",
    "return x * torch.empty_like(x).uniform_()",
]
RC002_VALID = [
    "return F.dropout(x, p=0.0)",
    "return F.dropout(x, p=0.1, training=False)",
    "return F.scaled_dot_product_attention(x, x, x, dropout_p=0.0)",
    "return torch.nn.init.zeros_(torch.empty_like(x))",
]
PRESERVE_OFF = ", preserve_rng_state=False"


@pytest.mark.parametrize("body", RC002_INVALID, ids=range(len(RC002_INVALID)))
def test_rc002_invalid(body):
    found = [(c, m) for _, _, c, m in _lint(body, PRESERVE_OFF) if c == "RC002"]
    assert len(found) == 1 and "draws random numbers" in found[0][1], found


@pytest.mark.parametrize("body", RC002_VALID, ids=range(len(RC002_VALID)))
def test_rc002_valid(body):
    assert [c for _, _, c, _ in _lint(body, PRESERVE_OFF) if c == "RC002"] == []


RC101_SOURCE = '''
from torch import nn
from torch.utils.checkpoint import checkpoint


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.mask = None
        self.shared_kv = None

    def _attend(self, x):
        return self.proj(x) * self.mask + self.shared_kv

    def forward(self, x, mask, kv):
        self.mask = mask
        return checkpoint(self._attend, x, use_reentrant=False)


class Whole(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.mask = None

    def forward(self, x, mask):
        self.mask = mask
        return self.proj(x) * self.mask


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.whole = Whole()

    def forward(self, x, mask):
        return checkpoint(self.whole, x, mask, use_reentrant=False)
'''


def test_rc101_attribute_rebound_outside_the_region():
    found = [(f.line, f.column, f.message) for f in lint_sources({"m.py": RC101_SOURCE}).findings if f.code == "RC101"]
    # Layer.forward rebinds self.mask outside the region _attend reads it in; self.shared_kv is
    # never rebound by a forward; Whole rebinds self.mask inside its own region: RC104's business
    assert [(line, column) for line, column, _ in found] == [(14, 31)]
    assert "`self.mask` (rebound by `Layer.forward` outside the region)" in found[0][2]


HANDWRITTEN = '''
import torch


class Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, *args):
        ctx.run_function = run_function
{forward}
        ctx.save_for_backward(*args)
        with torch.no_grad():
            return run_function(*args)

    @staticmethod
    def backward(ctx, *grads):
        inputs = [x.detach().requires_grad_(True) for x in ctx.saved_tensors]
{backward}
        with torch.enable_grad():
            outputs = ctx.run_function(*inputs)
        torch.autograd.backward(outputs, grads)
        return (None, *[x.grad for x in inputs])
'''
RNG_SAVE = "        ctx.rng = torch.get_rng_state()"
RNG_RESTORE = "        torch.set_rng_state(ctx.rng)"
AUTOCAST = "        ctx.autocast = torch.is_autocast_enabled()"


@pytest.mark.parametrize(("forward", "backward", "missing"), [
    ("", "", "the RNG state or the autocast state"),
    (RNG_SAVE, RNG_RESTORE, "the autocast state"),
    (AUTOCAST, "", "the RNG state"),
    (RNG_SAVE + "\n" + AUTOCAST, RNG_RESTORE, None),
])
def test_rc003_table(forward, backward, missing):
    source = HANDWRITTEN.format(forward=forward, backward=backward)
    found = [(f.line, f.column, f.message) for f in lint_sources({"m.py": source}).findings if f.code == "RC003"]
    if missing is None:
        assert found == []
    else:
        assert [(line, column) for line, column, _ in found] == [(5, 1)]
        assert found[0][2].endswith(f"without saving and restoring {missing}; "
                                    + ("the recomputation draws other dropout masks" if "RNG" in missing else
                                       "the recomputation runs outside the forward's autocast and computes in another precision"))


def test_rc003_leaves_other_functions_alone():
    source = HANDWRITTEN.format(forward="", backward="").replace("with torch.enable_grad():", "if True:")
    assert [f for f in lint_sources({"m.py": source}).findings if f.code == "RC003"] == []


def test_rc003_leaves_a_fixed_recomputation_alone():
    # fairscale's mevo shape: backward recomputes the class's own arithmetic, not a callable
    source = HANDWRITTEN.format(forward="", backward="").replace(
        "outputs = ctx.run_function(*inputs)", "outputs = Recompute.math(*inputs)")
    assert [f for f in lint_sources({"m.py": source}).findings if f.code == "RC003"] == []


STACK = '''
from torch import nn
from torch.utils.checkpoint import checkpoint

_messages = []
_seen = []


def push(msg):
    _messages.append(msg)


def pop():
    return _messages.pop()


class Block(nn.Module):
    def forward(self, x):
        push("block")
        y = x * 2
        pop()
        _seen.append(len(_messages))
        return y


def run(x):
    return checkpoint(Block(), x, use_reentrant=False)
'''


def test_rc104_a_stack_pushed_and_popped_in_the_region_is_left_as_it_was():
    found = [(f.line, f.code) for f in lint_sources({"m.py": STACK}).findings]
    assert found == [(22, "RC104")]  # _seen grows; _messages is pushed and popped (nor is its read RC101)
