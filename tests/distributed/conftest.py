"""Makes the scenario modules in ``fixtures/distributed/`` importable (also by spawned ranks,
which inherit ``sys.path`` from this process)."""

import sys
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "distributed"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))
