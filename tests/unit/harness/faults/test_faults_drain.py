"""The drain fault over the fake context: SIGHUP to the source process alone, a bounded wait for its
``drain_started``, nothing to heal, and the scenario rule that its target is a source started with
debug hooks."""

from __future__ import annotations

import pytest
from fixtures.fault_context import FakeContext
from fixtures.hooked_scenario import parses, problems

from harness.errors import FaultError
from harness.faults import make_fault
from harness.faults.drain import DrainSpec


@pytest.fixture
def ctx() -> FakeContext:
    return FakeContext.source_and_reader()


def test_drain_sends_sighup_to_the_source_alone_and_waits_for_drain_started(ctx: FakeContext) -> None:
    pid = ctx.procs["source-1"].pid
    ctx.events[("source-1", "drain_started")] = {"t": 2.5, "live": 1, "timeout_s": 5.0}
    fault = make_fault(DrainSpec(kind="drain", target="source-1", confirm="3s"), "refit")
    injected = fault.inject(ctx)
    assert injected.record == {"target": "source-1", "pid": pid, "signal": "SIGHUP", "live": 1, "timeout_s": 5.0,
                               "confirmed_t": 2.5}
    assert ctx.recorded("signal") == [("source-1", pid, "SIGHUP", False)]  # the process only, not its group
    assert ctx.recorded("wait") == [("source-1", "drain_started", {}, 3.0)]
    assert ctx.procs["source-1"].alive and not fault.healable


def test_an_unconfirmed_drain_is_a_fault_error(ctx: FakeContext) -> None:
    with pytest.raises(FaultError, match="source-1 did not emit drain_started within 1s"):
        make_fault(DrainSpec(kind="drain", target="source-1", confirm="1s"), "refit").inject(ctx)


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
