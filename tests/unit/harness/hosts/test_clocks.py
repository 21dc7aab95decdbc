"""Where a process's event stamps land on the timeline (``harness.hosts.clocks`` and the process
table): the offsets the harness gave an incarnation are taken off its stamps; a stamp that
could not be true (after its receipt, before its incarnation's start) gives way to the receipt
and says why; and a real process in a time namespace has its events placed where they happened."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from harness.engine.processes import ProcessTable, ProcState
from harness.engine.waits import RunClock
from harness.hosts import clocks
from harness.hosts.base import LocalHost, Proc, StopResult
from harness.hosts.clocks import HOST_CLOCKS, STAMP_SLACK_S, ClockOffsets, place
from harness.record.timeline import Entry, Timeline
from harness.scenario import capabilities

OFFSET = 259200.0  # 72 h


class FakeProc:
    """A process that runs until the test says otherwise (it is never signalled here)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        return None

    def wait(self, timeout: float) -> int | None:
        return None

    def signal(self, sig: int, *, group: bool = True) -> bool:
        raise AssertionError("not signalled in these tests")

    def stop(self, grace: float) -> StopResult:
        raise AssertionError("not stopped in these tests")


class SpawnHost(LocalHost):
    """Reads events files as the local host does; spawns nothing, records the argv."""

    def __init__(self) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path) -> Proc:  # type: ignore[override]
        self.argvs.append(list(argv))
        return FakeProc(4000 + len(self.argvs))


class Table:
    """One process, a timeline on a clock the test moves (``now``: the harness's monotonic)."""

    def __init__(self, tmp_path: Path) -> None:
        self.now = 1000.0
        self.timeline = Timeline(t0=900.0, clock=lambda: self.now)
        self.host = SpawnHost()
        self.events = tmp_path / "server-b.events.jsonl"
        self.events.write_text("")
        state = ProcState("server-b", "server", self.host, self.events, tmp_path / "server-b.log")
        self.table = ProcessTable(self.timeline, RunClock(self.timeline, run_budget=60, step_budget=10), [state])

    def spawn(self, clocks: ClockOffsets = HOST_CLOCKS) -> int:
        value = self.table.spawn("server-b", ["mxref", "server"], {}, Path("."), clocks)
        return int(value["pid"])

    def emit(self, event: str, mono: float, pid: int) -> Entry:
        with open(self.events, "a") as out:
            out.write(json.dumps({"event": event, "mono": mono, "pid": pid}) + "\n")
        self.table.drain(["server-b"])
        return [e for e in self.timeline.entries() if e.f == event][-1]


def test_host_clocks_leave_the_argv_alone_and_offsets_start_it_in_a_time_namespace() -> None:
    assert HOST_CLOCKS.none and HOST_CLOCKS.wrap(["a", "b"]) == ["a", "b"]
    wrapped = ClockOffsets(OFFSET, -60).wrap(["python", "-m", "mxref"])
    assert wrapped == ["unshare", "--time", "--monotonic=259200", "--boottime=-60", "--", "python", "-m", "mxref"]


def test_a_wall_clock_offset_preloads_libfaketime_inside_the_time_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clocks, "FAKETIME_LIBRARIES", ("/nonexistent/libfaketimeMT.so.1", __file__))
    wrapped = ClockOffsets(3600, 3600, -2).wrap(["python"])
    assert wrapped == ["unshare", "--time", "--monotonic=3600", "--boottime=3600", "--", "env", f"LD_PRELOAD={__file__}",
                       "FAKETIME=-2", "FAKETIME_DONT_FAKE_MONOTONIC=1", "FAKETIME_NO_CACHE=1", "python"]
    assert ClockOffsets(realtime_s=5).wrap(["python"])[:4] == ["env", f"LD_PRELOAD={__file__}", "FAKETIME=+5",
                                                               "FAKETIME_DONT_FAKE_MONOTONIC=1"]
    monkeypatch.setattr(clocks, "FAKETIME_LIBRARIES", ("/nonexistent/libfaketimeMT.so.1",))
    with pytest.raises(FileNotFoundError, match="apt-get install faketime"):
        ClockOffsets(realtime_s=5).wrap(["python"])


def test_a_start_that_cannot_be_wrapped_records_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clocks, "FAKETIME_LIBRARIES", ("/nonexistent/libfaketimeMT.so.1",))
    run = Table(tmp_path)
    with pytest.raises(FileNotFoundError):
        run.spawn(ClockOffsets(realtime_s=-2))
    assert run.timeline.entries() == [] and run.host.argvs == []


@pytest.mark.parametrize("bad", [1.5, math.inf, math.nan])
def test_an_offset_is_a_whole_number_of_seconds(bad: float) -> None:
    with pytest.raises(ValueError, match="whole number of seconds"):
        ClockOffsets(monotonic_s=bad)


