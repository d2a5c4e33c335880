"""``--fix`` writes all or nothing: a full disk or a kill mid-write never loses a file (issue 40)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

INSERTED = b", use_reentrant=False"

FLAGGED = b"import torch.utils.checkpoint as cp\n\n\ndef run(block, x):\n    return cp.checkpoint(block, x)\n"
FIXED = FLAGGED.replace(b"checkpoint(block, x)", b"checkpoint(block, x" + INSERTED + b")")


def _limited_lint(args: list[str], cwd: Path, max_file_bytes: int) -> subprocess.CompletedProcess:
    """``recheck lint`` in a child that may not write a file past ``max_file_bytes``: a disk
    that fills up mid-write, as a real one does (``write`` fails with EFBIG)."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write(2), not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "recheck", "lint", "--no-cache", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, preexec_fn=limit, timeout=120)


def test_a_write_that_fails_midway_leaves_the_file_whole_and_the_rest_still_runs(tmp_path):
    big = FLAGGED + b"# " + b"-" * 200 + b"\n"
    (tmp_path / "a_big.py").write_bytes(big)
    (tmp_path / "b_small.py").write_bytes(FLAGGED)
    run = _limited_lint(["--fix", "."], tmp_path, len(big) + 5)  # room for the small fix, not the big one
    assert (tmp_path / "a_big.py").read_bytes() == big
    assert (tmp_path / "b_small.py").read_bytes() == FIXED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_big.py", "b_small.py"]  # no temporary file left
    assert "Traceback" not in run.stderr
    assert "a_big.py: not fixed: " in run.stderr
    assert run.returncode == 1  # the big file's finding stays, and is reported
    assert "a_big.py:5:" in run.stdout and "b_small.py" not in run.stdout


def test_fix_keeps_the_file_mode(lint, write):
    path = write("m.py", FLAGGED)
    path.chmod(0o751)
    assert lint("--fix").code == 0
    assert path.read_bytes() == FIXED
    assert path.stat().st_mode & 0o7777 == 0o751
