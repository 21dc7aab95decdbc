"""The machine-load caveat goes with a failed timing check only, as a note beside the failure
box, never as one more failure in it (``harness.judge.timing.load_caveat``)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

from fixtures.htmltree import by_class, parse_html, text_of

from harness.checks import NamedResult
from harness.judge.timing import load_caveat
from harness.judge.verdict import RunResult, verdict_of
from harness.record.timeline import History
from harness.reports.invocation import SuiteProgress
from harness.reports.night import run_detail
from harness.reports.report import render_html
from harness.scenario import parse_scenario

BUSY = {"load1": 7.5, "load5": 6.0, "load15": 3.0, "cpus": 2, "per_cpu": 3.75, "cpu_pressure": 88.0}
CALM = {"load1": 0.4, "load5": 0.3, "load15": 0.2, "cpus": 2, "per_cpu": 0.2, "cpu_pressure": None}
SCENARIO = """
name: demo
processes:
  server: {role: server}
steps:
  - start: [server]
"""


def _result(tmp_path: Path, check: NamedResult, load: Mapping[str, object]) -> RunResult:
    history = History.build([(0.0, "invoke", "harness", "run", {"load": CALM}), (0.1, "ok", "server", "start", {"pid": 1}),
                             (2.0, "info", "harness", "teardown", {"load": load})])
    return RunResult(scenario=parse_scenario(SCENARIO, "demo.yaml"), run_id="r", run_dir=tmp_path / "demo", status="completed",
                     reason="", verdict=verdict_of("completed", [check]), history=history, checks=[check],
                     started_at="2026-01-01T00:00:00+00:00", seconds=2.0, seed=1)


LATE = NamedResult(0, "elapsed", "recovered within 2s", False, "3.2s, later than 2s", {})
WRONG = NamedResult(0, "integrity", "integrity", False, "1 tensor differs", {})


def test_a_failed_timing_check_on_a_loaded_machine_gets_the_caveat_as_a_note(tmp_path: Path) -> None:
    result = _result(tmp_path, LATE, BUSY)
    assert load_caveat(result).startswith("at start load 0.4") and "load 7.5" in load_caveat(result)
    tree = parse_html(render_html(result, {}))
    (why,) = by_class(tree, "div", "why")
    assert "load" not in text_of(why)  # not styled as one more failure
    (note,) = by_class(tree, "p", "caveat")
    assert "recovered within 2s" in text_of(note) and "load 7.5 on 2 CPUs" in text_of(note)
    assert run_detail(result).load == load_caveat(result)
    out = io.StringIO()
    SuiteProgress(1, {}, out).ended(result, "demo")
    assert "a timing check, on a loaded machine: at start load 0.4" in out.getvalue()


def test_a_failed_check_that_is_no_time_bound_gets_no_caveat_however_loaded(tmp_path: Path) -> None:
    result = _result(tmp_path, WRONG, BUSY)
    assert load_caveat(result) == "" and run_detail(result).load == ""
    assert not by_class(parse_html(render_html(result, {})), "p", "caveat")
    out = io.StringIO()
    SuiteProgress(1, {}, out).ended(result, "demo")
    assert "load" not in out.getvalue().splitlines()[0]


def test_a_quiet_machine_gets_no_caveat(tmp_path: Path) -> None:
    assert load_caveat(_result(tmp_path, LATE, CALM)) == ""
