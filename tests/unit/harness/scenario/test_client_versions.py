"""A scenario about some releases of the ModelExpress client (``client_versions``): validated
naming the file, the key and the rule; played by the client of another release it SKIPs, naming
both (``Scenario.not_playable``, which the runner and ``mxchaos list`` ask). Nothing starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import ScenarioInvalid
from harness.scenario import load_scenario, parse_scenario
from harness.subjects.envs import ENV_CLIENT_VERSION
from harness.subjects.releases import client_release_fits

INCIDENT = Path(__file__).resolve().parents[4] / "scenarios" / "incidents" / "mx_topology_domain_required_unknown.yaml"

DOC = """\
name: pinned
subject: modelexpress
client_versions: "{spec}"
processes:
  server: {{role: server}}
  reader-1: {{role: reader}}
steps:
  - start: [server, reader-1]
"""


@pytest.fixture(autouse=True)
def no_release_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CLIENT_VERSION, raising=False)


@pytest.mark.parametrize(("version", "fits"), [
    ("0.7.0", False), ("0.8.0.dev20261015", True), ("0.8.0.dev20261026", True), ("0.8.0", True), ("0.9.1", True),
    ("not-a-version", False),
])
def test_pre_releases_count(version: str, fits: bool) -> None:
    assert client_release_fits(">=0.8.0.dev0", version) is fits


def test_another_release_skips_naming_both_and_the_release_asked_plays(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = parse_scenario(DOC.format(spec=">=0.8.0.dev0"), "x.yaml")
    why = sc.not_playable()  # the pinned default, 0.7.0
    assert why is not None
    assert "about the ModelExpress client >=0.8.0.dev0 (client_versions), and this run plays 0.7.0" in why
    assert "--subject modelexpress@" in why
    monkeypatch.setenv(ENV_CLIENT_VERSION, "0.8.0.dev20261026")  # mxchaos run --subject modelexpress@0.8.0.dev20261026
    assert sc.not_playable() is None
    monkeypatch.setenv(ENV_CLIENT_VERSION, "0.7.0")
    assert "this run plays 0.7.0" in str(sc.not_playable())


def test_mxref_players_are_not_versioned_by_it() -> None:
    sc = parse_scenario(DOC.format(spec="==0.8.0.dev20261026").replace("subject: modelexpress\n", ""), "x.yaml")
    assert sc.not_playable() is None  # mxref plays: no client release to check
    assert sc.with_subject("modelexpress").not_playable() is not None


@pytest.mark.parametrize(("spec", "message"), [
    ("0.8", "x.yaml:3: client_versions: '0.8' is not a version specifier: write e.g. '>=0.8.0.dev0'"),
    (">=zero", "x.yaml:3: client_versions: '>=zero' is not a version specifier"),
    (" ", "x.yaml:3: client_versions: name the client releases, e.g. '>=0.8.0.dev0' (a PEP 440 specifier), or drop the key"),
])
def test_a_bad_specifier_names_the_file_the_key_and_the_rule(spec: str, message: str) -> None:
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(DOC.format(spec=spec), "x.yaml")
    assert message in info.value.render()


def test_a_scenario_the_client_cannot_play_names_no_release() -> None:
    text = DOC.format(spec=">=0.8.0.dev0").replace("subject: modelexpress\n", "subjects: [mxref]\nsubjects_note: mxref's own hooks\n")
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(text, "x.yaml")
    assert ("client_versions: the ModelExpress client cannot play this scenario (subjects: [mxref]): its releases do "
            "not apply (drop the key)") in info.value.render()


def test_the_topology_incident_is_about_0_8(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = load_scenario(INCIDENT)
    assert sc.client_versions == ">=0.8.0.dev0" and sc.subjects == ("modelexpress",)
    assert "this run plays 0.7.0" in str(sc.not_playable())
    monkeypatch.setenv(ENV_CLIENT_VERSION, "0.8.0.dev20261026")
    assert sc.not_playable() is None
    assert "not staged for mxref" in str(sc.with_subject("mxref").not_playable())
