"""The drain fault over the fake context: SIGHUP to the source process alone, a bounded wait for its
``drain_started``, nothing to heal, and the scenario rule that its target is a source started with
debug hooks."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from fixtures.fault_context import FakeContext
from fixtures.hooked_scenario import parses, problems

from harness.errors import FaultError
from harness.faults import drain, make_fault
from harness.faults.drain import DrainSpec

CATCHES = drain.catches  # as written (the fixture below stands in for it)
HUP_STATE = drain.hup_state


@pytest.fixture
def ctx() -> FakeContext:
    return FakeContext.source_and_reader()


@pytest.fixture(autouse=True)
def handlers(monkeypatch: pytest.MonkeyPatch) -> dict[int, bool]:
    """pid -> whether it catches SIGHUP (the fake context's pids are no processes of this machine)."""
    caught: dict[int, bool] = {}
    monkeypatch.setattr(drain, "catches", lambda pid, sig: caught.get(pid, True))
    monkeypatch.setattr(drain, "hup_state", lambda pid, sig=drain.REFIT: PENDING if pid in caught else None)
    return caught


PENDING = drain.SignalState("T", pending=True, blocked=False, ignored=False, caught=True)


def test_drain_sends_sighup_to_the_source_alone_and_waits_for_drain_started(ctx: FakeContext) -> None:
    pid = ctx.procs["source-1"].pid
    ctx.events[("source-1", "drain_started")] = {"t": 2.5, "live": 1, "timeout_s": 5.0}
    fault = make_fault(DrainSpec(kind="drain", target="source-1", confirm="3s"), "refit")
    injected = fault.inject(ctx)
    witness = injected.record.pop("witness")
    assert witness["effect"] == "seen" and witness["figures"] == {
        "pid": pid, "live": 1, "timeout_s": 5.0, "catches_sighup": True, "alive": True}
    assert injected.record == {"target": "source-1", "pid": pid, "signal": "SIGHUP", "live": 1, "timeout_s": 5.0,
                               "confirmed_t": 2.5}
    assert ctx.recorded("signal") == [("source-1", pid, "SIGHUP", False)]  # the process only, not its group
    assert ctx.recorded("wait") == [("source-1", "drain_started", {}, 3.0)]
    assert ctx.procs["source-1"].alive and not fault.healable


@pytest.mark.parametrize(("live", "caught", "alive", "effect"), [
    (2, True, True, "seen"),
    (0, True, True, "none"),  # nothing to wait for: the drain drained nothing
    (2, False, True, "none"),  # no handler: the SIGHUP ends it, whatever an event said
    (2, True, False, "none"),  # it ended as its drain began
    (2, None, None, "seen"),  # an ssh host's target: its state unread, its events still count
    (None, True, True, "unwitnessed"),
])
def test_a_drains_witness_is_its_live_leases_and_the_targets_state(live: int | None, caught: bool | None,
                                                                    alive: bool | None, effect: str) -> None:
    assert drain.drain_witness("source-1", 7, {"live": live}, caught, alive).effect == effect


def test_the_sighup_handler_is_read_from_sigcgt(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_text("Name:\tpython\nSigCgt:\t0000000180000001\n")  # HUP (1) caught
    assert CATCHES(7, signal.SIGHUP, tmp_path) is True
    assert CATCHES(7, signal.SIGUSR2, tmp_path) is False  # bit 12 clear
    assert CATCHES(8, signal.SIGHUP, tmp_path) is None  # no such process


def test_an_unconfirmed_drain_is_a_fault_error_carrying_a_witness_of_no_effect(ctx: FakeContext) -> None:
    pid = ctx.procs["source-1"].pid
    with pytest.raises(FaultError, match="source-1 did not emit drain_started within 1s") as raised:
        make_fault(DrainSpec(kind="drain", target="source-1", confirm="1s"), "refit").inject(ctx)
    witness = raised.value.witness
    assert witness is not None and witness["effect"] == "none"
    assert witness["why"] == f"source-1 (pid {pid}) never began a drain: no drain_started within 1s, still running"
    assert witness["figures"] == {"pid": pid, "live": None, "waited_s": 1.0, "catches_sighup": True, "alive": True,
                                  "drain_started": False, "hup_pending": None, "hup_ignored": None, "hup_state": None}


def test_an_unconfirmed_drain_says_where_its_sighup_went(ctx: FakeContext, handlers: dict[int, bool]) -> None:
    pid = ctx.procs["source-1"].pid
    assert pid is not None
    handlers[pid] = True  # the fixture's hup_state: a pending SIGHUP in a stopped process
    with pytest.raises(FaultError) as raised:
        make_fault(DrainSpec(kind="drain", target="source-1", confirm="1s"), "refit").inject(ctx)
    witness = raised.value.witness
    assert witness is not None and witness["why"].endswith(
        "still running: its SIGHUP is still pending, never taken (the process is stopped (state T))")
    assert (witness["figures"]["hup_pending"], witness["figures"]["hup_state"]) == (True, "T")


STATUS = "State:\tS (sleeping)\nSigPnd:\t0000000000000000\nShdPnd:\t%s\nSigBlk:\t0000000000000000\n" \
         "SigIgn:\t%s\nSigCgt:\t%s\n"


@pytest.mark.parametrize(("shd", "ign", "cgt", "where"), [
    ("0000000000000001", "0000000000000000", "0000000000000001", "its SIGHUP is still pending, never taken (state S)"),
    ("0000000000000000", "0000000000000001", "0000000000000000", "it ignores SIGHUP (SigIgn): the kernel discarded it"),
    ("0000000000000000", "0000000000000000", "0000000000004001", "its SIGHUP was taken by its handler, which began no drain"),
])
def test_hup_state_reads_the_signal_masks_of_proc_status(tmp_path: Path, shd: str, ign: str, cgt: str, where: str) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_text(STATUS % (shd, ign, cgt))
    found = HUP_STATE(7, proc=tmp_path)
    assert found is not None and found.where(signal.SIGHUP) == where
    assert HUP_STATE(8, proc=tmp_path) is None  # gone: unread


def test_a_target_without_debug_hooks_is_a_validation_error_naming_key_and_rule() -> None:
    parses("{kind: drain, target: source-1, if_gone: skip}")
    assert problems("{kind: drain, target: source-2}") == [
        "x.yaml:9: steps[1].fault.target: a drain fault asks a source's refit through its debug hooks, "
        "and 'source-2' is not started with `options: {debug_hooks: true}`"
    ]
    assert problems("{kind: drain, target: reader-1}") == [
        "x.yaml:9: steps[1].fault.target: a drain fault drains a source's tensor read leases, and 'reader-1' is a reader"
    ]
    assert problems("{kind: drain, target: source-1, duration: 2s}") == [
        "x.yaml:9: steps[1].fault.duration: a drain fault has nothing to heal, so it takes no duration"
    ]
