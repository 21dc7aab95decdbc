"""Which servers can play a scenario: its ``servers`` key (validated like ``subjects``), and the
SKIP reason a scenario gets when ``--subject server=modelexpress`` hands its server to the real
ModelExpress server it is not staged for. Nothing here starts a process."""

from __future__ import annotations

import pytest

from harness.errors import ScenarioInvalid
from harness.scenario import parse_scenario
from harness.scenario.subjects import with_subjects

BASE = """\
name: servers_key
{extra}
processes:
  server: {{role: server{server_subject}}}
  source-1: {{role: source}}
steps:
  - start: [server, source-1]
"""
NOTE = "it reads mxref's server gauge"


def text(extra: str = "", server_subject: str = "") -> str:
    return BASE.format(extra=extra, server_subject=f", subject: {server_subject}, store: store" if server_subject else "")


def problems(doc: str) -> str:
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(doc)
    return info.value.render()


def test_by_default_both_servers_can_play_a_scenario() -> None:
    sc = parse_scenario(text())
    assert sc.servers == ("mxref", "modelexpress") and sc.servers_note == ""
    assert with_subjects(sc, {"server": "modelexpress"}).not_playable() is None


def test_a_scenario_for_mxrefs_server_skips_under_the_real_one() -> None:
    sc = parse_scenario(text(f'servers: [mxref]\nservers_note: "{NOTE}"'))
    assert sc.not_playable() is None
    why = with_subjects(sc, {"server": "modelexpress"}).not_playable()
    assert why == f"not staged for a modelexpress server (servers: [mxref]): {NOTE}"
    assert with_subjects(sc, {"client": "modelexpress"}).not_playable() is None  # clients are `subjects`


@pytest.mark.parametrize(("extra", "server_subject", "message"), [
    ("servers: [mxref]", "", "servers: say why a modelexpress server cannot play this scenario in servers_note"),
    ('servers: [mxref, modelexpress]\nservers_note: "why"', "", "servers_note: every subject can play"),
    ("servers: []", "", "servers: name who can play the scenario"),
    ("servers: [mxref, mxref]", "", "name each subject once"),
    (f'servers: [mxref]\nservers_note: "{NOTE}"\nstore: redis', "modelexpress",
     "processes.server.subject: 'modelexpress' is not among the scenario's servers (mxref)"),
])
def test_servers_are_validated(extra: str, server_subject: str, message: str) -> None:
    assert message in problems(text(extra, server_subject))


def test_grpc_impl_puts_every_mxref_server_on_it_and_leaves_modelexpress_alone(tmp_path: object) -> None:
    from pathlib import Path

    from harness.engine import launch

    two = parse_scenario(BASE.format(extra="", server_subject="").replace(
        "  source-1: {role: source}", "  mx: {role: server, subject: modelexpress, store: store}\n"
        "  store: {role: redis}\n  source-1: {role: source, server: server}"))
    played = two.with_grpc_impl("grpcio")
    assert played.processes["server"].options.grpc_impl == "grpcio"  # type: ignore[union-attr]
    assert played.processes["mx"].options.grpc_impl is None  # type: ignore[union-attr]
    assert two.processes["server"].options.grpc_impl is None  # type: ignore[union-attr]  # a copy, not an edit
    run_dir = Path(str(tmp_path))
    where = launch.Placement(run_dir=run_dir, events_path=run_dir / "server.events.jsonl", log_path=run_dir / "server.log",
                             host_address="127.0.0.1", in_netns=False, incarnation=1)
    argv = launch.process_argv(played, "server", where)
    assert argv[argv.index("--grpc-impl") + 1] == "grpcio"
    assert "--grpc-impl" not in launch.process_argv(two, "server", where)
