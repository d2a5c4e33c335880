"""The JSON forms: one schema for a finding (:meth:`recheck.findings.Finding.to_dict`), used by
every face: ``recheck lint --format json`` prints a list of them (ruff's layout), a report is
:meth:`recheck.findings.Report.to_dict`, and the documents of ``recheck check`` and ``recheck run``
hold reports; all go through :func:`dumps`, and back through the validating
:meth:`recheck.findings.Report.from_dict`."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from recheck.findings import Finding
from recheck.output.text import rule_counts

__all__ = ["check_document", "dumps", "finding_list", "run_document", "statistics_list", "steps_document"]


def dumps(value: Any) -> str:
    """``json.dumps`` as every face writes it: indented, unknown objects by ``repr``."""
    return json.dumps(value, indent=2, default=repr)


def finding_list(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """Every finding's record, in order."""
    return [f.to_dict() for f in findings]


def statistics_list(findings: Sequence[Finding], names: Mapping[str, str],
                    fixable: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """``--statistics`` as JSON: ``{"code", "name", "count", "fixable"}`` per rule (ruff's keys)."""
    return [{"code": code, "name": names.get(str(code), ""), "count": count, "fixable": code in fixable}
            for code, count in rule_counts(findings)]


def _outcomes(outcomes: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """``{"target": label, **outcome.to_dict()}`` each: a report, or an error's ``error`` and ``traceback``."""
    return [{"target": label, **outcome.to_dict()} for label, outcome in outcomes]


def check_document(outcomes: Sequence[tuple[str, Any]], *, regions: int, with_findings: int, differences: int,
                   errors: int, interrupted: bool, text: str) -> dict[str, Any]:
    """``recheck check --format json``: every region's report (or error) in order, then the summary."""
    return {"reports": _outcomes(outcomes),
            "summary": {"regions": regions, "with_findings": with_findings, "differences": differences,
                        "errors": errors, "interrupted": interrupted, "text": text}}


def steps_document(outcomes: Sequence[tuple[str, Any]], *, with_findings: int, errors: int, interrupted: bool,
                   text: str) -> dict[str, Any]:
    """``recheck check --step ... --format json``: every step's report (or error), then the summary."""
    return {"steps": _outcomes(outcomes),
            "summary": {"steps": len(outcomes), "with_findings": with_findings, "errors": errors,
                        "interrupted": interrupted, "text": text}}


def run_document(program: str, module: bool, argv: Sequence[str], watcher: Any, status: int,
                 report: Any) -> dict[str, Any]:
    """``recheck run --format json``: the run (program, argv, its steps as ``watcher`` counted them,
    exit status) and the watch report."""
    return {
        "program": program,
        "module": module,
        "argv": list(argv),
        "steps": {"asked": watcher.steps, "watched": watcher.steps_watched, "unit": watcher.unit,
                  "optimizer_steps": watcher.optimizer_steps, "backward_calls": watcher.backward_calls,
                  "window_ended": watcher.window_ended},
        "program_status": status,
        "report": report.to_dict(),
    }
