"""Scenario validation gaps: schema and cross-reference problems in one report, ``where``
clauses checked against mxref's event schema, misspellings located at their own line
with a did-you-mean, and input limits (size, encoding, YAML alias expansion)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from harness.errors import ScenarioInvalid
from harness.scenario import MAX_BYTES, MAX_NODES, describe_step, iter_steps, load_scenario, parse_scenario

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "scenarios"

HEAD = """\
name: demo
processes:
  server: {role: server}
  source-1: {role: source}
  reader-1: {role: reader}
steps:
  - start: [server, source-1]
"""


def problems(text: str) -> list[str]:
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(textwrap.dedent(text), "x.yaml")
    return [issue.render("x.yaml") for issue in info.value.issues]


def test_schema_and_cross_reference_errors_in_one_report() -> None:
    path = FIXTURES / "invalid" / "schema_and_xref.yaml"
    with pytest.raises(ScenarioInvalid) as info:
        load_scenario(path)
    lines = [issue.render("f") for issue in info.value.issues]
    assert len(lines) == 2, lines
    assert lines[0].startswith("f:9: steps[1].sleep: a duration must be")
    assert lines[1] == "f:10: steps[2].stop: no process named 'sourse-1'; did you mean 'source-1'? (processes: server, source-1)"


def test_names_of_entries_that_failed_are_not_reported_missing() -> None:
    # source-1 is defined, but its options are wrong: the steps naming it are not "no process named"
    lines = problems(HEAD.replace("source-1: {role: source}", "source-1: {role: source, options: {rank: -1}}") + """\
  - fault: {kind: pause, target: source-1, name: f, duraton: 1s}
  - heal: f
  - stop: nobody
""")
    assert len(lines) == 3, lines
    assert "processes.source-1.options.rank" in lines[0]
    assert "unknown key 'duraton'; did you mean 'duration'?" in lines[1]
    assert "no process named 'nobody'" in lines[2]


def test_await_where_field_must_be_a_field_of_the_event() -> None:
    lines = problems(HEAD + "  - await: {process: source-1, event: status_change, where: {state: READY}}\n")
    assert lines == [
        "x.yaml:8: steps[1].await.where.state: 'state' is not a field of status_change events; did you mean "
        "'status'? (fields: reason, status, previous, pid, incarnation)"
    ]


def test_await_where_value_must_be_one_the_field_takes() -> None:
    lines = problems(HEAD + "  - await: {process: source-1, event: status_change, where: {status: ready}}\n")
    assert lines == [
        "x.yaml:8: steps[1].await.where.status: not one of the values status_change.status takes "
        "(UNKNOWN, INITIALIZING, READY, STALE); did you mean 'READY'? (got 'ready')"
    ]


def test_where_of_check_references_and_counts_is_checked_too() -> None:
    lines = problems(HEAD + """\
checks:
  - count: {process: source-1, event: heartbeat, where: {stat: READY}, min: 1}
  - elapsed: {from: {process: server, event: source_status, where: {by: reaperr}}, to: {process: source-1, event: exit}, within: 1s}
""")
    assert len(lines) == 2, lines
    assert lines[0].startswith("x.yaml:9: checks[0].count.where.stat: 'stat' is not a field of heartbeat events")
    assert lines[1].startswith("x.yaml:10: checks[1].elapsed.from.where.by: not one of the values source_status.by takes")


def test_valid_where_clauses_pass() -> None:
    scenario = parse_scenario(HEAD + """\
  - await: {process: source-1, event: status_change, where: {status: READY, previous: UNKNOWN, pid: 7}}
  - await: {process: server, event: source_status, where: {status: STALE, by: reaper}}
""")
    assert len(scenario.steps) == 3


def test_misspelled_key_is_located_at_its_own_line() -> None:
    # the await mapping has a key "event", which once swallowed the location of its siblings
    lines = problems(HEAD + """\
  - await:
      process: source-1
      event: status_change
      wehre: {status: READY}
  - start: reader-1
    within: 3s
""")
    assert lines == [
        "x.yaml:11: steps[1].await.wehre: unknown key 'wehre'; did you mean 'where'? (allowed: process, event, "
        "where, count, since, within, on_timeout, subjects)",
        "x.yaml:13: steps[2].within: unknown key 'within' (allowed: start)",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (HEAD + "  - sleeep: 1s\n", "no action key in step (got 'sleeep'); did you mean 'sleep'?"),
        (HEAD + "  - fault: {kind: kil, target: source-1}\n", "'kil' is not a known kind; did you mean 'kill'?"),
        (HEAD + "checks:\n  - integrty: {}\n", "'integrty' is not a check; did you mean 'integrity'?"),
        (HEAD + "hosts:\n  a: {kind: netnss}\n", "'netnss' is not a known kind; did you mean 'netns'?"),
        (HEAD.replace("role: reader", "role: raeder"), "'raeder' is not a known role; did you mean 'reader'?"),
    ],
)
def test_did_you_mean_for_kinds(text: str, expected: str) -> None:
    assert any(expected in line for line in problems(text)), problems(text)


def test_alias_bomb_is_refused_quickly() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 10):
        bomb += f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]\n"
    t0 = time.monotonic()
    lines = problems(bomb)
    assert time.monotonic() - t0 < 5
    assert lines == [f"x.yaml:5: YAML aliases expand the document past {MAX_NODES} nodes; write the scenario out instead"]


def test_recursive_alias_is_refused() -> None:
    assert problems("a: &a [1, *a]\n") == ["x.yaml:1: a YAML alias refers to the node that contains it"]


def test_huge_file_is_refused_naming_file_and_limit(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("name: huge\n" + "# padding\n" * (MAX_BYTES // 10 + 1))
    with pytest.raises(ScenarioInvalid) as info:
        load_scenario(path)
    text = str(info.value)
    assert str(path) in text and f"over the {MAX_BYTES} byte limit" in text


def test_binary_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00")
    with pytest.raises(ScenarioInvalid) as info:
        load_scenario(path)
    assert info.value.issues[0].message.startswith("not UTF-8 text (byte 0x89 at offset 0)")
    assert str(path) in str(info.value)


def test_step_registry_describes_and_walks_parallel_blocks() -> None:
    scenario = parse_scenario(HEAD + """\
  - parallel:
      - [{sleep: 1s}, {mark: m}]
      - {heal: all}
""")
    refs = list(iter_steps(scenario.steps))
    assert [(ref.id, describe_step(ref.step)) for ref in refs] == [
        ("1", "start server, source-1"),
        ("2", "parallel (2 branches)"),
        ("2.1.1", "sleep 1s"),
        ("2.1.2", "mark m"),
        ("2.2.1", "heal all"),
    ]
    assert refs[3].loc == ("steps", 1, "parallel", 0, 1)


def test_defect_versions_name_where_a_known_defect_was_measured() -> None:
    base = "name: dv\nprocesses: {server: {role: server}}\nsteps: [{start: server}]\n"
    ok = parse_scenario(base + 'known_defect: it breaks\ndefect_versions: ["1.5.1", "1.4"]\n', "dv.yaml")
    assert ok.defect_versions == ("1.5.1", "1.4")
    for bad, rule in (
        ('defect_versions: ["1.5.1"]\n', "state known_defect too"),
        ("known_defect: it breaks\ndefect_versions: [1.5]\n", "list NIXL versions as strings"),
        ('known_defect: it breaks\ndefect_versions: ["latest"]\n', "list NIXL versions as strings"),
    ):
        with pytest.raises(ScenarioInvalid, match=rule):
            parse_scenario(base + bad, "dv.yaml")
