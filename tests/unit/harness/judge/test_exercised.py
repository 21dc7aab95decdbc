"""The first stage of a verdict (``harness.judge.exercised``): each fault's witness read from the
run, and a run whose fault had no effect judged NOT EXERCISED, never PASS nor FAIL."""

from __future__ import annotations

from typing import Any

import pytest

from harness.checks import NamedResult
from harness.judge.exercised import fault_witness, not_exercised
from harness.judge.verdict import verdict_of
from harness.record.timeline import History
from harness.record.witness import Witness, combined

N = "nemesis"
SEEN = Witness.seen("all 3 threads of pid 7 in state T", pid=7, threads=3).to_json()
NONE = Witness.none("chain mxc-1: 0 packets (no hook jumps to it)", packets=0).to_json()


def healed_fault(kind: str, inject: dict[str, Any] | None, heal: dict[str, Any] | None, **spec: Any) -> History:
    return History.build([
        (1.0, "invoke", N, "inject", {"fault": "f", "kind": kind, "target": "s", "spec": {"kind": kind, **spec}}),
        (1.1, "ok", N, "inject", {"fault": "f", "kind": kind, "target": "s", "healable": True,
                                  **({"witness": inject} if inject else {})}),
        (3.0, "ok", N, "heal", {"fault": "f", "kind": kind, "reason": "step", **({"witness": heal} if heal else {})}),
    ])


def kill(rows: list[tuple[float, str, str, str, dict[str, Any]]], signal: str = "SIGKILL") -> History:
    return History.build([
        (0.1, "ok", "s", "start", {"incarnation": 1, "pid": 40}),
        (1.0, "invoke", N, "inject", {"fault": "k", "kind": "kill", "target": "s"}),
        (1.1, "ok", N, "inject", {"fault": "k", "kind": "kill", "target": "s", "pid": 40, "signal": signal}),
        *rows,
    ])


def test_a_window_reads_the_witnesses_of_its_inject_and_its_heal() -> None:
    (w,) = healed_fault("pause", SEEN, NONE).fault_windows()
    assert [x.at for x in w.witnesses] == ["inject", "heal"]
    assert w.witness is not None and w.witness.effect == "none"  # it did not hold until its heal


@pytest.mark.parametrize(("effects", "combined_effect"), [
    (("seen", "seen"), "seen"), (("seen", "none"), "none"), (("unwitnessed", "seen"), "seen"),
    (("unwitnessed",), "unwitnessed"), ((), None),
])
def test_witnesses_combine_with_no_effect_first(effects: tuple[str, ...], combined_effect: str | None) -> None:
    one = combined(Witness(e, "") for e in effects)  # type: ignore[arg-type]
    assert (one.effect if one else None) == combined_effect


def test_a_record_that_is_not_a_witness_is_none() -> None:
    assert Witness.of({"effect": "maybe"}) is None and Witness.of("seen") is None and Witness.of(None) is None


def test_a_fault_without_effect_makes_the_run_not_exercised_naming_it_and_its_witness() -> None:
    history = healed_fault("partition", None, NONE)
    (why,) = not_exercised(history)
    assert why == "fault f (partition s): no effect: chain mxc-1: 0 packets (no hook jumps to it)"
    ok = [NamedResult(0, "loaded", "loaded", True, "ok")]
    bad = [NamedResult(0, "loaded", "loaded", False, "no")]
    assert verdict_of("completed", ok, None, [why]) == "not_exercised"  # never PASS
    assert verdict_of("completed", bad, None, [why]) == "not_exercised"  # never FAIL
    assert verdict_of("completed", bad, "a defect", [why]) == "not_exercised"
    assert verdict_of("hang", ok, None, [why]) == "hang" and verdict_of("skipped", [], None, [why]) == "skip"
    assert verdict_of("completed", ok) == "pass"


