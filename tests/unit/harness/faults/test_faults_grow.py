"""The grow fault over the fake context: SIGHUP to the source process alone, a bounded wait for its
``manifest_grown``, nothing to heal, and the scenario rule that its target is a source started with
debug hooks and ``grow_tensors``."""

from __future__ import annotations

import textwrap

import pytest
from fixtures.fault_context import FakeContext
from fixtures.hooked_scenario import SCENARIO, problems

from harness.errors import FaultError, ScenarioInvalid
from harness.faults import grow, make_fault
from harness.faults.grow import GrowSpec
from harness.scenario import parse_scenario

GROWING = SCENARIO.replace("options: {debug_hooks: true}}", "options: {debug_hooks: true, grow_tensors: 4}}")


@pytest.fixture
def ctx() -> FakeContext:
    return FakeContext.source_and_reader()


def test_grow_sends_sighup_to_the_source_alone_and_waits_for_manifest_grown(ctx: FakeContext) -> None:
    pid = ctx.procs["source-1"].pid
    ctx.events[("source-1", "manifest_grown")] = {"t": 1.5, "added": 4, "tensors": 8}
    fault = make_fault(GrowSpec(kind="grow", target="source-1", confirm="3s"), "grow")
    injected = fault.inject(ctx)
    witness = injected.record.pop("witness")
    assert witness["effect"] == "seen" and witness["figures"] == {"pid": pid, "added": 4, "tensors": 8, "alive": True}
    assert injected.record == {"target": "source-1", "pid": pid, "signal": "SIGHUP", "added": 4, "tensors": 8,
                               "confirmed_t": 1.5}
    assert ctx.recorded("signal") == [("source-1", pid, "SIGHUP", False)]  # the process only, not its group
    assert ctx.recorded("wait") == [("source-1", "manifest_grown", {}, 3.0)]
    assert not fault.healable


@pytest.mark.parametrize(("added", "alive", "effect"), [
    (4, True, "seen"), (0, True, "none"), (4, False, "none"), (4, None, "seen"), (None, True, "unwitnessed"),
])
def test_a_growths_witness_is_the_tensors_it_added(added: int | None, alive: bool | None, effect: str) -> None:
    assert grow.grow_witness("source-1", 7, {"added": added, "tensors": 8}, alive).effect == effect


def test_an_unconfirmed_growth_is_a_fault_error(ctx: FakeContext) -> None:
    with pytest.raises(FaultError, match="source-1 did not emit manifest_grown within 1s"):
        make_fault(GrowSpec(kind="grow", target="source-1", confirm="1s"), "grow").inject(ctx)


def test_its_target_is_a_hooked_source_that_sets_grow_tensors() -> None:
    parse_scenario(GROWING.replace("FAULT", "{kind: grow, target: source-1}"), "x.yaml")
    assert problems("{kind: grow, target: source-2}") == [
        "x.yaml:9: steps[1].fault.target: a grow fault asks a source's refit through its debug hooks, "
        "and 'source-2' is not started with `options: {debug_hooks: true}`"
    ]
    with pytest.raises(ScenarioInvalid, match="sets none"):
        parse_scenario(textwrap.dedent(SCENARIO.replace("FAULT", "{kind: grow, target: source-1}")), "x.yaml")
