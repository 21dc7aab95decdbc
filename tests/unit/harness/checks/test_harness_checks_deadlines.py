"""Timing bounds in the reader's announced stall deadlines (``harness.checks.deadlines``): the
announcement is held to the contract, then the observed time to the announcement."""

from __future__ import annotations

from typing import Any

import pytest
from fixtures.scenario_heads import THREE_PROCESSES
from pydantic import ValidationError

from harness import checks
from harness.checks import RunFacts, evaluate
from harness.checks.deadlines import Bound, ReadWindow, parse_bound
from harness.checks.events import ElapsedParams
from harness.checks.loads import FellBackParams
from harness.errors import ScenarioInvalid
from harness.record.timeline import History
from harness.reports.invocation import is_time_bound
from harness.scenario import parse_scenario
from harness.scenario.placement import _tight_check

ROLES = RunFacts(roles={"server": "server", "source-1": "source", "reader-1": "reader"})
ONE_READER = "name: t\nmodel: {tensors: 2, tensor_mib: 16}\n" + THREE_PROCESSES  # a scenario's head: its steps go on after it
STALL = {"from": {"process": "reader-1", "event": "transfer_start"}, "to": {"process": "reader-1", "event": "transfer_timeout"},
         "stall_of": "reader-1", "not_before": "D1", "within": "2D1"}


def run(kind: str, params: dict[str, Any], rows: list[tuple[Any, ...]]) -> checks.NamedResult:
    return evaluate(0, kind, checks.REGISTRY[kind].params.model_validate(params), History.build(rows), ROLES)


def read(first_stall_s: float | None, stall_s: float | None, stalled_after: float, start: float = 2.0) -> list[tuple[Any, ...]]:
    """A reader's READ that announces its deadlines and is called a stall ``stalled_after`` in."""
    return [
        (1.0, "ok", "reader-1", "start", {"incarnation": 1, "pid": 200}),
        (start, "info", "reader-1", "transfer_start", {"index": 0, "stall_s": stall_s, "first_stall_s": first_stall_s}),
        (start + stalled_after, "info", "reader-1", "transfer_timeout", {"index": 0, "stalled": True}),
    ]


@pytest.mark.parametrize(("text", "bound"), [
    ("D1", Bound(0.0, 1.0, "D1")),
    ("2D1", Bound(0.0, 2.0, "D1")),
    ("D + 1.5s", Bound(1.5, 1.0, "D")),
    ("D1 - 80ms", Bound(-0.08, 1.0, "D1")),
    ("3D + 4.5s", Bound(4.5, 3.0, "D")),
    ("750ms", Bound(0.75)),
    (2, Bound(2.0)),
])
def test_a_bound_is_a_duration_or_one_in_the_deadlines(text: Any, bound: Bound) -> None:
    assert parse_bound(text) == bound
    assert parse_bound(str(bound)) == bound  # written back as it reads


@pytest.mark.parametrize("bad", ["E", "D + x", "-1s", "0D", "D2", True])
def test_a_bad_bound_says_what_a_bound_is(bad: Any) -> None:
    with pytest.raises(ValidationError, match="announced stall deadlines: D"):
        ElapsedParams.model_validate({**STALL, "within": bad})


def test_a_bound_in_the_deadlines_needs_the_reader_that_announces_them() -> None:
    with pytest.raises(ValidationError, match="name that reader in stall_of"):
        ElapsedParams.model_validate({k: v for k, v in STALL.items() if k != "stall_of"})
    with pytest.raises(ValidationError, match=r"not_before 1.02s is after within 0.51s \(at the contract's deadlines\)"):
        ElapsedParams.model_validate({**STALL, "not_before": "2D1", "within": "D1"})
    assert list(ElapsedParams.model_validate(STALL).process_refs()) == [("stall_of", "reader-1", ("reader",))]


def test_a_stall_called_between_the_announced_bounds_passes() -> None:
    ok = run("elapsed", STALL, read(0.51, 1.842, 0.80))
    assert (ok.valid, ok.summary) == (True, "0.800s")
    assert ok.details["deadlines"] == {"announced": {"D1": 0.51}, "contract": {"D1": 0.51}}


def test_an_announcement_the_contract_does_not_hold_fails_however_consistent_the_reader() -> None:
    """The mutant that multiplies the deadline by 20: it announces 20 x D1 and waits that long."""
    result = run("elapsed", STALL, read(15.04, 16.72, 15.5))
    assert result.valid is False
    assert result.summary.startswith(
        "stall deadlines: reader-1 announced D = 16.72s (transfer_start at 2.000s); the contract's D is 1.84s (±5ms); "
        "reader-1 announced D1 = 15.04s")
    assert not is_time_bound("elapsed", result.summary)  # a behaviour, not a time the machine's load can move


