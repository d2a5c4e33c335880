"""``--fix`` adds ``use_reentrant=False`` (RC001 only), keeping the file's layout."""

from __future__ import annotations

SOURCE = '''\
import torch.utils.checkpoint as cp


def run(block, x, **kwargs):
    a = cp.checkpoint(block, x)  # a comment stays
    b = cp.checkpoint(
        block,
        x,
    )
    c = cp.checkpoint(block, x, **kwargs)
    d = cp.checkpoint_sequential([block], 1, x)
    return a, b, c, d
'''

FIXED = '''\
import torch.utils.checkpoint as cp


def run(block, x, **kwargs):
    a = cp.checkpoint(block, x, use_reentrant=False)  # a comment stays
    b = cp.checkpoint(
        block,
        x,
        use_reentrant=False,
    )
    c = cp.checkpoint(block, x, **kwargs)
    d = cp.checkpoint_sequential([block], 1, x, use_reentrant=False)
    return a, b, c, d
'''


def test_fix_rewrites_rc001_calls(lint, write):
    path = write("m.py", SOURCE)
    run = lint("--fix")
    assert path.read_text() == FIXED
    assert run.code == 0
    assert run.out == "Fixed 3 findings.\nAll checks passed!\n"
    assert lint().code == 0


def test_without_fix_the_file_is_untouched(lint, write):
    path = write("m.py", SOURCE)
    run = lint()
    assert path.read_text() == SOURCE
    assert run.lines[-1] == "Found 3 findings (3 fixable with `--fix`)."
