"""A scenario's ``security`` section: validated before anything starts, and turned by
``harness.engine.launch`` into each process's ``--tls-*`` / ``--token-file`` flags (paths only)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.engine import launch
from harness.errors import ScenarioInvalid
from harness.scenario import Scenario, parse_scenario
from mxref import pki

SECURE = """\
name: secure
security: {tls: true, token: true}
processes:
  server: {role: server}
  honest: {role: source}
  rogue: {role: source, credentials: no_token}
  liar: {role: source, credentials: wrong_token}
  stranger: {role: source, credentials: none}
  reader-1: {role: reader}
steps:
  - start: [server, honest, reader-1]
"""


def load(text: str) -> Scenario:
    return parse_scenario(textwrap.dedent(text), "x.yaml")


def problems(text: str) -> list[str]:
    with pytest.raises(ScenarioInvalid) as info:
        load(text)
    return [issue.render("x.yaml") for issue in info.value.issues]


def place(tmp_path: Path, name: str, creds: pki.RunCredentials | None) -> launch.Placement:
    return launch.Placement(
        run_dir=tmp_path, events_path=tmp_path / f"{name}.events.jsonl", log_path=tmp_path / f"{name}.log",
        host_address="127.0.0.1", in_netns=False, incarnation=1, server_address="127.0.0.1:9",
        credentials=creds,
    )


def flags(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--tls") or argv[i] == "--token-file"}


def test_each_process_gets_what_its_credentials_say(tmp_path: Path) -> None:
    sc = load(SECURE)
    creds = pki.generate(tmp_path, tls=True, token=True)
    ca, cert, key, token, wrong = (str(p) for p in (creds.ca_cert, creds.server_cert, creds.server_key,
                                                    creds.token, creds.wrong_token))
    got = {name: flags(launch.process_argv(sc, name, place(tmp_path, name, creds))) for name in sc.processes}
    assert got["server"] == {"--tls-cert": cert, "--tls-key": key, "--token-file": token}
    full = {"--tls-ca": ca, "--tls-cert": cert, "--tls-key": key, "--token-file": token}
    assert got["honest"] == full and got["reader-1"] == full
    assert got["rogue"] == {"--tls-ca": ca}
    assert got["liar"] == {"--tls-ca": ca, "--tls-cert": cert, "--tls-key": key, "--token-file": wrong}
    assert got["stranger"] == {}
    secret = creds.token.read_text().strip() if creds.token else ""
    for name in sc.processes:  # the token itself is never on a command line
        assert secret not in " ".join(launch.process_argv(sc, name, place(tmp_path, name, creds)))


def test_without_security_nothing_changes(tmp_path: Path) -> None:
    sc = load(SECURE.replace("security: {tls: true, token: true}\n", "").replace(", credentials: no_token", "")
              .replace(", credentials: wrong_token", "").replace(", credentials: none", ""))
    assert not sc.security.tls
    for name in sc.processes:
        assert flags(launch.process_argv(sc, name, place(tmp_path, name, None))) == {}


def test_tls_without_token_gives_no_token_flag(tmp_path: Path) -> None:
    sc = load(SECURE.replace("token: true", "token: false"))
    creds = pki.generate(tmp_path, tls=True, token=False)
    assert "--token-file" not in flags(launch.process_argv(sc, "server", place(tmp_path, "server", creds)))
    assert flags(launch.process_argv(sc, "liar", place(tmp_path, "liar", creds))) == {"--tls-ca": str(creds.ca_cert)}


def test_a_token_without_tls_is_refused() -> None:
    lines = problems(SECURE.replace("tls: true", "tls: false"))
    assert any("token: true needs tls: true" in line for line in lines), lines


def test_a_rogue_needs_a_run_with_credentials() -> None:
    lines = problems(SECURE.replace("security: {tls: true, token: true}\n", ""))
    assert sum("withholds credentials the run does not have" in line for line in lines) == 3, lines
    assert any("processes.rogue.credentials" in line for line in lines), lines


def test_credentials_are_one_of_the_known_kinds() -> None:
    lines = problems(SECURE.replace("credentials: none", "credentials: nothing"))
    assert any("processes.stranger" in line and "credentials" in line for line in lines), lines
