"""Capability probes: root, a program on PATH, toxiproxy (next to this Python or on PATH),
netns (root and ``ip``), the ``MXCHAOS_MISSING_CAPABILITIES`` override, and what a scenario's
faults require. Probing never touches validation."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.scenario_heads import THREE_PROCESSES

from harness.scenario import capabilities, parse_scenario
from harness.scenario.capabilities import ENV_MISSING, describe_missing, have, missing, scenario_requirements, toxiproxy_server

TCP_RESET = "name: reset\n" + THREE_PROCESSES + """\
  - fault: {kind: tcp_reset, target: reader-1, peer: source-1, name: cut}
  - fault: {kind: pause, target: source-1}
  - parallel:
      - {fault: {kind: tcp_reset, target: reader-1, peer: server}}
      - {sleep: 1s}
"""


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_MISSING, raising=False)


def test_root_is_the_effective_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert have("root")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert not have("root")


def test_any_other_name_is_a_program_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = tmp_path / "mxchaos-probe-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert have("mxchaos-probe-tool")
    assert not have("iptables")
    assert missing(["mxchaos-probe-tool", "iptables", "iptables"]) == ["iptables"]


def test_netns_needs_root_and_ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert not have("netns")  # no `ip`
    ip = tmp_path / "ip"
    ip.write_text("#!/bin/sh\n")
    ip.chmod(0o755)
    assert have("netns")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert not have("netns")


def test_toxiproxy_is_found_next_to_this_python_or_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    (venv / "bin").mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setenv("PATH", str(elsewhere))
    assert toxiproxy_server() is None and not have("toxiproxy")
    on_path = elsewhere / "toxiproxy-server"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert toxiproxy_server() == str(on_path)
    beside = venv / "bin" / "toxiproxy-server"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert toxiproxy_server() == str(beside) and have("toxiproxy")


def test_the_environment_can_take_capabilities_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capabilities, "PROBES", {**capabilities.PROBES, "root": lambda: True})
    assert have("root")
    monkeypatch.setenv(ENV_MISSING, " root , tc")
    assert not have("root") and not have("tc")
    assert missing(["tc", "root"]) == ["tc", "root"]


def test_a_scenario_requires_what_its_faults_require(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = parse_scenario(textwrap.dedent(TCP_RESET), "x.yaml")
    needs = scenario_requirements(sc)
    assert needs == {"root": ["cut (tcp_reset)", "tcp_reset-3 (tcp_reset)"], "ss": ["cut (tcp_reset)", "tcp_reset-3 (tcp_reset)"]}
    monkeypatch.setattr(capabilities, "PROBES", {**capabilities.PROBES, "root": lambda: False})
    monkeypatch.setenv("PATH", "")
    lacking, why = describe_missing(needs)
    assert lacking == ["root", "ss"]
    assert why == "this machine lacks root (for cut (tcp_reset), tcp_reset-3 (tcp_reset)); ss (for cut (tcp_reset), tcp_reset-3 (tcp_reset))"
    # validation does not probe: the file is valid where it cannot run
    assert parse_scenario(textwrap.dedent(TCP_RESET), "x.yaml").name == "reset"


def test_nothing_missing_says_nothing() -> None:
    assert describe_missing({}) == ([], "")
    sc = parse_scenario(textwrap.dedent(TCP_RESET).replace("tcp_reset", "pause").replace(", peer: source-1", "").replace(", peer: server", ""), "x.yaml")
    assert scenario_requirements(sc) == {}
