"""Every shipped scenario survives the round trip a run folder makes: the validated model is
saved as ``scenario.json`` and ``mxchaos check`` loads it back to re-judge the run. (A default
spelled out in the JSON, e.g. a fault's ``if_gone: fail``, once made every run of a scenario
with a network or proxy fault impossible to re-judge.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.explore import is_template
from harness.reports.report import write_scenario_files
from harness.scenario import load_scenario, parse_scenario_json

ROOT = Path(__file__).resolve().parents[4]
# exploration templates (*.explore.yaml) are no scenarios: tests/unit/harness/explore/test_explore.py loads them
SHIPPED = sorted(p for p in (ROOT / "scenarios").rglob("*.yaml") if not is_template(p)) + sorted((ROOT / "tests" / "fixtures" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_a_saved_scenario_loads_back_as_the_same_model(path: Path, tmp_path: Path) -> None:
    scenario = load_scenario(path)
    write_scenario_files(tmp_path, scenario)
    again = parse_scenario_json((tmp_path / "scenario.json").read_text(), tmp_path / "scenario.json")
    assert again.model_dump(mode="json", by_alias=True) == scenario.model_dump(mode="json", by_alias=True)


def test_a_run_saved_before_subject_defects_was_the_one_key_is_judged_again(tmp_path: Path) -> None:
    """Until 2026-12-07 every saved scenario.json held ``defect_subjects`` (the settled "whose
    defect"); a file may no longer say it, but an old run folder still re-judges, as it was."""
    import json

    from harness.scenario.subjects import with_subjects

    played = with_subjects(load_scenario(ROOT / "scenarios" / "frozen_source.yaml"), {"client": "modelexpress"})
    write_scenario_files(tmp_path, played)
    saved = json.loads((tmp_path / "scenario.json").read_text())
    assert "defect_subjects" not in saved
    saved["defect_subjects"] = ["modelexpress"]  # as the older harness wrote it
    again = parse_scenario_json(json.dumps(saved), tmp_path / "scenario.json")
    assert again.known_defect == played.known_defect and again.defect_subject == "modelexpress"
