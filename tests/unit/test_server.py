"""The metadata server over real loopback gRPC, with an injected clock.

Pins the ModelExpress server semantics mxref reproduces: bad publishes are
refused with a message (never a gRPC error), READY queries hide silent workers
before the reaper runs, the reaper demotes then deletes, STALE records stay
readable by GetMetadata, and a servicer bug is an INTERNAL error that is counted.

And the limits mxref adds (a server that trusts no client): each size, count,
range and enum limit refuses with INVALID_ARGUMENT naming the field, the size and
the limit, a rank past uint32 is refused rather than truncated, a client over its
write rate or a full store gets RESOURCE_EXHAUSTED, and every refusal is counted.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from fixtures.wire import field
from prometheus_client.parser import text_string_to_metric_families

from mxref.__main__ import build_parser
from mxref.config import ServerLimits, ServerTimers
from mxref.errors import MetadataServerError
from mxref.events import EventLog
from mxref.identity import mx_source_id
from mxref.metadata.limits import ClientBuckets
from mxref.metadata.main import server_limits
from mxref.metadata.query import SourceQuery, is_fresh, reap_action
from mxref.metadata.reaper import Reaper
from mxref.metadata.records import EventJournal, ReapAction, SourceRecord, UpdateRejected
from mxref.metadata.servicer import P2pServicer
from mxref.metadata.store import Store
from mxref.metadata.transport import GRPC_IMPLS, start_metadata_server
from mxref.metrics import ServerMetrics
from mxref.roles.client import MxClient
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


def make_stack(
    tmp_path: Path,
    store: Store | None = None,
    clock: ManualClock | None = None,
    *,
    grpc_impl: str,
    limits: ServerLimits | None = None,
    rate_clock: Callable[[], float] = time.monotonic,
) -> Generator[Stack, None, None]:
    clock = clock if clock is not None else ManualClock()
    events_path = tmp_path / "events.jsonl"
    events = EventLog(events_path, "server", "server")
    if store is None:  # not `or`: an empty Store is falsy
        store = Store(clock, listener=EventJournal(events))
    metrics = ServerMetrics()
    servicer = P2pServicer(store, TIMERS, metrics=metrics.server, limits=limits, rate_clock=rate_clock)
    reaper = Reaper(store, TIMERS, metrics=metrics.server)
    server, port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl=grpc_impl)
    address = f"127.0.0.1:{port}"
    client = MxClient(address, timeout_s=5)
    try:
        yield Stack(clock, store, metrics, events_path, servicer, reaper, client, address)
    finally:
        client.close()
        server.stop(0).wait(5)
        events.close()


@pytest.fixture(params=GRPC_IMPLS)
def grpc_impl(request: pytest.FixtureRequest) -> str:
    """Each server test runs on both gRPC implementations: answers, counts and events agree."""
    name: str = request.param
    return name


@pytest.fixture
def stack(tmp_path: Path, grpc_impl: str) -> Iterator[Stack]:
    yield from make_stack(tmp_path, grpc_impl=grpc_impl)


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
    ],
    ids=["no-identity", "empty-model", "blank-model", "empty-worker-id", "no-worker"],
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


def test_a_listing_follows_every_heartbeat_although_each_ref_is_encoded_once(stack: Stack) -> None:
    sid = publish(stack, "w1", status=INITIALIZING)
    [before] = stack.client.list_sources()  # encodes (and keeps) the record's ref
    stack.clock.advance(2)
    assert stack.client.update_status(sid, "w1", 0, READY).success
    [after] = stack.client.list_sources()
    assert (before.status, after.status) == (INITIALIZING, READY)
    assert after.updated_at - before.updated_at == 2000
    record = stack.store.get(sid, "w1")
    assert record is not None and record.listed == p2p_pb2.ListSourcesResponse(instances=[record.instance_ref()]).SerializeToString()


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


def test_ready_record_with_no_timestamp_is_never_fresh(tmp_path: Path, grpc_impl: str) -> None:
    record = SourceRecord("sid", "w", identity(), worker(), READY, updated_at_ms=0)
    assert not is_fresh(record, now_ms=1, heartbeat_timeout_s=90)
    for stack in make_stack(tmp_path, clock=ManualClock(now=0.0), grpc_impl=grpc_impl):
        publish(stack, "w1", status=READY)  # stamped at the epoch: updated_at == 0
        assert stack.client.list_sources(status_filter=READY) == []
        assert len(stack.client.list_sources()) == 1


class FailingStore(Store):
    """A backend that fails on reads, to pin how the server reports it."""

    def snapshot(self) -> list[SourceRecord]:
        raise RuntimeError("backend down")

    def candidates(self, query: SourceQuery) -> list[SourceRecord]:
        raise RuntimeError("backend down")

    def listing(self, query: SourceQuery, heartbeat_timeout_s: float) -> list[SourceRecord]:
        raise RuntimeError("backend down")

    def get(self, mx_source_id: str, worker_id: str) -> SourceRecord | None:
        raise RuntimeError("boom")


def test_backend_failure_reads_as_no_sources_and_is_counted(tmp_path: Path, grpc_impl: str) -> None:
    for stack in make_stack(tmp_path, store=FailingStore(ManualClock()), grpc_impl=grpc_impl):
        publish(stack, "w1", status=READY)
        assert stack.client.list_sources() == []
        samples = scrape(stack.metrics)
        assert samples[("mxref_server_rpcs_total", (("method", "ListSources"), ("result", "error")))] == 1


def test_servicer_exception_is_internal_with_a_message_and_counted(tmp_path: Path, grpc_impl: str) -> None:
    for stack in make_stack(tmp_path, store=FailingStore(ManualClock()), grpc_impl=grpc_impl):
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
    ],
    ids=["unknown-source", "unknown-worker", "wrong-rank", "no-worker-id", "unknown-status"],
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


# --- limits: a server that trusts no client ------------------------------------------

LIMITS = ServerLimits(max_message_bytes=1 << 20, max_blob_bytes=1024, max_name_bytes=32, max_tensors=4,
                      max_worker_rank=7, publish_rate_per_s=1, publish_burst=1000, max_records=1000)


@pytest.fixture
def limited(tmp_path: Path, grpc_impl: str) -> Iterator[Stack]:
    yield from make_stack(tmp_path, limits=LIMITS, grpc_impl=grpc_impl)


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode | None
    details: str
    reason: str | None


def call_raw(address: str, method: str, payload: bytes) -> Refusal | None:
    """Send ``payload`` as the request of ``method``; the refusal, or None if it was served."""
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        rpc = channel.unary_unary(f"/mxref.v1.P2pService/{method}", request_serializer=None,
                                  response_deserializer=None)
        try:
            rpc(payload, timeout=5)
        except grpc.RpcError as exc:
            call = cast("grpc.Call", exc)
            reasons = [value for key, value in (call.trailing_metadata() or ()) if key == "mxref-reject-reason"]
            return Refusal(call.code(), call.details() or "", str(reasons[0]) if reasons else None)
    return None


def good_publish(**worker_fields: Any) -> p2p_pb2.PublishMetadataRequest:
    request = p2p_pb2.PublishMetadataRequest(identity=identity(), worker=worker(), worker_id="w1")
    for name, value in worker_fields.items():
        setattr(request.worker, name, value)
    return request


def tensors(n: int) -> list[p2p_pb2.TensorDescriptor]:
    return [p2p_pb2.TensorDescriptor(name=f"t{i}", size=4, dtype="float16") for i in range(n)]


def publish_with(build: Callable[[p2p_pb2.PublishMetadataRequest], object]) -> bytes:
    request = good_publish()
    build(request)
    payload: bytes = request.SerializeToString()
    return payload


# A valid publish, then the same worker field again on the wire (protobuf merges it): the way to
# send a value no typed client can build.
RANK_PAST_UINT32 = good_publish().SerializeToString() + field(2, field(1, 2**32 + 5))

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
CASES: list[tuple[str, str, bytes, str, str]] = [
    # (id, method, request bytes, reason, what the message must say)
    ("blob", "PublishMetadata", good_publish(nixl_metadata=b"x" * 1025).SerializeToString(), "too_large",
     "worker.nixl_metadata is 1025 bytes, over the limit of 1024 bytes (--max-blob-bytes)"),
    ("model-name", "PublishMetadata", publish_with(lambda r: setattr(r.identity, "model_name", "m" * 33)),
     "too_large", "identity.model_name is 33 bytes, over the limit of 32 bytes (--max-name-bytes)"),
    ("worker-id", "PublishMetadata", publish_with(lambda r: setattr(r, "worker_id", "w" * 40)),
     "too_large", "worker_id is 40 bytes, over the limit of 32 bytes"),
    ("agent-name-utf8", "PublishMetadata", good_publish(agent_name="é" * 17).SerializeToString(),
     "too_large", "worker.agent_name is 34 bytes, over the limit of 32 bytes"),
    ("endpoint", "PublishMetadata", good_publish(metadata_endpoint="h" * 1025).SerializeToString(),
     "too_large", "worker.metadata_endpoint is 1025 bytes, over the limit of 1024 bytes"),
    ("tensor-source", "PublishMetadata",
     publish_with(lambda r: r.worker.tensor_source.tensors.extend(tensors(5))),
     "too_many", "worker.tensor_source.tensors has 5 entries, over the limit of 4 (--max-tensors)"),
    ("tensors", "PublishMetadata", publish_with(lambda r: r.worker.tensors.extend(tensors(5))),
     "too_many", "worker.tensors has 5 entries, over the limit of 4"),
    ("extra-parameters", "PublishMetadata",
     publish_with(lambda r: r.identity.extra_parameters.update({f"k{i}": "v" for i in range(65)})),
     "too_many", "identity.extra_parameters has 65 entries, over the limit of 64"),
    ("rank", "PublishMetadata", good_publish(worker_rank=8).SerializeToString(),
     "out_of_range", "worker.worker_rank is 8, outside the range 0..7 (--max-worker-rank)"),
    ("rank-past-uint32", "PublishMetadata", RANK_PAST_UINT32,
     "out_of_range", "worker.worker_rank is 4294967301, outside the range 0..7"),
    ("tp-past-uint32", "PublishMetadata",
     good_publish().SerializeToString() + field(1, field(5, 2**32)),
     "out_of_range", "identity.tensor_parallel_size is 4294967296, outside the range 0..4294967295"),
    ("status", "PublishMetadata", good_publish(status=out_of_enum(7)).SerializeToString(),
     "unknown_enum", "worker.status is 7, not a SourceStatus (known: 0, 1, 2, 3)"),
    ("backend", "PublishMetadata", good_publish().SerializeToString() + field(1, field(4, 9)),
     "unknown_enum", "identity.backend_framework is 9, not a BackendFramework"),
    ("malformed", "PublishMetadata", b"\xff\xff", "malformed", "PublishMetadataRequest (2 bytes) does not parse"),
    ("update-status", "UpdateStatus",
     p2p_pb2.UpdateStatusRequest(mx_source_id="s", worker_id="w1", status=out_of_enum(9)).SerializeToString(),
     "unknown_enum", "status is 9, not a SourceStatus"),
    ("update-rank-past-uint32", "UpdateStatus",
     p2p_pb2.UpdateStatusRequest(mx_source_id="s", worker_id="w1", status=READY).SerializeToString()
     + field(2, 2**32), "out_of_range", "worker_rank is 4294967296, outside the range 0..7"),
    ("list-rank", "ListSources", p2p_pb2.ListSourcesRequest(worker_rank_filter=8).SerializeToString(),
     "out_of_range", "worker_rank_filter is 8, outside the range 0..7"),
    ("list-status", "ListSources", p2p_pb2.ListSourcesRequest(status_filter=out_of_enum(5)).SerializeToString(),
     "unknown_enum", "status_filter is 5, not a SourceStatus"),
    ("list-model", "ListSources", p2p_pb2.ListSourcesRequest(model_name_filter="m" * 33).SerializeToString(),
     "too_large", "model_name_filter is 33 bytes, over the limit of 32 bytes"),
    ("get-source-id", "GetMetadata",
     p2p_pb2.GetMetadataRequest(mx_source_id="s" * 33, worker_id="w1").SerializeToString(),
     "too_large", "mx_source_id is 33 bytes, over the limit of 32 bytes"),
]


@pytest.mark.parametrize(("method", "payload", "reason", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_request_over_a_limit_is_refused_naming_the_field_and_the_limit(
    limited: Stack, method: str, payload: bytes, reason: str, says: str
) -> None:
    refusal = call_raw(limited.address, method, payload)
    assert refusal is not None, f"{method} was served"
    assert refusal.code == INVALID_ARGUMENT
    assert refusal.details == f"{method}: {says}" or refusal.details.startswith(f"{method}: {says}")
    assert refusal.reason == reason
    registry = limited.metrics.registry
    assert registry.get_sample_value("mxref_server_rejected_requests_total", {"method": method, "reason": reason}) == 1
    assert registry.get_sample_value("mxref_server_rpcs_total", {"method": method, "result": "rejected"}) == 1
    assert len(limited.store) == 0
    assert limited.events("source_published") == []


def test_the_same_requests_within_the_limits_are_served(limited: Stack) -> None:
    """The control of the table above: at the limit, not over it, everything is accepted."""
    request = good_publish(nixl_metadata=b"x" * 1024, worker_rank=7, agent_name="é" * 16)
    request.identity.model_name = "m" * 32
    request.worker.tensor_source.tensors.extend(tensors(4))
    request.identity.extra_parameters.update({f"k{i}": "v" for i in range(64)})
    response = limited.raw_publish(request)
    assert response.success, response.message
    assert len(limited.store) == 1
    assert limited.client.list_sources(worker_rank=7, model_name="m" * 32)
    assert limited.metrics.registry.get_sample_value(
        "mxref_server_rejected_requests_total", {"method": "PublishMetadata", "reason": "too_large"}) is None


def test_a_negative_answer_is_counted_as_invalid(stack: Stack) -> None:
    response = stack.raw_publish(p2p_pb2.PublishMetadataRequest(worker=worker(), worker_id="w1"))
    assert not response.success
    assert stack.metrics.registry.get_sample_value(
        "mxref_server_rejected_requests_total", {"method": "PublishMetadata", "reason": "invalid"}) == 1


def test_a_message_over_the_receive_limit_never_reaches_a_handler(limited: Stack) -> None:
    """gRPC itself refuses it (RESOURCE_EXHAUSTED), before the servicer could count it."""
    refusal = call_raw(limited.address, "PublishMetadata", good_publish(nixl_metadata=b"x" * (2 << 20))
                       .SerializeToString())
    assert refusal is not None
    assert refusal.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in refusal.details
    assert len(limited.store) == 0


def test_a_client_over_its_write_rate_is_refused_and_others_are_not(tmp_path: Path, grpc_impl: str) -> None:
    rate_clock = ManualClock(0.0)
    limits = ServerLimits(publish_rate_per_s=1, publish_burst=3)
    stack = make_stack(tmp_path, limits=limits, rate_clock=rate_clock, grpc_impl=grpc_impl)
    s = next(stack)
    try:
        sid = publish(s, "w1")
        publish(s, "w2")
        s.client.update_status(sid, "w1", 0, READY)  # a heartbeat spends from the same bucket
        with pytest.raises(MetadataServerError) as refused:
            s.client.publish_metadata(identity(), worker(), "w3")
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over the write rate of 1/s, burst 3, per client" in str(refused.value)
        with pytest.raises(MetadataServerError) as heartbeat:
            s.client.update_status(sid, "w1", 0, READY)
        assert heartbeat.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(s.client.list_sources()) == 2  # reads are not rate-limited
        # Another connection, another bucket (channels of one process share a connection unless told not to).
        with grpc.insecure_channel(s.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            other: p2p_pb2.PublishMetadataResponse = P2P_STUB(channel).PublishMetadata(
                p2p_pb2.PublishMetadataRequest(identity=identity(), worker=worker(), worker_id="w3"), timeout=5)
            assert other.success, other.message
        rate_clock.advance(1.0)
        publish(s, "w4")
        with pytest.raises(MetadataServerError):
            s.client.publish_metadata(identity(), worker(), "w5")
        registry = s.metrics.registry
        assert registry.get_sample_value(
            "mxref_server_rejected_requests_total", {"method": "PublishMetadata", "reason": "rate_limited"}) == 2
        assert registry.get_sample_value(
            "mxref_server_rejected_requests_total", {"method": "UpdateStatus", "reason": "rate_limited"}) == 1
        assert {r.worker_id for r in s.store.snapshot()} == {"w1", "w2", "w3", "w4"}
    finally:
        stack.close()


def test_a_full_store_refuses_new_records_but_not_replacements(tmp_path: Path, grpc_impl: str) -> None:
    stack = make_stack(tmp_path, store=Store(ManualClock(), max_records=2), grpc_impl=grpc_impl)
    s = next(stack)
    try:
        publish(s, "w1")
        publish(s, "w2")
        with pytest.raises(MetadataServerError) as full:
            s.client.publish_metadata(identity(), worker(), "w3")
        assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "holds 2 records, its limit (--max-records)" in str(full.value)
        publish(s, "w1", status=READY)  # a restart re-publishing its key always fits
        assert s.metrics.registry.get_sample_value(
            "mxref_server_rejected_requests_total", {"method": "PublishMetadata", "reason": "store_full"}) == 1
    finally:
        stack.close()


def test_client_buckets_refill_and_stay_bounded() -> None:
    clock = ManualClock(0.0)
    buckets = ClientBuckets(2.0, 2, clock=clock, max_clients=3)
    assert [buckets.take("a") for _ in range(3)] == [True, True, False]
    clock.advance(0.5)
    assert [buckets.take("a"), buckets.take("a")] == [True, False]
    for key in ("b", "c", "d", "e"):
        buckets.take(key)
    assert len(buckets) <= 3
    clock.advance(10)  # every bucket refilled: all prunable
    buckets.take("f")
    assert len(buckets) <= 3
    assert buckets.take("a") and buckets.take("a") and not buckets.take("a")


def test_server_limits_refuse_inconsistent_values() -> None:
    with pytest.raises(ValueError, match="max_blob_bytes=16 must be below max_message_bytes=16"):
        ServerLimits(max_message_bytes=16, max_blob_bytes=16)
    with pytest.raises(ValueError, match="publish_rate_per_s"):
        ServerLimits(publish_rate_per_s=float("nan"))
    with pytest.raises(ValueError, match="max_worker_rank"):
        ServerLimits(max_worker_rank=2**32)


def test_limit_flags_reach_the_servicer() -> None:
    args = build_parser().parse_args(["server", "--max-blob-bytes", "10", "--max-worker-rank", "3", "--publish-rate", "0.5",
                                      "--publish-burst", "2", "--max-records", "9", "--max-tensors", "5",
                                      "--max-name-bytes", "12", "--max-message-bytes", "1000"])
    assert server_limits(args) == ServerLimits(
        max_message_bytes=1000, max_blob_bytes=10, max_name_bytes=12, max_tensors=5, max_worker_rank=3,
        publish_rate_per_s=0.5, publish_burst=2, max_records=9)
    assert server_limits(build_parser().parse_args(["server"])) == ServerLimits()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["server", "--publish-rate", "0"])


# --- the indexed store answers as a scan would ------------------------------------------


class ScanModel:
    """The store's rules applied by brute force: every query and every sweep reads every record."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.records: dict[tuple[str, str], SourceRecord] = {}

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def publish(self, ident: p2p_pb2.SourceIdentity, work: p2p_pb2.WorkerMetadata, wid: str,
                status: p2p_pb2.SourceStatus) -> None:
        record = SourceRecord(mx_source_id(ident), wid, ident, work, status, self.now_ms())
        self.records[record.key] = record

    def update(self, sid: str, wid: str, rank: int, status: p2p_pb2.SourceStatus) -> bool:
        record = self.records.get((sid, wid))
        if record is None or record.worker.worker_rank != rank:
            return False
        self.records[record.key] = SourceRecord(sid, wid, record.identity, record.worker, status, self.now_ms())
        return True

    def reap(self, timers: ServerTimers) -> set[tuple[str, tuple[str, str]]]:
        done = set()
        now_ms = self.now_ms()
        for key, record in list(self.records.items()):
            action = reap_action(record, now_ms, timers)
            if action is ReapAction.MARK_STALE:
                self.records[key] = SourceRecord(*key, record.identity, record.worker, STALE, record.updated_at_ms)
            elif action is ReapAction.DELETE:
                del self.records[key]
            if action is not None:
                done.add((action.value, key))
        return done

    def query(self, query: SourceQuery, timers: ServerTimers) -> list[tuple[str, str]]:
        now_ms = self.now_ms()
        chosen = [r for r in self.records.values() if query.matches(r)
                  and (query.status != READY or is_fresh(r, now_ms, timers.heartbeat_timeout_s))]
        chosen.sort(key=lambda r: (-r.updated_at_ms, r.mx_source_id, r.worker_id))
        return [r.key for r in (chosen[: query.limit] if query.limit > 0 else chosen)]


