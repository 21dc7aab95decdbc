"""The corrupt fault over the fake context: SIGUSR2 to the source process alone, a bounded
wait for its confirmation, heal toggling back the pid it corrupted (not a later incarnation),
an unconfirmed toggle undone, an interrupted inject undone, and the scenario rule that its
target must be a source started with debug hooks."""

from __future__ import annotations

import ctypes
import os

import pytest
from fixtures.fault_context import FakeContext
from fixtures.hooked_scenario import parses, problems

from harness.errors import FaultError, RunInterrupted
from harness.faults import make_fault
from harness.faults.corrupt import Corrupted, CorruptSpec, memory_witness, read_bytes, where_flipped
from harness.spec import SourceOf


@pytest.fixture
def ctx() -> FakeContext:
    return FakeContext.source_and_reader()


def test_corrupt_toggles_with_sigusr2_and_waits_for_the_sources_confirmation(ctx: FakeContext) -> None:
    pid = ctx.procs["source-1"].pid
    assert pid is not None
    ctx.events[("source-1", "debug_corrupt")] = {"t": 3.5, "corrupted": True, "tensors": 8}
    fault = make_fault(CorruptSpec(kind="corrupt", target="source-1", confirm="2s"), "rot")
    injected = fault.inject(ctx)
    why = "its debug_corrupt names no addresses (a subject whose hooks do not say where they flip)"
    assert injected.token == Corrupted("source-1", pid, (), None, why)
    assert injected.record == {"target": "source-1", "pid": pid, "signal": "SIGUSR2", "tensors": 8, "confirmed_t": 3.5,
                               "read": None}
    assert ctx.recorded("signal") == [("source-1", pid, "SIGUSR2", False)]  # the process only, not its group
    assert ctx.recorded("wait") == [("source-1", "debug_corrupt", {"corrupted": True}, 2.0)]
    assert ctx.procs["source-1"].alive  # SIGUSR2 is a toggle, not an end


def test_heal_toggles_back_the_pid_it_corrupted_and_waits_for_the_restore(ctx: FakeContext) -> None:
    ctx.events[("source-1", "debug_corrupt")] = {"corrupted": True, "tensors": 8}
    fault = make_fault(CorruptSpec(kind="corrupt", target="source-1"), "rot")
    token = fault.inject(ctx).token
    ctx.events[("source-1", "debug_corrupt")] = {"corrupted": False, "tensors": 8}
    healed = fault.heal(ctx, token)
    assert healed is not None and healed.pop("witness")["effect"] == "unwitnessed"  # no addresses to read
    assert healed == {"target": "source-1", "pid": token.pid, "restored": True, "tensors": 8}
    assert ctx.recorded("signal_pid") == [(token.pid, "SIGUSR2", False, True)]
    assert ctx.recorded("wait")[-1] == ("source-1", "debug_corrupt", {"corrupted": False}, 10.0)


def test_heal_of_a_source_gone_since_restores_nothing_and_never_signals_a_later_incarnation(ctx: FakeContext) -> None:
    ctx.events[("source-1", "debug_corrupt")] = {"corrupted": True, "tensors": 8}
    fault = make_fault(CorruptSpec(kind="corrupt", target="source-1"), "rot")
    token = fault.inject(ctx).token
    ctx.stop("source-1", 1.0)
    ctx.start("source-1")
    healed = fault.heal(ctx, token)
    assert healed is not None and healed.pop("witness")["effect"] == "unwitnessed"
    assert healed == {"target": "source-1", "pid": token.pid, "gone": True}
    assert ctx.recorded("signal_pid") == [(token.pid, "SIGUSR2", False, False)]
    assert len(ctx.recorded("wait")) == 1  # no wait for a restore that cannot come


def test_heal_without_confirmation_is_a_fault_error_naming_the_source(ctx: FakeContext) -> None:
    ctx.events[("source-1", "debug_corrupt")] = {"corrupted": True, "tensors": 8}
    fault = make_fault(CorruptSpec(kind="corrupt", target="source-1", confirm="1s"), "rot")
    token = fault.inject(ctx).token
    del ctx.events[("source-1", "debug_corrupt")]
    with pytest.raises(FaultError, match=rf"source-1 \(pid {token.pid}\) did not confirm its memory restored"):
        fault.heal(ctx, token)


def test_an_unconfirmed_corruption_is_toggled_back_before_the_error(ctx: FakeContext) -> None:
    pid = ctx.procs["source-1"].pid
    fault = make_fault(CorruptSpec(kind="corrupt", target="source-1", confirm="1s"), "rot")
    with pytest.raises(FaultError, match="source-1 did not emit debug_corrupt within 1s"):
        fault.inject(ctx)
    assert ctx.recorded("signal") == [("source-1", pid, "SIGUSR2", False)]
    assert ctx.recorded("signal_pid") == [(pid, "SIGUSR2", False, True)]  # toggled back


