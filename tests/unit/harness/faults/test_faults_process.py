"""Process faults over the fake context: what each sends to which pid, what pause's token
resumes (the paused pid, not a later incarnation), heal twice, an inject interrupted
midway, and references that lead nowhere."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fixtures.fault_context import FakeContext

from harness.errors import FaultError, RunInterrupted
from harness.faults import make_fault
from harness.faults import process as process_faults
from harness.faults.process import DepartSpec, KillSpec, Paused, PauseSpec, RestartSpec, StopSpec
from harness.record.witness import Witness
from harness.spec import SourceOf


@pytest.fixture
def ctx() -> FakeContext:
    return FakeContext.source_and_reader()


@pytest.fixture
def proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /proc of our own: ``threads(proc, pid, "TTS")`` gives pid three threads in those states."""
    monkeypatch.setattr(process_faults, "PROC", tmp_path)
    return tmp_path


def threads(proc: Path, pid: int | None, states: str) -> None:
    for tid, state in enumerate(states, start=1):
        task = proc / str(pid) / "task" / str(tid)
        task.mkdir(parents=True, exist_ok=True)
        (task / "stat").write_text(f"{tid} (py thr) a) {state} 1 {pid} {pid} 0 -1\n")


def split(value: Mapping[str, Any] | None) -> tuple[dict[str, Any], Witness]:
    rest = dict(value or {})
    witness = Witness.of(rest.pop("witness", None))
    assert witness is not None, f"no witness in {value}"
    return rest, witness


def test_kill_sends_its_signal_to_the_current_pid_and_has_nothing_to_heal(ctx: FakeContext) -> None:
    pid = ctx.procs["source-1"].pid
    fault = make_fault(KillSpec(kind="kill", target="source-1", signal="TERM", group=False), "k")
    injected = fault.inject(ctx)
    assert injected.token is None
    assert injected.record == {"target": "source-1", "pid": pid, "signal": "SIGTERM"}
    assert ctx.recorded("signal") == [("source-1", pid, "SIGTERM", False)]
    assert not ctx.procs["source-1"].alive
    assert fault.heal(ctx, None) is None and len(ctx.calls) == 1  # heal does nothing


def test_kill_of_source_of_hits_the_source_the_reader_attempts(ctx: FakeContext) -> None:
    fault = make_fault(KillSpec(kind="kill", target=SourceOf(source_of="reader-1")), "k")
    assert fault.inject(ctx).record["target"] == "source-1"
    assert fault.spec.process_refs() == ("reader-1",)  # validated: the reader


def test_pause_heal_resumes_the_pid_it_paused_not_a_later_incarnation(ctx: FakeContext, proc: Path) -> None:
    first = ctx.procs["source-1"].pid
    assert first is not None
    threads(proc, first, "TT")
    fault = make_fault(PauseSpec(kind="pause", target="source-1"), "freeze")
    injected = fault.inject(ctx)
    assert injected.token == Paused("source-1", first, True)
    record, witness = split(injected.record)
    assert record == {"target": "source-1", "pid": first, "signal": "SIGSTOP"}
    assert witness.effect == "seen" and witness.figures["threads"] == 2
    assert ctx.paused == {first}
    ctx.stop("source-1", 1.0)
    ctx.start("source-1")  # a new incarnation, another pid
    later = ctx.procs["source-1"].pid
    assert later != first
    threads(proc, first, "TS")  # something resumed one of its threads before the heal
    healed, witness = split(fault.heal(ctx, injected.token))
    assert healed == {"target": "source-1", "pid": first, "signal": "SIGCONT", "resumed": False}
    assert witness.effect == "none" and witness.why == f"1 of 2 threads of pid {first} in state T"
    assert ctx.recorded("signal_pid") == [(first, "SIGCONT", True, False)]  # never the new pid


def test_pause_heal_resumes_and_a_second_heal_is_harmless(ctx: FakeContext, proc: Path) -> None:
    fault = make_fault(PauseSpec(kind="pause", target="source-1", group=False), "freeze")
    token = fault.inject(ctx).token  # its threads cannot be read: not witnessed, and it does not wait for them
    pid = token.pid
    assert split(fault.heal(ctx, token))[0] == {"target": "source-1", "pid": pid, "signal": "SIGCONT", "resumed": True}
    assert ctx.paused == set()
    healed, witness = split(fault.heal(ctx, token))
    assert healed == {"target": "source-1", "pid": pid, "signal": "SIGCONT", "resumed": True}
    assert witness.effect == "unwitnessed" and "gone" in witness.why
    assert ctx.paused == set() and ctx.procs["source-1"].alive
    assert ctx.recorded("signal_pid") == [(pid, "SIGCONT", False, True)] * 2


