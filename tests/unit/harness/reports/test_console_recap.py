"""The end of a suite run's terminal output: check tables only for what did not pass, then the
recap (a line per run that did not pass, what fails the run first) and the tally last."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from harness.reports.console import rate_table, recap_lines, verdict_table


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
    assert [(e.word, e.line()) for e in lines] == [
        ("FAIL", f"frozen  stall_detected: no stall seen in 10 s  {Path('runs/frozen/report.html')}"),
        ("XFAIL", f"known  exit_codes: source-1 rc -6 (SIGABRT)  {Path('runs/known/report.html')}"),
        ("SKIP", "rooted  this machine lacks root"),
    ]
    reruns = [e.rerun for e in lines]
    assert reruns[0].endswith(" run frozen --seed 7") and reruns[1:] == ["", ""]


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


def _repeats(tmp_path: Path) -> tuple[list[Any], list[Any]]:
    """Runs of a --repeat 2 suite and their cells: steady PASS, coin FLAKY, known XFAIL, lucky XPASS."""
    from harness.record.rates import RunRecord, cell_of

    runs = tmp_path / "runs"
    loaded = [_check("loaded", True, "every reader loaded")]
    stalled = [_check("loaded", True, "ok"), _check("stall_detected", False, "no stall seen in 10 s")]
    aborted = [_check("exit_codes", False, "source-1 rc -6")]
    by: dict[str, list[Any]] = {
        "steady": [_run("steady", "pass", loaded, runs / "0"), _run("steady", "pass", loaded, runs / "1")],
        "coin": [_run("coin", "pass", loaded, runs / "0"), _run("coin", "fail", stalled, runs / "1")],
        "known": [_run("known", "xfail", aborted, runs / "0"), _run("known", "xfail", aborted, runs / "1")],
        "lucky": [_run("lucky", "xpass", loaded, runs / "0"), _run("lucky", "xpass", loaded, runs / "1")],
    }
    by["coin"][1].seed = 8
    cells = [cell_of(name, [RunRecord.of(r) for r in rs], known_defect=name in ("known", "lucky")) for name, rs in by.items()]
    return [r for rs in by.values() for r in rs], cells


def test_a_repeat_suite_recaps_each_cell_that_did_not_pass_from_its_first_failing_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    results, cells = _repeats(tmp_path)
    entries = recap_lines(cast(Any, results), cells)
    assert [(e.word, e.scenario, e.count) for e in entries] == [
        ("FLAKY", "coin", "passed 1/2"), ("XPASS", "lucky", "showed 0/2"), ("XFAIL", "known", "showed 2/2")]
    flaky, lucky, known = entries
    assert flaky.why == "stall_detected: no stall seen in 10 s"  # its failing run's, not its passing run's
    assert flaky.page == str(Path("runs/1/coin/report.html"))  # that run's page, relative
    assert flaky.rerun.endswith(" run coin --seed 8")  # that run's seed
    assert known.why == "exit_codes: source-1 rc -6 (SIGABRT)" and known.page == str(Path("runs/0/known/report.html"))
    assert known.rerun == "" and lucky.rerun == ""  # a known defect fails nothing: nothing to rerun
    assert "cannot be called fixed" in lucky.why  # its cell's note: no check failed

    out = io.StringIO()
    rate_table(cells, 2, out, results=cast(Any, results))
    lines = out.getvalue().splitlines()
    recap = lines.index(f"{'short summary':-^72}")
    assert lines[recap + 1] == f"FLAKY  coin  passed 1/2  stall_detected: no stall seen in 10 s  {Path('runs/1/coin/report.html')}"
    assert lines[recap + 2].startswith("       rerun:  ") and lines[recap + 2].endswith(" run coin --seed 8")
    assert lines[recap + 3].split()[:2] == ["XPASS", "lucky"] and lines[recap + 4].split()[:2] == ["XFAIL", "known"]
    assert lines[-1] == "4 scenarios x 2: 1 PASS, 1 FLAKY, 1 XFAIL, 1 XPASS; 1 fail the run"  # the tally last
    assert not any(line.split()[:1] == ["PASS"] for line in lines[recap:])  # a PASS cell has no recap line


def test_a_cell_whose_runs_were_not_seen_here_is_recapped_from_what_it_holds(tmp_path: Path) -> None:
    from harness.record.rates import RunRecord, cell_of

    cell = cell_of("far", [RunRecord("fail", str(tmp_path / "lane" / "far"), 3, 1.0)])
    (entry,) = recap_lines([], [cell])
    assert (entry.word, entry.why, entry.rerun) == ("FAIL", "passed 0/1", "")
    assert entry.page == str(tmp_path / "lane" / "far" / "report.html")


def test_the_step_summary_is_the_recap_as_a_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.reports.ci import step_summary

    monkeypatch.chdir(tmp_path)
    results, cells = _repeats(tmp_path)
    md = step_summary(cast(Any, results), tmp_path / "runs" / "index.html", cells, title="t")
    lines = md.splitlines()
    assert lines[0] == "### t: failed, 4 scenario(s), 8 run(s)"  # the FLAKY cell fails it
    assert lines[2] == "**1** PASS · **1** FLAKY · **1** XFAIL · **1** XPASS"
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| verdict")]
    assert [row.split(" | ")[:2] for row in rows] == [["| FLAKY", "coin (passed 1/2)"], ["| XPASS", "lucky (showed 0/2)"],
                                                       ["| XFAIL", "known (showed 2/2)"]]
    assert " run coin --seed 8`" in rows[0] and rows[2].endswith("| `" + str(Path("runs/0/known/report.html")) + "` |  |")
    passed = step_summary(cast(Any, results), tmp_path / "index.html", [c for c in cells if c.scenario != "coin"], title="t")
    assert passed.startswith("### t: passed, 3 scenario(s), 6 run(s)")  # XFAIL and XPASS cells do not fail it