def test_an_interrupt_after_the_toggle_landed_toggles_it_back(ctx: FakeContext) -> None:
    pid = ctx.procs["source-1"].pid
    ctx.fail("send_signal", RunInterrupted(15), after=True)
    with pytest.raises(RunInterrupted):
        make_fault(CorruptSpec(kind="corrupt", target="source-1"), "rot").inject(ctx)
    assert ctx.recorded("signal_pid") == [(pid, "SIGUSR2", False, True)]


def test_a_toggle_that_was_never_sent_is_not_undone(ctx: FakeContext) -> None:
    ctx.add_process("gone", alive=False)
    with pytest.raises(FaultError, match="gone is not running"):
        make_fault(CorruptSpec(kind="corrupt", target="gone"), "rot").inject(ctx)
    assert ctx.recorded("signal_pid") == []  # an undo here would corrupt what it meant to spare


def test_corrupt_of_source_of_hits_the_source_the_reader_attempts(ctx: FakeContext) -> None:
    ctx.events[("source-1", "debug_corrupt")] = {"corrupted": True, "tensors": 8}
    fault = make_fault(CorruptSpec(kind="corrupt", target=SourceOf(source_of="reader-1")), "rot")
    assert fault.inject(ctx).record["target"] == "source-1"
    assert fault.spec.process_refs() == ("reader-1",)


def test_a_target_without_debug_hooks_is_a_validation_error_naming_key_and_rule() -> None:
    parses("{kind: corrupt, target: source-1, duration: 2s}")
    assert problems("{kind: corrupt, target: source-2}") == [
        "x.yaml:9: steps[1].fault.target: a corrupt fault toggles a source's memory through its debug hooks, "
        "and 'source-2' is not started with `options: {debug_hooks: true}`"
    ]
    assert problems("{kind: corrupt, target: reader-1}") == [
        "x.yaml:9: steps[1].fault.target: a corrupt fault corrupts a source's memory, and 'reader-1' is a reader"
    ]
    assert problems("{kind: corrupt, target: {source_of: reader-1}}") == [
        "x.yaml:9: steps[1].fault.target: a corrupt fault on {source_of: reader-1} may hit any source, so every "
        "source needs `options: {debug_hooks: true}`, and source-2 has not"
    ]


def test_bytes_are_read_back_from_a_processs_memory() -> None:
    buf = ctypes.create_string_buffer(b"\x00\x7f\xff")
    base = ctypes.addressof(buf)
    assert read_bytes(os.getpid(), [base, base + 1, base + 2]) == b"\x00\x7f\xff"
    ctypes.memset(base + 1, 0x80, 1)  # flipped by 0xFF, as the toggle does
    assert read_bytes(os.getpid(), [base + 1]) == b"\x80"
    assert read_bytes(os.getpid(), [1]) is None  # not mapped
    assert read_bytes(2**22 + 7, [base]) is None  # no such process (beyond pid_max's default)


@pytest.mark.parametrize(("event", "kind", "why"), [
    ({"addrs": [4096, 8192], "memory": "host"}, "local", ""),
    ({"addrs": [4096], "memory": "host"}, "ssh", "ssh host"),
    ({"addrs": [4096], "memory": "device"}, "local", "device memory"),
    ({"tensors": 8}, "netns", "names no addresses"),
    ({"addrs": ["x"]}, "local", "names no addresses"),
])
def test_where_a_toggle_flipped_is_read_only_where_this_machine_can(event: dict[str, object], kind: str,
                                                                     why: str) -> None:
    addrs, said = where_flipped(event, kind)
    assert (bool(addrs), why in said) == (not why, True)


def test_the_memory_witness_counts_the_bytes_that_flipped_between_corrupted_and_restored() -> None:
    token = Corrupted("source-1", 7, (1, 2, 3), b"\x80\x00\x10")
    seen = memory_witness(token, b"\x7f\xff\xef", held=b"\x80\x00\x10")
    assert seen.effect == "seen" and seen.figures == {"pid": 7, "bytes": 3, "changed": 3, "held": 3}
    # the toggle's word without its deed: the bytes read corrupted and restored are the same
    lied = memory_witness(token, b"\x80\x00\x10", held=b"\x80\x00\x10")
    assert lied.effect == "none" and lied.figures["changed"] == 0
    assert memory_witness(token, None, None).effect == "unwitnessed"
    assert memory_witness(Corrupted("source-1", 7, why="device memory"), b"", None).why == "device memory"
