"""Typed fault windows read from a timeline: one per injection, with its resolved target, inject
and heal times and outcome (``harness.record.fault_windows``)."""

from __future__ import annotations

from pathlib import Path

from harness.record.fault_windows import FaultEntry, target_text
from harness.record.timeline import Entry, History, Timeline
from harness.spec import SourceOf

N = "nemesis"


def test_a_healed_fault_names_the_target_it_resolved_and_its_times() -> None:
    h = History.build([
        (1.0, "invoke", N, "inject", {"fault": "freeze", "kind": "pause", "target": {"source_of": "reader-1"},
                                      "spec": {"kind": "pause", "target": {"source_of": "reader-1"}}}),
        (1.1, "ok", N, "inject", {"fault": "freeze", "kind": "pause", "target": "source-2", "healable": True, "pid": 7}),
        (3.0, "invoke", N, "heal", {"fault": "freeze", "kind": "pause", "reason": "step"}),
        (3.2, "ok", N, "heal", {"fault": "freeze", "kind": "pause", "reason": "step"}),
    ])
    (w,) = h.fault_windows()
    assert (w.name, w.kind, w.target, w.resolved) == ("freeze", "pause", "source-2", "source-2")
    assert (w.start, w.inject_t, w.heal_t, w.end) == (1.0, 1.1, 3.2, 3.2)
    assert (w.outcome, w.injected, w.heal_reason, w.active_at_teardown, w.error) == ("healed", True, "step", False, None)
    assert w.spec == {"kind": "pause", "target": {"source_of": "reader-1"}} and w.value["pid"] == 7
    assert h[w.index].f == "inject" and h[w.index].type == "invoke"


def test_a_one_shot_fault_is_over_when_its_inject_answers() -> None:
    h = History.build([
        (2.0, "invoke", N, "inject", {"fault": "kill-1", "kind": "kill", "target": "source-1"}),
        (2.1, "ok", N, "inject", {"fault": "kill-1", "kind": "kill", "healable": False, "signal": "SIGKILL"}),
    ])
    (w,) = h.fault_windows()
    assert (w.outcome, w.end, w.heal_t, w.target, w.resolved) == ("healed", 2.1, None, "source-1", None)


def test_a_fault_that_failed_to_inject_says_why() -> None:
    h = History.build([
        (4.0, "invoke", N, "inject", {"fault": "gone", "kind": "pause", "target": {"source_of": "reader-1"}}),
        (4.1, "fail", N, "inject", {"fault": "gone", "kind": "pause", "error": "reader-1 has not started an attempt yet"}),
        (5.0, "invoke", N, "inject", {"fault": "cut", "kind": "partition", "target": "reader-1"}),
        (5.2, "info", N, "inject", {"fault": "cut", "kind": "partition", "indeterminate": True, "error": "interrupted"}),
        (6.0, "invoke", N, "inject", {"fault": "late", "kind": "pause", "target": "source-3"}),
        (6.1, "info", N, "inject", {"fault": "late", "kind": "pause", "skipped": "source-3 is not running"}),
    ])
    gone, cut, late = h.fault_windows()
    assert (gone.outcome, gone.injected, gone.end, gone.indeterminate) == ("failed", False, 4.1, False)
    assert gone.target == "source_of(reader-1)" and gone.error == "reader-1 has not started an attempt yet"
    assert (cut.outcome, cut.indeterminate, cut.error, cut.end) == ("failed", True, "interrupted", 5.2)
    assert (late.outcome, late.error, late.end) == ("skipped", "source-3 is not running", 6.1)
    assert not any(w.active_at_teardown for w in (gone, cut, late))


def test_a_fault_still_active_at_teardown() -> None:
    h = History.build([
        (1.0, "invoke", N, "inject", {"fault": "left", "kind": "pause", "target": "s"}),
        (1.1, "ok", N, "inject", {"fault": "left", "kind": "pause", "healable": True}),
        (2.0, "invoke", N, "inject", {"fault": "stuck", "kind": "stuck_heal", "target": "s"}),
        (2.1, "ok", N, "inject", {"fault": "stuck", "kind": "stuck_heal", "healable": True}),
        (3.0, "invoke", N, "inject", {"fault": "open", "kind": "pause", "target": "s"}),
        # teardown: newest first; stuck's heal overruns, left's completes
        (9.0, "invoke", N, "heal", {"fault": "stuck", "reason": "teardown"}),
        (9.5, "fail", N, "heal", {"fault": "stuck", "reason": "teardown", "error": "did not return within 0.5s (budgets.heal)"}),
        (9.6, "invoke", N, "heal", {"fault": "left", "reason": "teardown"}),
        (9.7, "ok", N, "heal", {"fault": "left", "reason": "teardown"}),
    ])
    left, stuck, still_injecting = h.fault_windows()
    assert (left.outcome, left.heal_reason, left.end, left.active_at_teardown) == ("healed", "teardown", 9.7, True)
    assert (stuck.outcome, stuck.end, stuck.heal_t, stuck.active_at_teardown) == ("active", None, None, True)
    assert stuck.error == "did not return within 0.5s (budgets.heal)"
    # the harness died before the inject answered: it may be in place
    assert (still_injecting.outcome, still_injecting.injected, still_injecting.inject_t) == ("active", False, None)


