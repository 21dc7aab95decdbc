"""The field-incident library (``scenarios/incidents/``): its shape, not its runs.

Every incident is an ordinary scenario (it runs with ``mxchaos run scenarios/`` and is collected
by pytest like any other); this pins what makes it an *incident*: the public thread it
reproduces in ``references`` (``ai-dynamo/modelexpress#N``, ``ai-dynamo/nixl#N``, or another tracker of
the field notes: ``kvcache-ai/Mooncake#N`` ...), the subjects
it applies to (its ``subjects:`` key, stated in the file: an incident says whether the real client
can be put through it, and ``subjects_note`` says why not; mxref plays all but those about a rule of
some client releases only, ``client_versions``), a description saying what happened and what must hold, and the narrative header comment. It also
keeps the library covering every thread the incident issue names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from harness.explore import is_template
from harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[4]
LIBRARY = ROOT / "scenarios" / "incidents"
INCIDENTS = sorted(LIBRARY.glob("*.yaml"))
# the public trackers: ModelExpress and NIXL, and the projects whose
# field reports the library reproduces over the same protocol (Mooncake, vLLM, SGLang, UCX)
THREAD = re.compile(r"^(ai-dynamo/(modelexpress|nixl)|kvcache-ai/Mooncake|vllm-project/vllm|sgl-project/sglang|openucx/ucx)#\d+$")
SUBJECTS = {"mxref", "modelexpress"}
# the threads the incident issue (12) names; each must be reproduced by some scenario here
REQUIRED = {
    "ai-dynamo/modelexpress#555", "ai-dynamo/modelexpress#582", "ai-dynamo/modelexpress#484",
    "ai-dynamo/modelexpress#491", "ai-dynamo/modelexpress#502", "ai-dynamo/modelexpress#499",
    "ai-dynamo/modelexpress#590", "ai-dynamo/modelexpress#608", "ai-dynamo/modelexpress#658",
    "ai-dynamo/modelexpress#233", "ai-dynamo/modelexpress#520", "ai-dynamo/nixl#2109", "ai-dynamo/nixl#2047",
}


def test_the_library_holds_at_least_twelve_incidents() -> None:
    assert len(INCIDENTS) >= 12, [p.name for p in INCIDENTS]


@pytest.mark.parametrize("path", INCIDENTS, ids=[p.stem for p in INCIDENTS])
def test_an_incident_cites_its_thread_subjects_and_story(path: Path) -> None:
    scenario = load_scenario(path)
    threads = [r for r in scenario.references if THREAD.match(r)]
    assert threads, f"{path.name}: references name no public thread (owner/repo#N): {scenario.references}"
    stated = yaml.safe_load(path.read_text()).get("subjects")
    assert stated, f"{path.name}: say who can play it: subjects: [mxref, modelexpress], or [mxref] with a subjects_note"
    assert set(scenario.subjects) <= SUBJECTS, f"{path.name}: subjects {scenario.subjects}"
    # mxref plays every incident, except one about a rule of some client releases that mxref does not
    # have (client_versions names the releases; subjects_note says why mxref cannot stage it)
    assert "mxref" in scenario.subjects or (scenario.client_versions and scenario.subjects_note), (
        f"{path.name}: subjects {scenario.subjects}: mxref plays every incident but one about a client release's own "
        "rule (client_versions, with a subjects_note)")
    assert not [r for r in scenario.references if r.startswith("subjects:")], (
        f"{path.name}: the subjects are the subjects: key now, not a reference")
    assert len(scenario.description.split()) >= 15, f"{path.name}: the description must say what happened and what must hold"
    assert "Must hold" in scenario.description, f"{path.name}: the description says what must hold now"
    header = path.read_text().splitlines()[0]
    assert header.startswith("# Incident: ") and THREAD.match(header.split()[2]), (
        f"{path.name}: the header comment opens with the incident's thread")
    assert scenario.name.startswith("incident_"), f"{path.name}: name {scenario.name!r}"
    assert scenario.checks, f"{path.name}: an incident without checks judges nothing"


def test_every_thread_the_issue_names_is_reproduced() -> None:
    cited = {r for p in INCIDENTS for r in load_scenario(p).references}
    assert cited >= REQUIRED, sorted(REQUIRED - cited)


def test_incident_names_are_unique_across_the_suite() -> None:
    names = [load_scenario(p).name for p in sorted((ROOT / "scenarios").rglob("*.yaml")) if not is_template(p)]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_the_library_puts_the_real_client_through_most_incidents() -> None:
    """Most incidents put the real client through them. Two stage what only mxref's own means can
    (issue 37): a half-open store read through mxref's per-heartbeat events, and a rolling upgrade's
    version skew set per process (the real client's version is its installed package's: a matrix
    axis, not a scenario option), and a NIXL probe through mxref's audited agent (NIXL #1792's
    duplicate registration: the real client's agent is not reachable); they are not counted
    against the rule."""
    mxref_means = {"mooncake4003_half_open_store", "mx_version_skew_rolling_upgrade", "nixl1792_duplicate_registration"}
    both = [p.stem for p in INCIDENTS if "modelexpress" in load_scenario(p).subjects]
    counted = [p for p in INCIDENTS if p.stem not in mxref_means]
    assert len(both) >= len(counted) // 2, f"only {both} can be played by the real client"
