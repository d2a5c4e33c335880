"""The snapshot's search for held state is bounded, and names what lies past its bounds.

Unit tests of :meth:`recheck.runtime.snapshot.Snapshot.hold` through ``recheck.check``: what the
search finds is put back, and where it stops (the fingerprints' depth, its count of values) the
report's notes say so by name: a check never claims to leave no trace where it did not look.
"""

from __future__ import annotations

import torch
from torch import nn

import recheck
from recheck.runtime import snapshot


class Node:
    def __init__(self, child: Node | None = None) -> None:
        self.n = 0
        self.child = child


class ChainBlock(nn.Module):
    """Holds a chain of four helpers and counts in each (``self.chain.child.child.child``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.chain = Node(Node(Node(Node())))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        node = self.chain
        while node is not None:
            node.n += 1
            node = node.child
        return self.lin(x)


def _counts(block: ChainBlock) -> list[int]:
    found, node = [], block.chain
    while node is not None:
        found.append(node.n)
        node = node.child
    return found


def test_a_helper_within_the_depth_is_put_back_and_one_below_it_is_named() -> None:
    block = ChainBlock()
    report = recheck.check(block, torch.randn(2, 4, requires_grad=True))
    assert _counts(block)[:3] == [0, 0, 0]
    named = [note for note in report.notes if "cannot be put back" in note]
    assert len(named) == 1 and "`self.chain.child.child.child`" in named[0] and "levels down" in named[0], named


def test_a_helper_reached_deep_and_shallow_is_put_back_and_not_named() -> None:
    block = ChainBlock()
    block.shortcut = block.chain.child.child.child  # the same object, one level down
    report = recheck.check(block, torch.randn(2, 4, requires_grad=True))
    assert _counts(block) == [0, 0, 0, 0]
    assert not [note for note in report.notes if "cannot be put back" in note], report.notes


class Crowd(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.members = [Node() for _ in range(size)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for member in self.members:
            member.n += 1
        return self.lin(x)


def test_the_search_stops_after_its_count_of_values_and_says_so(monkeypatch) -> None:
    monkeypatch.setattr(snapshot, "_MAX_HELD", 10)
    block = Crowd(30)
    report = recheck.check(block, torch.randn(2, 4, requires_grad=True))
    assert [m.n for m in block.members[:9]] == [0] * 9  # the list, then nine members
    named = [note for note in report.notes if "cannot be put back" in note]
    assert len(named) == 1 and "beyond the first 10 values" in named[0], report.notes