def test_a_stamp_within_its_bounds_is_kept_and_one_outside_gives_way_to_the_receipt() -> None:
    assert place(5.0, started_t=4.0, received_t=6.0) == (5.0, None)
    assert place(6.0 + STAMP_SLACK_S, started_t=4.0, received_t=6.0) == (6.0 + STAMP_SLACK_S, None)  # slack included
    t, why = place(7.0, started_t=4.0, received_t=6.0)
    assert t == 6.0 and why is not None and "1.000s after the harness read it" in why["why"]
    t, why = place(3.0, started_t=4.0, received_t=6.0)
    assert t == 6.0 and why is not None and "1.000s before its incarnation was started" in why["why"]
    assert place(-50.0, started_t=None, received_t=6.0) == (-50.0, None)  # no start known: no lower bound
    t, why = place(math.nan, started_t=4.0, received_t=6.0)
    assert t == 6.0 and why is not None and "not a finite number" in why["why"]


def test_the_declared_offset_is_taken_off_the_incarnations_stamps(tmp_path: Path) -> None:
    run = Table(tmp_path)
    pid = run.spawn(ClockOffsets(OFFSET, OFFSET))
    assert run.host.argvs[0][:4] == ["unshare", "--time", "--monotonic=259200", "--boottime=259200"]
    started = next(e for e in run.timeline.entries() if e.f == "start" and e.type == "ok")
    assert started.value["clocks"] == {"monotonic_s": OFFSET, "boottime_s": OFFSET}
    assert started.value["argv"] == ["mxref", "server"]  # the program, as the scenario named it
    run.now = 1002.0
    entry = run.emit("listening", 1001.5 + OFFSET, pid)  # written at harness mono 1001.5
    assert entry.t == pytest.approx(101.5) and "clock_rejected" not in entry.value


def test_an_offset_nobody_declared_is_not_believed(tmp_path: Path) -> None:
    run = Table(tmp_path)
    pid = run.spawn()
    run.now = 1002.0
    entry = run.emit("listening", 1001.5 + OFFSET, pid)
    assert entry.t == pytest.approx(102.0)  # its receipt, not 72 h from now
    assert entry.value["clock_rejected"]["stamp_t"] == pytest.approx(101.5 + OFFSET)
    assert "after the harness read it" in entry.value["clock_rejected"]["why"]
    entry = run.emit("heartbeat", 1001.0 - OFFSET, pid)  # 72 h behind: before its start
    assert entry.t == pytest.approx(102.0) and "before its incarnation was started" in entry.value["clock_rejected"]["why"]


def test_each_incarnation_keeps_its_own_offset(tmp_path: Path) -> None:
    run = Table(tmp_path)
    first = run.spawn(ClockOffsets(OFFSET, OFFSET))
    st = run.table.state("server-b")
    st.exit_recorded = True  # it ended (the fake proc never does)
    run.now = 1001.0
    second = run.spawn()
    run.now = 1002.0
    late = run.emit("stopped", 1000.5 + OFFSET, first)  # the first incarnation's last word, read late
    assert late.t == pytest.approx(100.5) and late.value["incarnation"] == 1 and "clock_rejected" not in late.value
    now = run.emit("started", 1001.5, second)
    assert now.t == pytest.approx(101.5) and now.value["incarnation"] == 2 and "clock_rejected" not in now.value


@pytest.mark.skipif(bool(capabilities.missing(("root", "unshare", "timens"))), reason="needs root, unshare and time namespaces")
def test_a_real_process_in_a_time_namespace_lands_where_it_wrote(tmp_path: Path) -> None:
    timeline = Timeline()
    events = tmp_path / "p.events.jsonl"
    state = ProcState("p", "server", LocalHost(), events, tmp_path / "p.log")
    table = ProcessTable(timeline, RunClock(timeline, run_budget=60, step_budget=10), [state])
    code = ("import json, os, time\n"
            f"line = json.dumps({{'event': 'hello', 'mono': time.monotonic(), 'pid': os.getpid()}})\n"
            f"open({str(events)!r}, 'a').write(line + '\\n')\n")
    before = timeline.now()
    table.spawn("p", [sys.executable, "-c", code], dict(os.environ), tmp_path, ClockOffsets(OFFSET, OFFSET))
    proc = table.state("p").proc
    assert proc is not None
    deadline = time.monotonic() + 20
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() == 0, (tmp_path / "p.log").read_text()
    table.drain(["p"])
    hello = [e for e in timeline.entries() if e.f == "hello"]
    assert len(hello) == 1 and "clock_rejected" not in hello[0].value
    assert before <= hello[0].t <= timeline.now()  # not 72 h later


@pytest.mark.skipif(bool(capabilities.missing(("faketime",))), reason="needs libfaketime")
def test_a_real_process_with_its_wall_clock_behind_keeps_its_monotonic_clock(tmp_path: Path) -> None:
    code = "import json, time; print(json.dumps([time.time(), time.monotonic()]))"
    out = subprocess.run(ClockOffsets(realtime_s=-3600).wrap([sys.executable, "-c", code]), capture_output=True, text=True,
                         timeout=20, check=True).stdout
    wall, mono = json.loads(out)
    assert wall == pytest.approx(time.time() - 3600, abs=5)
    assert mono == pytest.approx(time.monotonic(), abs=5)