def test_a_stall_outside_what_the_reader_announced_fails() -> None:
    early = run("elapsed", STALL, read(0.51, 1.842, 0.5))
    assert (early.valid, early.summary) == (False, "0.500s, earlier than D1 = 0.510s")
    assert is_time_bound("elapsed", early.summary)
    late = run("elapsed", STALL, read(0.51, 1.842, 15.04))  # announces D1, waits 20 x D1
    assert (late.valid, late.summary) == (False, "15.040s, later than 2D1 = 1.020s")


def test_a_read_that_announced_no_deadline_is_judged_at_the_contracts() -> None:
    ok = run("elapsed", STALL, read(None, None, 0.8))  # a single READ handle, a client without chunked READs
    assert (ok.valid, ok.details["deadlines"]) == (True, {"announced": {}, "contract": {"D1": 0.51}, "not_announced": ["D1"]})
    late = run("elapsed", STALL, read(None, None, 30.0))  # a stall seen only at a 30 s budget
    assert (late.valid, late.summary) == (False, "30.000s, later than 2D1 = 1.020s")


def test_plain_bounds_read_no_announcement() -> None:
    result = run("elapsed", {**STALL, "stall_of": None, "not_before": "0.5s", "within": "1s"}, read(15.04, 16.72, 0.8))
    assert (result.valid, result.summary, "deadlines" in result.details) == (True, "0.800s", False)


def test_another_contract_is_given_in_the_check() -> None:
    params = {**STALL, "contract": {"D": "1.2s", "D1": "1s", "tolerance": "20ms"}}
    assert run("elapsed", params, read(1.01, 1.19, 1.5)).valid is True
    assert run("elapsed", params, read(0.752, 0.836, 0.8)).valid is False


def test_fell_back_reads_its_readers_announcement() -> None:
    rows = [*read(0.51, 1.842, 0.8),
            (3.0, "info", "reader-1", "fallback", {"reason": "all candidates failed"}),
            (3.5, "info", "reader-1", "load_done", {"path": "disk", "integrity": True})]
    ok = run("fell_back", {"reader": "reader-1", "not_before": "2D1", "within": "3D + 4.5s"}, rows)
    assert (ok.valid, ok.summary) == (True, "reader-1 fell back 2.000s after reader-1 start (all candidates failed)")
    early = run("fell_back", {"reader": "reader-1", "not_before": "4D1 + 0.5s"}, rows)
    assert (early.valid, early.summary) == (False, "reader-1: fell back 2.000s after reader-1 start, before 4D1 + 500ms = 2.540s")
    lying = [*rows[:1], (2.0, "info", "reader-1", "transfer_start", {"stall_s": 16.72, "first_stall_s": 15.04}), *rows[2:]]
    lied = run("fell_back", {"reader": "reader-1", "not_before": "D1"}, lying)
    assert lied.valid is False and not is_time_bound("fell_back", lied.summary)
    assert FellBackParams.model_validate({"reader": "reader-1", "within": "D"}).announcer() == "reader-1"


def test_the_matrix_reads_a_deadline_bound_at_the_contract() -> None:
    sc = parse_scenario(ONE_READER + """\
checks:
  - elapsed: {from: {process: reader-1, event: transfer_start}, to: {process: reader-1, event: transfer_timeout}, stall_of: reader-1, within: 2D1}
""")
    assert _tight_check(sc) == "timing window within 1.02s (elapsed)"


def test_the_contract_is_the_readers_own_window_so_a_deeper_one_moves_the_bound() -> None:
    """A 6-deep window of 8 MiB chunks: D = 6 x 8 MiB at 25 MB/s + 0.5 s = 2.51 s, D1 (the 1 MiB
    probe chunk alone, at 100 MB/s) 0.51 s; 8 deep: 3.18 s. The default: 1.84 / 0.51; 0.5 MiB chunks: 0.51."""
    assert ReadWindow().deadlines() == {"D": 1.84, "D1": 0.51}
    assert ReadWindow(0.5, 2).deadlines() == {"D": 0.54, "D1": 0.51}
    assert ReadWindow(8, 6).deadlines() == {"D": 2.51, "D1": 0.51}
    assert ReadWindow(8, 8).deadlines() == {"D": 3.18, "D1": 0.51}
    cut = {"from": {"process": "reader-1", "event": "transfer_start"}, "to": {"process": "reader-1", "event": "transfer_timeout"},
           "stall_of": "reader-1", "within": "2D"}
    rows = read(0.51, 2.513, 4.9)
    deep = RunFacts(roles=ROLES.roles, read_windows={"reader-1": (8, 6)})
    ok = evaluate(0, "elapsed", ElapsedParams.model_validate(cut), History.build(rows), deep)
    assert (ok.valid, ok.details["deadlines"]) == (True, {"announced": {"D": 2.513}, "contract": {"D": 2.51}})
    # the same announcement judged at the default window breaks the contract (2.513 s is not 1.84 s)
    assert run("elapsed", cut, rows).summary.startswith("stall deadlines: reader-1 announced D = 2.513s")
    deeper = RunFacts(roles=ROLES.roles, read_windows={"reader-1": (8, 8)})
    moved = evaluate(0, "elapsed", ElapsedParams.model_validate(cut), History.build(read(0.510, 3.184, 6.2)), deeper)
    assert (moved.valid, moved.summary) == (True, "6.200s")  # inside 2D = 6.368 s, past the 6-deep 5.026 s
    late = evaluate(0, "elapsed", ElapsedParams.model_validate(cut), History.build(read(0.510, 3.184, 6.5)), deeper)
    assert (late.valid, late.summary) == (False, "6.500s, later than 2D = 6.368s")


