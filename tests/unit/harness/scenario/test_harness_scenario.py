"""Scenario files: the schema, its error messages (file, line, key path, value, rule), and the
cross-reference rules. A scenario that is refused here never starts a process."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.checks import REGISTRY as CHECK_REGISTRY
from harness.errors import ScenarioInvalid
from harness.faults import REGISTRY
from harness.faults.process import KillSpec
from harness.scenario import (
    AwaitEvent,
    AwaitExit,
    AwaitMetric,
    AwaitStep,
    FaultStep,
    ParallelStep,
    ReaderProcess,
    Scenario,
    StopStep,
    iter_steps,
    load_scenario,
    parse_scenario,
    scenario_json_schema,
)
from harness.spec import parse_duration

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "scenarios"
# registries grow (a fault or check kind is one new module), so messages list what is registered
FAULT_KINDS = ", ".join(repr(k) for k in sorted(REGISTRY))
CHECK_KINDS = ", ".join(sorted(CHECK_REGISTRY))

GOOD = """\
name: demo
processes:
  server: {role: server}
  source-1: {role: source}
  reader-1: {role: reader}
steps:
  - start: server
  - start: source-1
  - await: {process: source-1, event: status_change, where: {status: READY}}
  - start: reader-1
  - await: {process: reader-1, exit: true}
checks:
  - loaded: {reader: reader-1}
"""


def problems(text: str) -> list[str]:
    """The rendered issue lines of an invalid scenario (without the header)."""
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario(textwrap.dedent(text), "x.yaml")
    return [issue.render("x.yaml") for issue in info.value.issues]


def test_a_minimal_scenario_gets_the_documented_defaults() -> None:
    sc = parse_scenario(GOOD, "x.yaml")
    assert sc.transport is None and sc.transport_of("reader-1") == "ucx-tcp"  # auto: loopback
    assert list(sc.hosts) == ["local"]
    assert sc.budgets.step == 30.0 and sc.budgets.run == 300.0
    assert sc.seed == 0
    assert sc.server_of("reader-1") == "server"
    assert sc.host_of("reader-1") == "local"
    assert [kind for kind, _ in sc.check_entries()] == ["loaded"]


def test_a_typo_in_a_key_names_file_line_key_and_the_closest_allowed_key() -> None:
    """The 'done when' criterion: a typo'd key is refused before anything starts."""
    lines = problems(GOOD.replace("processes:", "procesess:"))
    assert lines == [
        "x.yaml:1: processes: required key is missing",
        "x.yaml:2: procesess: unknown key 'procesess'; did you mean 'processes'? (allowed: name, description, "
        "references, known_defect, defect_rate, defect_versions, defect_servers, subject_defects, seed, transport, markers, schedule, budgets, scrape, "
        "hosts, model, launcher, subject, subjects, subjects_note, servers, servers_note, client_versions, env, security, "
        "store, proxies, processes, steps, checks)",
    ]


def test_a_nested_typo_points_at_its_own_line_and_full_path() -> None:
    text = GOOD.replace("reader-1: {role: reader}", "reader-1: {role: reader, options: {transfer_timout: 5s}}")
    assert problems(text) == [
        "x.yaml:5: processes.reader-1.options.transfer_timout: unknown key 'transfer_timout'; did you mean "
        "'transfer_timeout'? (allowed: rank, agent_name, accelerator, device_id, advertise_host, worker_port, "
        "heartbeat_interval, serve_seconds, mx_version, transfer_timeout, handshake_timeout, rpc_timeout, read_chunk_mib, read_window, selector, selector_seed, "
        "serve_after_load, skip_release, push_metadata, mode, checkpoint, settle_s, settle_always, lease, probe_duplicate_registration, accept_growth)"
    ]


