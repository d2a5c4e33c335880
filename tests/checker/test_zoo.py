"""Every example of ``fixtures/models/zoo.py`` through ``recheck.check`` and ``recheck check``.

Hazards must be found with their kinds (and with nothing unrelated), safe examples must check
clean, in both checkpoint variants wherever the example applies; findings that only the full
replay sees must be marked latent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import recheck
from recheck.findings import DYNAMIC_KINDS, FIRST_LINE

# The zoo's warning example warns in the plain reference run, which lets output through.
pytestmark = pytest.mark.filterwarnings("ignore:region. falling back:UserWarning")

ROOT = Path(__file__).resolve().parents[2]
ZOO_FILE = "fixtures/models/zoo.py"
NONE: frozenset[str] = frozenset()


def _kinds_text(report) -> str:
    return f"kinds {sorted(report.kinds)}\n{report}"


def test_example(zoo_case, zoo, check_example) -> None:
    report = check_example(zoo_case.name, use_reentrant=zoo_case.use_reentrant)
    for _ in range(zoo.CHANCE_TRIES - 1):
        if zoo_case.name not in zoo.SHOWS_BY_CHANCE or zoo_case.expected <= report.kinds:
            break
        report = check_example(zoo_case.name, use_reentrant=zoo_case.use_reentrant)
    found = report.kinds
    missing = zoo_case.expected - found
    unexpected = found - zoo_case.expected - zoo_case.also_possible
    assert not missing, f"{zoo_case.id}: missing {sorted(missing)}; " + _kinds_text(report)
    assert not unexpected, f"{zoo_case.id}: unexpected {sorted(unexpected)}; " + _kinds_text(report)
    assert report.ok == (not zoo_case.expected), _kinds_text(report)
    for kind in zoo_case.latent:
        assert all(f.latent for f in report.by_kind(kind)), (
            f"{kind} should be latent under non-reentrant early stop; " + _kinds_text(report))
    for kind in zoo_case.expected - zoo_case.latent:
        assert any(not f.latent for f in report.by_kind(kind)), (
            f"{kind} is executed in this configuration, so not latent; " + _kinds_text(report))
    if not report.ok:
        assert str(report).splitlines()[0].startswith(FIRST_LINE)


def test_example_without_early_stop(zoo_name, zoo, check_example) -> None:
    """Non-reentrant with ``early_stop=False``: the configuration executes everything, so the
    same hazards are found and none is latent."""
    name = zoo_name
    expected = zoo.NO_EARLY_STOP_EXPECTED.get(name, zoo.expected_kinds(name, False))
    report = check_example(name, use_reentrant=False, early_stop=False)
    assert expected <= report.kinds <= expected | zoo.ALSO_POSSIBLE.get(name, NONE), (
        _kinds_text(report))
    assert not [f for f in report if f.latent], _kinds_text(report)


@pytest.mark.parametrize("name", ["region_mlp", "region_nested_outputs", "region_kwargs"])
def test_assert_recompute_equal_passes_on_safe_examples(name, build_example, example_options):
    fn, args, kwargs = build_example(name)
    assert recheck.assert_recompute_equal(fn, *args, kwargs=kwargs, **example_options(name)) is None


@pytest.mark.parametrize("name", ["region_batchnorm_train", "region_dropout_rng_not_preserved",
                                  "region_counter"])
def test_assert_recompute_equal_raises_on_hazards(name, zoo, build_example, example_options):
    fn, args, kwargs = build_example(name)
    with pytest.raises(recheck.RecomputeMismatch) as info:
        recheck.assert_recompute_equal(fn, *args, kwargs=kwargs, **example_options(name))
    assert zoo.EXPECTED[name] <= info.value.report.kinds
    assert str(info.value).startswith(FIRST_LINE)


# --- the zoo's own contract ------------------------------------------------------------------


def test_zoo_tables_describe_every_example(zoo) -> None:
    names = zoo.example_names()
    assert len(names) >= 20
    assert set(zoo.EXPECTED) == set(names)
    for table in (zoo.CHECK_OPTIONS, zoo.VARIANT_EXPECTED, zoo.ALSO_POSSIBLE,
                  zoo.LATENT_UNDER_EARLY_STOP, zoo.SHOWS_BY_CHANCE):
        assert set(table) <= set(names)
    assert all(zoo.EXPECTED[name] for name in zoo.SHOWS_BY_CHANCE)
    allowed_options = {"use_reentrant", "preserve_rng_state", "early_stop", "grad_outputs"}
    for options in zoo.CHECK_OPTIONS.values():
        assert set(options) <= allowed_options
    for name in names:
        assert getattr(zoo, name).__doc__, f"{name} has no docstring"
        assert zoo.EXPECTED[name] <= set(DYNAMIC_KINDS)
    assert sum(not zoo.EXPECTED[n] for n in names) >= 10, "at least ten safe examples"


def test_zoo_covers_every_dynamic_kind(zoo) -> None:
    # ``context`` is covered by fixtures/models/context_regions.py, kept beside the zoo (whose
    # region counts the docs quote) until the zoo takes its region
    from source_modules import load_file

    regions = load_file(ROOT / "fixtures" / "models" / "context_regions.py", "recheck_context_regions")
    covered = set().union(*zoo.EXPECTED.values(), *({k for k, _ in e} for e in regions.EXPECTED.values()))
    assert covered == set(DYNAMIC_KINDS)


def _flat_tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat_tensors(item)]
    return []


def test_examples_are_fresh_and_reproducible(zoo_name, build_example) -> None:
    """Two calls give bit-identical inputs and modules in separate objects, and run plainly.

    (Plain module-level functions are shared; the example resets the globals they use.)
    """
    first, second = build_example(zoo_name), build_example(zoo_name)
    if isinstance(first[0], torch.nn.Module):
        assert first[0] is not second[0]
    tensors = [_flat_tensors(list(b[1]) + list(b[2].values())) for b in (first, second)]
    for a, b in zip(*tensors):
        assert a is not b and torch.equal(a, b)
    if isinstance(first[0], torch.nn.Module):
        for (_, a), (_, b) in zip(first[0].state_dict().items(), second[0].state_dict().items()):
            assert torch.equal(a, b)
    first[0](*first[1], **first[2])


# --- the CLI ---------------------------------------------------------------------------------


def _run_cli(*arguments: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "recheck", "check", *arguments], check=False,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_cli_reports_every_hazard_and_nothing_for_safe_examples(zoo) -> None:
    result = _run_cli(ZOO_FILE, "--format", "json")
    assert result.returncode == 1, result.stderr
    payload = json.loads(result.stdout)
    by_region = {entry["target"].rpartition(":")[2]: entry for entry in payload["reports"]}
    assert set(by_region) == set(zoo.example_names())
    for name, entry in by_region.items():
        kinds = {f["kind"] for f in entry["findings"]}
        required = NONE if name in zoo.SHOWS_BY_CHANCE else zoo.EXPECTED[name]  # one run only here
        assert required <= kinds <= zoo.EXPECTED[name] | zoo.ALSO_POSSIBLE.get(name, NONE), (
            f"{name}: {sorted(kinds)}")
    hazards = sum(bool(zoo.EXPECTED[n]) for n in by_region)
    by_chance = sum(bool(zoo.EXPECTED[n]) for n in by_region if n in zoo.SHOWS_BY_CHANCE)
    assert hazards - by_chance <= payload["summary"]["with_findings"] <= hazards


@pytest.mark.slow
def test_cli_text_output_names_the_hazards(zoo) -> None:
    hazard, safe = "region_batchnorm_train", "region_mlp"
    assert zoo.EXPECTED[safe] == NONE
    result = _run_cli(f"{ZOO_FILE}:{hazard}", f"{ZOO_FILE}:{safe}")
    assert result.returncode == 1, result.stdout + result.stderr
    hazard_text, _, safe_text = result.stdout.partition(f"target         {ZOO_FILE}:{safe}")
    assert hazard_text.count(FIRST_LINE) == 1 and "buffer" in hazard_text
    assert FIRST_LINE not in safe_text
    assert "1 with findings" in result.stdout and "1 clean" in result.stdout


@pytest.mark.slow
def test_a_logger_read_as_a_global_is_not_state_in_a_fresh_process(zoo) -> None:
    # The first check in a process fills the logger's level cache and torch registers its
    # own loggers during the first backward: a logger compared by its __dict__ differed
    # ("state: global `zoo.LOG` differs"); it is compared by its configuration.
    result = _run_cli(f"{ZOO_FILE}:region_logging", "--format", "json")
    assert result.returncode == 1, result.stderr
    (entry,) = json.loads(result.stdout)["reports"]
    assert {f["kind"] for f in entry["findings"]} == zoo.EXPECTED["region_logging"] == {"side_effect"}
