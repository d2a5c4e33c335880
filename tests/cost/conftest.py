"""Fixtures for the cost tests: the demo model file, loaded from its path, and one CPU thread.

Each test builds a small copy of the demo (``make_step``) so the analytic values can be
written down from its shapes.  One intra-op thread keeps the suite fast on a shared
two-core machine (oversubscribed OpenMP threads spin) and changes no figure measured.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from source_modules import load_file

ROOT = Path(__file__).resolve().parents[2]
DEMO_PATH = ROOT / "fixtures" / "models" / "cost_demo.py"


def load_demo() -> ModuleType:
    """Import ``fixtures/models/cost_demo.py`` once, as ``recheck_cost_demo``."""
    return load_file(DEMO_PATH, "recheck_cost_demo")


@pytest.fixture(scope="session")
def demo() -> ModuleType:
    return load_demo()


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