def test_pause_interrupted_after_its_sigstop_landed_resumes_before_raising(ctx: FakeContext) -> None:
    pid = ctx.procs["source-1"].pid
    ctx.fail("send_signal", RunInterrupted(2), after=True)  # a signal handler raised mid-inject
    fault = make_fault(PauseSpec(kind="pause", target="source-1"), "freeze")
    with pytest.raises(RunInterrupted):
        fault.inject(ctx)
    assert ctx.paused == set()  # nothing left stopped
    assert ctx.recorded("signal_pid") == [(pid, "SIGCONT", True, True)]


def test_pause_of_a_process_not_running_sends_nothing(ctx: FakeContext) -> None:
    ctx.add_process("gone", alive=False)
    with pytest.raises(FaultError, match="gone is not running"):
        make_fault(PauseSpec(kind="pause", target="gone"), "freeze").inject(ctx)
    assert ctx.calls == []


@pytest.mark.parametrize("spec", [
    KillSpec(kind="kill", target="nobody"),
    PauseSpec(kind="pause", target="nobody"),
    StopSpec(kind="stop", target="nobody"),
    RestartSpec(kind="restart", target="nobody"),
    DepartSpec(kind="depart", target="nobody"),
    KillSpec(kind="kill", target=SourceOf(source_of="reader-2")),
])
def test_a_reference_that_leads_nowhere_is_a_fault_error_naming_it(ctx: FakeContext, spec: KillSpec) -> None:
    ctx.add_process("reader-2", role="reader")  # no attempt yet: its source cannot be told
    with pytest.raises(FaultError, match=r"nobody|reader-2"):
        make_fault(spec, "f").inject(ctx)
    assert ctx.recorded("signal") == [] and ctx.recorded("stop") == []


def test_stop_stops_gracefully_and_records_the_outcome(ctx: FakeContext) -> None:
    injected = make_fault(StopSpec(kind="stop", target="source-1", grace=3.0), "s").inject(ctx)
    assert injected.token is None
    record, witness = split(injected.record)
    assert record == {"target": "source-1", "rc": -15, "escalated": False}
    assert witness.effect == "seen" and witness.figures["rc"] == -15
    assert ctx.recorded("stop") == [("source-1", 3.0)]


def test_restart_signals_stops_waits_and_starts_a_new_incarnation(ctx: FakeContext) -> None:
    old = ctx.procs["source-1"].pid
    spec = RestartSpec(kind="restart", target="source-1", grace=2.0, signal="KILL", delay=0.5)
    injected = make_fault(spec, "r").inject(ctx)
    new = ctx.procs["source-1"]
    assert new.pid != old and new.incarnation == 2 and new.alive
    assert [call[0] for call in ctx.calls] == ["signal", "stop", "sleep", "start"]
    assert ctx.recorded("sleep") == [(0.5,)]
    assert injected.token is None
    record, witness = split(injected.record)
    assert witness.effect == "seen" and witness.figures["incarnation"] == 2
    assert record == {"target": "source-1", "pid": old, "signal": "SIGKILL",
                               "stopped": {"rc": None, "escalated": False},
                               "started": {"pid": new.pid, "incarnation": 2}}


def test_restart_without_signal_or_delay_is_stop_then_start(ctx: FakeContext) -> None:
    make_fault(RestartSpec(kind="restart", target="source-1"), "r").inject(ctx)
    assert [call[0] for call in ctx.calls] == ["stop", "start"]


def test_depart_kills_right_after_the_event(ctx: FakeContext) -> None:
    pid = ctx.procs["reader-1"].pid
    ctx.events[("reader-1", "load_done")] = {"t": 12.5, "bytes": 10}
    spec = DepartSpec(kind="depart", target="reader-1", where={"bytes": 10}, within=7.0)
    injected = make_fault(spec, "d").inject(ctx)
    assert ctx.recorded("wait") == [("reader-1", "load_done", {"bytes": 10}, 7.0)]
    assert ctx.recorded("signal") == [("reader-1", pid, "SIGKILL", True)]
    assert injected.record == {"target": "reader-1", "pid": pid, "signal": "SIGKILL", "after": "load_done",
                               "after_t": 12.5, "alive_at_kill": True}


def test_depart_whose_event_never_comes_kills_nothing(ctx: FakeContext) -> None:
    with pytest.raises(FaultError, match="did not emit load_done"):
        make_fault(DepartSpec(kind="depart", target="reader-1"), "d").inject(ctx)
    assert ctx.recorded("signal") == [] and ctx.procs["reader-1"].alive


def test_process_specs_declare_the_processes_they_refer_to() -> None:
    assert KillSpec(kind="kill", target="a").process_refs() == ("a",)
    assert PauseSpec(kind="pause", target=SourceOf(source_of="r")).process_refs() == ("r",)
    assert StopSpec(kind="stop", target="a").process_refs() == ("a",)
    assert RestartSpec(kind="restart", target="a").process_refs() == ("a",)
    assert DepartSpec(kind="depart", target="r").process_refs() == ("r",)
    for spec in (KillSpec(kind="kill", target="a"), DepartSpec(kind="depart", target="r")):
        assert spec.proxy_refs() == () and spec.host_refs() == ()
