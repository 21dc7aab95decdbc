"""Reports and verdicts from a hand-built result: verdict merge rules, JUnit XML that CI
parsers accept, a well-formed HTML report with the timeline picture, the run folder and
its ``latest`` link; plus the CLI's pure parts (-k expressions, exit codes of validate/schema)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, get_args

import pytest

from harness import cli
from harness.checks import NamedResult
from harness.judge.verdict import RUN_STATUSES, RunResult, RunStatus, verdict_of
from harness.machine.procscan import proc_start_time
from harness.record.timeline import History, Timeline
from harness.reports.htmlreport import nice_ticks
from harness.reports.report import RunFolderError, junit_xml, load_run, render_html, timeline_svg, write_run_folder, write_scenario_files
from harness.scenario import parse_scenario, select

SCENARIO = """\
name: demo
description: a reader loads while its source is frozen
processes:
  server: {role: server}
  source-1: {role: source}
  reader-1: {role: reader}
steps:
  - start: server
  - start: source-1
  - start: reader-1
checks:
  - loaded: {reader: reader-1}
"""

Row = tuple[float, str, str, str, dict[str, Any]]

ROWS: list[Row] = [
    (0.0, "invoke", "harness", "step", {"step": "1", "text": "start server"}),
    (0.1, "ok", "server", "start", {"incarnation": 1, "pid": 1}),
    (0.1, "ok", "harness", "step", {"step": "1", "text": "start server"}),
    (0.2, "ok", "source-1", "start", {"incarnation": 1, "pid": 2}),
    (0.3, "info", "source-1", "status_change", {"status": "READY"}),
    (0.5, "ok", "reader-1", "start", {"incarnation": 1, "pid": 3}),
    (0.6, "invoke", "nemesis", "inject", {"fault": "freeze", "kind": "pause", "target": "source-1"}),
    (0.6, "ok", "nemesis", "inject", {"fault": "freeze", "healable": True}),
    (0.7, "info", "reader-1", "transfer_start", {"index": 0}),
    (1.7, "info", "reader-1", "transfer_timeout", {"index": 0, "seconds": 1.0}),
    (1.8, "info", "reader-1", "fallback", {"reason": "transfer_timeout"}),
    (2.0, "info", "reader-1", "load_done", {"path": "disk", "integrity": True}),
    (2.1, "info", "reader-1", "process_exit", {"incarnation": 1, "rc": 0}),
    (2.5, "ok", "nemesis", "heal", {"fault": "freeze"}),
    (2.6, "info", "harness", "mark", {"mark": "<end & co>"}),
]


DEFECT = "NIXL 1.5.1: a resumed source aborts <SIGABRT>"


def make_result(tmp_path: Path, checks: list[NamedResult], status: str = "completed", known_defect: str | None = None) -> RunResult:
    text = SCENARIO if known_defect is None else SCENARIO.replace("description:", f"known_defect: {json.dumps(known_defect)}\ndescription:")
    sc = parse_scenario(text, "demo.yaml")
    return RunResult(
        scenario=sc,
        run_id="demo-1",
        run_dir=tmp_path / "runs" / "demo" / "stamp-1",
        status=status,
        reason="" if status == "completed" else "step 3: reader-1 did not exit in time",
        verdict=verdict_of(status, checks, known_defect),
        history=History.build(ROWS),
        checks=checks,
        started_at="2026-01-01T00:00:00+00:00",
        seconds=2.6,
        seed=7,
        failed_step=None if status == "completed" else "3",
    )


def named(index: int, valid: object, name: str = "c") -> NamedResult:
    return NamedResult(index, "loaded", f"{name}{index}", valid, f"summary {index}", {"x": 1}, ((2.0, "mark"),))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "valids", "verdict"),
    [
        ("completed", [True, True], "pass"),
        ("completed", [], "pass"),
        ("completed", [True, "unknown"], "unknown"),
        ("completed", [True, "unknown", False], "fail"),
        ("step_failed", [True], "fail"),
        ("hang", [True], "hang"),
        ("error", [True], "error"),
        ("interrupted", [True], "error"),
        ("crashed", [True], "error"),
    ],
)
def test_verdicts(status: str, valids: list[object], verdict: str) -> None:
    assert verdict_of(status, [named(i, v) for i, v in enumerate(valids)]) == verdict


@pytest.mark.parametrize(
    ("status", "valids", "verdict"),
    [
        ("completed", [True, False], "xfail"),  # the defect reproduced
        ("step_failed", [True], "fail"),  # steps that did not complete never got to the defect
        ("step_failed", [False], "fail"),
        ("completed", [True, True], "xpass"),  # it did not: fixed?
        ("completed", [], "xpass"),
        ("completed", [True, "unknown"], "unknown"),  # nothing to judge is not expected
        ("hang", [False], "hang"),  # a hang or a harness error still fails
        ("error", [False], "error"),
        ("interrupted", [True], "error"),
        ("skipped", [], "skip"),
    ],
)
def test_verdicts_of_a_known_defect(status: str, valids: list[object], verdict: str) -> None:
    assert verdict_of(status, [named(i, v) for i, v in enumerate(valids)], "NIXL x.y aborts") == verdict
    if verdict in ("xfail", "xpass"):
        assert verdict_of(status, [named(i, v) for i, v in enumerate(valids)]) == verdict[1:]


def test_which_verdicts_fail_a_run() -> None:
    from harness.judge.verdict import OK_VERDICTS, VERDICTS

    assert set(OK_VERDICTS) == {"pass", "xfail", "xpass", "skip"} and set(OK_VERDICTS) < set(VERDICTS)


def test_junit_has_a_case_per_check_plus_the_run(tmp_path: Path) -> None:
    result = make_result(tmp_path, [named(0, True), named(1, False), named(2, "unknown")], status="step_failed")
    root = junit_xml([result])
    text = ET.tostring(root, encoding="unicode")
    suite = ET.fromstring(text).find("testsuite")
    assert suite is not None
    assert (suite.get("name"), suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("mxchaos.demo", "4", "2", "1")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["run", "c0", "c1", "c2"]
    assert cases[0].find("failure").get("message") == "step 3: step 3: reader-1 did not exit in time"  # type: ignore[union-attr]
    assert cases[2].find("failure").get("message") == "summary 1"  # type: ignore[union-attr]
    assert cases[3].find("error").get("message") == "unknown: summary 2"  # type: ignore[union-attr]
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["seed"] == "7" and props["verdict"] == "fail"


def test_html_is_well_formed_and_escapes_everything(tmp_path: Path) -> None:
    result = make_result(tmp_path, [named(0, True), named(1, False)])
    page = render_html(result, {"nixl": "1.5.1", "host": {"hostname": "h"}})
    assert "<end &amp; co>" not in page and "&lt;end &amp; co&gt;" in page
    svg = timeline_svg(result.history, ["server", "source-1", "reader-1"], result.checks)
    root = ET.fromstring(svg)  # the picture is valid XML
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    for lane in ("harness", "nemesis", "server", "source-1", "reader-1", "checks"):
        assert lane in texts
    assert "freeze" in texts  # the fault window is labelled
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("transfer 0: transfer_timeout") for t in titles)
    assert any("fallback" in t for t in titles)


def test_run_folder_has_every_file_and_a_latest_link(tmp_path: Path) -> None:
    result = make_result(tmp_path, [named(0, True)])
    folder = write_run_folder(result)
    for name in ("scenario.yaml", "scenario.json", "versions.json", "timeline.jsonl", "metrics.jsonl", "verdict.json", "junit.xml", "report.html"):
        assert (folder / name).is_file(), name
    verdict = json.loads((folder / "verdict.json").read_text())
    assert (verdict["verdict"], verdict["seed"], verdict["run_id"]) == ("pass", 7, "demo-1")
    assert verdict["versions"]["python"]
    assert (folder.parent / "latest").resolve() == folder.resolve()
    assert len(History.from_jsonl(folder / "timeline.jsonl")) == len(ROWS)


def test_keyword_expressions() -> None:
    match = select.keyword_matcher("smoke and not (slow or kill)")
    assert match("smoke_basic")
    assert not match("smoke_kill")
    assert not match("other")
    assert select.keyword_matcher("KILL")("source_kill_midway")
    for bad in ("", "and x", "(a", "a b"):
        with pytest.raises(ValueError):
            select.keyword_matcher(bad)


def test_validate_and_schema_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(SCENARIO)
    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.replace("processes:", "procs:"))
    assert cli.main(["validate", str(good)]) == 0
    assert cli.main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: procs: unknown key 'procs'" in err
    assert cli.main(["run", str(bad)]) == 2  # refused before anything starts
    assert "nothing was run" in capsys.readouterr().err
    assert cli.main(["validate", str(tmp_path / "nope")]) == 2
    out = tmp_path / "schema.json"
    assert cli.main(["schema", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["title"] == "mxchaos scenario"
    assert cli.main(["bogus"]) == 2


def _suite(result: RunResult) -> ET.Element:
    suite = ET.fromstring(ET.tostring(junit_xml([result]), encoding="unicode")).find("testsuite")
    assert suite is not None
    return suite


def test_junit_reports_an_xfail_as_skipped_with_the_defect(tmp_path: Path) -> None:
    result = make_result(tmp_path, [named(0, True), named(1, False)], known_defect=DEFECT)
    assert result.verdict == "xfail"
    suite = _suite(result)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("3", "0", "0", "2")
    run, passed, failed = suite.findall("testcase")
    assert run.find("skipped").get("message") == f"XFAIL: known defect: {DEFECT}"  # type: ignore[union-attr]
    assert "c1: summary 1" in (run.find("skipped").text or "")  # type: ignore[union-attr]
    assert list(passed) == []
    assert failed.find("skipped").get("message") == "XFAIL: summary 1"  # type: ignore[union-attr]
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert (props["verdict"], props["known_defect"]) == ("xfail", DEFECT)


def test_junit_reports_an_xpass_as_passed_with_a_note(tmp_path: Path) -> None:
    result = make_result(tmp_path, [named(0, True)], known_defect=DEFECT)
    assert result.verdict == "xpass" and result.ok
    suite = _suite(result)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("2", "0", "0", "0")
    run = suite.findall("testcase")[0]
    assert [child.tag for child in run] == ["system-out"]
    assert (run.find("system-out").text or "").startswith("XPASS: every check passed")  # type: ignore[union-attr]


def test_junit_still_fails_a_known_defect_that_hung(tmp_path: Path) -> None:
    result = make_result(tmp_path, [named(0, False)], status="hang", known_defect=DEFECT)
    assert result.verdict == "hang" and not result.ok
    suite = _suite(result)
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("1", "1", "0")


def test_html_and_verdict_json_show_the_known_defect(tmp_path: Path) -> None:
    for valids, verdict, words in (([False], "xfail", "reproduced"), ([True], "xpass", "did not reproduce")):
        result = make_result(tmp_path / verdict, [named(0, v) for v in valids], known_defect=DEFECT)
        folder = write_run_folder(result)
        page = (folder / "report.html").read_text()
        assert f">{verdict.upper()}</span>" in page
        assert "NIXL 1.5.1: a resumed source aborts &lt;SIGABRT&gt;" in page and words in page
        saved = json.loads((folder / "verdict.json").read_text())
        assert (saved["verdict"], saved["known_defect"]) == (verdict, DEFECT)


def test_the_verdict_table_names_xfail_xpass_and_skip(tmp_path: Path) -> None:
    import io

    from harness.record.vocabulary import meaning
    from harness.reports.console import verdict_table

    xfail = make_result(tmp_path, [named(0, False)], known_defect=DEFECT)
    xpass = make_result(tmp_path, [named(0, True)], known_defect=DEFECT)
    skipped = make_result(tmp_path, [], status="skipped")
    skipped.reason = "this machine lacks root (for cut (tcp_reset))"
    out = io.StringIO()
    verdict_table([xfail, xpass, skipped], out)
    text = out.getvalue()
    assert f"demo      XFAIL    0/1/0  {meaning('xfail')}" in text
    assert f"demo      XPASS    1/0/0  {meaning('xpass')}" in text
    assert "demo      SKIP     0/0/0  this machine lacks root (for cut (tcp_reset))" in text
    assert f"XPASS demo: every check passed, the known defect did not reproduce in this run.\n  defect: {DEFECT}" in text


def test_junit_reports_a_skip(tmp_path: Path) -> None:
    result = make_result(tmp_path, [], status="skipped")
    result.reason = "this machine lacks root (for cut (tcp_reset))"
    assert result.verdict == "skip" and result.ok
    suite = _suite(result)
    assert (suite.get("tests"), suite.get("skipped")) == ("1", "1")
    assert suite.find("testcase/skipped").get("message") == "skip: this machine lacks root (for cut (tcp_reset))"  # type: ignore[union-attr]


def test_a_run_folder_is_judged_again_with_the_current_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness import checks
    from harness.judge.verdict import judge
    from harness.reports.report import load_run

    result = make_result(tmp_path, [])
    result.checks = judge(result.scenario, result.history)
    result.verdict = verdict_of(result.status, result.checks)
    folder = write_run_folder(result)
    # ROWS has no ``outcome`` entry (a run recorded before it existed): verdict.json tells the status
    again = load_run(folder)
    assert (again.verdict, again.status, again.run_id, again.seed) == (result.verdict, "completed", "demo-1", result.scenario.seed)
    assert [c.to_json() | {"seconds": 0} for c in again.checks] == [c.to_json() | {"seconds": 0} for c in result.checks]
    assert again.scenario.text == result.scenario.text  # scenario.yaml is kept for a rewrite

    def lenient(p, h, run):  # type: ignore[no-untyped-def]
        return checks.CheckResult(True, "fixed check")

    monkeypatch.setitem(checks.REGISTRY, "loaded", checks.CheckDef("loaded", checks.REGISTRY["loaded"].params, lenient, ""))
    again = load_run(folder.parent)  # runs/<scenario>: its latest run
    assert again.run_dir == folder.resolve()
    assert again.verdict == "pass" and again.checks[0].summary == "fixed check"


# ------------------------------------------------------------------------ the page, as a person reads it

SVG = "{http://www.w3.org/2000/svg}"


def _svg(text: str) -> ET.Element:
    return ET.fromstring(text)


def _of_class(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [el for el in root.iter(SVG + tag) if el.get("class") == cls]


def _fault_rows(*windows: tuple[str, float, float]) -> list[Row]:
    rows: list[Row] = []
    for name, start, end in windows:
        rows.append((start, "invoke", "nemesis", "inject", {"fault": name, "kind": "pause", "target": "source-1"}))
        rows.append((start, "ok", "nemesis", "inject", {"fault": name, "healable": True}))
        rows.append((end, "ok", "nemesis", "heal", {"fault": name}))
    return sorted(rows, key=lambda r: r[0])


def test_overlapping_faults_get_a_row_and_a_readable_label_each() -> None:
    h = History.build([*ROWS[:5], *_fault_rows(("freeze-1", 0.6, 2.5), ("freeze-2", 0.6, 2.5), ("freeze-3", 0.61, 2.4))])
    root = _svg(timeline_svg(h, ["server", "source-1", "reader-1"]))
    bars = _of_class(root, "rect", "fault")
    labels = {el.text: float(el.get("y", "0")) for el in _of_class(root, "text", "fault-label")}
    assert len(bars) == 3 and len({b.get("y") for b in bars}) == 3  # three rows, not one bar
    assert set(labels) == {"freeze-1", "freeze-2", "freeze-3"} and len(set(labels.values())) == 3
    # one shading for the time any fault is active, not three layers
    assert len(_of_class(root, "rect", "fault-shade")) == 1
    # faults one after the other share a row
    h = History.build([*ROWS[:5], *_fault_rows(("a", 0.1, 0.5), ("b", 1.5, 2.0))])
    bars = _of_class(_svg(timeline_svg(h, ["server", "source-1", "reader-1"])), "rect", "fault")
    assert len(bars) == 2 and bars[0].get("y") == bars[1].get("y")


def test_coincident_marks_are_kept_apart_and_a_failure_is_not_hidden(tmp_path: Path) -> None:
    checks = [named(0, True), named(1, False), named(2, "unknown")]  # all marked at t=2.0
    root = _svg(timeline_svg(History.build(ROWS), ["server", "source-1", "reader-1"], checks))
    marks = _of_class(root, "g", "check-mark")
    where = {m.get("data-valid"): (m.find(SVG + "text").get("x"), float(m.find(SVG + "text").get("y", "0"))) for m in marks}  # type: ignore[union-attr]
    assert set(where) == {"PASS", "FAIL", "UNKNOWN"}
    # a shape per verdict as well as a colour: a circle passed, a square failed, a diamond neither
    assert {m.get("data-valid"): m[0].tag.removeprefix(SVG) for m in marks} == {"PASS": "circle", "FAIL": "rect", "UNKNOWN": "path"}
    assert len({cy for _, cy in where.values()}) == 3  # stacked, not drawn over each other
    assert where["FAIL"][1] < where["UNKNOWN"][1] < where["PASS"][1]  # the failure keeps the first row
    assert len({cx for cx, _ in where.values()}) == 1  # at the same time
    # load_done at 2.0 and a fallback at the same instant on the reader's lane
    h = History.build([*ROWS, (2.0, "info", "reader-1", "fallback", {"reason": "x"})])
    dots = [(float(c.get("cx", "0")), float(c.get("cy", "0"))) for c in _of_class(_svg(timeline_svg(h, ["reader-1"])), "circle", "event")]
    assert len(dots) == 4 and dots[2][0] == dots[3][0]  # transfer timeout, fallback, then load_done + fallback at 2.0
    assert len(set(dots)) == len(dots)  # no two dots share a spot


def test_the_time_axis_has_round_ticks_in_seconds() -> None:
    for end, step in ((2.6, 0.5), (16.88, 2), (15.3, 2), (61, 10), (0.3, 0.05), (120, 20)):
        got, ticks = nice_ticks(end)
        assert got == pytest.approx(step)
        assert ticks[0] == 0 and ticks[-1] >= end and ticks[-2] < end
    root = _svg(timeline_svg(History.build(ROWS), ["server", "source-1", "reader-1"]))  # ends at 2.6s
    values = [float(t.text or "") for t in _of_class(root, "text", "tick")]
    assert sorted(set(values)) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert [t.text for t in _of_class(root, "text", "unit")] == ["s", "s"]  # top and bottom axis


def test_failed_checks_come_first_and_their_reason_is_at_the_top(tmp_path: Path) -> None:
    result = make_result(tmp_path, [named(0, True), named(1, "unknown"), named(2, False)])
    page = render_html(result, {})
    assert re.findall(r"<tr class='(\w+)'><td>(\d+)</td>", page) == [("fail", "3"), ("unknown", "2"), ("pass", "1")]
    why = page.index("class='why'")
    assert why < page.index("<h2>Checks") and why < page.index("<svg")
    assert "#3 c2: summary 2" in page[why : page.index("<h2>Checks")]
    assert "class='why'" not in render_html(make_result(tmp_path, [named(0, True)]), {})


def test_the_legend_names_every_mark_and_colour(tmp_path: Path) -> None:
    from harness.reports.htmlreport.style import _EVENT_STYLE
    from harness.reports.htmlreport.timeline import legend_html

    every = legend_html()  # the whole table: every symbol the timeline can draw
    for text in (
        "process alive",
        "process exit",
        "status change",
        "transfer, completed",
        "transfer, timed out or failed",
        "fault window (nemesis lane",
        "fault window on the process it hit",
        "some fault active",
        "step started",
        "mark, hang or await timeout",
        "check #n, PASS",
        "check #n, FAIL",
        "check #n, UNKNOWN",
        *(label for _, label in _EVENT_STYLE.values()),
    ):
        assert text in every, text
    page = render_html(make_result(tmp_path, [named(0, True)]), {})
    legend = page[page.index("<ul class='legend'>") :]
    legend = legend[: legend.index("</ul>")]
    # the page's: what its timeline draws (a frozen source, a timed-out transfer, a fallback), no more
    for text in ("process alive", "process exit", "status change", "transfer, timed out or failed", "fault window (nemesis lane",
                 "fault window on the process it hit", "some fault active", "step started", "mark, hang or await timeout",
                 "check #n, PASS", _EVENT_STYLE["fallback"][1]):
        assert text in legend, text
    for text in ("check #n, FAIL", "transfer, completed", "the harness was interrupted"):
        assert text not in legend, text
    assert page.index("<svg xmlns='http://www.w3.org/2000/svg' class='timeline'") < page.index("<ul class='legend'>")


def _scrape(t: float, process: str, attempts: float, name: str = "mx_p2p_source_attempts_total") -> Row:
    samples = [
        [name, {"policy": "p", "result": "transfer_retry"}, attempts],
        [name, {"policy": "p", "result": "transfer_fallback"}, 1.0],
        ["mx_p2p_source_attempts_created", {"policy": "p", "result": "transfer_retry"}, 1.7e9],
        ["mxref_data_plane_healthy", {}, 1.0],
    ]
    return (t, "info", process, "scrape", {"ok": True, "port": 1, "samples": samples})


def test_a_metric_chart_has_one_series_per_process_on_the_timeline_axis(tmp_path: Path) -> None:
    from harness.reports.htmlreport import METRIC_CHARTS, MetricChart, metric_charts

    rows = [*ROWS, _scrape(0.8, "reader-1", 0), _scrape(1.8, "reader-1", 2), _scrape(0.9, "source-1", 5, "mx_p2p_source_attempts")]
    rows.append((1.0, "info", "source-1", "scrape", {"ok": False, "error": "refused"}))
    h = History.build(sorted(rows, key=lambda r: r[0]))
    html_ = metric_charts(h, ["server", "source-1", "reader-1"])
    charts = re.findall(r"<figure class='metric' data-metric='([^']+)'>.*?(<svg [^>]*class='chart'.*?</svg>)</div></figure>", html_)
    assert [name for name, _ in charts] == [METRIC_CHARTS[0].names[0], METRIC_CHARTS[1].names[0]]  # only what was scraped
    root = _svg(charts[0][1])
    series = {p.get("data-process"): p.get("d", "") for p in _of_class(root, "path", "series")}
    assert set(series) == {"source-1", "reader-1"}  # with and without _total; server never had it
    assert series["reader-1"].count("V") == 1  # a step: 1 -> 3 (retries + fallback), _created not summed
    axis = _svg(timeline_svg(h, ["server", "source-1", "reader-1"]))
    assert [t.text for t in _of_class(root, "text", "tick")] == [t.text for t in _of_class(axis, "text", "tick")][: len(_of_class(root, "text", "tick"))]
    # the table is the one place names are chosen
    renamed = metric_charts(h, ["reader-1"], [MetricChart("healthy", ("mxref_data_plane_healthy_total",), "flag")])
    assert renamed.count("<figure") == 1
    page = render_html(make_result(tmp_path, []), {})
    assert "<h2>Metrics" not in page and "class='metric'" not in page  # nothing scraped: no charts


def test_a_skipped_run_and_a_hung_run_still_render(tmp_path: Path) -> None:
    skipped = make_result(tmp_path, [], status="skipped")
    skipped.history = History.build([])
    skipped.reason = "this machine lacks root"
    page = render_html(skipped, {})
    assert ">SKIP</span>" in page and "this machine lacks root" in page and "No check was judged" in page
    _svg(timeline_svg(skipped.history, ["server", "source-1", "reader-1"]))
    hung = make_result(tmp_path, [named(0, "unknown")], status="hang")
    hung.history = History.build([r for r in ROWS if r[3] != "process_exit"] + [(3.0, "info", "harness", "hang", {})])
    page = render_html(hung, {})
    assert ">HANG</span>" in page and "did not exit in time" in page
    root = _svg(timeline_svg(hung.history, ["server", "source-1", "reader-1"], hung.checks))
    assert "hang" in [t.text for t in root.iter(SVG + "text")]


# ------------------------------------------------------------------------ a run folder that outlives its harness


def _live_folder(tmp_path: Path, rows: list[Row], *, close: bool = True) -> tuple[Path, Timeline]:
    """What the runner leaves at start: scenario files, run.json, and the timeline file
    written entry by entry."""
    sc = parse_scenario(SCENARIO, "demo.yaml")
    folder = tmp_path / "runs" / "demo" / "stamp-1"
    write_scenario_files(folder, sc)
    (folder / "run.json").write_text(json.dumps({"run_id": "demo-1", "started": "2026-01-01T00:00:00+00:00"}))
    tl = Timeline(clock=lambda: 0.0)
    tl.open_sink(folder / "timeline.jsonl")
    for t, type_, actor, f, value in rows:
        tl.append(type_, actor, f, value, t=t)
    if close:
        tl.close_sink()
    return folder, tl


def test_the_run_folder_keeps_the_timeline_the_run_wrote_as_it_went(tmp_path: Path) -> None:
    folder, tl = _live_folder(tmp_path, [*ROWS, (2.7, "info", "harness", "outcome", {"status": "completed"})])
    before = (folder / "timeline.jsonl").stat()
    result = make_result(tmp_path, [])
    result.history = tl.snapshot()
    write_run_folder(result)
    after = (folder / "timeline.jsonl").stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    # entries it lacks (recorded after its sink closed, a failed write): rewritten whole, atomically
    tl.append("info", "harness", "late", t=2.8)
    result.history = tl.snapshot()
    write_run_folder(result)
    again = History.from_jsonl(folder / "timeline.jsonl")
    assert [e.to_json() for e in again] == [e.to_json() for e in result.history]
    assert (folder / "timeline.jsonl").stat().st_ino != before.st_ino
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []


def test_a_folder_whose_harness_died_is_judged_as_crashed(tmp_path: Path) -> None:
    rows = [r for r in ROWS if r[0] <= 1.8]  # killed mid-run: no exit, no heal, no outcome
    folder, _tl = _live_folder(tmp_path, rows, close=False)
    with open(folder / "timeline.jsonl", "ab") as out:
        out.write(b'{"index":99,"t":1.9,"type":"info","act')  # torn by the kill
    (folder / "CRASHED").write_text("the harness of this run died; swept 3 process(es) at Thu Jan  1 00:00:09 2026\n")
    result = load_run(folder)
    assert (result.status, result.verdict, result.run_id, result.ok) == ("crashed", "error", "demo-1", False)
    assert result.reason.startswith("the harness died before the run ended (its timeline has no outcome entry)")
    assert "its last entry is at 1.800s (reader-1 info fallback), written at 20" in result.reason
    assert "a torn last line of timeline.jsonl was dropped (1)" in result.reason
    assert "mxchaos cleanup: the harness of this run died; swept 3 process(es)" in result.reason
    assert result.history.torn_lines == 1 and len(result.history) == len(rows)
    assert [c.name for c in result.checks] and result.checks[0].valid is False  # judged: loaded? not by then
    assert result.seconds == 1.8 and result.started_at == "2026-01-01T00:00:00+00:00"
    page = render_html(result, {})
    assert ">ERROR</span>" in page and ">CRASHED</span>" in page and "<b>crashed</b>: the harness died" in page
    run_case = junit_xml([result]).find("testsuite/testcase")
    assert run_case is not None and (run_case.find("error").get("message") or "").startswith("crashed: the harness died")  # type: ignore[union-attr]


def test_a_folder_without_an_outcome_whose_harness_lives_is_not_a_crash(tmp_path: Path) -> None:
    folder, _tl = _live_folder(tmp_path, ROWS[:3])
    info = {"run_id": "demo-1", "harness_pid": os.getpid(), "harness_start": proc_start_time(os.getpid())}
    (folder / "run.json").write_text(json.dumps(info))
    with pytest.raises(RunFolderError, match=r"still going \(its harness, pid \d+, is alive\)"):
        load_run(folder)
    info["harness_start"] = -1  # that pid now is another process: the harness is gone
    (folder / "run.json").write_text(json.dumps(info))
    assert load_run(folder).status == "crashed"


def test_check_write_judges_a_crashed_folder_and_writes_its_verdict_files(tmp_path: Path) -> None:
    folder, _tl = _live_folder(tmp_path, [r for r in ROWS if r[0] <= 1.8])
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "check", str(folder), "--write"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[4]), "NO_COLOR": "1"},
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"--- demo: ERROR (CRASHED)  {folder}" in out.stdout
    assert "  crashed: the harness died before the run ended" in out.stdout
    verdict = json.loads((folder / "verdict.json").read_text())
    assert (verdict["status"], verdict["verdict"]) == ("crashed", "error")
    assert verdict["reason"].startswith("the harness died") and verdict["checks"]
    assert ">CRASHED</span>" in (folder / "report.html").read_text()
    assert 'errors="1"' in (folder / "junit.xml").read_text()
    (folder / "CRASHED").write_text("swept later\n")
    again = load_run(folder)  # its own verdict.json does not stand in for an outcome: judged again
    assert (again.status, again.reason) == ("crashed", verdict["reason"] + "; mxchaos cleanup: swept later")


def test_the_statuses_listed_are_the_statuses_typed() -> None:
    assert get_args(RunStatus) == RUN_STATUSES and "crashed" in RUN_STATUSES


# ------------------------------------------------------------------------ not exercised (issue 35)

NO_EFFECT = {"effect": "none", "why": "1 of 3 threads of pid 2 in state T", "figures": {"pid": 2, "threads": 3, "stopped": 1}}


def test_a_fault_without_effect_is_not_exercised_on_the_page_in_junit_and_when_checked_again(tmp_path: Path) -> None:
    from harness.judge.exercised import not_exercised

    rows = [r if r[3] != "heal" else (r[0], r[1], r[2], r[3], {**r[4], "witness": NO_EFFECT}) for r in ROWS]
    result = make_result(tmp_path, [named(0, True), named(1, False)])
    result.history = History.build(rows)
    result.not_exercised = not_exercised(result.history)
    result.verdict = verdict_of(result.status, result.checks, None, result.not_exercised)
    assert result.verdict == "not_exercised" and not result.ok
    why = "fault freeze (pause source-1): no effect: 1 of 3 threads of pid 2 in state T"
    assert result.not_exercised == [why]

    suite = _suite(result)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("3", "0", "1", "1")
    run = suite.findall("testcase")[0].find("error")
    assert run is not None and (run.get("type"), run.get("message")) == ("not_exercised", f"not exercised: {why}")

    folder = write_run_folder(result)
    page = (folder / "report.html").read_text()
    assert ">NOT_EXERCISED</span>" in page and "not exercised: 1 fault did not do what the scenario meant" in page
    assert "<td class='witness'" in page and "no effect: 1 of 3 threads of pid 2 in state T" in page
    saved = json.loads((folder / "verdict.json").read_text())
    assert (saved["verdict"], saved["not_exercised"]) == ("not_exercised", [why])
    again = load_run(folder)  # mxchaos check: judged again from the timeline, witnesses included
    assert (again.verdict, again.not_exercised) == ("not_exercised", [why])