STATUSES = (INITIALIZING, READY, STALE, p2p_pb2.SOURCE_STATUS_UNKNOWN)


def random_query(rng: random.Random, sids: list[str]) -> SourceQuery:
    return SourceQuery(
        mx_source_id=rng.choice([None, rng.choice(sids), "no-such-source"]),
        status=rng.choice([None, *STATUSES]),
        model_name=rng.choice([None, "m0", "m1"]),
        worker_rank=rng.choice([None, 0, 1, 2]),
        min_updated_at_ms=rng.choice([0, 0, int(T0 * 1000) + rng.randrange(0, 400_000)]),
        limit=rng.choice([0, 0, 1, 3]),
    )


@pytest.mark.parametrize("seed", range(12))
def test_indexed_store_answers_as_a_scan_over_random_operations(seed: int) -> None:
    """Publishes, heartbeats, status reports, clock steps (some backwards), reaper passes in
    small batches: after each, the store holds what the scan model holds, and every query,
    count and reap gives the scan's answer."""
    rng = random.Random(seed)
    timers = ServerTimers(heartbeat_timeout_s=rng.choice([0.3, 30.0, 90.0]), reaper_scan_interval_s=1,
                          gc_timeout_s=rng.choice([60.0, 200.0]))
    clock = ManualClock()
    store, model = Store(clock), ScanModel(clock)
    idents = [identity(f"m{i % 2}", tp=1 + i // 2) for i in range(4)]
    sids = [mx_source_id(i) for i in idents]
    wids = [f"w{i}" for i in range(12)]
    reaped = 0
    for step in range(400):
        op = rng.random()
        if op < 0.25:
            ident, wid, rank = rng.choice(idents), rng.choice(wids), rng.randrange(3)
            status = rng.choice(STATUSES)
            store.publish(ident, worker(rank, status), wid, status)
            model.publish(ident, worker(rank, status), wid, status)
        elif op < 0.6:
            sid, wid, rank = rng.choice(sids), rng.choice(wids), rng.randrange(3)
            status = rng.choice(STATUSES)
            expected = model.update(sid, wid, rank, status)
            try:
                store.update_status(sid, wid, rank, status)
                assert expected
            except UpdateRejected:
                assert not expected
        elif op < 0.8:
            clock.advance(rng.choice([0.0, 0.0005, 0.2, 5.0, 40.0, 100.0, -3.0]))
        else:
            batch = rng.choice([1, 2, 1024])
            done = {(d.action.value, d.record.key) for d in store.reap(timers, batch=batch)}
            assert done == model.reap(timers), f"step {step}"
            reaped += len(done)
        assert {r.key: r for r in store.snapshot()} == model.records, f"step {step}"
        for status in STATUSES:
            assert store.count(status) == sum(1 for r in model.records.values() if r.status == status)
        for _ in range(3):
            query = random_query(rng, sids)
            answer = model.query(query, timers)
            got = [r.key for r in query.select(store.candidates(query), store.now_ms(), timers.heartbeat_timeout_s)]
            assert got == answer, f"step {step}: {query}"
            listed = [r.key for r in store.listing(query, timers.heartbeat_timeout_s)]
            assert listed == answer, f"step {step}: listing {query}"
    assert reaped > 0  # the reaper had something to do (else the comparison proved little)


def test_reap_applies_the_reapers_rules_in_batches(tmp_path: Path) -> None:
    """A mass expiry is applied in batches (the lock is let go between them) and gives what one
    pass gives; a record demoted now is not deleted in the same pass."""
    clock = ManualClock()
    store = Store(clock)
    for i in range(10):
        store.publish(identity(), worker(), f"w{i}", READY)
    clock.advance(TIMERS.gc_timeout_s + 1)  # older than both timeouts
    done = store.reap(TIMERS, batch=3)
    assert sorted(d.record.worker_id for d in done) == sorted(f"w{i}" for i in range(10))
    assert {d.action for d in done} == {ReapAction.MARK_STALE}
    assert store.count(STALE) == 10
    done = store.reap(TIMERS, batch=3)
    assert [d.action for d in done] == [ReapAction.DELETE] * 10
    assert len(store) == 0
    assert store.candidates(SourceQuery()) == []


def test_the_workers_of_one_source_share_its_identity_message() -> None:
    """Fewer objects for a fleet: records of one source hold one identity message (an equal one
    is not copied again); a heartbeat keeps it, and another source has its own."""
    store = Store(ManualClock())
    first = store.publish(identity(), worker(0), "w0", READY)
    second = store.publish(identity(), worker(1), "w1", READY)
    other = store.publish(identity("acme/model-b"), worker(0), "w0", READY)
    assert second.identity is first.identity
    assert other.identity is not first.identity and other.identity.model_name == "acme/model-b"
    beat = store.update_status(second.mx_source_id, "w1", 1, READY).record
    assert beat.identity is first.identity
