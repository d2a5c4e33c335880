"""The comparison as a table, JSON and a plot; the budget estimate; byte sizes."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from recheck.cost import measure
from recheck.cost.budget import estimate
from recheck.cost.ledger import CATEGORIES
from recheck.cost.plot import PlotError
from recheck.cost.results import RegionResult, rank_regions
from recheck.cost.table import BLIND_SPOTS, DEFINITIONS
from recheck.cost.units import format_bytes, parse_bytes
from recheck.cost.work import Work

SMALL = dict(seq=4, dim=8, heads=2, hidden=16, blocks=2, mlp_layers=1, default_batch=2)


@pytest.fixture(scope="module")
def comparison(demo):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step, _, _ = demo.make_step(**SMALL)
        return measure(step, repeats=2, budget="1GiB")
    finally:
        torch.set_num_threads(threads)


def test_table_prints_every_term_beside_its_definition(comparison):
    text = str(comparison)
    for term in ("retained saved state, peak", "observed peak", "recompute", "step time (median)"):
        assert term in text
    for category in CATEGORIES:
        assert DEFINITIONS[category] in text
    for definition in ("retained_peak", "observed_peak", "recompute_flops", "bytes_moved", "region_net"):
        assert DEFINITIONS[definition] in text
    assert all(spot in text for spot in BLIND_SPOTS)
    assert "Block.forward" in text and "MLPLayer.forward" in text and "tanh" in text


def test_json_has_every_figure_and_the_definitions(comparison):
    data = json.loads(comparison.to_json())
    assert set(data["modes"]) == {"checkpointed", "bypassed"}
    for mode in data["modes"].values():
        assert mode["retained_saved_state"]["peak"] > 0
        assert set(mode["peak_breakdown"]) == set(CATEGORIES)
        assert len(mode["seconds"]) == 2
        assert mode["work"]["forward"]["flops"] > 0
    assert data["recompute"]["flops"] == comparison.recompute.flops
    assert [r["region"] for r in data["regions"]] == [r.name for r in comparison.regions]
    assert data["definitions"] == DEFINITIONS
    timeline = json.loads(comparison.to_json(timeline=True))["modes"]["checkpointed"]["timeline"]
    assert len(timeline["observed_bytes"]) == len(timeline["retained_bytes"]) > 10
    assert max(timeline["retained_bytes"]) == comparison.checkpointed.retained_peak


def test_plot_writes_a_png(comparison, tmp_path):
    pytest.importorskip("matplotlib")
    written = comparison.plot(str(tmp_path / "memory.png"))
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert written.endswith("memory.png")


def test_plot_without_matplotlib_is_a_clear_error(comparison, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotError, match="needs matplotlib.*pip install matplotlib"):
        comparison.plot(str(tmp_path / "memory.png"))


def test_plot_to_an_unwritable_path_is_a_clear_error(comparison, tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(PlotError, match="cannot write the plot"):
        comparison.plot(str(tmp_path / "missing-dir" / "memory.png"))


def test_budget_is_extrapolated_from_two_batch_sizes(comparison):
    est = comparison.budget
    assert est is not None and est.extrapolated and est.batch_sizes == (2, 4)
    assert "extrapolated" in est.note and "extrapolated" in str(comparison)
    for info in est.per_mode.values():
        largest = info["largest_batch"]
        fits = info["fit_by_phase"]
        def within(batch: int, fits=fits) -> bool:
            return all(f["fixed_bytes"] + f["bytes_per_sample"] * batch <= est.budget for f in fits.values())

        assert within(largest) and not within(largest + 1)
    assert est.per_mode["checkpointed"]["largest_batch"] > est.per_mode["bypassed"]["largest_batch"]


def test_budget_fits_each_phase_separately():
    # the optimizer phase does not grow with the batch: a single line through the overall
    # peak (max of the phases) would be flat here and overestimate the largest batch
    points = [(8, {"backward": 100, "optimizer": 500}, 1.0), (16, {"backward": 200, "optimizer": 500}, 2.0)]
    est = estimate(1000, {"checkpointed": points})
    info = est.per_mode["checkpointed"]
    assert info["largest_batch"] == 80 and info["limiting_phase"] == "backward"
    assert info["samples_per_second"] == pytest.approx(8.0)
    too_small = estimate(400, {"checkpointed": points})
    assert too_small.per_mode["checkpointed"]["largest_batch"] == 0


def test_budget_without_batch_size_only_judges_the_measured_size():
    est = estimate(1000, {"checkpointed": [(None, {"backward": 900}, 1.0)], "bypassed": [(None, {"backward": 1100}, 1.0)]})
    assert not est.extrapolated and "not extrapolated" in est.note
    assert est.per_mode["checkpointed"]["fits_measured_size"] is True
    assert est.per_mode["bypassed"]["fits_measured_size"] is False


@pytest.mark.parametrize(
    "text, expected",
    [("40GiB", 40 * 2**30), ("1.5GB", 1_500_000_000), ("512 MiB", 512 * 2**20), ("1000", 1000), ("2kib", 2048)],
)
def test_sizes_parse(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "40 parsecs", "-1GiB", "0", "1e9"])
def test_bad_sizes_are_a_clear_error(text):
    with pytest.raises(ValueError, match="size"):
        parse_bytes(text)


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(-3 * 2**20) == "-3.00 MiB"


def _region(name: str, saved: int, kept: int, flops: int, moved: int = 0, recomputes: int = 1) -> RegionResult:
    return RegionResult(name, None, None, 1, saved, kept, Work(flops, moved), None, recomputes)


def test_regions_are_ranked_by_net_bytes_per_recompute_and_poor_trades_called_out():
    good = _region("good", saved=1000, kept=100, flops=1000)
    poor = _region("poor", saved=200, kept=100, flops=10_000)  # 0.01 B/FLOP vs 0.9: under 10%
    pointwise = _region("pointwise", saved=1000, kept=100, flops=0, moved=1_000_000)  # bytes are not free
    nothing = _region("nothing", saved=100, kept=100, flops=10)
    idle = _region("idle", saved=500, kept=100, flops=0, recomputes=0)
    ranked = rank_regions([nothing, poor, pointwise, good, idle])
    assert [r.name for r in ranked][:2] == ["idle", "good"]
    verdicts = {r.name: r.verdict for r in ranked}
    assert verdicts["good"] == "ok"
    assert verdicts["poor"].startswith("poor trade") and verdicts["pointwise"].startswith("poor trade")
    assert verdicts["nothing"].startswith("saves nothing") and ranked[-1] is nothing
    assert verdicts["idle"].startswith("never recomputed")


def test_a_step_without_checkpoints_says_so():
    layer = torch.nn.Linear(2, 2)
    cmp = measure(lambda: layer(torch.ones(1, 2)).sum().backward(), repeats=1)
    assert cmp.regions == [] and any("no checkpoint call" in note for note in cmp.notes)
    assert cmp.checkpointed.retained_peak == cmp.bypassed.retained_peak
    assert "the step made no checkpoint call" in str(cmp)


def test_cuda_figures_are_absent_off_cuda(comparison):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: benchmarks/cost_cuda_check.py covers it")
    assert comparison.checkpointed.cuda is None and "cuda max" not in str(comparison)
