"""The run page's readable parts (``harness.reports.htmlreport``): a zoomed view of the fault
windows when they are a small part of the run, ``elapsed`` checks as brackets, a legend of only
the symbols the page draws, signal names for negative exit codes and the last lines of the log of
a process that died by a signal, inline; and no page scrolls sideways at 800 px (measured in
headless Chromium where one is installed) nor fixes a width above it in its style."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from harness.checks import NamedResult
from harness.judge.verdict import RunResult, verdict_of
from harness.nightly.history import render_history
from harness.record.saved import NightDoc
from harness.record.timeline import History
from harness.reports.htmlreport import render_html
from harness.reports.htmlreport.timeline import legend_html, timeline_svg, zoom_window
from harness.reports.night_page import render_night
from harness.scenario import parse_scenario

SVG = "{http://www.w3.org/2000/svg}"
PROCESSES = ["server", "source-1", "reader-1"]

Row = tuple[float, str, str, str, dict[str, Any]]


def _rows(freeze: tuple[float, float], end: float, reader_rc: int = 0) -> list[Row]:
    a, b = freeze
    return [
        (0.0, "invoke", "harness", "step", {"step": "1", "text": "start server"}),
        (0.1, "ok", "server", "start", {"incarnation": 1, "pid": 1}),
        (0.2, "ok", "source-1", "start", {"incarnation": 1, "pid": 2}),
        (0.3, "info", "source-1", "status_change", {"status": "READY"}),
        (0.5, "ok", "reader-1", "start", {"incarnation": 1, "pid": 3}),
        (a, "invoke", "nemesis", "inject", {"fault": "freeze", "kind": "pause", "target": "source-1"}),
        (a, "ok", "nemesis", "inject", {"fault": "freeze", "healable": True}),
        (a + 0.1, "info", "reader-1", "transfer_start", {"index": 0}),
        (b - 0.1, "info", "reader-1", "transfer_timeout", {"index": 0, "seconds": 0.5}),
        (b, "ok", "nemesis", "heal", {"fault": "freeze"}),
        (end - 1.0, "info", "reader-1", "process_exit",
         {"incarnation": 1, "rc": reader_rc, "stopped_by_harness": False,
          **({"signal": "SIGABRT"} if reader_rc == -6 else {})}),
        (end, "info", "harness", "mark", {"mark": "end"}),
    ]


def test_a_short_fault_in_a_long_run_gets_a_zoomed_window_and_a_long_one_does_not() -> None:
    zoom = zoom_window(History.build(_rows((4.8, 5.7), 20.0)))
    assert zoom is not None
    lo, hi = zoom
    assert lo < 4.8 and hi > 5.7 and hi - lo < 3.0  # the crucial second, padded, not the whole run
    assert zoom_window(History.build(_rows((1.0, 15.0), 20.0))) is None  # most of the run: the timeline shows it
    no_fault = [r for r in _rows((4.8, 5.7), 20.0) if r[2] != "nemesis"]
    assert zoom_window(History.build(no_fault)) is None


def test_the_zoomed_view_spreads_the_window_over_the_width_and_leaves_out_what_is_outside() -> None:
    h = History.build(_rows((4.8, 5.7), 20.0))
    whole = ET.fromstring(timeline_svg(h, PROCESSES))
    zoomed = ET.fromstring(timeline_svg(h, PROCESSES, window=zoom_window(h)))

    def fault_width(root: ET.Element) -> float:
        (rect,) = [el for el in root.iter(SVG + "rect") if el.get("class") == "fault"]
        return float(rect.get("width") or 0)

    assert fault_width(zoomed) > 4 * fault_width(whole)
    # the READY at 0.3 s and the step at 0.0 s lie outside the window: not drawn at its edge
    assert [el for el in zoomed.iter(SVG + "text") if el.get("class") == "status"] == []
    assert [el for el in zoomed.iter(SVG + "line") if el.get("class") == "step"] == []
    ticks = [float(el.text or 0) for el in zoomed.iter(SVG + "text") if el.get("class") == "tick"]
    assert ticks[0] <= 4.8 and ticks[-1] >= 5.7 and ticks[0] > 0


def _elapsed(index: int, valid: bool, a: float, b: float) -> NamedResult:
    return NamedResult(index, "elapsed", f"elapsed{index}", valid, f"{b - a:.3f}s",
                       {"from": a, "to": b, "elapsed": b - a}, ((a, "from"), (b, "to")))


def test_an_elapsed_check_is_a_bracket_from_its_start_to_its_end() -> None:
    h = History.build(_rows((4.8, 5.7), 20.0))
    root = ET.fromstring(timeline_svg(h, PROCESSES, [_elapsed(0, False, 4.8, 5.6)]))
    (bracket,) = [el for el in root.iter(SVG + "g") if el.get("class") == "bracket"]
    assert bracket.get("data-valid") == "FAIL"
    path = bracket.find(SVG + "path")
    assert path is not None
    xs = [float(v) for v in re.findall(r"[MH]([\d.]+)", path.get("d") or "")]
    assert xs[1] > xs[0]  # from the start to the end
    label = bracket.find(SVG + "text")
    assert label is not None and label.text == "#1 0.800s"


def test_the_legend_lists_only_the_symbols_drawn() -> None:
    h = History.build(_rows((4.8, 5.7), 20.0))
    svg = timeline_svg(h, PROCESSES, [_elapsed(0, True, 4.8, 5.6)])
    items = re.findall(r"<span>([^<]*)</span>", legend_html(svg))
    assert "process alive (start to exit)" in items and "fault window (nemesis lane, a row per overlapping fault)" in items
    assert any(text.startswith("an elapsed check") for text in items) and "check #n, PASS" in items
    assert "check #n, FAIL" not in items and "the harness was interrupted (Ctrl-C)" not in items
    assert "attempt with no outcome by the end" not in items
    every = re.findall(r"<span>([^<]*)</span>", legend_html())
    assert len(every) > len(items) and set(items) <= set(every)


def test_a_crash_reads_by_its_signal_and_its_log_tail_is_on_the_page(tmp_path: Path) -> None:
    sc = parse_scenario(
        "name: crash\nprocesses:\n  server: {role: server}\n  source-1: {role: source}\n  reader-1: {role: reader}\n"
        "steps:\n  - start: [server, source-1, reader-1]\nchecks:\n  - exit_codes: {expect: {reader-1: 0}}\n", "crash.yaml")
    run_dir = tmp_path / "crash" / "stamp"
    (run_dir / "procs").mkdir(parents=True)
    (run_dir / "procs" / "reader-1.log").write_text("".join(f"line {i}\n" for i in range(50)) + "free(): invalid next size\n")
    check = NamedResult(0, "exit_codes", "exit_codes", False, "reader-1 exited -6, expected 0", {}, ())
    result = RunResult(scenario=sc, run_id="crash-1", run_dir=run_dir, status="completed", reason="",
                       verdict=verdict_of("completed", [check]), history=History.build(_rows((4.8, 5.7), 20.0, -6)),
                       checks=[check], started_at="2026-01-01T00:00:00+00:00", seconds=20.0, seed=1)
    page = render_html(result)
    assert "reader-1 exited -6 (SIGABRT), expected 0" in page
    assert "rc -6 (SIGABRT)" in page  # the processes table
    tail = re.search(r"<pre class='tail'>(.*?)</pre>", page, re.S)
    assert tail is not None and tail.group(1).endswith("free(): invalid next size")
    assert "line 31" in tail.group(1) and "line 30\n" not in tail.group(1)  # the last 20 lines only
    assert "<a href='procs/reader-1.log'>procs/reader-1.log</a>" in page


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
WIDE = re.compile(r"(?<![-\w])(?:min-)?width\s*:\s*(\d+)px")


def _pages(tmp_path: Path) -> dict[str, str]:
    long = "a_scenario_name_long_enough_to_push_a_table_column_wider_than_it_should_" * 2
    sc = parse_scenario(
        f"name: {long[:63]}\ndescription: {'words ' * 80}\nprocesses:\n  server: {{role: server}}\n"
        "  source-1: {role: source}\n  reader-1: {role: reader}\nsteps:\n  - start: [server, source-1, reader-1]\n"
        "checks:\n  - exit_codes: {expect: {reader-1: 0}}\n", "wide.yaml")
    run_dir = tmp_path / "run"
    (run_dir / "procs").mkdir(parents=True)
    (run_dir / "procs" / "reader-1.log").write_text("x" * 3000 + "\n" + "/a/very/long/path/" * 40 + "\n")
    checks = [_elapsed(0, False, 4.8, 5.6)]
    result = RunResult(scenario=sc, run_id="wide-1", run_dir=run_dir, status="completed", reason="",
                       verdict=verdict_of("completed", checks), history=History.build(_rows((4.8, 5.7), 20.0, -6)),
                       checks=checks, started_at="2026-01-01T00:00:00+00:00", seconds=20.0, seed=1)
    scenario = {"name": long, "cell": "FAIL", "fails_night": True, "rate": {"k": 0, "n": 1}, "median_seconds": 20.0,
                "path": "scenarios/" + long + ".yaml",
                "runs": [{"index": i, "verdict": "fail", "seconds": 20.0, "seed": i, "report": "run/report.html",
                          "failed_checks": ["exit_codes: " + "reader-1 exited -6 " * 20]} for i in range(1, 21)]}
    night = {"night": "20260101T000000Z", "kind": "run", "repeat": 20, "passed": False, "seconds": 400,
             "counts": {"scenarios": 1, "cells": {"FAIL": 1}}, "scenarios": [scenario], "command": ["mxchaos", "run", long]}
    return {"run": render_html(result), "index": render_night(night),
            "history": render_history([(f"202601{d:02d}T000000Z", NightDoc.model_validate(night)) for d in range(1, 31)])}


def test_no_page_style_fixes_a_width_above_800_px(tmp_path: Path) -> None:
    for name, page in _pages(tmp_path).items():
        for style in re.findall(r"<style>(.*?)</style>", page, re.S) + re.findall(r"style=['\"]([^'\"]*)['\"]", page):
            wide = [int(w) for w in WIDE.findall(style) if int(w) > 800]
            assert not wide, (name, wide)


@pytest.mark.integration
@pytest.mark.skipif(BROWSER is None, reason="needs chromium (headless) to measure a page")
def test_no_page_scrolls_sideways_at_800_px(tmp_path: Path) -> None:
    for name, page in _pages(tmp_path).items():
        probe = page.replace("</body>", "<script>document.body.setAttribute('data-scroll-width', "
                                        "document.documentElement.scrollWidth)</script></body>")
        path = tmp_path / f"{name}.html"
        path.write_text(probe)
        dom = subprocess.run([str(BROWSER), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                              "--window-size=800,2000", "--dump-dom", path.as_uri()],
                             capture_output=True, text=True, timeout=120).stdout
        found = re.search(r'data-scroll-width="(\d+)"', dom)
        assert found is not None, (name, dom[-500:])
        assert int(found.group(1)) <= 800, (name, found.group(1))
