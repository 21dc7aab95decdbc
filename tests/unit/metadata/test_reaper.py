"""The reaper over a real server: it demotes silent workers to STALE, then deletes them; a
heartbeat revives a demoted worker; the thread scans on its interval."""

from __future__ import annotations

import time
from pathlib import Path

from fixtures.metadata_stack import (
    READY,
    STALE,
    ManualClock,
    Stack,
    identity,
    publish,
    worker,
)

from mxref.config import ServerTimers
from mxref.metadata.reaper import Reaper
from mxref.metadata.store import Store

# --- reaper ---------------------------------------------------------------------


def test_reaper_marks_stale_then_deletes(stack: Stack) -> None:
    ready = publish(stack, "ready", status=READY)
    init = publish(stack, "init")
    stack.clock.advance(60)
    fresh = publish(stack, "fresh", status=READY)

    stack.clock.advance(30)  # ready/init are exactly 90 s old: not yet
    assert stack.reaper.scan_once() == []
    stack.clock.advance(1)
    done = stack.reaper.scan_once()
    assert sorted((d.action.value, d.record.worker_id) for d in done) == [("mark_stale", "init"), ("mark_stale", "ready")]
    assert stack.client.get_metadata(ready, "ready").worker.status == STALE  # still readable
    assert stack.client.get_metadata(init, "init").worker.status == STALE
    assert stack.client.get_metadata(fresh, "fresh").worker.status == READY
    stale_events = {(e["worker_id"], e["previous"]) for e in stack.events("source_status") if e["by"] == "reaper"}
    assert stale_events == {("ready", "READY"), ("init", "INITIALIZING")}

    stack.clock.advance(3600 - 91)  # ages count from the last heartbeat, not from the demotion
    done = stack.reaper.scan_once()
    assert [(d.action.value, d.record.worker_id) for d in done] == [("mark_stale", "fresh")]
    stack.clock.advance(1)
    done = stack.reaper.scan_once()
    assert sorted((d.action.value, d.record.worker_id) for d in done) == [("delete", "init"), ("delete", "ready")]
    assert stack.client.get_metadata(ready, "ready").found is False
    assert {e["worker_id"] for e in stack.events("source_deleted")} == {"ready", "init"}
    assert all(e["by"] == "reaper" for e in stack.events("source_deleted"))
    assert [r.worker_id for r in stack.client.list_sources()] == ["fresh"]


def test_heartbeat_after_demotion_revives_the_worker(stack: Stack) -> None:
    sid = publish(stack, "w1", status=READY)
    stack.clock.advance(91)
    stack.reaper.scan_once()
    assert stack.client.update_status(sid, "w1", 0, READY).success
    assert [r.worker_id for r in stack.client.list_sources(status_filter=READY)] == ["w1"]


def test_reaper_thread_scans_on_its_interval(tmp_path: Path) -> None:
    clock = ManualClock()
    store = Store(clock)
    fast = ServerTimers(heartbeat_timeout_s=1, reaper_scan_interval_s=0.02, gc_timeout_s=1000)
    store.publish(identity(), worker(status=READY), "w1", READY)
    reaper = Reaper(store, fast)
    reaper.start()
    try:
        clock.advance(2)
        deadline = time.monotonic() + 5
        while store.count(STALE) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.count(STALE) == 1
    finally:
        assert reaper.stop(timeout_s=5)
