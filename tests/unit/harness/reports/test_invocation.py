"""What ``harness.reports.invocation`` tells a person about a run that did not pass."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from harness.checks import NamedResult
from harness.judge.verdict import RunResult
from harness.reports.invocation import first_failing_check, next_steps, rerun_command


def _run(tmp_path: Path, *checks: NamedResult, verdict: str = "fail") -> RunResult:
    (tmp_path / "procs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "procs" / "reader-1.log").write_text("...")
    scenario = SimpleNamespace(path=Path("scenarios/frozen_source.yaml"), name="frozen_source",
                               processes={"server": None, "reader-1": None})
    return cast(RunResult, cast(Any, SimpleNamespace(verdict=verdict, seed=12, run_dir=tmp_path, scenario=scenario,
                                                     checks=list(checks), history=(), status="failed",
                                                     reason="elapsed", seconds=1.0)))


def test_a_missed_time_bound_is_rerun_with_repeats_and_the_named_process_log_is_shown(tmp_path: Path) -> None:
    late = NamedResult(0, "elapsed", "next candidate within 2.35s", False, "3.896s, later than 2.35s",
                       details={"process": "reader-1"})
    steps = next_steps(_run(tmp_path, late), mxchaos="mxchaos")
    assert steps[0] == "rerun:  mxchaos run scenarios/frozen_source.yaml --seed 12 --repeat 5"
    assert steps[1].startswith(f"replay: mxchaos replay {tmp_path}")
    assert steps[2] == f"log:    {tmp_path / 'procs' / 'reader-1.log'}"
    assert first_failing_check(_run(tmp_path, late)) == "next candidate within 2.35s: 3.896s, later than 2.35s"


def test_a_failure_that_is_no_time_bound_is_rerun_once_and_a_pass_needs_nothing(tmp_path: Path) -> None:
    wrong = NamedResult(0, "integrity", "integrity", False, "1 tensor differs", details={})
    assert next_steps(_run(tmp_path, wrong), mxchaos="mxchaos")[0] == "rerun:  mxchaos run scenarios/frozen_source.yaml --seed 12"
    assert next_steps(_run(tmp_path, verdict="pass")) == []


def test_the_recap_the_next_steps_and_ci_say_one_rerun_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``rerun_command`` is the one builder: the next steps' ``rerun:``, the recap's entry and the
    JUnit body's ``rerun:`` line are its words; a known defect's run has one only in JUnit, without
    the repeats."""
    from harness.reports import ci
    from harness.reports.console import recap_lines

    monkeypatch.setattr("harness.reports.invocation.mxchaos_command", lambda: "mx")
    late = NamedResult(0, "elapsed", "next candidate within 2.35s", False, "3.896s, later than 2.35s",
                       details={"process": "reader-1"})
    failed = _run(tmp_path / "a", late)
    line = rerun_command(failed)
    assert line == "mx run scenarios/frozen_source.yaml --seed 12 --repeat 5"
    assert next_steps(failed)[0] == f"rerun:  {line}"
    (entry,) = recap_lines([failed])
    assert entry.rerun == line
    assert f"rerun:    {line}\n" in ci.run_failure_text(failed)
    known = _run(tmp_path / "b", late, verdict="xfail")
    assert rerun_command(known) == "" and recap_lines([known])[0].rerun == ""
    assert rerun_command(known, passing_too=True) == "mx run scenarios/frozen_source.yaml --seed 12"
    assert "rerun:    mx run scenarios/frozen_source.yaml --seed 12\n" in ci.run_failure_text(known)


def test_printed_commands_run_as_printed_and_paths_are_relative_to_the_working_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From a checkout's .venv the commands say .venv/bin/mxchaos (a README user has no mxchaos on
    PATH), from the checkout's root; an installed harness says mxchaos. Paths inside the working
    folder are printed relative to it."""
    from harness.record import results

    checkout = Path(results.__file__).resolve().parents[2]
    monkeypatch.chdir(checkout)
    monkeypatch.setattr(sys, "prefix", str(checkout / ".venv"))
    assert results.command() == str(Path(".venv") / "bin" / "mxchaos")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # another interpreter: an installed harness
    assert results.command() == "mxchaos"

    monkeypatch.chdir(tmp_path)
    wrong = NamedResult(0, "integrity", "integrity", False, "1 tensor differs", details={})
    run = _run(tmp_path / "runs" / "inv" / "frozen_source", wrong)
    assert next_steps(run) == ["rerun:  mxchaos run scenarios/frozen_source.yaml --seed 12",
                               f"replay: mxchaos replay {Path('runs/inv/frozen_source')} -o again.yaml",
                               f"page:   {Path('runs/inv/frozen_source/report.html')}"]
