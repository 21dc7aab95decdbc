"""A client's own known defect beside a file's general one (``subject_defects``), settled in the one
place that decides (``harness.scenario.subjects.settle_subject_defect``), and the matrix cell that
shows the defect in force where its column plays the scenario (``harness.matrix.defects.column_defects``).
Nothing here starts a process."""

from __future__ import annotations

import pytest
from fixtures.defect_scenarios import CLIENT_DEFECT
from fixtures.scenario_heads import THREE_PROCESSES

from harness.errors import ScenarioInvalid
from harness.matrix.defects import column_defects, defect_info
from harness.record.cells import Column
from harness.scenario import parse_scenario
from harness.scenario.subjects import with_subjects

BOTH = """\
name: two_defects
known_defect: NIXL 1.5.1 aborts the source after the heal
defect_rate: 2/6
defect_versions: ["1.5.1"]
subject_defects:
  modelexpress:
    known_defect: the real client has no stall detection
    defect_rate: 1/1
""" + THREE_PROCESSES



def test_the_playing_clients_own_defect_replaces_the_general_one_and_the_general_one_comes_back() -> None:
    plain = parse_scenario(BOTH)  # mxref plays: the general (NIXL) defect
    assert plain.known_defect == "NIXL 1.5.1 aborts the source after the heal"
    assert plain.defect_rate == "2/6" and plain.defect_versions == ("1.5.1",) and plain.defect_subject is None
    real = with_subjects(plain, {"client": "modelexpress"})
    assert real.known_defect == "the real client has no stall detection"
    assert real.defect_rate == "1/1" and real.defect_versions == () and real.defect_subject == "modelexpress"
    back = with_subjects(real, {"client": "mxref"})
    assert back.known_defect == plain.known_defect and back.defect_versions == ("1.5.1",)
    assert with_subjects(plain, {"reader": "modelexpress"}).known_defect == real.known_defect  # one reader is the client's


def test_a_servers_defect_is_still_dropped_where_another_server_plays() -> None:
    text = BOTH.replace("known_defect: NIXL", "defect_servers: [modelexpress]\nknown_defect: NIXL").replace(
        "server: {role: server}", "server: {role: server, subject: modelexpress}").replace("processes:", "store: redis\nprocesses:")
    sc = parse_scenario(text)
    assert sc.known_defect is not None and sc.defect_servers == ("modelexpress",)
    assert with_subjects(sc, {"server": "mxref"}).known_defect is None
    assert with_subjects(with_subjects(sc, {"server": "mxref"}), {"server": "modelexpress"}).known_defect is not None
    # the client's own defect holds whichever server plays
    assert with_subjects(sc, {"server": "mxref", "client": "modelexpress"}).known_defect == "the real client has no stall detection"


@pytest.mark.parametrize(("block", "message"), [
    ("    defect_rate: 1/1\n", "subject_defects.modelexpress.known_defect: required key is missing"),
    ("    known_defect: x\n    defect_rate: one\n", "subject_defects.modelexpress.defect_rate: 'one' is not a rate: write k/n"),
    ("    known_defect: x\n    defect_versions: [latest]\n", "subject_defects.modelexpress.defect_versions: list NIXL versions"),
    ("    known_defect: x\n    rate: 1/1\n", "subject_defects.modelexpress.rate"),
])
def test_a_subject_defect_is_validated_naming_the_key_and_the_rule(block: str, message: str) -> None:
    text = BOTH.replace("    known_defect: the real client has no stall detection\n    defect_rate: 1/1\n", block)
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(text)
    assert message in info.value.render()


def test_a_subject_defect_names_a_subject() -> None:
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(BOTH.replace("  modelexpress:\n", "  vllm:\n"))
    assert "subject_defects.vllm" in info.value.render()


def test_each_matrix_column_gets_the_defect_in_force_where_it_plays_the_scenario() -> None:
    columns = [Column(nixl="1.5.1", subject="mxref"), Column(nixl="1.5.1", subject="modelexpress"),
               Column(nixl="1.5.1", subject="modelexpress@0.8.0.dev20261026"), Column(nixl="1.5.1")]
    both = column_defects(parse_scenario(BOTH), columns)
    assert both[columns[0].id].text == "NIXL 1.5.1 aborts the source after the heal"
    assert both[columns[0].id].versions == ["1.5.1"]
    assert both[columns[1].id].to_json() == {"text": "the real client has no stall detection", "versions": None,
                                   "servers": None, "subjects": ["modelexpress"]}
    assert both[columns[2].id] == both[columns[1].id]  # a release of the client is that client
    assert both[columns[3].id] == both[columns[0].id]  # each scenario's own subject: mxref here
    client = parse_scenario(CLIENT_DEFECT)
    assert defect_info(client) is None  # played as written (mxref): no defect in force
    only = column_defects(client, columns)
    assert set(only) == {columns[1].id, columns[2].id}
    assert only[columns[1].id].text == "the real client loads a tampered checkpoint without a check"
