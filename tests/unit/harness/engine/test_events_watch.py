"""The monitor's wake-up (``harness.engine.watch.EventsWatch``) on real files: it reports an events
file that appears or grows, by process, and never a log beside it; the monitor drains a grown
file between its polls (with inotify), and in both wake modes records events on the run clock
at the time the process wrote them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.engine import watch as watch_module
from harness.engine.processes import ProcessTable, ProcState
from harness.engine.proxies import RunProxies
from harness.engine.waits import RunClock
from harness.engine.watch import EventsWatch, Scraper, Watchers
from harness.hosts.base import LocalHost
from harness.record.timeline import Entry, Timeline
from harness.scenario.models import Budgets, ScrapeSpec

BOUND = 10.0  # seconds: only reached when the wake-up is missing (the test then fails)


def append(path: Path, text: str) -> None:
    with open(path, "a") as out:
        out.write(text)


def drain(watch: EventsWatch) -> set[str]:
    """What the watch reports, until it reports nothing more right away."""
    seen: set[str] = set()
    while grown := watch.wait(0):
        seen |= grown
    return seen


def test_a_file_created_after_the_watch_began_is_reported_and_then_watched(tmp_path: Path) -> None:
    events = tmp_path / "procs" / "source-1.events.jsonl"
    watch = EventsWatch({events: "source-1"})
    try:
        append(events, '{"event": "started"}\n')
        assert watch.wait(BOUND) == {"source-1"}
        drain(watch)
        append(events, '{"event": "heartbeat"}\n')
        assert watch.wait(BOUND) == {"source-1"}
    finally:
        watch.close()


def test_each_grown_file_is_named_by_its_process_and_a_log_never_wakes_it(tmp_path: Path) -> None:
    procs = tmp_path / "procs"
    procs.mkdir()
    a, b = procs / "a.events.jsonl", procs / "b.events.jsonl"
    a.write_text("")
    b.write_text("")
    watch = EventsWatch({a: "server", b: "reader-1"})
    try:
        append(procs / "server.log", "a log line\n")
        assert watch.wait(0.2) == set()  # the log beside them does not count
        append(b, "{}\n")
        assert watch.wait(BOUND) == {"reader-1"}
        append(a, "{}\n")
        append(b, "{}\n")
        seen = watch.wait(BOUND) | drain(watch)
        assert seen == {"server", "reader-1"}
    finally:
        watch.close()


def test_wait_returns_at_its_timeout_when_nothing_grows(tmp_path: Path) -> None:
    events = tmp_path / "x.events.jsonl"
    events.write_text("")
    watch = EventsWatch({events: "x"})
    try:
        assert watch.wait(0.05) == set()
        assert watch.wait(0) == set()
    finally:
        watch.close()


class Run:
    """A monitor over one process's events file (no process: only its events are read)."""

    def __init__(self, tmp_path: Path, wake: str, others: tuple[ProcState, ...] = ()) -> None:
        self.events = tmp_path / "procs" / "source-1.events.jsonl"
        self.events.parent.mkdir(parents=True)
        self.timeline = Timeline()
        self.clock = RunClock(self.timeline, run_budget=60, step_budget=10)
        state = ProcState("source-1", "source", LocalHost(), self.events, tmp_path / "procs" / "source-1.log")
        self.table = ProcessTable(self.timeline, self.clock, [state, *others])
        self.watchers = Watchers(
            timeline=self.timeline, clock=self.clock, table=self.table, proxies=RunProxies("run-x", tmp_path, self.timeline),
            scraper=Scraper(ScrapeSpec(enabled=False), self.table, self.timeline), budgets=Budgets(), on_hang=lambda why: None,
        )
        self.watchers.wake = wake

    def emit(self, event: str, **fields: object) -> float:
        mono = time.monotonic()
        with open(self.events, "a") as out:
            out.write(json.dumps({"event": event, "mono": mono, **fields}) + "\n")
        return mono

    def seen(self, event: str) -> Entry | None:
        return self.clock.wait_entry(lambda e: e.actor == "source-1" and e.f == event, time.monotonic() + BOUND)


@pytest.fixture
def slow_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch_module, "MONITOR_PERIOD", 3 * BOUND)  # no poll within a wait's bound


def test_with_inotify_the_monitor_drains_a_grown_file_between_its_polls(tmp_path: Path, slow_polls: None) -> None:
    run = Run(tmp_path, "inotify")
    run.watchers.start()
    try:
        time.sleep(0.1)  # past the monitor's first poll: only the wake-up can bring what follows
        mono = run.emit("heartbeat", status="READY")
        entry = run.seen("heartbeat")
        assert entry is not None, "the grown events file did not wake the monitor"
        assert entry.t == round(run.timeline.t_of_mono(mono), 6) and entry.get("status") == "READY"  # the timeline keeps microseconds
    finally:
        run.watchers.stop()
    assert run.watchers.monitor_wakes >= 2 and run.watchers.monitor_cpu > 0


def heartbeat(n: int) -> Callable[[Entry], bool]:
    return lambda e: e.f == "heartbeat" and e.get("n") == n


@pytest.mark.parametrize("wake", ["inotify", "poll"])
def test_either_wake_mode_records_events_at_the_time_they_were_written(tmp_path: Path, wake: str) -> None:
    run = Run(tmp_path, wake)
    run.watchers.start()
    try:
        monos = [run.emit("heartbeat", n=i) for i in range(3)]
        entries = [run.clock.wait_entry(heartbeat(i), time.monotonic() + BOUND) for i in range(3)]
    finally:
        run.watchers.stop()
    assert [e.t if e else None for e in entries] == [round(run.timeline.t_of_mono(m), 6) for m in monos]


def test_an_unknown_wake_mode_is_refused(tmp_path: Path) -> None:
    run = Run(tmp_path, "sometimes")
    with pytest.raises(ValueError, match="wake is one of inotify, poll"):
        run.watchers._events_watch()


class PolledHost(LocalHost):
    """A host whose events files are not on this machine's file system (only its polls read them)."""

    events_local = False


def test_the_monitor_watches_the_events_files_a_host_keeps_here_and_only_polls_the_others(tmp_path: Path, slow_polls: None) -> None:
    from harness.hosts.ssh import SshHost

    assert SshHost.events_local is True  # its ``read`` serves the run folder's mirrors (tail -F), which grow here
    remote = ProcState("reader-1", "reader", PolledHost(), tmp_path / "procs" / "reader-1.events.jsonl", tmp_path / "procs" / "reader-1.log")
    run = Run(tmp_path, "inotify", (remote,))
    assert run.table.local_events_files() == {run.events: "source-1"}
    run.watchers.start()
    try:
        time.sleep(0.1)  # past the monitor's first poll
        with open(tmp_path / "procs" / "reader-1.events.jsonl", "a") as out:
            out.write(json.dumps({"event": "attempt_start", "mono": time.monotonic()}) + "\n")
        run.emit("heartbeat", status="READY")  # wakes the monitor: it drains the watched file only
        assert run.seen("heartbeat") is not None
        time.sleep(0.2)
        assert not [e for e in run.timeline.entries() if e.actor == "reader-1"], "an unwatched file was drained between polls"
    finally:
        run.watchers.stop()
    assert [e.f for e in run.timeline.entries() if e.actor == "reader-1"] == ["attempt_start"]  # the final poll reads it
