"""The index's count chips filter its rows (CSS ``:target``, no script), and the nightly history
draws a duration trend and a "now" column that always says something."""

from __future__ import annotations

import re
from typing import Any

from harness.nightly.history import render_history, trend_svg
from harness.record.saved import NightDoc
from harness.reports.night_page import render_night


def _scenario(name: str, cell: str, median: float | None = 1.0, **extra: Any) -> dict[str, Any]:
    return {"name": name, "cell": cell, "rate": {"k": 1, "n": 1}, "median_seconds": median,
            "runs": [{"index": 1, "verdict": cell.lower(), "seconds": median, "seed": 1, "report": f"{name}/r/report.html"}],
            **extra}


def test_each_cell_count_is_a_link_that_shows_only_its_rows() -> None:
    night = {"night": "20260101T000000Z", "kind": "run", "repeat": 1, "passed": False,
             "counts": {"scenarios": 3, "cells": {"FAIL": 1, "PASS": 1, "FIXED?": 1}},
             "scenarios": [_scenario("a", "FAIL", fails_night=True), _scenario("b", "PASS"),
                           _scenario("c", "FIXED?", known_defect="d")]}
    page = render_night(night)
    links = re.findall(r'<a class="filter" href="#only-([^"]+)"', page)
    assert links == ["FAIL", "PASS", "FIXED_"] and '<a class="filter" href="#"' in page
    for slug in links:
        assert f'<i id="only-{slug}" class="target"></i>' in page
        # the rule hides every row that is not that cell's (group headings carry their members' cells)
        assert f'#only-{slug}:target ~ table.scenarios tr[data-cells]:not([data-cells~="{slug}"]){{display:none}}' in page
    rows = re.findall(r'<tr data-cells="([^"]+)">', page)
    assert sorted(rows) == ["FAIL", "FIXED_", "PASS"]
    assert page.index('<i id="only-FAIL"') < page.index("<table class=scenarios>")  # a sibling before the table


def test_the_history_says_something_now_for_every_scenario_and_draws_duration_trends() -> None:
    def night(seconds: float, **cells: str) -> dict[str, Any]:
        return {"seconds": seconds, "scenarios": [_scenario(n, c, median=seconds / 10) for n, c in cells.items()]}

    nights = [("20260101T000000Z", night(100, steady="PASS", gone="PASS")),
              ("20260102T000000Z", night(120, steady="PASS", gone="PASS", late="XFAIL")),
              ("20260103T000000Z", night(90, steady="PASS", late="XFAIL"))]
    page = render_history([(name, NightDoc.model_validate(doc)) for name, doc in nights])
    now = dict(re.findall(r'<tr data-scenario="([^"]+)">.*?<td class="small now">(.*?)</td></tr>', page))
    assert now["steady"] == "PASS, 3 nights in a row (every night shown)"
    assert now["late"] == "XFAIL, 2 nights in a row"
    assert now["gone"] == "not in the newest night (last seen 1 night(s) before)"
    assert page.count("<svg class='trend'") == 4  # a line per scenario, one for the nights' durations
    assert "<title>10.0s · 12.0s · 9.0s</title>" in page


def test_a_trend_leaves_a_gap_where_a_value_is_missing_and_says_the_newest() -> None:
    svg = trend_svg([1.0, None, 2.0, 4.0])
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 1  # 1.0 alone, then 2.0 -> 4.0
    assert svg.endswith("<span class='small'>4.0s</span>")
    assert trend_svg([None, None]) == "-"