def test_every_problem_is_reported_not_only_the_first() -> None:
    text = """\
    name: demo
    sed: 1
    transport: ucx-tpc
    budgets: {step: 0s}
    processes:
      server: {role: sever}
    steps:
      - strat: server
      - fault: {kind: pauze, target: server}
      - sleep: forever
    checks:
      - loadd: {reader: x}
    """
    lines = problems(text)
    assert lines == [
        "x.yaml:2: sed: unknown key 'sed'; did you mean 'seed'? (allowed: name, description, references, known_defect, defect_rate, defect_versions, "
        "defect_servers, subject_defects, seed, transport, markers, schedule, budgets, scrape, hosts, model, launcher, subject, subjects, "
        "subjects_note, servers, "
        "servers_note, client_versions, env, security, store, proxies, processes, steps, checks)",
        "x.yaml:3: transport: 'ucx-tpc' is not a transport profile (known: "
        + ", ".join(__import__("mxref.config").config.TRANSPORT_PROFILES)
        + ")",
        "x.yaml:4: budgets.step: a duration must be a positive finite number of seconds or a string like 500ms, "
        "2s, 1.5m, 1h (got '0s')",
        "x.yaml:6: processes.server.role: 'sever' is not a known role; did you mean 'server'? (known: 'server', 'source', 'reader', 'command', 'redis')",
        "x.yaml:8: steps[0]: no action key in step (got 'strat'); did you mean 'start'? (actions: start, stop, "
        "restart, await, sleep, fault, heal, mark, parallel)",
        f"x.yaml:9: steps[1].fault.kind: 'pauze' is not a known kind; did you mean 'pause'? (known: {FAULT_KINDS})",
        "x.yaml:10: steps[2].sleep: a duration must be a positive finite number of seconds or a string like 500ms, "
        "2s, 1.5m, 1h (got 'forever')",
        f"x.yaml:12: checks[0]: 'loadd' is not a check; did you mean 'loaded'? (known: {CHECK_KINDS})",
    ]


def test_wrong_values_show_the_value_and_the_rule() -> None:
    text = GOOD.replace("reader-1: {role: reader}", "reader-1: {role: reader, options: {selector: best}}")
    assert problems(text) == [
        "x.yaml:5: processes.reader-1.options.selector: Input should be 'random', 'rendezvous_hash' or 'ordinal' (got 'best')"
    ]


def test_a_missing_fault_kind_says_which_key_is_missing() -> None:
    text = GOOD + "  - nothing_leaked: {}\n"
    text = text.replace("  - start: reader-1\n", "  - fault: {target: source-1}\n  - start: reader-1\n")
    assert problems(text) == [
        "x.yaml:10: steps[3].fault.kind: required key is missing (the kind decides which other keys are allowed)"
    ]


def test_signals_are_names_or_numbers() -> None:
    text = GOOD.replace("  - start: reader-1\n", "  - fault: {kind: kill, target: source-1, signal: FOO}\n  - start: reader-1\n")
    (line,) = problems(text)
    assert line.startswith("x.yaml:10: steps[3].fault.signal: 'FOO' is not a signal name or number")
    ok = parse_scenario(text.replace("FOO", "SIGTERM"), "x.yaml")
    fault = next(r.step for r in iter_steps(ok.steps) if isinstance(r.step, FaultStep)).fault
    assert isinstance(fault, KillSpec) and fault.signal == 15


def test_duplicate_keys_are_refused_instead_of_silently_overwritten() -> None:
    text = GOOD.replace("name: demo\n", "name: demo\nseed: 1\nseed: 2\n")
    assert problems(text) == ["x.yaml:3: seed: duplicate key 'seed' (first at line 2); a later value would silently win"]


def test_yaml_syntax_errors_name_the_line() -> None:
    (line,) = problems("name: demo\nprocesses: {server: {role: server}\nsteps: []\n")
    assert line.startswith("x.yaml:3: not valid YAML")


