"""The timeline: dense indices, one clock, thread-safe appends, waits with deadlines, the
frozen History view (time order), fault windows, incarnations and JSONL round trips."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from harness.timeline import Entry, History, Timeline, matches


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_entries_get_dense_indices_and_times_from_run_start() -> None:
    clock = FakeClock(100.0)
    tl = Timeline(clock=clock)
    a = tl.append("invoke", "harness", "step", {"step": "1"})
    clock.now = 101.5
    b = tl.append("ok", "harness", "step", {"step": "1"})
    assert (a.index, a.t) == (0, 0.0)
    assert (b.index, b.t) == (1, 1.5)
    assert tl.t_of_mono(100.25) == 0.25


def test_bad_types_and_times_are_refused() -> None:
    tl = Timeline()
    with pytest.raises(ValueError, match="entry type 'done'"):
        tl.append("done", "harness", "x")
    with pytest.raises(ValueError, match="not finite"):
        tl.append("info", "harness", "x", t=float("nan"))


def test_concurrent_appends_keep_indices_dense() -> None:
    tl = Timeline()

    def writer(n: int) -> None:
        for i in range(200):
            tl.append("info", f"w{n}", "tick", {"i": i})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    entries = tl.entries()
    assert [e.index for e in entries] == list(range(800))


def test_wait_for_returns_a_later_entry_and_gives_up_at_the_deadline() -> None:
    tl = Timeline()
    threading.Timer(0.05, lambda: tl.append("info", "p", "ready")).start()
    got = tl.wait_for(lambda e: e.f == "ready", time.monotonic() + 5)
    assert got is not None and got.actor == "p"
    started = time.monotonic()
    assert tl.wait_for(lambda e: e.f == "never", time.monotonic() + 0.2) is None
    assert 0.15 < time.monotonic() - started < 2.0


def test_wait_for_wakes_on_abort_and_counts_matches() -> None:
    tl = Timeline()
    abort = threading.Event()
    threading.Timer(0.05, abort.set).start()
    assert tl.wait_for(lambda e: False, time.monotonic() + 10, abort=abort) is None
    for i in range(3):
        tl.append("info", "p", "hb", {"i": i})
    third = tl.wait_for(lambda e: e.f == "hb", time.monotonic() + 1, count=3)
    assert third is not None and third.get("i") == 2


def test_scrapes_do_not_count_as_progress() -> None:
    clock = FakeClock(10.0)
    tl = Timeline(clock=clock)
    clock.now = 11.0
    tl.append("info", "p", "heartbeat")
    clock.now = 15.0
    tl.append("info", "p", "scrape", {"ok": True, "samples": []})
    assert tl.last_progress == 11.0


def test_listeners_see_every_entry_and_cannot_break_recording() -> None:
    tl = Timeline()
    seen: list[str] = []
    tl.add_listener(lambda e: seen.append(e.f))

    def broken(_entry: Entry) -> None:
        raise ZeroDivisionError("a listener's own bug")

    tl.add_listener(broken)
    tl.append("info", "p", "x")
    assert seen == ["x"] and len(tl) == 1


def test_history_orders_by_time_and_reindexes() -> None:
    """Process events are ingested late (after the harness action that followed them); the
    frozen view puts them back in time order."""
    tl = Timeline(clock=FakeClock(0.0))
    tl.append("ok", "harness", "step", t=2.0)
    tl.append("info", "reader-1", "load_done", t=1.0)
    h = tl.snapshot()
    assert [(e.index, e.f) for e in h] == [(0, "load_done"), (1, "step")]
    assert h.end == 2.0


def test_select_first_last_and_where() -> None:
    h = History.build(
        [
            (0.1, "info", "s", "status_change", {"status": "READY"}),
            (0.2, "info", "s", "status_change", {"status": "STALE"}),
            (0.3, "info", "s", "status_change", {"status": "READY"}),
            (0.4, "info", "r", "load_done", {"path": "rdma", "integrity": True}),
        ]
    )
    assert [e.t for e in h.select(actor="s", where={"status": "READY"})] == [0.1, 0.3]
    assert h.first(f="status_change").get("status") == "READY"  # type: ignore[union-attr]
    assert h.last(f="status_change", until=0.25).get("status") == "STALE"  # type: ignore[union-attr]
    assert h.select(f=("load_done", "fallback"), since=0.35)[0].actor == "r"
    assert h.actors() == ["s", "r"]


def test_where_matching_is_strict_about_booleans() -> None:
    e = Entry(0, 0.0, "info", "p", "x", {"ok": True, "n": 1})
    assert matches(e, {"ok": True})
    assert not matches(e, {"n": True})
    assert not matches(e, {"missing": 1})
    assert matches(e, {"n": 1.0})


def test_fault_windows_pair_injection_and_heal() -> None:
    h = History.build(
        [
            (1.0, "invoke", "nemesis", "inject", {"fault": "freeze", "kind": "pause", "target": "s"}),
            (1.1, "ok", "nemesis", "inject", {"fault": "freeze", "kind": "pause", "healable": True, "pid": 7}),
            (2.0, "invoke", "nemesis", "inject", {"fault": "kill-2", "kind": "kill", "target": "r"}),
            (2.1, "ok", "nemesis", "inject", {"fault": "kill-2", "kind": "kill", "healable": False}),
            (3.0, "invoke", "nemesis", "heal", {"fault": "freeze"}),
            (3.2, "ok", "nemesis", "heal", {"fault": "freeze"}),
            (4.0, "invoke", "nemesis", "inject", {"fault": "gone", "kind": "pause", "target": "x"}),
            (4.1, "fail", "nemesis", "inject", {"fault": "gone", "error": "x is not running"}),
            (5.0, "invoke", "nemesis", "inject", {"fault": "open", "kind": "pause", "target": "s"}),
            (5.1, "ok", "nemesis", "inject", {"fault": "open", "healable": True}),
        ]
    )
    windows = {w.name: w for w in h.fault_windows()}
    assert (windows["freeze"].start, windows["freeze"].end, windows["freeze"].injected) == (1.0, 3.2, True)
    assert windows["freeze"].value["pid"] == 7
    assert (windows["kill-2"].start, windows["kill-2"].end) == (2.0, 2.1)
    assert (windows["gone"].end, windows["gone"].injected) == (4.1, False)
    assert windows["open"].end is None


def test_incarnations_pair_starts_with_exits() -> None:
    h = History.build(
        [
            (0.5, "ok", "s", "start", {"incarnation": 1, "pid": 10}),
            (1.0, "info", "s", "process_exit", {"incarnation": 1, "rc": -9}),
            (1.5, "ok", "s", "start", {"incarnation": 2, "pid": 11}),
            (3.0, "info", "s", "process_exit", {"incarnation": 2, "rc": 0, "stopped_by_harness": True}),
        ]
    )
    a, b = h.incarnations("s")
    assert (a.pid, a.rc, a.end, a.stopped_by_harness) == (10, -9, 1.0, False)
    assert (b.pid, b.rc, b.stopped_by_harness) == (11, 0, True)


def test_jsonl_round_trip(tmp_path: Path) -> None:
    h = History.build([(0.1, "info", "p", "x", {"a": [1, 2]}), (0.2, "ok", "harness", "run", {})])
    path = tmp_path / "timeline.jsonl"
    h.to_jsonl(path)
    again = History.from_jsonl(path)
    assert [e.to_json() for e in again] == [e.to_json() for e in h]
