"""Fixtures for the dynamic checker's tests: the example zoo, its cases, and state snapshots.

The zoo (``fixtures/models/zoo.py``) is loaded from its path, the way ``recheck check`` loads a
file, so these tests do not depend on ``fixtures`` being importable as a package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from source_modules import load_file

ROOT = Path(__file__).resolve().parents[2]
ZOO_PATH = ROOT / "fixtures" / "models" / "zoo.py"
NONE: frozenset[str] = frozenset()


def load_zoo() -> ModuleType:
    """Import ``fixtures/models/zoo.py`` once, registered in ``sys.modules`` as ``recheck_zoo``."""
    return load_file(ZOO_PATH, "recheck_zoo")


@dataclass(frozen=True)
class ZooCase:
    """One zoo example in one checkpoint variant, with the kinds a check must and may report."""

    name: str
    use_reentrant: bool
    expected: frozenset[str]
    also_possible: frozenset[str]
    latent: frozenset[str]

    @property
    def id(self) -> str:
        variant = "reentrant" if self.use_reentrant else "nonreentrant"
        return f"{self.name.removeprefix('region_')}-{variant}"


def zoo_cases() -> list[ZooCase]:
    """Every example in every variant it applies to."""
    zoo = load_zoo()
    cases = []
    for name in zoo.example_names():
        for use_reentrant in (False, True):
            expected = zoo.expected_kinds(name, use_reentrant)
            if expected is None:
                continue
            latent = NONE if use_reentrant else zoo.LATENT_UNDER_EARLY_STOP.get(name, NONE)
            cases.append(ZooCase(name, use_reentrant, expected,
                                 zoo.ALSO_POSSIBLE.get(name, NONE), latent))
    return cases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``zoo_case`` (example x variant) and ``zoo_name`` (every example)."""
    if "zoo_case" in metafunc.fixturenames:
        cases = zoo_cases()
        metafunc.parametrize("zoo_case", cases, ids=[c.id for c in cases])
    if "zoo_name" in metafunc.fixturenames:
        metafunc.parametrize("zoo_name", load_zoo().example_names())


@pytest.fixture(scope="session")
def zoo() -> ModuleType:
    return load_zoo()


@pytest.fixture(scope="session")
def check() -> Callable[..., Any]:
    """``recheck.check``, the API under test."""
    import recheck

    return recheck.check


def _build_example(name: str) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """Call zoo example ``name``: ``(fn, args, kwargs)``, kwargs ``{}`` when it gives none."""
    built = getattr(load_zoo(), name)()
    fn, args = built[0], built[1]
    kwargs = built[2] if len(built) > 2 else {}
    return fn, tuple(args), dict(kwargs)


def _example_options(name: str, **overrides: Any) -> dict[str, Any]:
    """The check() options for example ``name``: its CHECK_OPTIONS, then ``overrides``."""
    return {**load_zoo().CHECK_OPTIONS.get(name, {}), **overrides}


@pytest.fixture(scope="session")
def check_example(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check_example(name, **overrides) -> Report`` for a freshly built zoo example."""

    def run(name: str, **overrides: Any) -> Any:
        fn, args, kwargs = _build_example(name)
        return check(fn, *args, kwargs=kwargs, **_example_options(name, **overrides))

    return run


@pytest.fixture(scope="session")
def build_example() -> Callable[[str], tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]:
    """``build_example(name) -> (fn, args, kwargs)``."""
    return _build_example


@pytest.fixture(scope="session")
def example_options() -> Callable[..., dict[str, Any]]:
    """``example_options(name, **overrides) -> dict`` of check() options."""
    return _example_options
