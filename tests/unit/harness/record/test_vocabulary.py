"""One outcome, one name: the cells, the palette, the glossary and older records agree."""

from __future__ import annotations

from pathlib import Path

from harness.judge.verdict import OK_VERDICTS, VERDICTS
from harness.record.rates import CELLS, FAILING_CELLS
from harness.record.saved import CellDoc, NightDoc, SummaryDoc
from harness.record.vocabulary import OUTCOMES, canonical, meaning
from harness.reports.htmlreport.palette import swatch

ROOT = Path(__file__).resolve().parents[4]
NAMES = {o.name for o in OUTCOMES}


def test_every_verdict_and_cell_is_an_outcome_with_one_name() -> None:
    assert {v.upper() for v in VERDICTS} <= NAMES
    assert set(CELLS) <= NAMES
    assert {"FAIL", "FLAKY", "HANG", "ERROR", "UNKNOWN", "NOT_EXERCISED"} == FAILING_CELLS
    assert {v.upper() for v in VERDICTS if v not in OK_VERDICTS} <= FAILING_CELLS  # a run and a cell fail alike


def test_older_words_read_as_todays() -> None:
    assert (canonical("REPRODUCED"), canonical("not_reproduced"), canonical("xfail"), canonical("whatever")) == (
        "XFAIL", "XPASS", "xfail", "whatever")
    assert meaning("REPRODUCED") == meaning("xfail") != ""
    old = SummaryDoc.parse({"repeat": 2, "scenarios": {"d": {"cell": "NOT_REPRODUCED", "runs": []}}}, Path("summary.json"))
    assert old.scenarios["d"].cell == "XPASS"
    assert CellDoc(cell="REPRODUCED").cell == "XFAIL"
    night = NightDoc.parse({"scenarios": [{"name": "d", "cell": "REPRODUCED"}, {"name": "p", "cell": "PASS"}],
                            "counts": {"ran": 2, "cells": {"REPRODUCED": 1, "PASS": 1}}}, Path("i.json"))
    assert [s.cell for s in night.scenarios] == ["XFAIL", "PASS"]
    assert night.to_json()["counts"] == {"ran": 2, "cells": {"XFAIL": 1, "PASS": 1}}
    assert swatch("REPRODUCED") == swatch("xfail") and swatch("NOT_REPRODUCED") == swatch("XPASS")


def test_xpass_is_a_blue_star_and_every_outcome_has_its_own_swatch_in_the_palette_and_the_glossary() -> None:
    assert (swatch("xpass").glyph, swatch("xpass").kind) == ("\u2605", "info")
    unknown = swatch("UNKNOWN")
    assert all(swatch(o.name) != unknown for o in OUTCOMES if o.name != "UNKNOWN")  # none falls back
    glossary = (ROOT / "README.md").read_text().split("## Glossary", 1)[1].split("\n## ", 1)[0]
    for o in OUTCOMES:
        assert f"{swatch(o.name).glyph} {o.name}" in glossary, o.name
    for old in ("REPRODUCED", "reproduced (expected)"):
        assert old not in glossary
