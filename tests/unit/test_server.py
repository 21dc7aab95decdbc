"""The metadata server over real loopback gRPC, with an injected clock.

Pins the ModelExpress server semantics mxref reproduces: bad publishes are
refused with a message (never a gRPC error), READY queries hide silent workers
before the reaper runs, the reaper demotes then deletes, STALE records stay
readable by GetMetadata, and a servicer bug is an INTERNAL error that is counted.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mxref.client import MxClient
from mxref.config import ServerTimers
from mxref.errors import MetadataServerError
from mxref.events import EventLog
from mxref.identity import mx_source_id
from mxref.metrics import ServerMetrics
from mxref.server import (
    EventJournal,
    P2pServicer,
    Reaper,
    SourceRecord,
    Store,
    is_fresh,
    start_metadata_server,
)
from mxref.v1 import p2p_pb2, p2p_pb2_grpc

T0 = 1_800_000_000.0  # a fixed wall-clock instant, seconds
TIMERS = ServerTimers(heartbeat_timeout_s=90, reaper_scan_interval_s=30, gc_timeout_s=3600)
READY = p2p_pb2.SOURCE_STATUS_READY
# The generated stub carries no annotations.
P2P_STUB: Callable[[grpc.Channel], Any] = p2p_pb2_grpc.P2pServiceStub
STALE = p2p_pb2.SOURCE_STATUS_STALE
INITIALIZING = p2p_pb2.SOURCE_STATUS_INITIALIZING


class ManualClock:
    """Wall seconds that move only when a test says so."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Stack:
    clock: ManualClock
    store: Store
    metrics: ServerMetrics
    events_path: Path
    servicer: P2pServicer
    reaper: Reaper
    client: MxClient
    address: str

    def raw_publish(self, request: p2p_pb2.PublishMetadataRequest) -> p2p_pb2.PublishMetadataResponse:
        """Send a request MxClient's typed signature would not let us build."""
        with grpc.insecure_channel(self.address) as channel:
            response: p2p_pb2.PublishMetadataResponse = P2P_STUB(channel).PublishMetadata(
                request, timeout=5
            )
        return response

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        lines = self.events_path.read_text().splitlines() if self.events_path.exists() else []
        records = [json.loads(line) for line in lines]
        return [r for r in records if name is None or r["event"] == name]


def identity(model: str = "acme/model-a", tp: int = 1) -> p2p_pb2.SourceIdentity:
    return p2p_pb2.SourceIdentity(
        mx_version="0.1.0", model_name=model, backend_framework=p2p_pb2.VLLM, tensor_parallel_size=tp, dtype="float16"
    )


def out_of_enum(value: int) -> p2p_pb2.SourceStatus:
    """A status number outside the enum, as a peer may send it (proto3 enums are open)."""
    return cast("p2p_pb2.SourceStatus", value)


def worker(rank: int = 0, status: p2p_pb2.SourceStatus = p2p_pb2.SOURCE_STATUS_UNKNOWN) -> p2p_pb2.WorkerMetadata:
    return p2p_pb2.WorkerMetadata(
        worker_rank=rank,
        status=status,
        metadata_endpoint="127.0.0.1:5555",
        agent_name=f"agent-{rank}",
        worker_grpc_endpoint="127.0.0.1:6555",
        accelerator="cpu",
    )


def make_stack(tmp_path: Path, store: Store | None = None, clock: ManualClock | None = None) -> Iterator[Stack]:
    clock = clock if clock is not None else ManualClock()
    events_path = tmp_path / "events.jsonl"
    events = EventLog(events_path, "server", "server")
    if store is None:  # not `or`: an empty Store is falsy
        store = Store(clock, listener=EventJournal(events))
    metrics = ServerMetrics()
    servicer = P2pServicer(store, TIMERS, metrics=metrics.server)
    reaper = Reaper(store, TIMERS, metrics=metrics.server)
    server, port = start_metadata_server(servicer, "127.0.0.1", 0)
    address = f"127.0.0.1:{port}"
    client = MxClient(address, timeout_s=5)
    try:
        yield Stack(clock, store, metrics, events_path, servicer, reaper, client, address)
    finally:
        client.close()
        server.stop(0).wait(5)
        events.close()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    yield from make_stack(tmp_path)


def publish(stack: Stack, worker_id: str, *, model: str = "acme/model-a", rank: int = 0,
            status: p2p_pb2.SourceStatus = p2p_pb2.SOURCE_STATUS_UNKNOWN) -> str:
    response = stack.client.publish_metadata(identity(model), worker(rank, status), worker_id)
    assert response.success, response.message
    return response.mx_source_id


