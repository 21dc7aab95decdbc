"""What the servicer answers when its store fails (``StoreUnavailable``, as ``RedisStore`` raises
when Redis is down, paused or slow): ModelExpress's negative answers, never an RPC error: an
empty list, ``found=false``, ``success=false`` with the store's message; each counted as an
``error`` outcome. Over a fake store and a fake call context (no gRPC, no Redis)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mxref import config
from mxref.metadata.query import SourceQuery
from mxref.metadata.records import SourceRecord, StoreUnavailable
from mxref.metadata.servicer import P2pServicer, store_failure_response
from mxref.metadata.store import Store
from mxref.metrics import ServerFamilies
from mxref.v1 import p2p_pb2

DOWN = "redis store redis://127.0.0.1:1/0: list failed: TimeoutError: Timeout reading from socket"


class DownStore(Store):
    """Every operation fails as a store whose backend is gone."""

    def publish(self, *args: Any, **kwargs: Any) -> SourceRecord:
        raise StoreUnavailable(DOWN)

    def get(self, mx_source_id: str, worker_id: str) -> SourceRecord | None:
        raise StoreUnavailable(DOWN)

    def update_status(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable(DOWN)

    def candidates(self, query: SourceQuery) -> list[SourceRecord]:
        raise StoreUnavailable(DOWN)

    def listing(self, query: SourceQuery, heartbeat_timeout_s: float) -> list[SourceRecord]:
        raise StoreUnavailable(DOWN)


class Context:
    """The part of ``grpc.ServicerContext`` a served call touches; an abort is a test failure."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def abort(self, code: Any, details: str) -> None:
        pytest.fail(f"aborted with {code}: {details}")

    def set_trailing_metadata(self, metadata: Any) -> None:
        pytest.fail(f"trailing metadata {metadata}")


IDENTITY = p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name="acme/tiny", dtype="float16")


@pytest.fixture
def served() -> tuple[P2pServicer, ServerFamilies]:
    families = ServerFamilies(CollectorRegistry())
    return P2pServicer(DownStore(), config.ServerTimers(), metrics=families), families


def serve(servicer: P2pServicer, method: str, request: Any) -> Any:
    return servicer.serve(method, request.SerializeToString(), Context())


def test_every_rpc_gets_its_negative_answer_when_the_store_is_down(served: tuple[P2pServicer, ServerFamilies]) -> None:
    servicer, families = served
    listed = serve(servicer, "ListSources", p2p_pb2.ListSourcesRequest(identity=IDENTITY))
    assert list(listed.instances) == []
    got = serve(servicer, "GetMetadata", p2p_pb2.GetMetadataRequest(mx_source_id="abc", worker_id="w1"))
    assert (got.found, got.mx_source_id, got.worker_id) == (False, "abc", "w1")
    published = serve(servicer, "PublishMetadata", p2p_pb2.PublishMetadataRequest(
        identity=IDENTITY, worker=p2p_pb2.WorkerMetadata(worker_rank=0), worker_id="w1"))
    assert (published.success, published.message, published.worker_id) == (False, DOWN, "w1")
    updated = serve(servicer, "UpdateStatus", p2p_pb2.UpdateStatusRequest(
        mx_source_id="abc", worker_id="w1", worker_rank=0, status=p2p_pb2.SOURCE_STATUS_READY))
    assert (updated.success, updated.message) == (False, DOWN)
    for method in ("ListSources", "GetMetadata", "PublishMetadata", "UpdateStatus"):
        assert families.rpcs.labels(method, "error")._value.get() == 1, method


def test_the_negative_answer_of_each_method() -> None:
    request = p2p_pb2.GetMetadataRequest(mx_source_id="s", worker_id="w")
    assert store_failure_response("GetMetadata", request, "x") == p2p_pb2.GetMetadataResponse(
        found=False, mx_source_id="s", worker_id="w")
    assert store_failure_response("ListSources", p2p_pb2.ListSourcesRequest(), "x") == p2p_pb2.ListSourcesResponse()
    assert store_failure_response("UpdateStatus", p2p_pb2.UpdateStatusRequest(), "down") == p2p_pb2.UpdateStatusResponse(
        success=False, message="down")