def test_a_scenario_must_be_a_mapping() -> None:
    assert problems("- a\n- b\n") == ["x.yaml:1: a scenario file must be a YAML mapping (name, processes, steps, ...)"]


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            ("  - start: [source-1]\n", "  - start: [source-2]\n"),
            "x.yaml:8: steps[1].start[0]: no process named 'source-2'; did you mean 'source-1'? "
            "(processes: server, source-1, reader-1)",
        ),
        (
            ("event: status_change", "event: status_chang"),
            "x.yaml:9: steps[2].await.event: 'status_chang' is not an mxref event; did you mean 'status_change'?",
        ),
        (
            ("  - loaded: {reader: reader-1}\n", "  - loaded: {reader: source-1}\n"),
            "x.yaml:13: checks[0].loaded.reader: 'source-1' is a source, expected a reader",
        ),
        (
            ("  - start: server\n  - start: [source-1]\n", "  - start: [source-1]\n  - start: server\n"),
            "x.yaml:7: steps[0].start[0]: 'source-1' is started before its server 'server'",
        ),
        (
            ("  - start: reader-1\n", "  - heal: freeze\n  - start: reader-1\n"),
            "x.yaml:10: steps[3].heal: no fault named 'freeze' (faults: none defined)",
        ),
        (
            ("  - start: reader-1\n", "  - fault: {kind: kill, target: source-1, duration: 2s}\n  - start: reader-1\n"),
            "x.yaml:10: steps[3].fault.duration: a kill fault has nothing to heal, so it takes no duration",
        ),
        (
            ("{process: reader-1, exit: true}", "{process: reader-1, exit: true, within: 1h}"),
            "x.yaml:11: steps[4].await.within: 3600s is longer than the whole run's budget (budgets.run 300s) (got 3600.0)",
        ),
        (
            ("  - start: reader-1\n", "  - sleep: 10m\n  - start: reader-1\n"),
            "x.yaml:10: steps[3].sleep: 600s is longer than the whole run's budget (budgets.run 300s) (got 600.0)",
        ),
        (
            ("name: demo\n", "name: demo\nbudgets: {step: 10m}\n"),
            "x.yaml:2: budgets.step: 600s is longer than budgets.run (300s)",
        ),
        (
            ("  - loaded: {reader: reader-1}\n", "  - fell_back: {reader: reader-1, from: {fault: nope}}\n"),
            "x.yaml:13: checks[0].fell_back.from.fault: no fault named 'nope' (faults: none)",
        ),
        (
            ("source-1: {role: source}", "source-1: {role: source, env: {X: '{pyhton}'}}"),
            "x.yaml:4: processes.source-1: unknown placeholder {pyhton} (known: {python}, {run_dir}, {proc_dir}, "
            "{scenario_dir}, {seed})",
        ),
    ],
)
def test_cross_reference_rules(patch: tuple[str, str], expected: str) -> None:
    text = GOOD.replace("  - start: source-1\n", "  - start: [source-1]\n")
    old, new = patch
    assert old in text
    assert problems(text.replace(old, new)) == [expected]


def test_shorthands_normalise_to_one_shape() -> None:
    text = GOOD.replace(
        "  - start: reader-1\n",
        "  - start: reader-1\n  - stop: source-1\n  - parallel:\n      - {sleep: 1s}\n      - [{mark: m}, {sleep: 500ms}]\n",
    )
    sc = parse_scenario(text, "x.yaml")
    stop = sc.steps[4]
    assert isinstance(stop, StopStep) and stop.stop.process == ("source-1",) and stop.stop.grace is None
    par = sc.steps[5]
    assert isinstance(par, ParallelStep)
    assert [len(branch) for branch in par.parallel] == [1, 2]
    assert [r.id for r in iter_steps(sc.steps)][5:] == ["6", "6.1.1", "6.2.1", "6.2.2", "7"]


def test_await_forms_are_told_apart_by_their_keys() -> None:
    sc = parse_scenario(
        GOOD.replace(
            "  - start: reader-1\n",
            "  - await: {metric: {process: server, metric: up, value: 1}, within: 2s}\n  - start: reader-1\n",
        ),
        "x.yaml",
    )
    kinds = [type(s.await_) for s in sc.steps if isinstance(s, AwaitStep)]
    assert kinds == [AwaitEvent, AwaitMetric, AwaitExit]


