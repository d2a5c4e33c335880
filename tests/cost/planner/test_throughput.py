"""--objective throughput: every term on a line in the batch size, the plan run at the batch size it wins at."""

from __future__ import annotations

import pytest

from recheck.cost.planner.memory_model import Problem, Row
from recheck.cost.planner.suggest import suggest
from recheck.cost.planner.throughput import _largest, _sizes, interpolate


def test_every_coefficient_is_on_the_line_through_the_two_measured_sizes_and_never_below_zero():
    p0 = Problem([("none", "full")], [[0.0, 0.010]], [Row(("w", 0, 0), 100, {(0, 0): 40, (0, 1): 10}, {})],
                 [], [])
    p1 = Problem([("none", "full")], [[0.0, 0.018]], [Row(("w", 0, 0), 120, {(0, 0): 80, (0, 1): 10}, {})],
                 [], [])
    at = interpolate(p0, p1, 4, 8, 16)
    assert at.rows[0].constant == 160 and at.rows[0].terms == {(0, 0): 160, (0, 1): 10}
    assert at.seconds == [[0.0, pytest.approx(0.034)]]
    below = interpolate(p1, p0, 8, 4, 1)  # the lines cross zero below the measured sizes
    assert below.rows[0].terms[(0, 0)] == 10 and below.seconds[0][1] == pytest.approx(0.004)
    assert interpolate(p0, p1, 4, 8, 1).rows[0].terms[(0, 0)] == 10


def test_batch_sizes_tried_are_all_of_a_small_range_and_a_grid_with_the_largest_of_a_big_one():
    assert _sizes(5) == [1, 2, 3, 4, 5]
    grid = _sizes(10_000)
    assert grid[0] == 1 and grid[-1] == 10_000 and len(grid) <= 49 and grid == sorted(set(grid))


def test_the_largest_batch_size_that_fits_is_found_by_doubling_and_halving():
    assert _largest(lambda b: b <= 37, 8) == 37
    assert _largest(lambda b: b <= 3, 8) == 3
    assert _largest(lambda b: False, 8) == 0


@pytest.mark.slow
def test_throughput_buys_a_larger_batch_with_checkpointing(small_demo, peaks):
    step = small_demo[0]
    low, high = peaks(step)  # at the default batch of 4
    s = suggest(step, budget=high, objective="throughput", repeats=1, anchors=True)
    assert s.objective == "throughput" and s.throughput["measured_at"] == [4, 8]
    run = s.suggested
    assert run.batch_size and run.fits(s.budget) and run.verified, str(s)
    none = next(a for a in s.anchors if a.name == "no checkpointing")
    every = next(a for a in s.anchors if a.name == "every layer")
    assert every.batch_size > none.batch_size  # the memory checkpointing saves buys a larger microbatch
    assert all(a.fits(s.budget) for a in s.anchors)


def test_throughput_needs_a_batch_size_argument(small_demo):
    step = small_demo[0]
    with pytest.raises(ValueError, match="needs a step with a batch_size argument"):
        suggest(lambda: step(), budget="1GiB", objective="throughput")
