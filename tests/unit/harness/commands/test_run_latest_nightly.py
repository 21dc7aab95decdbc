"""``mxchaos run --subject modelexpress@latest-nightly``: resolved by the matrix's own resolver
(``harness.subjects.releases.resolve_latest``) before anything runs, and recorded in the
invocation's ``summary.json``. The registry is a fake; no env is built (``MXCHAOS_BUILD_SUBJECTS=0``:
a release whose env is not there is a SKIP) and no process starts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness import cli
from harness.commands import run as run_command
from harness.exits import EXIT_ENV_BROKEN
from harness.subjects import mx_server
from harness.subjects.releases import Resolved

SMOKE = Path(__file__).resolve().parents[4] / "scenarios" / "smoke.yaml"


def test_latest_nightly_is_a_client_spelling_for_run() -> None:
    assert mx_server.parse_subjects("modelexpress@latest-nightly") == {
        "client": "modelexpress", "client_version": "latest-nightly"}


def test_resolve_subject_puts_the_registrys_version_in_its_place() -> None:
    found = Resolved("--subject", "latest-nightly", "0.8.0.dev20261026", "pip index versions --pre modelexpress")
    logs: list[str] = []
    subject, r = run_command.resolve_subject({"client": "modelexpress", "client_version": "latest-nightly"},
                                             logs.append, client=lambda: found)
    assert subject == {"client": "modelexpress", "client_version": "0.8.0.dev20261026"} and r is found
    assert logs == ["--subject modelexpress@latest-nightly: 0.8.0.dev20261026 (pip index versions --pre modelexpress)"]


def test_an_unresolved_nightly_refuses_the_run_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    failed = Resolved("--subject", "latest-nightly", None, "pip index versions --pre modelexpress",
                      "the registry did not answer")
    monkeypatch.setattr(run_command, "resolve_client", lambda: failed)
    assert cli.main(["run", "--subject", "modelexpress@latest-nightly", "--out", str(tmp_path / "out"), str(SMOKE)]) \
        == EXIT_ENV_BROKEN
    assert "latest-nightly: the registry did not answer" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_resolved_version_plays_and_is_recorded_in_the_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = Resolved("--subject", "latest-nightly", "9.9.9.dev1", "pip index versions --pre modelexpress")
    monkeypatch.setattr(run_command, "resolve_client", lambda: found)
    monkeypatch.setenv("MXCHAOS_BUILD_SUBJECTS", "0")  # that release's env is not there: its run SKIPs
    monkeypatch.setenv("MXCHAOS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MXCHAOS_MX_CLIENT_VERSION", "")  # restored after the test (run sets it)
    out = tmp_path / "out"
    assert cli.main(["run", "--subject", "modelexpress@latest-nightly", "--out", str(out), str(SMOKE)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resolved"] == [found.to_json()]
    assert summary["scenarios"]["smoke"]["cell"] == "SKIP"
    assert os.environ["MXCHAOS_MX_CLIENT_VERSION"] == "9.9.9.dev1"  # the release that plays


TOPOLOGY = SMOKE.parent / "incidents" / "mx_topology_domain_required_unknown.yaml"  # client_versions: >=0.8.0.dev0


def test_list_asks_the_registry_too_so_a_pinned_scenario_shows_as_the_nightly_plays_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MXCHAOS_MX_CLIENT_VERSION", "")  # restored after the test (list sets it)
    monkeypatch.setattr(run_command, "resolve_client",
                        lambda: Resolved("--subject", "latest-nightly", "0.8.0.dev20261026", "pip index versions --pre modelexpress"))
    assert cli.main(["list", "--subject", "modelexpress@latest-nightly", str(TOPOLOGY)]) == 0
    out = capsys.readouterr().out
    assert "incident_mx_topology_domain_required_unknown" in out and "0.7.0" not in out
    monkeypatch.setattr(run_command, "resolve_client",
                        lambda: Resolved("--subject", "latest-nightly", "0.7.0", "pip index versions --pre modelexpress"))
    cli.main(["list", "--subject", "modelexpress@latest-nightly", str(TOPOLOGY)])
    assert "0.7.0" in capsys.readouterr().out  # an older release resolved: the scenario says it cannot play it
    monkeypatch.setattr(run_command, "resolve_client", lambda: Resolved(
        "--subject", "latest-nightly", None, "pip index versions --pre modelexpress", "the registry did not answer"))
    assert cli.main(["list", "--subject", "modelexpress@latest-nightly", str(TOPOLOGY)]) == 2
    assert "the registry did not answer" in capsys.readouterr().err
