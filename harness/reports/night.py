"""A night as data: its scenarios' cells (``harness.record.rates``) and ``nightly.json``.

The night passed (``night_passed``) when it was not interrupted, at least one scenario ran,
and no cell fails the run (``rates.FAILING_CELLS``: FAIL, FLAKY, HANG, ERROR, UNKNOWN): the
rule of ``mxchaos run --repeat N``, so a plain scenario passes only at N/N, a known defect
XFAIL, FIXED? or XPASS does not fail it, and a SKIP (a capability missing, a
host not bound) does not either.

``nightly.json`` (``SCHEMA`` 1)::

    {"schema": 1, "night": ID, "started": ISO, "ended": ISO, "seconds": float,
     "repeat": N, "seed": int | null (--seed), "command": [argv], "passed": bool,
     "interrupted": bool, "exit_code": int,
     "counts": {"scenarios", "ran", "skipped", "runs", "failing", "cells": {CELL: n}},
     "versions": {...harness.versions.collect_versions},
     "hosts": {"binding": "here" | "inventory", "inventory": {path, bytes, sha256, hosts} | null},
     "scenarios": [{"name", "path", "known_defect", "hosts": {host: where}, "skip": str | null,
                    "cell", "rate": {k, n}, "bound", "measured", "note", "fails_night": bool,
                    "failures": {k, n}, "median_seconds",
                    "runs": [{"index", "seed", "verdict", "status", "reason", "seconds",
                              "failed_checks", "load", "run_dir", "report"}]}],  # run_dir, report: relative to the night
     "artifacts": {"bytes", "log_cap_bytes", "capped": [...], "removed": [...]},
     "previous": {"night", "dir"} | null,
     "comparison": harness.nightly.compare.compare_nights(...) | null}

``failures`` is the matrix's failure rate (``harness.record.cells.BAD``: runs ending error,
hang, fail, unknown or xfail, over runs not skipped), so ``harness.record.baseline`` judges a
move of it between nights.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.judge.verdict import RunResult
from harness.record.cells import BAD
from harness.record.rates import Cell, Rate

__all__ = ["SCHEMA", "RunDetail", "ScenarioNight", "failures_of", "night_json", "night_passed", "run_detail", "scenario_json"]

SCHEMA = 1


@dataclass(frozen=True)
class RunDetail:
    """What a run record of ``harness.record.rates`` does not hold: how the run ended and why."""

    status: str = "completed"
    reason: str = ""
    failed_checks: tuple[str, ...] = ()  # the checks that failed or were unknown: "name: summary"
    load: str = ""  # the machine's load during the run when it had more runnable tasks than CPUs (else "")


@dataclass(frozen=True)
class ScenarioNight:
    """One scenario of the night: where it was bound, its cell, and per run (same order as
    ``cell.runs``) how it ended; ``skip`` says why it did not run at all."""

    name: str
    path: str
    cell: Cell
    hosts: dict[str, str] = field(default_factory=dict)
    known_defect: str | None = None
    skip: str | None = None
    details: tuple[RunDetail, ...] = ()

    @property
    def ran(self) -> bool:
        return self.skip is None and any(r.verdict != "skip" for r in self.cell.runs)


def run_detail(result: RunResult) -> RunDetail:
    """How a run ended, its checks that did not pass, and the machine's load when it was
    oversubscribed and a timing check failed (``harness.reports.invocation.load_caveat``)."""
    from harness.judge.timing import load_caveat

    failed = tuple(f"not exercised: {why}" for why in result.not_exercised)  # first: the scenario did not happen
    failed += tuple(f"{c.name}: {c.summary}" for c in result.checks if c.valid is not True)
    return RunDetail(result.status, result.reason, failed, load_caveat(result))


def failures_of(cell: Cell) -> Rate:
    counted = [r for r in cell.runs if r.verdict != "skip"]
    return Rate(sum(1 for r in counted if r.verdict in BAD), len(counted))


def _link(run_dir: str, night_dir: Path) -> str:
    path = Path(run_dir)
    if not path.is_absolute():
        return run_dir
    try:
        return str(path.resolve().relative_to(night_dir.resolve()))
    except ValueError:
        return os.path.relpath(path, night_dir)


def scenario_json(s: ScenarioNight, night_dir: Path) -> dict[str, Any]:
    judged = s.cell.to_json()
    runs = []
    for index, record in enumerate(s.cell.runs, 1):
        detail = s.details[index - 1] if index - 1 < len(s.details) else RunDetail()
        link = _link(record.run_dir, night_dir)
        runs.append({"index": index, "seed": record.seed, "verdict": record.verdict, "status": detail.status,
                     "reason": detail.reason, "failed_checks": list(detail.failed_checks), "load": detail.load,
                     "seconds": record.seconds, "run_dir": link,
                     "report": f"{link}/report.html"})
    seconds = [r.seconds for r in s.cell.runs if r.verdict != "skip"]
    return {
        "name": s.name,
        "path": s.path,
        "known_defect": s.known_defect,
        "hosts": dict(s.hosts),
        "skip": s.skip,
        "cell": s.cell.name,
        "rate": judged["rate"],
        "bound": judged["bound"],
        "measured": judged["measured"],
        "note": s.cell.note,
        "fails_night": s.cell.fails_run,
        "failures": failures_of(s.cell).to_json(),
        "median_seconds": round(statistics.median(seconds), 3) if seconds else None,
        "runs": runs,
    }


def night_passed(scenarios: Sequence[ScenarioNight], interrupted: bool) -> bool:
    return (not interrupted and any(s.ran for s in scenarios)
            and not any(s.cell.fails_run or s.cell.name == "ENV_BROKEN" for s in scenarios))  # nightly.run's cell


def night_json(
    *,
    night: str,
    night_dir: Path,
    started: str,
    ended: str,
    seconds: float,
    repeat: int,
    seed: int | None,
    command: Sequence[str],
    scenarios: Sequence[ScenarioNight],
    interrupted: bool,
    exit_code: int,
    versions: Mapping[str, Any],
    hosts: Mapping[str, Any],
    artifacts: Mapping[str, Any],
    previous: Mapping[str, Any] | None = None,
    comparison: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``nightly.json``'s content (the shape in this module's docstring)."""
    cells = Counter(s.cell.name for s in scenarios)
    return {
        "schema": SCHEMA,
        "night": night,
        "started": started,
        "ended": ended,
        "seconds": round(seconds, 3),
        "repeat": repeat,
        "seed": seed,
        "command": list(command),
        "passed": night_passed(scenarios, interrupted),
        "interrupted": interrupted,
        "exit_code": exit_code,
        "counts": {
            "scenarios": len(scenarios),
            "ran": sum(1 for s in scenarios if s.ran),
            "skipped": sum(1 for s in scenarios if not s.ran),
            "runs": sum(1 for s in scenarios for r in s.cell.runs if r.verdict != "skip"),
            "failing": sum(1 for s in scenarios if s.cell.fails_run),
            "cells": dict(sorted(cells.items())),
        },
        "versions": dict(versions),
        "hosts": dict(hosts),
        "scenarios": [scenario_json(s, night_dir) for s in scenarios],
        "artifacts": dict(artifacts),
        "previous": dict(previous) if previous else None,
        "comparison": dict(comparison) if comparison else None,
    }
