"""The end of a suite run's terminal output: check tables only for what did not pass, then the
recap (a line per run that did not pass, what fails the run first) and the tally last."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from harness.reports.console import recap_lines, verdict_table


def _check(name: str, valid: bool | None, summary: str) -> Any:
    return SimpleNamespace(name=name, valid=valid, summary=summary, not_judged=None, kind=name, details={})


def _run(name: str, verdict: str, checks: list[Any], run_dir: Path, *, reason: str = "", status: str = "completed") -> Any:
    return SimpleNamespace(
        scenario=SimpleNamespace(name=name, path=None, processes={}), verdict=verdict, seconds=1.0, seed=7,
        run_dir=run_dir / name, status=status, reason=reason, known_defect="a defect" if verdict in ("xfail", "xpass") else None,
        checks=checks, not_exercised=[], history=(),
    )


@pytest.fixture
def suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    return [
        _run("steady", "pass", [_check("loaded", True, "every reader loaded")], runs),
        _run("known", "xfail", [_check("exit_codes", False, "source-1 rc -6")], runs),
        _run("frozen", "fail", [_check("loaded", True, "ok"), _check("stall_detected", False, "no stall seen in 10 s")], runs),
        _run("rooted", "skip", [], runs, reason="this machine lacks root", status="skipped"),
    ]


def test_the_recap_puts_what_fails_the_run_first_with_its_first_failing_check_and_page(suite: list[Any]) -> None:
    lines = recap_lines(cast(Any, suite))
    assert [(verdict, line) for verdict, line, _ in lines] == [
        ("fail", f"frozen  stall_detected: no stall seen in 10 s  {Path('runs/frozen/report.html')}"),
        ("xfail", f"known  exit_codes: source-1 rc -6 (SIGABRT)  {Path('runs/known/report.html')}"),
        ("skip", "rooted  this machine lacks root"),
    ]
    reruns = [rerun for _, _, rerun in lines]
    assert reruns[0].startswith("rerun:  ") and reruns[0].endswith(" run frozen --seed 7") and reruns[1:] == ["", ""]


def test_a_suite_prints_check_tables_only_for_runs_that_did_not_pass_then_recap_then_tally(suite: list[Any]) -> None:
    out = io.StringIO()
    verdict_table(cast(Any, suite), out)
    text = out.getvalue()
    lines = text.splitlines()
    assert "every reader loaded" not in text  # the passing run's table is on its page only
    assert "  FAIL    stall_detected  no stall seen in 10 s" in lines
    assert any(line.startswith("steady ") and "PASS" in line for line in lines)  # its row stays
    recap = lines.index(f"{'short summary':-^72}")
    assert lines[recap + 1].split()[:3] == ["FAIL", "frozen", "stall_detected:"]
    assert lines[recap + 2].split()[0] == "rerun:"  # under what fails the run, the command that reruns it
    assert lines[recap + 4].split()[:2] == ["SKIP", "rooted"]
    assert lines[-1] == "4 scenarios: 1 PASS, 1 XFAIL, 1 FAIL, 1 SKIP in 4.0s"

    verbose = io.StringIO()
    verdict_table(cast(Any, suite), verbose, verbose=True)
    assert "every reader loaded" in verbose.getvalue()


def test_one_run_keeps_its_table_and_gets_no_recap(suite: list[Any]) -> None:
    out = io.StringIO()
    verdict_table(cast(Any, suite[:1]), out)
    assert "every reader loaded" in out.getvalue() and "short summary" not in out.getvalue()


def test_a_suite_that_all_passed_has_no_recap(suite: list[Any]) -> None:
    out = io.StringIO()
    verdict_table(cast(Any, [suite[0], suite[0]]), out)
    assert "short summary" not in out.getvalue() and out.getvalue().splitlines()[-1].startswith("2 scenarios: 2 PASS")