def scrape(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Serve ``metrics`` on a loopback port and read /metrics over HTTP."""
    port = metrics.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        metrics.close()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


# --- PublishMetadata ----------------------------------------------------------


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        ({"worker": worker(), "worker_id": "w1"}, "identity is missing"),
        ({"identity": identity(model=""), "worker": worker(), "worker_id": "w1"}, "identity.model_name is empty"),
        ({"identity": identity(model="  "), "worker": worker(), "worker_id": "w1"}, "identity.model_name is empty"),
        ({"identity": identity(), "worker": worker(), "worker_id": ""}, "worker_id is empty"),
        ({"identity": identity(), "worker_id": "w1"}, "worker is missing"),
        ({"identity": identity(), "worker": worker(status=out_of_enum(7)), "worker_id": "w1"}, "worker.status 7 is not a SourceStatus"),
    ],
    ids=["no-identity", "empty-model", "blank-model", "empty-worker-id", "no-worker", "bad-status"],
)
def test_publish_rejects_with_a_message(stack: Stack, request_fields: dict[str, Any], expected: str) -> None:
    request = p2p_pb2.PublishMetadataRequest(**request_fields)
    response = stack.raw_publish(request)
    assert not response.success
    assert expected in response.message
    assert response.mx_source_id == ""
    assert len(stack.store) == 0
    assert stack.events("source_published") == []


def test_publish_lists_every_problem_at_once(stack: Stack) -> None:
    response = stack.raw_publish(p2p_pb2.PublishMetadataRequest())
    assert not response.success
    for problem in ("identity is missing", "worker_id is empty", "worker is missing"):
        assert problem in response.message


def test_publish_stores_initializing_stamped_with_the_server_computed_id(stack: Stack) -> None:
    response = stack.client.publish_metadata(identity(), worker(rank=3), "w1")
    assert response.success
    assert response.mx_source_id == mx_source_id(identity())
    assert response.worker_id == "w1"
    got = stack.client.get_metadata(response.mx_source_id, "w1")
    assert got.found
    assert got.worker.status == INITIALIZING
    assert got.worker.updated_at == int(T0 * 1000)
    assert got.worker.worker_rank == 3
    assert got.identity.model_name == "acme/model-a"
    [event] = stack.events("source_published")
    assert event["mx_source_id"] == response.mx_source_id
    assert event["worker_id"] == "w1"
    assert event["worker_rank"] == 3
    assert event["status"] == "INITIALIZING"


def test_publish_keeps_a_given_status(stack: Stack) -> None:
    sid = publish(stack, "w1", status=READY)
    assert stack.client.get_metadata(sid, "w1").worker.status == READY


def test_republish_replaces_the_record(stack: Stack) -> None:
    sid = publish(stack, "w1", status=READY)
    stack.clock.advance(5)
    response = stack.client.publish_metadata(identity(), worker(rank=0), "w1")
    assert response.success
    got = stack.client.get_metadata(sid, "w1")
    assert got.worker.status == INITIALIZING
    assert got.worker.updated_at == int((T0 + 5) * 1000)
    assert len(stack.store) == 1


# --- ListSources --------------------------------------------------------------


def test_list_filters(stack: Stack) -> None:
    a = publish(stack, "a0", model="acme/model-a", rank=0, status=READY)
    stack.clock.advance(1)
    publish(stack, "a1", model="acme/model-a", rank=1, status=READY)
    stack.clock.advance(1)
    b = publish(stack, "b0", model="acme/model-b", rank=0)
    c = stack.client

    def ids(refs: list[p2p_pb2.SourceInstanceRef]) -> list[str]:
        return [r.worker_id for r in refs]

    assert ids(c.list_sources()) == ["b0", "a1", "a0"]  # newest first
    assert ids(c.list_sources(identity=p2p_pb2.SourceIdentity())) == ["b0", "a1", "a0"]  # empty model: any source
    assert ids(c.list_sources(identity=identity("acme/model-a"))) == ["a1", "a0"]
    assert ids(c.list_sources(identity=identity("ACME/Model-A"))) == ["a1", "a0"]  # the id is case-insensitive
    assert ids(c.list_sources(identity=identity("acme/model-a", tp=2))) == []
    assert ids(c.list_sources(status_filter=READY)) == ["a1", "a0"]
    assert ids(c.list_sources(status_filter=INITIALIZING)) == ["b0"]
    assert ids(c.list_sources(worker_rank=0)) == ["b0", "a0"]
    assert ids(c.list_sources(model_name="acme/model-b")) == ["b0"]
    assert ids(c.list_sources(min_updated_at=int((T0 + 1) * 1000))) == ["b0", "a1"]
    assert ids(c.list_sources(limit=2)) == ["b0", "a1"]
    assert ids(c.list_sources(identity=identity("acme/model-a"), worker_rank=0, status_filter=READY)) == ["a0"]

    [ref] = c.list_sources(worker_rank=0, model_name="acme/model-a")
    assert (ref.mx_source_id, ref.model_name, ref.accelerator, ref.status) == (a, "acme/model-a", "cpu", READY)
    assert ref.updated_at == int(T0 * 1000)
    assert b != a


def test_ready_query_hides_silent_workers_before_the_reaper_runs(stack: Stack) -> None:
    """Query-time freshness (ModelExpress #491): READY alone is not enough, it must be recent."""
    sid = publish(stack, "w1", status=READY)
    stack.clock.advance(90)
    assert [r.worker_id for r in stack.client.list_sources(status_filter=READY)] == ["w1"]  # exactly at the limit
    stack.clock.advance(0.001)
    assert stack.client.list_sources(status_filter=READY) == []
    assert [r.status for r in stack.client.list_sources()] == [READY]  # still READY, only hidden
    assert stack.client.update_status(sid, "w1", 0, READY).success  # a heartbeat makes it fresh again
    assert [r.worker_id for r in stack.client.list_sources(status_filter=READY)] == ["w1"]


def test_ready_record_with_no_timestamp_is_never_fresh(tmp_path: Path) -> None:
    record = SourceRecord("sid", "w", identity(), worker(), READY, updated_at_ms=0)
    assert not is_fresh(record, now_ms=1, heartbeat_timeout_s=90)
    for stack in make_stack(tmp_path, clock=ManualClock(now=0.0)):
        publish(stack, "w1", status=READY)  # stamped at the epoch: updated_at == 0
        assert stack.client.list_sources(status_filter=READY) == []
        assert len(stack.client.list_sources()) == 1


class FailingStore(Store):
    """A backend that fails on reads, to pin how the server reports it."""

    def snapshot(self) -> list[SourceRecord]:
        raise RuntimeError("backend down")

    def get(self, mx_source_id: str, worker_id: str) -> SourceRecord | None:
        raise RuntimeError("boom")


def test_backend_failure_reads_as_no_sources_and_is_counted(tmp_path: Path) -> None:
    for stack in make_stack(tmp_path, store=FailingStore(ManualClock())):
        publish(stack, "w1", status=READY)
        assert stack.client.list_sources() == []
        samples = scrape(stack.metrics)
        assert samples[("mxref_server_rpcs_total", (("method", "ListSources"), ("result", "error")))] == 1


def test_servicer_exception_is_internal_with_a_message_and_counted(tmp_path: Path) -> None:
    for stack in make_stack(tmp_path, store=FailingStore(ManualClock())):
        with pytest.raises(MetadataServerError) as caught:
            stack.client.get_metadata("sid", "w1")
        assert caught.value.code == grpc.StatusCode.INTERNAL
        assert "boom" in str(caught.value)
        assert not caught.value.retryable
        samples = scrape(stack.metrics)
        assert samples[("mxref_server_rpcs_total", (("method", "GetMetadata"), ("result", "error")))] == 1
        assert stack.client.update_status("sid", "w1", 0, READY).success is False  # server still serves


# --- GetMetadata / UpdateStatus ---------------------------------------------------


@pytest.mark.parametrize(("sid", "wid"), [("", "w1"), ("abc", ""), ("", "")])
def test_get_metadata_with_empty_ids_is_not_found(stack: Stack, sid: str, wid: str) -> None:
    publish(stack, "w1")
    assert stack.client.get_metadata(sid, wid).found is False


def test_get_metadata_of_unknown_worker_is_not_found(stack: Stack) -> None:
    sid = publish(stack, "w1")
    assert stack.client.get_metadata(sid, "w2").found is False
    assert stack.client.get_metadata("0000000000000000", "w1").found is False


def test_get_metadata_returns_stale_records(stack: Stack) -> None:
    sid = publish(stack, "w1", status=READY)
    assert stack.client.update_status(sid, "w1", 0, STALE).success
    got = stack.client.get_metadata(sid, "w1")
    assert got.found
    assert got.worker.status == STALE
    assert got.worker.worker_grpc_endpoint == "127.0.0.1:6555"


@pytest.mark.parametrize(
    ("sid_known", "wid", "rank", "status", "expected"),
    [
        (False, "w1", 0, READY, "no worker 'w1' is published"),
        (True, "w2", 0, READY, "no worker 'w2' is published"),
        (True, "w1", 1, READY, "worker_rank 1 does not match the rank 0"),
        (True, "", 0, READY, "mx_source_id and worker_id are both required"),
        (True, "w1", 0, p2p_pb2.SOURCE_STATUS_UNKNOWN, "status UNKNOWN cannot be reported"),
        (True, "w1", 0, out_of_enum(9), "status 9 cannot be reported"),
    ],
    ids=["unknown-source", "unknown-worker", "wrong-rank", "no-worker-id", "unknown-status", "out-of-enum"],
)
def test_update_status_rejections(
    stack: Stack, sid_known: bool, wid: str, rank: int, status: p2p_pb2.SourceStatus, expected: str
) -> None:
    sid = publish(stack, "w1")
    response = stack.client.update_status(sid if sid_known else "0000000000000000", wid, rank, status)
    assert response.success is False
    assert expected in response.message
    assert stack.client.get_metadata(sid, "w1").worker.status == INITIALIZING


def test_update_status_is_a_heartbeat_and_emits_only_on_change(stack: Stack) -> None:
    sid = publish(stack, "w1")
    stack.clock.advance(10)
    assert stack.client.update_status(sid, "w1", 0, READY).success
    stack.clock.advance(10)
    assert stack.client.update_status(sid, "w1", 0, READY).success
    assert stack.client.get_metadata(sid, "w1").worker.updated_at == int((T0 + 20) * 1000)
    [change] = stack.events("source_status")
    assert (change["status"], change["previous"], change["by"]) == ("READY", "INITIALIZING", "rpc")


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


# --- metrics --------------------------------------------------------------------


def test_metrics_count_rpcs_sources_and_reaper_actions(stack: Stack) -> None:
    sid = publish(stack, "w1", status=READY)
    publish(stack, "w2")
    stack.client.publish_metadata(identity(model=""), worker(), "w3")  # rejected
    stack.client.update_status(sid, "w1", 0, READY)
    stack.client.update_status(sid, "nope", 0, READY)  # rejected
    stack.client.get_metadata(sid, "w1")
    stack.client.list_sources()
    stack.clock.advance(91)
    stack.reaper.scan_once()

    samples = scrape(stack.metrics)

    def rpcs(method: str, result: str) -> float:
        return samples.get(("mxref_server_rpcs_total", (("method", method), ("result", result))), 0.0)

    assert rpcs("PublishMetadata", "ok") == 2
    assert rpcs("PublishMetadata", "rejected") == 1
    assert rpcs("UpdateStatus", "ok") == 1
    assert rpcs("UpdateStatus", "rejected") == 1
    assert rpcs("GetMetadata", "ok") == 1
    assert rpcs("ListSources", "ok") == 1
    assert samples[("mxref_server_rpc_seconds_count", (("method", "PublishMetadata"),))] == 3
    assert samples[("mxref_server_sources", (("status", "STALE"),))] == 2
    assert samples[("mxref_server_sources", (("status", "READY"),))] == 0
    assert samples[("mxref_server_reaper_actions_total", (("action", "mark_stale"),))] == 2


def test_events_replay_to_the_stored_status_under_concurrency(tmp_path: Path) -> None:
    """Events are written under the store's lock, so replaying them gives the true final status
    even when heartbeats and reaper demotions race."""
    clock = ManualClock()
    events_path = tmp_path / "race.jsonl"
    events = EventLog(events_path, "server", "server")
    store = Store(clock, listener=EventJournal(events))
    sid = store.publish(identity(), worker(), "w1", READY).mx_source_id
    always_stale = ServerTimers(heartbeat_timeout_s=0.001, reaper_scan_interval_s=1, gc_timeout_s=1e9)
    reaper = Reaper(store, always_stale)
    clock.advance(1)  # from here on every record looks silent to the reaper

    def heartbeats() -> None:
        for _ in range(300):
            store.update_status(sid, "w1", 0, READY)

    def sweeps() -> None:
        for _ in range(300):
            reaper.scan_once()

    threads = [threading.Thread(target=heartbeats), threading.Thread(target=sweeps)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    events.close()
    replayed = None
    for line in events_path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] in ("source_published", "source_status"):
            replayed = event["status"]
    record = store.get(sid, "w1")
    assert record is not None
    assert replayed == {READY: "READY", STALE: "STALE"}[record.status]
