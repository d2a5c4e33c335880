"""``--fix`` writes only regular files inside the paths given, never through a link out (issue 40)."""

from __future__ import annotations

import os
from pathlib import Path

INSERTED = b", use_reentrant=False"

FLAGGED = b"import torch.utils.checkpoint as cp\n\n\ndef run(block, x):\n    return cp.checkpoint(block, x)\n"
FIXED = FLAGGED.replace(b"checkpoint(block, x)", b"checkpoint(block, x" + INSERTED + b")")


def test_fix_never_writes_through_a_link_to_outside_the_tree(lint, write, tmp_path):
    outside = write("outside/target.py", FLAGGED)
    inside = write("tree/own.py", FLAGGED)
    (tmp_path / "tree" / "link.py").symlink_to(outside)
    run = lint("--fix", "tree")
    assert outside.read_bytes() == FLAGGED
    assert (tmp_path / "tree" / "link.py").is_symlink()
    assert inside.read_bytes() == FIXED
    message = [line for line in run.err.splitlines() if str(Path("tree", "link.py")) in line]
    assert message and "not fixed" in message[0] and "outside" in message[0]
    assert run.code == 1  # the link's finding is still reported


def test_a_link_inside_the_tree_fixes_its_target_once_and_stays_a_link(lint, write, tmp_path):
    target = write("tree/target.py", FLAGGED)
    link = tmp_path / "tree" / "link.py"
    link.symlink_to("target.py")
    run = lint("--fix", "tree")
    assert target.read_bytes() == FIXED
    assert link.is_symlink() and os.readlink(link) == "target.py"
    assert run.code == 0, run.err


def test_a_link_named_on_the_command_line_is_fixed_at_its_target(lint, write, tmp_path):
    target = write("outside/target.py", FLAGGED)
    link = tmp_path / "link.py"
    link.symlink_to(target)
    run = lint("--fix", "link.py")  # the user chose this file: its target is what they named
    assert target.read_bytes() == FIXED
    assert link.is_symlink()
    assert run.code == 0, run.err