def test_a_parallel_pair_pairs_up_by_name() -> None:
    h = History.build([
        (1.00, "invoke", N, "inject", {"fault": "cut-a", "kind": "partition", "target": "source-1"}),
        (1.01, "invoke", N, "inject", {"fault": "cut-b", "kind": "partition", "target": "source-2"}),
        (1.05, "ok", N, "inject", {"fault": "cut-b", "healable": True, "host": "b", "peer_host": "r"}),
        (1.08, "ok", N, "inject", {"fault": "cut-a", "healable": True, "host": "a", "peer_host": "r"}),
        (2.00, "ok", N, "heal", {"fault": "cut-b", "reason": "duration"}),
        (2.50, "ok", N, "heal", {"fault": "cut-a", "reason": "step"}),
    ])
    a, b = h.fault_windows()
    assert (a.name, a.start, a.inject_t, a.end, a.hosts, a.heal_reason) == ("cut-a", 1.0, 1.08, 2.5, ("a", "r"), "step")
    assert (b.name, b.start, b.inject_t, b.end, b.hosts, b.heal_reason) == ("cut-b", 1.01, 1.05, 2.0, ("b", "r"), "duration")
    assert [w.name for w in h.fault_windows("cut-b")] == ["cut-b"]


def test_a_name_injected_again_opens_a_new_window() -> None:
    h = History.build([
        (1.0, "invoke", N, "inject", {"fault": "f", "kind": "pause"}),
        (1.1, "ok", N, "inject", {"fault": "f", "healable": True}),
        (2.0, "ok", N, "heal", {"fault": "f"}),
        (3.0, "invoke", N, "inject", {"fault": "f", "kind": "pause"}),
        (3.1, "fail", N, "inject", {"fault": "f", "error": "no"}),
    ])
    first, second = h.fault_windows()
    assert (first.start, first.end, first.outcome) == (1.0, 2.0, "healed")
    assert (second.start, second.end, second.outcome) == (3.0, 3.1, "failed")


def test_windows_read_back_from_the_file_are_the_same(tmp_path: Path) -> None:
    timeline = Timeline(t0=0.0, clock=lambda: 0.0)
    timeline.append("invoke", N, "inject", {"fault": "x", "kind": "pause", "target": {"source_of": "reader-1"}}, t=1.0)
    timeline.append("fail", N, "inject", {"fault": "x", "kind": "pause", "target": {"source_of": "reader-1"},
                                          "error": "no attempt yet"}, t=1.5)
    live = timeline.snapshot().fault_windows()
    timeline.snapshot().to_jsonl(tmp_path / "t.jsonl")
    assert History.from_jsonl(tmp_path / "t.jsonl").fault_windows() == live
    assert live[0].target == "source_of(reader-1)"


def test_a_target_is_written_one_way() -> None:
    assert target_text("reader-1") == "reader-1"
    assert target_text(None) is None
    assert target_text({"source_of": "reader-1"}) == target_text(SourceOf(source_of="reader-1")) == "source_of(reader-1)"


def test_a_fault_entry_is_typed_and_other_entries_are_not_faults() -> None:
    heal = FaultEntry.of(Entry(3, 2.0, "info", N, "heal", {"fault": "f", "reason": "step", "noop": True}))
    assert heal is not None and (heal.action, heal.noop, heal.reason, heal.describe()) == ("heal", True, "step", "fault f ()")
    inject = FaultEntry.of(Entry(1, 1.0, "fail", N, "inject", {"fault": "p", "kind": "latency", "proxy": "px", "error": "e"}))
    assert inject is not None and inject.describe() == "fault p (latency px)" and inject.error == "e"
    assert FaultEntry.of(Entry(0, 0.0, "info", "reader-1", "inject", {"fault": "f"})) is None  # not the nemesis
    assert FaultEntry.of(Entry(0, 0.0, "info", N, "inject", {})) is None  # no fault name
