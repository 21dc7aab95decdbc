"""The ``nixl_balance`` check over made-up timelines, and the implicit one every run gets."""

from __future__ import annotations

import textwrap
from typing import Any

from harness import checks
from harness.checks import RunFacts, evaluate
from harness.checks.nixl import NixlBalanceParams
from harness.record.timeline import History
from harness.scenario import parse_scenario

ROLES = RunFacts(roles={"server": "server", "source-1": "source", "reader-1": "reader", "reader-mx": "reader"},
                 players={"reader-mx": "modelexpress"})
CLEAN = {"handles": 0, "dlists": 0, "registrations": 0, "remote_agents": 0}


def judge(params: dict[str, Any], rows: list[tuple[Any, ...]]) -> checks.NamedResult:
    return evaluate(0, "nixl_balance", NixlBalanceParams.model_validate(params), History.build(rows), ROLES)


def audit(t: float, actor: str, **open_: int) -> tuple[Any, ...]:
    return (t, "info", actor, "nixl_audit", {"agent_name": f"{actor}-a", "open": {**CLEAN, **open_}})


def test_an_agent_dropped_with_a_handle_open_fails() -> None:
    result = judge({}, [(1.0, "info", "reader-1", "transfer_start", {}), audit(2.0, "reader-1", handles=1),
                        (2.1, "info", "reader-1", "exit", {"code": 0})])
    assert result.valid is False and "1 handles open" in result.summary


def test_a_process_that_used_nixl_and_exited_0_without_a_balance_fails() -> None:
    rows = [(1.0, "info", "reader-1", "transfer_start", {}), (2.0, "info", "reader-1", "exit", {"code": 0}),
            audit(3.0, "source-1")]
    result = judge({"processes": ["reader-1", "source-1"]}, rows)
    assert result.valid is False and "exited 0" in result.summary and "reader-1" in result.summary
    # a restarted process balances each incarnation: the first one's audit does not cover the second
    rows = [(1.0, "info", "reader-1", "transfer_start", {}), audit(1.5, "reader-1"),
            (2.0, "info", "reader-1", "exit", {"code": 0}), (3.0, "info", "reader-1", "transfer_start", {}),
            (4.0, "info", "reader-1", "exit", {"code": 0})]
    assert judge({}, rows).valid is False
    # killed (no exit of its own) or never used NIXL: nothing to ask of it
    assert judge({}, [(1.0, "info", "reader-1", "exit", {"code": 0}), audit(3.0, "reader-1")]).valid is True


def test_a_failure_killed_before_its_balance_is_excused_only_when_implicit() -> None:
    rows = [(1.0, "info", "reader-1", "transfer_timeout", {"handles_open": 0, "dlists_open": 0}),
            audit(0.5, "reader-1")]
    assert judge({}, rows).valid is False  # stated: the balance must follow the failure
    implicit = judge({"implicit": True, "processes": ["reader-1"]}, rows)
    assert implicit.valid is True, implicit.summary
    exited = [*rows, (2.0, "info", "reader-1", "exit", {"code": 1})]  # it exited on its own: no excuse
    assert judge({"implicit": True, "processes": ["reader-1"]}, exited).valid is False
    held = [(1.0, "info", "reader-1", "transfer_error", {"handles_open": 2}), audit(2.0, "reader-1")]
    assert judge({"implicit": True, "processes": ["reader-1"]}, held).valid is False


def test_implicit_names_what_modelexpress_plays_and_is_not_observable_when_that_is_all() -> None:
    only_mx = judge({"implicit": True, "not_audited": ["reader-mx"]}, [])
    assert only_mx.valid is True and only_mx.summary.startswith("not observable: reader-mx (played by modelexpress) not judged")
    mixed = judge({"implicit": True, "processes": ["reader-1"], "not_audited": ["reader-mx"]}, [audit(1.0, "reader-1")])
    assert mixed.valid is True and "reader-mx (played by modelexpress) not judged" in mixed.summary
    nothing = judge({"implicit": True, "processes": ["reader-1"]}, [])
    assert nothing.valid is True and "nothing to balance" in nothing.summary
    assert judge({}, []).valid == "unknown"  # stated: no agent dropped is nothing judged


SCENARIO = """
name: x
processes:
  server: {role: server}
  source-1: {role: source}
  reader-1: {role: reader%s}
steps:
  - start: server
checks:
  - exit_codes: {expect: {reader-1: 0}}
%s"""


def test_every_run_is_judged_by_the_balance_unless_its_file_states_it() -> None:
    sc = parse_scenario(textwrap.dedent(SCENARIO % ("", "")), "x.yaml")
    entries = sc.judged_entries()
    assert [kind for kind, _ in entries] == ["exit_codes", "nixl_balance"]
    implicit = entries[-1][1]
    assert isinstance(implicit, NixlBalanceParams) and implicit.implicit
    assert implicit.processes == ("source-1", "reader-1") and implicit.not_audited == ()
    assert [kind for kind, _ in sc.check_entries()] == ["exit_codes"]  # the file's own, unchanged
    stated = parse_scenario(textwrap.dedent(SCENARIO % ("", "  - nixl_balance: {}\n")), "x.yaml")
    assert [kind for kind, _ in stated.judged_entries()] == ["exit_codes", "nixl_balance"]
    assert not stated.judged_entries()[-1][1].implicit  # type: ignore[attr-defined]
    mixed = parse_scenario(textwrap.dedent(SCENARIO % (", subject: modelexpress", "")), "x.yaml")
    mx = mixed.judged_entries()[-1][1]
    assert isinstance(mx, NixlBalanceParams) and mx.processes == ("source-1",) and mx.not_audited == ("reader-1",)
    all_mx = mixed.with_subject("modelexpress").judged_entries()[-1][1]
    assert isinstance(all_mx, NixlBalanceParams) and all_mx.processes == ()


def test_a_reader_that_leaves_without_teardown_by_design_is_named_not_judged() -> None:
    sc = parse_scenario(textwrap.dedent(SCENARIO % (", options: {skip_release: true}", "")), "x.yaml")
    implicit = sc.judged_entries()[-1][1]
    assert isinstance(implicit, NixlBalanceParams)
    assert implicit.processes == ("source-1",) and implicit.departs == ("reader-1",)
    result = judge(implicit.model_dump(), [(1.0, "info", "reader-1", "transfer_start", {}),
                                           (2.0, "info", "reader-1", "exit", {"code": 0}), audit(3.0, "source-1")])
    assert result.valid is True and "reader-1 not judged" in result.summary
