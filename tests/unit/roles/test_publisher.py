"""The source's publisher: publish, READY heartbeat gated on data-plane health, demotion.

Pins ModelExpress's publisher contract as mxref implements it: a worker that was READY and
turns unhealthy sends STALE once (and retries a demotion that failed), comes back READY when
healthy again (demotion is not terminal), is never demoted if it never went READY, and
publishes again after two rejected heartbeats (a wiped store).
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from mxref.errors import MetadataServerError
from mxref.events import EventLog
from mxref.metrics import SourceMetrics
from mxref.roles import source as source_mod
from mxref.roles.source import Publisher
from mxref.v1 import p2p_pb2

READY, STALE = p2p_pb2.SOURCE_STATUS_READY, p2p_pb2.SOURCE_STATUS_STALE


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.publish_errors: list[Exception] = []
        self.status_errors: list[Exception] = []
        self.reject_status = 0
        self.block: threading.Event | None = None

    def publish_metadata(
        self, identity: p2p_pb2.SourceIdentity, worker: p2p_pb2.WorkerMetadata, worker_id: str
    ) -> p2p_pb2.PublishMetadataResponse:
        self.calls.append(("publish", worker_id))
        if self.publish_errors:
            raise self.publish_errors.pop(0)
        return p2p_pb2.PublishMetadataResponse(success=True, mx_source_id="sid", worker_id=worker_id)

    def update_status(
        self, mx_source_id: str, worker_id: str, worker_rank: int, status: p2p_pb2.SourceStatus,
        timeout_s: float | None = None,
    ) -> p2p_pb2.UpdateStatusResponse:
        if self.block is not None:
            self.block.wait(5)
        self.calls.append(("status", p2p_pb2.SourceStatus.Name(status)))
        if self.status_errors:
            raise self.status_errors.pop(0)
        if self.reject_status:
            self.reject_status -= 1
            return p2p_pb2.UpdateStatusResponse(success=False, message="unknown worker")
        return p2p_pb2.UpdateStatusResponse(success=True)


def unavailable() -> MetadataServerError:
    return MetadataServerError("down", "UpdateStatus", grpc.StatusCode.UNAVAILABLE)


@pytest.fixture
def health() -> dict[str, bool]:
    return {"ok": True}


@pytest.fixture
def client() -> FakeClient:
    return FakeClient()


@pytest.fixture
def pub(client: FakeClient, health: dict[str, bool], monkeypatch: pytest.MonkeyPatch) -> Publisher:
    monkeypatch.setattr(source_mod, "PUBLISH_BACKOFF_S", (0.0, 0.0))
    worker = p2p_pb2.WorkerMetadata(worker_rank=0, agent_name="a")
    return Publisher(client, p2p_pb2.SourceIdentity(model_name="m"), worker, "w1", lambda: health["ok"],
                     interval_s=60, events=EventLog(None, "src", "source"), metrics=SourceMetrics().source)


def statuses(pub: Publisher) -> list[tuple[str, str]]:
    assert isinstance(pub.client, FakeClient)
    return list(pub.client.calls)


def test_first_tick_publishes_then_goes_ready(pub: Publisher) -> None:
    pub.tick()
    assert statuses(pub) == [("publish", "w1"), ("status", "SOURCE_STATUS_READY")]
    assert pub.status == READY and pub.mx_source_id == "sid"


def test_publish_retries_unavailable_twice_then_gives_up_until_the_next_tick(pub: Publisher, client: FakeClient) -> None:
    client.publish_errors = [unavailable(), unavailable(), unavailable()]
    pub.tick()
    assert [c[0] for c in statuses(pub)] == ["publish"] * 3
    assert pub.mx_source_id is None
    pub.tick()
    assert pub.status == READY


def test_unhealthy_after_ready_sends_stale_once(pub: Publisher, health: dict[str, bool]) -> None:
    pub.tick()
    health["ok"] = False
    pub.tick()
    pub.tick()
    assert statuses(pub)[-1] == ("status", "SOURCE_STATUS_STALE")
    assert [c for c in statuses(pub) if c == ("status", "SOURCE_STATUS_STALE")] == [("status", "SOURCE_STATUS_STALE")]


def test_a_failed_demotion_is_retried_on_the_next_tick(pub: Publisher, client: FakeClient, health: dict[str, bool]) -> None:
    pub.tick()
    health["ok"] = False
    client.status_errors = [unavailable()]
    pub.tick()
    assert pub.status == READY
    pub.tick()
    assert pub.status == STALE


def test_demotion_is_not_terminal(pub: Publisher, health: dict[str, bool]) -> None:
    pub.tick()
    health["ok"] = False
    pub.tick()
    health["ok"] = True
    pub.tick()
    assert pub.status == READY
    assert [c[1] for c in statuses(pub)[1:]] == ["SOURCE_STATUS_READY", "SOURCE_STATUS_STALE", "SOURCE_STATUS_READY"]


def test_a_worker_that_never_went_ready_is_never_demoted(pub: Publisher, health: dict[str, bool]) -> None:
    health["ok"] = False
    pub.tick()
    pub.tick()
    assert statuses(pub) == [("publish", "w1")]


def test_two_rejected_heartbeats_publish_again(pub: Publisher, client: FakeClient) -> None:
    pub.tick()
    client.reject_status = 2
    pub.tick()
    assert pub.mx_source_id == "sid"  # one rejection is not enough
    pub.tick()
    assert pub.mx_source_id is None
    pub.tick()
    assert [c[0] for c in statuses(pub)].count("publish") == 2
    assert pub.status == READY


def test_mark_stale_is_bounded_while_a_heartbeat_is_stuck(pub: Publisher, client: FakeClient) -> None:
    pub.tick()
    gate = threading.Event()
    client.block = gate
    stuck = threading.Thread(target=pub.tick, daemon=True)
    stuck.start()
    time.sleep(0.1)  # the tick now holds the publisher's lock inside update_status
    t0 = time.monotonic()
    threading.Timer(0.5, gate.set).start()  # the stuck call returns eventually
    pub.mark_stale("shutdown", timeout_s=0.2)
    assert time.monotonic() - t0 < 2.0
    stuck.join(5)


def test_republish_sends_the_grown_worker_under_the_same_identity_and_keeps_ready(pub: Publisher, client: FakeClient) -> None:
    """A grown manifest (ModelExpress 0.8): the new worker record is published again, same id, and the
    status goes on from READY (no INITIALIZING in between)."""
    pub.tick()
    grown = p2p_pb2.WorkerMetadata(worker_rank=0, agent_name="a", metadata_endpoint="h:1")
    assert pub.republish(grown) == "sid"
    assert pub.worker is grown and pub.status == READY
    pub.tick()
    assert statuses(pub) == [("publish", "w1"), ("status", "SOURCE_STATUS_READY"), ("publish", "w1"),
                             ("status", "SOURCE_STATUS_READY")]


def test_a_republish_that_fails_leaves_the_next_tick_to_publish(pub: Publisher, client: FakeClient) -> None:
    pub.tick()
    client.publish_errors = [unavailable(), unavailable(), unavailable()]
    assert pub.republish(p2p_pb2.WorkerMetadata(worker_rank=0, agent_name="a")) is None
    assert pub.mx_source_id is None
    pub.tick()
    assert pub.mx_source_id == "sid" and statuses(pub)[-2:] == [("publish", "w1"), ("status", "SOURCE_STATUS_READY")]
