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


# --- a check declared for some servers (``servers:`` on the check): judged only where one plays ---

CHECKED = BASE + """\
checks:
  - metric: {{name: real counter, process: server, metric: mx_grpc_requests_total, op: ">=", value: 1, when: any{servers}}}
  - count: {{name: no fallback, process: source-1, event: fallback, max: 0{servers}}}
"""


def checked(servers: str) -> str:
    return CHECKED.format(extra="", server_subject="", servers=f", servers: {servers}" if servers else "")


def test_a_check_for_the_real_server_is_not_judged_under_mxrefs() -> None:
    """The regression: a matrix's mxref server column failed mx_server/smoke on a metric only
    ModelExpress's server exports; a check declared for it is "not for this server" there."""
    from harness.checks import NOT_FOR_SERVER
    from harness.judge.verdict import judge, verdict_of
    from harness.record.timeline import History

    sc = parse_scenario(checked("[modelexpress]"))
    mxref_run = judge(sc, History(()))  # nothing scraped: judged, the metric check could not pass
    metric, count = mxref_run[0], mxref_run[1]
    assert metric.valid is True and metric.not_judged == NOT_FOR_SERVER
    assert metric.summary.startswith("not for this server: for modelexpress") and "server played by mxref" in metric.summary
    assert count.not_judged == NOT_FOR_SERVER  # no process of its own that is a server: every server of the run
    real = judge(with_subjects(sc, {"server": "modelexpress"}), History(()))
    assert real[0].valid is not True and real[0].not_judged is None  # judged where the real server plays
    assert verdict_of("completed", real) != "pass"
    assert parse_scenario(checked("")).check_entries()[0][1].servers is None  # unset: every server
    undeclared = judge(parse_scenario(checked("")), History(()))
    assert undeclared[0].valid is not True and undeclared[0].not_judged is None


@pytest.mark.parametrize(("servers", "message"), [
    ("[]", "checks[0].metric.servers: name the servers the check is for (mxref, modelexpress), or drop the key"),
    ("[mxref, mxref]", "checks[0].metric.servers: name each server once"),
    ("[vllm]", "<string>:9: checks[0].metric.servers[0]: Input should be 'mxref' or 'modelexpress' (got 'vllm')"),
])
def test_a_checks_servers_are_validated_naming_the_key_and_the_rule(servers: str, message: str) -> None:
    assert message in problems(checked(servers))


def test_the_check_server_names_are_the_subjects() -> None:
    import typing

    from harness.checks import ServerName
    from harness.subjects.mx_server import SUBJECT_NAMES

    assert typing.get_args(ServerName) == SUBJECT_NAMES


DEFECT = """\
name: defect_of_a_server
known_defect: the real server bounds no store call
{extra}
store: redis
processes:
  server: {{role: server, subject: modelexpress}}
  source-1: {{role: source}}
steps:
  - start: [server, source-1]
"""


def test_a_defect_of_the_real_server_is_no_defect_under_mxrefs() -> None:
    """``defect_servers``: a matrix's mxref server column judges the scenario as a plain one (a
    pass is PASS, not FIXED?), the real server's column as the known defect it documents."""
    from harness.matrix.defects import defect_here, defect_info

    sc = parse_scenario(DEFECT.format(extra="defect_rate: 3/3\ndefect_servers: [modelexpress]"))
    assert sc.defect_servers == ("modelexpress",)
    assert with_subjects(sc, {"server": "modelexpress"}).known_defect == sc.known_defect
    plain = with_subjects(sc, {"server": "mxref"})
    assert plain.known_defect is None and plain.defect_rate is None and plain.defect_servers == ()
    info = defect_info(sc)
    assert info is not None and info.servers == ["modelexpress"]
    assert defect_here(info, "modelexpress") and defect_here(info, "") and not defect_here(info, "mxref")
    unlisted = parse_scenario(DEFECT.format(extra=""))  # without the key: every server's
    assert with_subjects(unlisted, {"server": "mxref"}).known_defect == unlisted.known_defect


@pytest.mark.parametrize(("extra", "message"), [
    ("defect_servers: [vllm]", "defect_servers[0]: Input should be 'mxref' or 'modelexpress'"),
    ("defect_servers: [modelexpress, modelexpress]", "defect_servers: name each server once"),
])
def test_defect_servers_are_validated(extra: str, message: str) -> None:
    assert message in problems(DEFECT.format(extra=extra))
    no_defect = DEFECT.replace("known_defect: the real server bounds no store call\n", "")
    assert "defect_servers: defect_servers name whose defect a known_defect is: state known_defect too" in problems(
        no_defect.format(extra="defect_servers: [modelexpress]"))
