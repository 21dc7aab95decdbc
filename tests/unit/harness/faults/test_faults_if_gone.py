"""Faults whose target is gone, over the fake context: ``gone`` names the target and how it
ended, ``if_gone`` is validated and only where it applies, and the nemesis fails the fault
(the default) or skips it (recorded as skipped, nothing to heal), also when the target ends
during the inject; a failure of the inject's own is never taken for a skip."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from fixtures.fault_context import FakeContext

from harness.engine.nemesis import Nemesis
from harness.errors import FaultError, ScenarioInvalid
from harness.faults import FaultSpec, gone
from harness.faults.process import DepartSpec, KillSpec, PauseSpec
from harness.record.timeline import Entry, History, Timeline
from harness.reports.console import Progress
from harness.scenario import parse_scenario
from harness.spec import SourceOf

SCENARIO = """\
name: t
budgets: {heal: 2s}
processes:
  server: {role: server}
  source-1: {role: source}
  reader-1: {role: reader}
steps:
  - start: server
"""


@pytest.fixture
def ctx() -> FakeContext:
    return FakeContext.source_and_reader()


def nemesis(ctx: FakeContext) -> tuple[Nemesis, Timeline]:
    timeline = Timeline()
    return Nemesis(parse_scenario(SCENARIO), timeline, ctx), timeline


def injects(timeline: Timeline) -> list[tuple[str, dict[str, object]]]:
    return [(e.type, dict(e.value)) for e in timeline.entries() if e.actor == "nemesis" and e.f == "inject" and e.type != "invoke"]


# ---------------------------------------------------------------------------- gone


def test_gone_is_none_while_every_target_runs(ctx: FakeContext) -> None:
    assert gone(KillSpec(kind="kill", target="source-1"), ctx) is None


def test_gone_names_the_target_and_how_it_ended(ctx: FakeContext) -> None:
    ctx.send_signal("source-1", 9)
    assert gone(KillSpec(kind="kill", target="source-1"), ctx) == "source-1 exited (rc -9, SIGKILL)"
    ctx.add_process("source-2", alive=False)
    assert gone(PauseSpec(kind="pause", target="source-2"), ctx) == "source-2 was never started"


def test_gone_of_source_of_is_about_the_source_the_reader_attempts(ctx: FakeContext) -> None:
    ctx.end("source-1", "exited (rc 0) at 2.500s")
    spec = KillSpec(kind="kill", target=SourceOf(source_of="reader-1"))
    assert gone(spec, ctx) == "source-1 exited (rc 0) at 2.500s"


def test_gone_cannot_tell_a_source_of_before_an_attempt(ctx: FakeContext) -> None:
    del ctx.sources["reader-1"]
    with pytest.raises(FaultError, match="has not started an attempt"):
        gone(KillSpec(kind="kill", target=SourceOf(source_of="reader-1")), ctx)


# ---------------------------------------------------------------------------- if_gone, validated


def test_if_gone_defaults_to_fail_and_takes_skip() -> None:
    assert KillSpec(kind="kill", target="source-1").if_gone == "fail"
    assert KillSpec(kind="kill", target="source-1", if_gone="skip").if_gone == "skip"


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("{kind: kill, target: source-1, if_gone: maybe}", "Input should be 'fail' or 'skip' (got 'maybe')"),
        ("{kind: stop, target: source-1, if_gone: skip}", "if_gone: a stop fault does not need a running process"),
        ("{kind: restart, target: source-1, if_gone: skip}", "if_gone: a restart fault does not need a running process"),
    ],
)
def test_if_gone_is_validated_and_only_where_a_fault_needs_a_running_target(fault: str, problem: str) -> None:
    with pytest.raises(ScenarioInvalid) as err:
        parse_scenario(SCENARIO + f"  - fault: {fault}\n")
    assert problem in str(err.value)


def test_the_kinds_that_act_on_a_running_process_say_so() -> None:
    specs: list[FaultSpec] = [
        KillSpec(kind="kill", target="source-1"),
        PauseSpec(kind="pause", target=SourceOf(source_of="reader-1")),
        DepartSpec(kind="depart", target="reader-1"),
    ]
    assert [s.running_refs() for s in specs] == [("source-1",), (SourceOf(source_of="reader-1"),), ("reader-1",)]
    sc = parse_scenario(SCENARIO + "  - fault: {kind: tcp_reset, target: reader-1, peer: {source_of: reader-1}, if_gone: skip}\n")
    assert sc.steps[-1].fault.running_refs() == ("reader-1", SourceOf(source_of="reader-1"))  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- the nemesis


def test_a_gone_target_fails_the_fault_by_default_naming_it_and_how_it_ended(ctx: FakeContext) -> None:
    ctx.end("source-1", "exited (rc -9, SIGKILL) at 3.210s")
    nem, timeline = nemesis(ctx)
    with pytest.raises(FaultError) as err:
        nem.inject(KillSpec(kind="kill", target="source-1", name="k"))
    assert str(err.value) == "fault k (kill): source-1 exited (rc -9, SIGKILL) at 3.210s (if_gone: fail)"
    assert injects(timeline) == [("fail", {"fault": "k", "kind": "kill", "target": "source-1", "error": str(err.value)})]
    assert ctx.recorded("signal") == []


def test_a_gone_target_with_if_gone_skip_is_recorded_as_skipped_and_nothing_is_healed(ctx: FakeContext) -> None:
    ctx.end("source-1", "exited (rc 0) at 1.000s")
    nem, timeline = nemesis(ctx)
    why = nem.inject(PauseSpec(kind="pause", target="source-1", name="freeze", duration=0.01, if_gone="skip"))
    assert why == "source-1 exited (rc 0) at 1.000s"
    assert injects(timeline) == [("info", {"fault": "freeze", "kind": "pause", "target": "source-1", "skipped": why})]
    assert nem.active() == []
    nem.heal_all()
    assert [e for e in timeline.entries() if e.f == "heal"] == []
    assert ctx.calls == []  # no signal sent, no heal ran
    assert timeline.snapshot().fault_windows()[0].injected is False


def test_a_target_that_ends_during_the_inject_is_gone_too(ctx: FakeContext) -> None:
    ctx.events[("reader-1", "load_done")] = {"t": 1.5}
    ctx.ends_after[("reader-1", "load_done")] = "exited (rc 0) at 1.502s"
    nem, timeline = nemesis(ctx)
    why = nem.inject(DepartSpec(kind="depart", target="reader-1", name="leave", if_gone="skip"))
    assert why == "reader-1 exited (rc 0) at 1.502s, during the inject"
    assert injects(timeline)[-1] == ("info", {"fault": "leave", "kind": "depart", "target": "reader-1", "skipped": why})
    ctx.start("reader-1")
    ctx.ends_after[("reader-1", "load_done")] = "exited (rc 0) at 4.000s"
    with pytest.raises(FaultError, match=r"^fault depart-2 \(depart\): reader-1 exited \(rc 0\) at 4.000s, during the inject"):
        nem.inject(DepartSpec(kind="depart", target="reader-1"))


def test_a_failure_of_the_inject_itself_is_not_a_skip(ctx: FakeContext) -> None:
    nem, timeline = nemesis(ctx)
    with pytest.raises(FaultError, match="reader-1 did not emit load_done"):
        nem.inject(DepartSpec(kind="depart", target="reader-1", name="leave", within=1.0, if_gone="skip"))
    assert injects(timeline)[-1][0] == "fail"
    assert ctx.procs["reader-1"].alive


def test_a_running_target_is_injected_as_before(ctx: FakeContext) -> None:
    nem, timeline = nemesis(ctx)
    assert nem.inject(PauseSpec(kind="pause", target="source-1", name="freeze", if_gone="skip")) is None
    assert nem.active() == ["freeze"]
    nem.heal_all()
    assert [e.type for e in timeline.entries() if e.f == "heal"] == ["invoke", "ok"]
    assert ctx.paused == set()


def test_the_console_says_a_fault_was_skipped_and_why() -> None:
    out = io.StringIO()
    skipped = {"fault": "again", "kind": "pause", "target": "source-1", "skipped": "source-1 was never started"}
    Progress(out)(Entry(0, 1.25, "info", "nemesis", "inject", skipped))
    assert out.getvalue() == "   1.250s fault again (pause source-1) skipped: source-1 was never started\n"


def test_a_source_of_target_is_recorded_as_data_the_same_live_and_read_back(ctx: FakeContext, tmp_path: Path) -> None:
    del ctx.sources["reader-1"]
    nem, timeline = nemesis(ctx)
    with pytest.raises(FaultError, match="has not started an attempt"):
        nem.inject(KillSpec(kind="kill", target=SourceOf(source_of="reader-1"), name="k"))
    live = timeline.snapshot()
    live.to_jsonl(tmp_path / "timeline.jsonl")
    (window,) = live.fault_windows()
    assert (window.target, window.outcome) == ("source_of(reader-1)", "failed")
    assert History.from_jsonl(tmp_path / "timeline.jsonl").fault_windows() == [window]
    out = io.StringIO()
    Progress(out)(live[-1])
    assert out.getvalue().startswith("   ") and "fault k (kill source_of(reader-1)) inject FAIL: " in out.getvalue()