def test_the_scenario_gives_the_checks_each_readers_window() -> None:
    sc = parse_scenario("""\
name: t
processes:
  server: {role: server}
  source-1: {role: source}
  reader-1: {role: reader, options: {read_chunk_mib: 8, read_window: 6}}
  reader-2: {role: reader}
steps:
  - start: [server, source-1, reader-1]
""")
    assert sc.read_windows() == {"reader-1": (8, 6), "reader-2": (None, None)}


FROZEN_FIRST = {"before": [{"fault": "freeze", "at": "landed"}, {"process": "reader-1", "event": "transfer_start"}]}
READ_FIRST = {"before": [{"process": "reader-1", "event": "transfer_start"}, {"fault": "freeze", "at": "landed"}]}


def frozen(invoked: float, landed: float, stalled_after: float) -> list[tuple[Any, ...]]:
    """``read`` (its READ starting at 2.0 s) with a freeze invoked and landed at those times."""
    return [*read(0.51, 1.842, stalled_after),
            (invoked, "invoke", "nemesis", "inject", {"fault": "freeze", "kind": "pause", "target": "source-1"}),
            (landed, "ok", "nemesis", "inject", {"fault": "freeze", "healable": True})]


def test_only_if_judges_a_check_in_its_case_and_names_the_other_case() -> None:
    """A race the scenario cannot close (frozen_source: the freeze lands before the READ began, or
    after, when the probe may have been served), told apart by the timeline, one check per side."""
    before = {**STALL, "only_if": FROZEN_FIRST}
    after = {**STALL, "not_before": None, "within": "2D", "from": {"fault": "freeze"}, "only_if": READ_FIRST}
    # landed before the READ began: the D1 rule is judged, and a stall past 2D1 fails it
    early = frozen(1.990, 1.995, 1.166)
    failed = run("elapsed", before, early)
    assert (failed.valid, failed.summary) == (False, "1.166s, later than 2D1 = 1.020s")
    other = run("elapsed", after, early)
    assert (other.valid, other.not_judged) == (True, "not this case")
    assert other.summary == ("not this case: only if reader-1 transfer_start before fault freeze landed; here fault freeze "
                             "landed (1.995s) came first (reader-1 transfer_start 2.000s); not judged")
    # invoked before the READ began but landed after it: the landing decides, and the D rule counts from the invocation
    late = frozen(1.990, 2.013, 1.166)
    assert run("elapsed", before, late).not_judged == "not this case"
    judged = run("elapsed", after, late)
    assert (judged.valid, judged.summary, judged.not_judged) == (True, "1.176s", None)
    assert run("elapsed", after, frozen(1.990, 2.013, 4.0)).valid is False  # past 2D = 3.684s of the freeze


def test_only_if_that_cannot_be_told_is_unknown() -> None:
    never = run("elapsed", {**STALL, "only_if": FROZEN_FIRST}, read(0.51, 1.842, 0.6))
    assert (never.valid, never.summary) == (
        "unknown", "only if fault freeze landed before reader-1 transfer_start: fault freeze landed never happened, "
                   "so the case cannot be told")
    refused = [*read(0.51, 1.842, 0.6), (1.9, "invoke", "nemesis", "inject", {"fault": "freeze", "kind": "pause"}),
               (1.95, "fail", "nemesis", "inject", {"fault": "freeze", "error": "no such process"})]
    assert run("elapsed", {**STALL, "only_if": FROZEN_FIRST}, refused).valid == "unknown"  # a failed inject never landed


def test_at_landed_is_a_fault_references_and_only_ifs_references_are_checked() -> None:
    with pytest.raises(ValidationError, match="'at' belongs to a fault reference"):
        ElapsedParams.model_validate({**STALL, "from": {"process": "reader-1", "event": "transfer_start", "at": "landed"}})
    text = ONE_READER + """\
  - fault: {kind: pause, target: source-1, name: freeze}
checks:
  - elapsed: {from: {process: reader-1, event: transfer_start}, to: {process: reader-1, event: transfer_timeout}, stall_of: reader-1, within: 2D1, only_if: {before: [{fault: frieze, at: landed}, {process: reader-1, event: transfer_start}]}}
"""
    with pytest.raises(ScenarioInvalid, match=r"only_if\.before\[0\]\.fault: no fault named 'frieze'"):
        parse_scenario(text)
    assert parse_scenario(text.replace("frieze", "freeze")).name == "t"
