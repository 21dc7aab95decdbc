"""The run page explains itself, read as a parsed page: a reader's attempts labelled with their
index and source and drawn apart, with their load phases; the processes on a host a fault hit
outlined; the server's view of each source on its lane; gaps where a process could not be
scraped; SKIP neutral and XFAIL amber (shapes as well as colours); an interrupted run's line and
its checks NOT JUDGED; figures that scale with the page."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from fixtures.htmltree import by_class, parse_html, text_of

from harness.checks import NamedResult
from harness.judge.verdict import RunResult, verdict_of
from harness.record.timeline import History
from harness.reports.htmlreport import render_html, timeline_svg
from harness.reports.htmlreport.lanes import attempts, host_hit, scrape_gaps, server_view
from harness.reports.htmlreport.palette import swatch
from harness.scenario import parse_scenario

SCENARIO = """\
name: pages
description: a reader tries a frozen source, then another
hosts: {a: netns, b: netns, r: netns}
processes:
  server: {role: server, host: r}
  source-1: {role: source, host: a}
  source-2: {role: source, host: b}
  helper: {role: command, host: a, argv: [sleep, "1"]}
  reader-1: {role: reader, host: r}
steps:
  - start: server
checks:
  - loaded: {reader: reader-1}
"""

Row = tuple[float, str, str, str, dict[str, Any]]


def _phase(t: float, index: int, phase: str, seconds: float, ok: bool = True, overlapped: bool = False) -> Row:
    return (t, "info", "reader-1", "load_phase", {"index": index, "phase": phase, "seconds": seconds, "ok": ok,
                                                   "overlapped": overlapped})


ROWS: list[Row] = [
    (0.0, "invoke", "harness", "step", {"step": "1", "text": "start server"}),
    (0.1, "ok", "server", "start", {"incarnation": 1, "pid": 1}),
    (0.2, "ok", "source-1", "start", {"incarnation": 1, "pid": 2}),
    (0.2, "ok", "source-2", "start", {"incarnation": 1, "pid": 3}),
    (0.2, "ok", "helper", "start", {"incarnation": 1, "pid": 5}),
    (0.5, "info", "source-1", "published", {"mx_source_id": "m", "worker_id": "w1"}),
    (0.5, "info", "server", "source_published", {"mx_source_id": "m", "worker_id": "w1", "status": "INITIALIZING"}),
    (0.6, "info", "server", "source_status", {"mx_source_id": "m", "worker_id": "w1", "status": "READY"}),
    (0.5, "info", "source-2", "published", {"mx_source_id": "m", "worker_id": "w2"}),
    (0.6, "info", "server", "source_status", {"mx_source_id": "m", "worker_id": "w2", "status": "READY"}),
    (1.0, "ok", "reader-1", "start", {"incarnation": 1, "pid": 4}),
    (2.0, "invoke", "nemesis", "inject", {"fault": "unplug", "kind": "link_down", "target": "source-1"}),
    (2.0, "ok", "nemesis", "inject", {"fault": "unplug", "healable": True, "host": "a", "link": "veth-a"}),
    (2.1, "info", "reader-1", "attempt_start", {"index": 0, "worker_id": "w1"}),
    _phase(2.2, 0, "allocate", 0.1),
    _phase(2.3, 0, "register", 0.1),
    _phase(2.4, 0, "handshake", 0.1),
    (2.4, "info", "reader-1", "transfer_start", {"index": 0}),
    _phase(3.2, 0, "read", 0.8, ok=False),
    (3.2, "info", "reader-1", "transfer_timeout", {"index": 0}),
    (3.25, "info", "reader-1", "attempt_outcome", {"index": 0, "outcome": "transfer_retry", "error": "stalled"}),
    (3.3, "info", "reader-1", "attempt_start", {"index": 1, "worker_id": "w1"}),
    (3.6, "info", "reader-1", "attempt_outcome", {"index": 1, "outcome": "transfer_retry", "error": "stalled"}),
    (3.1, "info", "source-1", "scrape", {"ok": False, "error": "timed out"}),
    (3.7, "info", "reader-1", "attempt_start", {"index": 2, "worker_id": "w2"}),
    _phase(3.9, 2, "read", 0.2),
    _phase(4.0, 2, "verify", 0.1),
    (4.0, "info", "reader-1", "attempt_outcome", {"index": 2, "outcome": "success"}),
    (4.2, "info", "server", "source_status", {"mx_source_id": "m", "worker_id": "w1", "status": "STALE"}),
    (4.5, "info", "source-1", "scrape", {"ok": True, "samples": [["mxref_data_plane_healthy", {}, 1.0]]}),
    (5.0, "ok", "nemesis", "heal", {"fault": "unplug"}),
    (5.5, "info", "reader-1", "process_exit", {"incarnation": 1, "rc": 0}),
]

PROCESSES = ["server", "source-1", "source-2", "helper", "reader-1"]


def result(tmp_path: Path, checks: list[NamedResult], status: str = "completed", defect: str | None = None,
           rows: list[Row] = ROWS) -> RunResult:
    text = SCENARIO if defect is None else SCENARIO.replace("description:", f"known_defect: {defect}\ndescription:")
    sc = parse_scenario(text, "pages.yaml")
    return RunResult(scenario=sc, run_id="p-1", run_dir=tmp_path / "run", status=status,
                     reason="" if status == "completed" else "harness got SIGINT", verdict=verdict_of(status, checks, defect),
                     history=History.build(sorted(rows, key=lambda r: r[0])), checks=checks,
                     started_at="2026-01-01T00:00:00+00:00", seconds=5.5, seed=3)


def check(i: int, valid: bool | str, t: float = 3.0) -> NamedResult:
    return NamedResult(i, "count", f"check {i}", valid, f"summary {i}", {}, ((t, "here"),))  # type: ignore[arg-type]


def history() -> History:
    return History.build(sorted(ROWS, key=lambda r: r[0]))


def test_attempts_are_read_with_their_index_source_outcome_and_phases() -> None:
    tried = attempts(history(), "reader-1")
    assert [(a.index, a.source, a.outcome) for a in tried] == [
        (0, "source-1", "transfer_retry"), (1, "source-1", "transfer_retry"), (2, "source-2", "success")]
    assert [p.name for p in tried[0].phases] == ["allocate", "register", "handshake", "read"]
    read = tried[0].phases[-1]
    assert (round(read.start, 3), read.end, read.ok) == (2.4, 3.2, False)  # the seconds before its event
    assert attempts(history(), "source-1") == []


def test_three_attempts_are_three_labelled_bars_that_do_not_touch() -> None:
    root = parse_html(timeline_svg(history(), PROCESSES))
    groups = by_class(root, "g", "attempt")
    assert [(g.get("data-index"), g.get("data-source"), g.get("data-outcome")) for g in groups] == [
        ("0", "source-1", "transfer_retry"), ("1", "source-1", "transfer_retry"), ("2", "source-2", "success")]
    labels = [text_of(by_class(g, "text", "attempt-label")[0]) for g in groups]
    assert labels == ["#0 source-1 \u2717", "#1 source-1 \u2717", "#2 source-2 \u2713"]
    bars = [g.find("rect") for g in groups]
    spans = [(float(b.get("x", 0)), float(b.get("x", 0)) + float(b.get("width", 0)), b.get("y")) for b in bars if b is not None]
    for (_, a1, ay), (b0, _, by) in itertools.pairwise(spans):
        assert ay != by or a1 < b0, "two attempts drawn as one bar"
    # a failure is hatched (a shape), a success solid
    assert [b.get("fill") for b in bars if b is not None] == ["url(#hatch-fail)", "url(#hatch-fail)", swatch("pass").strong]
    phases = [p.get("data-phase") for p in by_class(groups[0], "rect", "phase")]
    assert phases == ["allocate", "register", "handshake", "read"]


def test_processes_on_a_host_a_fault_hit_are_outlined() -> None:
    h = history()
    hit = host_hit(h.fault_windows(), {"source-1": "a", "helper": "a", "reader-1": "r"})
    assert list(hit) == ["helper"]  # source-1 is the fault's own target: outlined solid, not dashed
    root = parse_html(timeline_svg(h, PROCESSES, host_of={"source-1": "a", "helper": "a", "reader-1": "r",
                                                           "server": "r", "source-2": "b"}))
    assert [r.get("data-fault") for r in by_class(root, "rect", "host-fault")] == ["unplug"]
    assert len(by_class(root, "rect", "fault-outline")) == 1


def test_the_servers_view_of_each_source_is_on_its_lane() -> None:
    view = server_view(history(), ["source-1", "source-2"])
    assert view == {"source-1": [(0.5, "INITIALIZING"), (0.6, "READY"), (4.2, "STALE")], "source-2": [(0.6, "READY")]}
    root = parse_html(timeline_svg(history(), PROCESSES))
    assert [r.get("data-status") for r in by_class(root, "rect", "server-view")] == ["INITIALIZING", "READY", "STALE", "READY"]


def test_a_process_that_could_not_be_scraped_has_a_gap_not_its_last_value(tmp_path: Path) -> None:
    assert scrape_gaps(history(), "source-1") == [(3.1, 4.5)]
    rows = [*ROWS, (1.0, "info", "source-1", "scrape", {"ok": True, "samples": [["mxref_data_plane_healthy", {}, 0.0]]})]
    page = parse_html(render_html(result(tmp_path, [check(0, True)], rows=rows)))
    chart = next(f for f in page.iter("figure") if f.get("data-metric") == "mxref_data_plane_healthy")
    assert [g.get("data-process") for g in by_class(chart, "rect", "gap")] == ["source-1"]
    path = by_class(chart, "path", "series")[0].get("d", "")
    assert path.count("M") == 2  # the line stops at the failed scrape and starts again at the next good one


def test_skip_is_neutral_and_xfail_amber_not_the_red_failure_box(tmp_path: Path) -> None:
    failed = parse_html(render_html(result(tmp_path, [check(0, False)])))
    assert [d.get("class") for d in failed.iter("div") if "why" in (d.get("class") or "")] == ["why"]
    xfail = parse_html(render_html(result(tmp_path, [check(0, False)], defect="a known NIXL defect")))
    assert [d.get("class") for d in xfail.iter("div") if "why" in (d.get("class") or "")] == ["why warn"]
    badge = by_class(xfail, "span", "verdict")[0]
    assert badge.get("style") == f"background:{swatch('xfail').strong}" and text_of(badge) == "! XFAIL"
    assert swatch("skip").kind == "neutral" and swatch("xfail").kind == "warn" and swatch("fail").kind == "fail"
    assert len({swatch(v).glyph for v in ("pass", "fail", "xfail", "skip", "not judged")}) == 5


def test_an_interrupted_run_draws_the_interrupt_and_its_checks_are_not_judged(tmp_path: Path) -> None:
    rows = [*ROWS, (4.1, "info", "harness", "step", {"step": "2", "text": "await", "indeterminate": True, "error": "interrupted"}),
            (4.3, "info", "harness", "outcome", {"status": "interrupted", "reason": "harness got SIGINT"})]
    run = result(tmp_path, [check(0, True), check(1, False)], status="interrupted", rows=rows)
    page = parse_html(render_html(run))
    words = {text_of(r.findall("td")[1]): text_of(r.findall("td")[2]) for t in by_class(page, "table", "checks")
             for r in t.iter("tr") if r.findall("td")}
    assert words == {"check 0": "\u2713 PASS", "check 1": "\u25cb NOT JUDGED"}
    assert [g.get("data-valid") for g in by_class(page, "g", "check-mark")] == ["NOT JUDGED", "PASS"]
    line = by_class(page, "g", "interrupt")
    assert len(line) == 1 and "interrupted" in text_of(line[0])
    why = [d for d in page.iter("div") if "why" in (d.get("class") or "")]
    assert why[0].get("class") == "why neutral" and "not judged" in text_of(why[0])


def test_figures_scale_with_the_page_and_a_failed_run_says_what_next(tmp_path: Path) -> None:
    page = parse_html(render_html(result(tmp_path, [check(0, False)])))
    svg = next(page.iter("svg"))
    assert svg.get("viewbox") and svg.get("class") == "timeline"  # html.parser lowers attribute names
    assert any("fig" in (d.get("class") or "") for d in page.iter("div"))
    nxt = by_class(page, "div", "next")
    assert len(nxt) == 1 and "mxchaos run pages --seed 3" in text_of(nxt[0])
    assert by_class(parse_html(render_html(result(tmp_path, [check(0, True)]))), "div", "next") == []


def test_a_check_for_another_server_is_not_judged_on_the_page(tmp_path: Path) -> None:
    """A check declared ``servers: [modelexpress]`` in a run on mxref's server reads NOT JUDGED,
    not PASS: the page does not claim what the run never judged."""
    other = NamedResult(1, "metric", "check 1", True, "not for this server: for modelexpress (servers:)",
                        {"not_judged": "not for this server"}, ((3.0, "here"),))
    page = parse_html(render_html(result(tmp_path, [check(0, True), other])))
    words = {text_of(r.findall("td")[1]): text_of(r.findall("td")[2]) for t in by_class(page, "table", "checks")
             for r in t.iter("tr") if r.findall("td")}
    assert words == {"check 0": "\u2713 PASS", "check 1": "\u25cb NOT JUDGED"}
    assert sorted(str(g.get("data-valid")) for g in by_class(page, "g", "check-mark")) == ["NOT JUDGED", "PASS"]
