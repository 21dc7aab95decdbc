"""The field-incident library (``scenarios/incidents/``): its shape, not its runs.

Every incident is an ordinary scenario (it runs with ``mxchaos run scenarios/`` and is collected
by pytest like any other); this pins what makes it an *incident*: the public thread it
reproduces in ``references`` (``ai-dynamo/modelexpress#N`` or ``ai-dynamo/nixl#N``), the subjects
it applies to (a ``"subjects: ..."`` reference, until the scenario model has a ``subject`` key),
a description saying what happened and what must hold, and the narrative header comment. It also
keeps the library covering every thread the incident issue names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.explore import is_template
from harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "scenarios" / "incidents"
INCIDENTS = sorted(LIBRARY.glob("*.yaml"))
THREAD = re.compile(r"^ai-dynamo/(modelexpress|nixl)#\d+$")
SUBJECTS = {"mxref", "modelexpress"}
# the threads the incident issue (12) names; each must be reproduced by some scenario here
REQUIRED = {
    "ai-dynamo/modelexpress#555", "ai-dynamo/modelexpress#582", "ai-dynamo/modelexpress#484",
    "ai-dynamo/modelexpress#491", "ai-dynamo/modelexpress#502", "ai-dynamo/modelexpress#499",
    "ai-dynamo/modelexpress#590", "ai-dynamo/modelexpress#608", "ai-dynamo/modelexpress#658",
    "ai-dynamo/modelexpress#233", "ai-dynamo/modelexpress#520", "ai-dynamo/nixl#2109", "ai-dynamo/nixl#2047",
}


def subjects_of(references: tuple[str, ...] | list[str]) -> set[str]:
    found: set[str] = set()
    for ref in references:
        if ref.startswith("subjects:"):
            found |= {s.strip() for s in ref.removeprefix("subjects:").split(",") if s.strip()}
    return found


def test_the_library_holds_at_least_twelve_incidents() -> None:
    assert len(INCIDENTS) >= 12, [p.name for p in INCIDENTS]


@pytest.mark.parametrize("path", INCIDENTS, ids=[p.stem for p in INCIDENTS])
def test_an_incident_cites_its_thread_subjects_and_story(path: Path) -> None:
    scenario = load_scenario(path)
    threads = [r for r in scenario.references if THREAD.match(r)]
    assert threads, f"{path.name}: references name no public thread (ai-dynamo/<repo>#N): {scenario.references}"
    subjects = subjects_of(scenario.references)
    assert subjects and subjects <= SUBJECTS, f"{path.name}: a 'subjects: ...' reference from {sorted(SUBJECTS)}"
    assert len(scenario.description.split()) >= 15, f"{path.name}: the description must say what happened and what must hold"
    assert "Must hold" in scenario.description, f"{path.name}: the description says what must hold now"
    header = path.read_text().splitlines()[0]
    assert header.startswith("# Incident: ai-dynamo/"), f"{path.name}: the header comment opens with the incident"
    assert scenario.name.startswith("incident_"), f"{path.name}: name {scenario.name!r}"
    assert scenario.checks, f"{path.name}: an incident without checks judges nothing"


def test_every_thread_the_issue_names_is_reproduced() -> None:
    cited = {r for p in INCIDENTS for r in load_scenario(p).references}
    assert cited >= REQUIRED, sorted(REQUIRED - cited)


def test_incident_names_are_unique_across_the_suite() -> None:
    names = [load_scenario(p).name for p in sorted((ROOT / "scenarios").rglob("*.yaml")) if not is_template(p)]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_the_subjects_reference_is_parsed() -> None:
    assert subjects_of(["ai-dynamo/nixl#1", "subjects: mxref, modelexpress"]) == {"mxref", "modelexpress"}
    assert subjects_of(["ai-dynamo/nixl#1"]) == set()
