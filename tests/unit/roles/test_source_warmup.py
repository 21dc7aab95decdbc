"""A source still warming up (``--ready-delay``) is published but never READY before it is healthy.

ModelExpress #520: weight sources were advertised as soon as their weights loaded, before the
engine finished its post-load initialisation, so peers picked sources that could not serve yet.
mxref's ``warming_gate`` holds ``is_healthy`` False until the warm-up is over; the publisher then
publishes the record INITIALIZING and sends READY only once the gate opens.
"""

from __future__ import annotations

from mxref.events import EventLog
from mxref.metrics import SourceMetrics
from mxref.roles.source import Publisher, warming_gate
from mxref.v1 import p2p_pb2


class FakeClient:
    """The metadata server as the publisher sees it: every call recorded, every call accepted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def publish_metadata(
        self, identity: p2p_pb2.SourceIdentity, worker: p2p_pb2.WorkerMetadata, worker_id: str
    ) -> p2p_pb2.PublishMetadataResponse:
        self.calls.append(("publish", worker_id))
        return p2p_pb2.PublishMetadataResponse(success=True, mx_source_id="sid", worker_id=worker_id)

    def update_status(
        self, mx_source_id: str, worker_id: str, worker_rank: int, status: p2p_pb2.SourceStatus,
        timeout_s: float | None = None,
    ) -> p2p_pb2.UpdateStatusResponse:
        self.calls.append(("status", p2p_pb2.SourceStatus.Name(status)))
        return p2p_pb2.UpdateStatusResponse(success=True)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_delay_is_the_health_check_itself() -> None:
    def healthy() -> bool:
        return True

    assert warming_gate(healthy, 0.0) is healthy


def test_the_gate_opens_after_the_delay_and_still_follows_health() -> None:
    clock, health = Clock(), {"ok": True}
    gate = warming_gate(lambda: health["ok"], 3.0, clock)
    assert gate() is False
    clock.now += 2.999
    assert gate() is False
    clock.now += 0.001
    assert gate() is True
    health["ok"] = False
    assert gate() is False


def test_a_warming_source_is_published_initializing_and_ready_only_after_warm_up() -> None:
    clock, client = Clock(), FakeClient()
    worker = p2p_pb2.WorkerMetadata(worker_rank=0, agent_name="a", status=p2p_pb2.SOURCE_STATUS_INITIALIZING)
    pub = Publisher(client, p2p_pb2.SourceIdentity(model_name="m"), worker, "w1", warming_gate(lambda: True, 5.0, clock),
                    interval_s=60, events=EventLog(None, "src", "source"), metrics=SourceMetrics().source)
    pub.tick()
    pub.tick()
    assert client.calls == [("publish", "w1")]  # published (INITIALIZING), no READY, no STALE
    assert pub.status == p2p_pb2.SOURCE_STATUS_UNKNOWN
    clock.now += 5.0
    pub.tick()
    assert client.calls[-1] == ("status", "SOURCE_STATUS_READY")
    assert pub.status == p2p_pb2.SOURCE_STATUS_READY