def test_a_failed_inject_with_a_witness_of_no_effect_is_not_exercised_with_its_step_still_failed() -> None:
    never = Witness.none("source-1 (pid 7) never began a drain: no drain_started within 10s", pid=7).to_json()
    history = History.build([
        (1.0, "invoke", N, "inject", {"fault": "d", "kind": "drain", "target": "s", "spec": {"kind": "drain"}}),
        (11.0, "fail", N, "inject", {"fault": "d", "kind": "drain", "target": "s",
                                     "error": "s did not emit drain_started within 10s", "witness": never}),
    ])
    (w,) = history.fault_windows()
    assert (w.outcome, w.injected) == ("failed", False)
    (why,) = not_exercised(history)
    assert why == "fault d (drain s): no effect: source-1 (pid 7) never began a drain: no drain_started within 10s"
    bad = [NamedResult(0, "loaded", "loaded", False, "no")]
    assert verdict_of("step_failed", bad, None, [why]) == "not_exercised"  # the failed step: not the system's FAIL
    assert verdict_of("step_failed", bad) == "fail"
    # a failed inject that measured nothing judges nothing
    plain = History.build([
        (1.0, "invoke", N, "inject", {"fault": "d", "kind": "drain", "target": "s"}),
        (2.0, "fail", N, "inject", {"fault": "d", "kind": "drain", "target": "s", "error": "refused"}),
    ])
    assert not_exercised(plain) == [] and fault_witness(plain.fault_windows()[0], plain) is None


def test_a_negative_control_expects_no_effect() -> None:
    assert not_exercised(healed_fault("partition", None, NONE, expect_effect=False)) == []
    (why,) = not_exercised(healed_fault("partition", None, SEEN, expect_effect=False))
    assert "a negative control (expect_effect: false): effect seen" in why


def test_a_kind_without_a_witness_is_not_witnessed_and_judges_nothing() -> None:
    history = healed_fault("toxic", None, None)
    (w,) = history.fault_windows()
    witness = fault_witness(w, history)
    assert witness is not None and witness.effect == "unwitnessed" and "toxic" in witness.why
    assert not_exercised(history) == []


def test_a_kill_is_witnessed_by_the_exit_the_harness_saw() -> None:
    history = kill([(1.2, "info", "s", "process_exit", {"incarnation": 1, "rc": -9})])
    (w,) = history.fault_windows()
    witness = fault_witness(w, history)
    assert witness is not None and witness.effect == "seen"
    assert dict(witness.figures) == {"pid": 40, "rc": -9, "after_s": 0.1, "by_signal": True}
    assert not_exercised(history) == []


def test_a_kill_the_target_outlived_is_no_effect() -> None:
    history = kill([(9.0, "info", "s", "process_exit", {"incarnation": 1, "rc": -15, "stopped_by_harness": True})],
                   signal="SIGTERM")
    (why,) = not_exercised(history)
    assert why == "fault k (kill s): no effect: s (pid 40) outlived the SIGTERM: the harness stopped it 7.9s later"


def test_a_signal_that_need_not_end_a_process_is_not_witnessed() -> None:
    history = kill([], signal="SIGCONT")
    (w,) = history.fault_windows()
    witness = fault_witness(w, history)
    assert witness is not None and witness.effect == "unwitnessed"


SCENARIO = """\
name: t
processes:
  server: {role: server}
  source-1: {role: source}
steps:
  - start: [server, source-1]
"""


def test_expect_effect_is_a_boolean_of_every_fault_named_with_its_line() -> None:
    from harness.errors import ScenarioInvalid
    from harness.scenario import parse_scenario

    sc = parse_scenario(SCENARIO + "  - fault: {kind: pause, target: source-1, expect_effect: false}\n", "t.yaml")
    assert sc.model_dump(mode="json")["steps"][1]["fault"]["expect_effect"] is False
    with pytest.raises(ScenarioInvalid) as err:
        parse_scenario(SCENARIO + "  - fault: {kind: pause, target: source-1, expect_effect: maybe}\n", "t.yaml")
    assert "t.yaml:7" in str(err.value) and "expect_effect" in str(err.value)
