"""The metadata server over real loopback gRPC, with an injected clock.

Pins the ModelExpress server semantics mxref reproduces: bad publishes are
refused with a message (never a gRPC error), READY queries hide silent workers
before the reaper runs, the reaper demotes then deletes, STALE records stay
readable by GetMetadata, and a servicer bug is an INTERNAL error that is counted.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from fixtures.metadata_stack import (
    INITIALIZING,
    READY,
    STALE,
    T0,
    ManualClock,
    Stack,
    identity,
    make_stack,
    publish,
    scrape,
    worker,
)

from mxref.config import ServerTimers
from mxref.errors import MetadataServerError
from mxref.events import EventLog
from mxref.identity import mx_source_id
from mxref.metadata.query import SourceQuery, is_fresh
from mxref.metadata.reaper import Reaper
from mxref.metadata.records import EventJournal, SourceRecord
from mxref.metadata.store import Store

# --- PublishMetadata ----------------------------------------------------------
from mxref.v1 import p2p_pb2


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
