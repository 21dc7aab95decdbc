"""What ``harness.reports.invocation`` tells a person about a run that did not pass."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from harness.checks import NamedResult
from harness.judge.verdict import RunResult
from harness.reports.invocation import first_failing_check, next_steps


def _run(tmp_path: Path, *checks: NamedResult, verdict: str = "fail") -> RunResult:
    (tmp_path / "procs").mkdir(exist_ok=True)
    (tmp_path / "procs" / "reader-1.log").write_text("...")
    scenario = SimpleNamespace(path=Path("scenarios/frozen_source.yaml"), name="frozen_source",
                               processes={"server": None, "reader-1": None})
    return cast(RunResult, cast(Any, SimpleNamespace(verdict=verdict, seed=12, run_dir=tmp_path, scenario=scenario,
                                                     checks=list(checks))))


def test_a_missed_time_bound_is_rerun_with_repeats_and_the_named_process_log_is_shown(tmp_path: Path) -> None:
    late = NamedResult(0, "elapsed", "next candidate within 2.35s", False, "3.896s, later than 2.35s",
                       details={"process": "reader-1"})
    steps = next_steps(_run(tmp_path, late))
    assert steps[0] == "rerun:  mxchaos run scenarios/frozen_source.yaml --seed 12 --repeat 5"
    assert steps[1].startswith(f"replay: mxchaos replay {tmp_path}")
    assert steps[2] == f"log:    {tmp_path / 'procs' / 'reader-1.log'}"
    assert first_failing_check(_run(tmp_path, late)) == "next candidate within 2.35s: 3.896s, later than 2.35s"


def test_a_failure_that_is_no_time_bound_is_rerun_once_and_a_pass_needs_nothing(tmp_path: Path) -> None:
    wrong = NamedResult(0, "integrity", "integrity", False, "1 tensor differs", details={})
    assert next_steps(_run(tmp_path, wrong))[0] == "rerun:  mxchaos run scenarios/frozen_source.yaml --seed 12"
    assert next_steps(_run(tmp_path, verdict="pass")) == []
