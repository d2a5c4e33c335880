"""``pytest --recheck`` on two ranks: two real ``python -m pytest`` processes joined by env vars.

Each process gets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1`` and ``MASTER_PORT``, as
torchrun gives them: the store is hosted here, bound to a port the kernel picks (port 0) and
held for the whole run, and the ranks join it as clients (``TORCHELASTIC_USE_AGENT_STORE``),
so no rank has to bind a port that was free "a moment ago".  Each runs ``fixtures/distributed/case_ddp_rank_hazard.py`` (a DDP step whose
checkpointed region reads a global that rank 1 alone flips before backward) and writes
``--recheck-report report.json`` with its rank in the name.  Both processes are killed if
they have not finished in time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

#: two pytest processes joined in one world
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "fixtures" / "distributed" / "case_ddp_rank_hazard.py"
RANKS = 2
#: seconds both pytest processes together may run (a normal run takes about 10 s on 2 cores)
TIMEOUT = 120


def agent_store():
    """A TCPStore served from this process on a port the kernel picks, as torchrun's agent does."""
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, world_size=RANKS, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=TIMEOUT))


def run_ranks(workdir: Path) -> list[int]:
    store = agent_store()
    processes: list[subprocess.Popen] = []
    try:
        for rank in range(RANKS):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(RANKS), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
                   "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
                   "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
            with open(workdir / f"pytest.rank{rank}.log", "wb") as log:  # the child keeps its own copy
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "pytest", "-p", "recheck._pytest_plugin", "-p", "no:cacheprovider",
                     "--recheck", "--recheck-report", "report.json", "test_ddp_ranks.py"],
                    cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT))
        return [process.wait(timeout=TIMEOUT) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        del store  # closes the server


def test_each_rank_writes_its_own_report_and_only_rank_1_fails(tmp_path):
    shutil.copy(CASE, tmp_path / "test_ddp_ranks.py")
    codes = run_ranks(tmp_path)
    logs = [(tmp_path / f"pytest.rank{rank}.log").read_text(errors="replace") for rank in range(RANKS)]
    assert codes == [0, 1], "\n".join(logs)
    assert not (tmp_path / "report.json").exists()
    documents = [json.loads((tmp_path / f"report.rank{rank}.json").read_text()) for rank in range(RANKS)]
    for rank, document in enumerate(documents):
        assert (document["rank"], document["world_size"]) == (rank, RANKS)
        (test,) = document["tests"]
        assert test["nodeid"] == "test_ddp_ranks.py::test_ddp_step"
        assert (test["stats"]["rank"], test["stats"]["world_size"]) == (rank, RANKS)
        assert test["stats"]["verified"] == 1
    assert documents[0]["tests"][0]["findings"] == []
    findings = documents[1]["tests"][0]["findings"]
    assert {f["kind"] for f in findings} >= {"global"}
    assert all(f["invocation"]["tags"] == {"rank": 1} for f in findings)
    for rank, log in enumerate(logs):
        assert f"recheck summary (rank {rank} of {RANKS})" in log
        assert f"recheck (rank {rank} of {RANKS}): 1 test(s) watched" in log
