"""The timeline: dense indices, one clock, thread-safe appends, waits with deadlines, the
frozen History view (time order), fault windows, incarnations and JSONL round trips; its
file sink (a line per entry as it is recorded, one write each, kept by a SIGKILL) and a
torn last line read back."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harness.record.timeline import Entry, History, Timeline, matches

REPO = Path(__file__).resolve().parents[4]


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
    assert not [p for p in tmp_path.iterdir() if p.name != "timeline.jsonl"]  # written via a temporary file, renamed


# ------------------------------------------------------------------------ the file sink


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_sink_has_every_entry_on_disk_as_soon_as_it_is_recorded(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    tl = Timeline(clock=clock)
    tl.append("invoke", "harness", "run", {"seed": 1})  # before the folder existed: written on open
    path = tmp_path / "timeline.jsonl"
    tl.open_sink(path)
    assert tl.sink_path == path
    assert [line["f"] for line in _lines(path)] == ["run"]
    clock.now = 101.25
    tl.append("info", "reader-1", "load_done", {"path": "rdma"}, t=0.5)
    # on disk before the timeline is closed or frozen: nothing is buffered in the harness
    assert _lines(path)[-1] == {"index": 1, "t": 0.5, "type": "info", "actor": "reader-1", "f": "load_done", "value": {"path": "rdma"}}
    tl.append("ok", "harness", "run", {"status": "done"})
    tl.close_sink()
    tl.append("info", "harness", "late")  # after the close: in memory only
    assert len(_lines(path)) == 3 and len(tl) == 4
    again = History.from_jsonl(path)
    assert [e.to_json() for e in again] == [e.to_json() for e in History(tl.entries()[:3])]
    assert again.torn_lines == 0


def test_each_entry_is_one_write_of_one_whole_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[bytes] = []
    real_write = os.write

    def recording_write(fd: int, data: bytes | memoryview) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    tl = Timeline()
    tl.open_sink(tmp_path / "timeline.jsonl")
    big = {"ok": True, "samples": [["mxref_bytes_loaded", {"proc": f"r{i}"}, float(i)] for i in range(2000)]}
    tl.append("info", "reader-1", "scrape", big)
    tl.append("info", "harness", "mark", {"mark": "x"})
    assert len(writes) == 2
    assert all(w.endswith(b"\n") and w.count(b"\n") == 1 for w in writes)
    assert json.loads(writes[0])["value"] == big


def test_lines_from_many_threads_never_interleave(tmp_path: Path) -> None:
    tl = Timeline()
    path = tmp_path / "timeline.jsonl"
    tl.open_sink(path)
    payload = "x" * 5000  # lines of several KiB: a torn or interleaved write would show

    def writer(n: int) -> None:
        for i in range(100):
            tl.append("info", f"w{n}", "scrape" if i % 2 else "tick", {"i": i, "pad": payload})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    tl.close_sink()
    lines = _lines(path)
    assert [line["index"] for line in lines] == list(range(400))  # file order is index order
    assert sorted((line["actor"], line["value"]["i"]) for line in lines) == sorted(  # type: ignore[index]
        (f"w{n}", i) for n in range(4) for i in range(100)
    )


def test_a_failing_write_closes_the_sink_and_recording_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tl = Timeline()
    tl.open_sink(tmp_path / "timeline.jsonl")
    tl.append("info", "harness", "first")

    def full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    entry = tl.append("info", "harness", "second")
    assert entry.index == 1 and len(tl) == 2
    assert tl.sink_path is None and tl.sink_error is not None and "No space left" in tl.sink_error
    monkeypatch.undo()
    tl.append("info", "harness", "third")  # no sink any more: no error
    assert [line["f"] for line in _lines(tmp_path / "timeline.jsonl")] == ["first"]


def test_an_unencodable_value_is_recorded_as_its_repr(tmp_path: Path) -> None:
    tl = Timeline()
    tl.open_sink(tmp_path / "timeline.jsonl")
    loop: dict[str, object] = {}
    loop["self"] = loop
    tl.append("info", "harness", "odd", {"loop": loop, "path": tmp_path})
    tl.append("info", "harness", "after")
    lines = _lines(tmp_path / "timeline.jsonl")
    assert [line["f"] for line in lines] == ["odd", "after"]
    assert "unencodable" in lines[0]["value"]  # type: ignore[operator]


def test_what_was_recorded_before_a_sigkill_is_in_the_file(tmp_path: Path) -> None:
    """A real process records 50 entries through the sink and SIGKILLs itself: no close, no
    flush, no atexit; every entry is in the file."""
    path = tmp_path / "timeline.jsonl"
    code = textwrap.dedent(
        f"""
        import os, signal
        from harness.record.timeline import Timeline
        tl = Timeline()
        tl.open_sink({str(path)!r})
        for i in range(50):
            tl.append("info", "harness", "tick", {{"i": i, "pad": "x" * 3000}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=False)
    assert proc.returncode == -signal.SIGKILL
    history = History.from_jsonl(path)
    assert [e.get("i") for e in history] == list(range(50)) and history.torn_lines == 0


def test_a_torn_last_line_is_dropped_and_counted(tmp_path: Path) -> None:
    tl = Timeline(clock=FakeClock(0.0))
    path = tmp_path / "timeline.jsonl"
    tl.open_sink(path)
    for i in range(3):
        tl.append("info", "p", "tick", {"i": i}, t=float(i))
    tl.close_sink()
    whole = path.read_bytes()
    last = whole.splitlines(keepends=True)[-1]
    for cut in (1, len(last) // 2, len(last) - 2):  # the harness died in the middle of the third write
        path.write_bytes(whole[: len(whole) - len(last) + cut])
        history = History.from_jsonl(path)
        assert ([e.get("i") for e in history], history.torn_lines) == ([0, 1], 1), cut
    path.write_bytes(whole[: len(whole) - 1])  # only the newline is missing: the entry is whole
    assert len(History.from_jsonl(path)) == 3
    path.write_bytes(whole + "{\"index\":3,\"t\":3.0,\"value\":{\"s\":\"\u00e9".encode()[:-1])  # torn inside a UTF-8 character
    assert History.from_jsonl(path).torn_lines == 1


def test_a_bad_line_before_the_last_is_damage_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    good = json.dumps(Entry(0, 0.0, "info", "p", "x").to_json())
    path.write_text(f"{good}\n{{not json\n{good}\n")
    with pytest.raises(ValueError, match=r"timeline.jsonl:2: not a timeline entry"):
        History.from_jsonl(path)


def test_times_are_kept_to_the_microsecond_so_the_file_reads_back_the_same(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    tl = Timeline(clock=clock)
    path = tmp_path / "timeline.jsonl"
    tl.open_sink(path)
    tl.append("info", "b", "x", t=1.0000004)
    tl.append("info", "a", "x", t=1.0000001)  # apart in memory by less than the file keeps
    assert [e.actor for e in tl.snapshot()] == [e.actor for e in History.from_jsonl(path)]