def test_durations() -> None:
    assert parse_duration("500ms") == 0.5
    assert parse_duration("2s") == 2.0
    assert parse_duration("1.5m") == 90.0
    assert parse_duration("1h") == 3600.0
    assert parse_duration(3) == 3.0
    for bad in (0, -1, "0s", "inf", float("inf"), float("nan"), True, "2 weeks", None):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_models_are_frozen() -> None:
    sc = parse_scenario(GOOD, "x.yaml")
    with pytest.raises(ValueError):
        sc.seed = 5  # type: ignore[misc]


def test_seed_override_and_round_trip_through_json() -> None:
    sc = parse_scenario(GOOD, "x.yaml").with_seed(42)
    assert sc.seed == 42
    dumped = sc.model_dump(mode="json", by_alias=True)
    again = Scenario.model_validate(dumped)
    assert again.model_dump(mode="json", by_alias=True) == dumped
    assert isinstance(again.processes["reader-1"], ReaderProcess)


def test_json_schema_rejects_unknown_keys_and_lists_fault_kinds() -> None:
    schema = scenario_json_schema()
    assert schema["title"] == "mxchaos scenario"
    assert schema["additionalProperties"] is False
    text = json.dumps(schema)
    for kind in ("kill", "pause", "stop", "restart", "depart"):
        assert f'"const": "{kind}"' in text
    assert "ucx-tcp" in text or "transport" in schema["properties"]


def test_load_scenario_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("name: demo", "nmae: demo"))
    with pytest.raises(ScenarioInvalid) as info:
        load_scenario(bad)
    text = str(info.value)
    assert text.splitlines()[0] == f"{bad}: invalid scenario (2 problems)"
    assert f"{bad}:1: nmae: unknown key 'nmae'; did you mean 'name'?" in text
    with pytest.raises(ScenarioInvalid, match="cannot read the file"):
        load_scenario(tmp_path / "missing.yaml")


def test_the_fixture_scenarios_are_valid() -> None:
    for path in sorted(FIXTURES.glob("*.yaml")):
        sc = load_scenario(path)
        assert sc.path == path.resolve()
        assert sc.text.startswith("#")


def test_a_known_defect_is_free_text_and_must_say_something() -> None:
    sc = parse_scenario(GOOD.replace("name: demo", "name: demo\nknown_defect: >-\n  NIXL 1.5.1 aborts\n  a resumed source"), "x.yaml")
    assert sc.known_defect == "NIXL 1.5.1 aborts a resumed source"
    assert parse_scenario(GOOD, "x.yaml").known_defect is None
    assert problems(GOOD.replace("name: demo", "name: demo\nknown_defect: '  '")) == [
        "x.yaml:2: known_defect: describe the defect: what is broken, where, since which version (or drop the key) (got '  ')"
    ]
    assert "known_defect" in scenario_json_schema()["properties"]


def test_a_saved_scenario_json_is_validated_again_with_lines() -> None:
    from harness.scenario import parse_scenario_json

    sc = parse_scenario(GOOD.replace("name: demo", "name: demo\nknown_defect: it breaks"), "x.yaml").with_seed(9)
    text = json.dumps(sc.model_dump(mode="json", by_alias=True), indent=2)
    again = parse_scenario_json(text, "scenario.json")
    assert again.model_dump(mode="json", by_alias=True) == sc.model_dump(mode="json", by_alias=True)
    assert (again.seed, again.known_defect) == (9, "it breaks")
    # a saved scenario that the current harness refuses names the line of scenario.json
    data = sc.model_dump(mode="json", by_alias=True)
    data["checks"][0]["loaded"]["path"] = "carrier-pigeon"
    bad = json.dumps(data, indent=2)
    line = next(i for i, text_line in enumerate(bad.splitlines(), 1) if "carrier-pigeon" in text_line)
    with pytest.raises(ScenarioInvalid) as info:
        parse_scenario_json(bad, "scenario.json")
    (issue,) = info.value.issues
    assert (issue.line, issue.path) == (line, "checks[0].loaded.path")
    with pytest.raises(ScenarioInvalid, match="not valid JSON"):
        parse_scenario_json("{", "scenario.json")
