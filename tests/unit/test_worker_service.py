"""A source's WorkerService and the client's reading of it, over loopback gRPC.

Pins each refusal code ModelExpress readers rely on, and the reused-endpoint
case (#502): a new worker behind an old address must surface as
WorkerIdMismatch, never as a manifest for the wrong worker.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import grpc
import pytest

from mxref import config
from mxref.config import ServerTimers
from mxref.errors import LocalError, ManifestError, SourceError, WorkerIdMismatch
from mxref.metadata.servicer import P2pServicer
from mxref.metadata.store import Store
from mxref.metadata.transport import start_metadata_server
from mxref.metrics import SourceMetrics
from mxref.roles.client import fetch_tensor_manifest
from mxref.rpc import start_grpc_server
from mxref.v1 import p2p_pb2, p2p_pb2_grpc
from mxref.worker_service import (
    RejectReason,
    WorkerManifest,
    WorkerServicer,
    check_request,
    start_worker_server,
)

SID = "0123456789abcdef"
TENSORS = (
    p2p_pb2.TensorDescriptor(name="w.0", addr=4096, size=1024, device_id=0, dtype="float16", shape=[512]),
    p2p_pb2.TensorDescriptor(name="w.1", addr=8192, size=2048, device_id=0, dtype="float16", shape=[32, 32]),
)
MANIFEST = WorkerManifest(
    worker_id="w-new",
    worker_rank=2,
    tensors=TENSORS,
    metadata_endpoint="127.0.0.1:5557",
    agent_name="mx-auto-worker2-abcd1234",
    accelerator="cpu",
)


@pytest.fixture
def metrics() -> SourceMetrics:
    return SourceMetrics()


@pytest.fixture
def servicer(metrics: SourceMetrics) -> WorkerServicer:
    return WorkerServicer(MANIFEST, metrics=metrics.source)


@pytest.fixture
def endpoint(servicer: WorkerServicer) -> Iterator[str]:
    server, port = start_worker_server(servicer, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait(5)


def refusal(endpoint: str, sid: str = SID, worker_id: str = "w-new") -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        fetch_tensor_manifest(endpoint, sid, worker_id, timeout_s=5)
    return caught.value


def count(metrics: SourceMetrics, result: str) -> float:
    return metrics.registry.get_sample_value("mxref_source_manifest_requests_total", {"result": result}) or 0.0


def test_before_publish_every_request_is_failed_precondition(endpoint: str, metrics: SourceMetrics) -> None:
    error = refusal(endpoint)
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert not isinstance(error, WorkerIdMismatch)
    assert "has not published" in str(error)
    assert count(metrics, "not_published") == 1


def test_published_worker_serves_its_manifest(endpoint: str, servicer: WorkerServicer, metrics: SourceMetrics) -> None:
    servicer.set_manifest(MANIFEST.published_as(SID))
    response = fetch_tensor_manifest(endpoint, SID, "w-new", timeout_s=5)
    assert [t.name for t in response.tensors] == ["w.0", "w.1"]
    assert list(response.tensors[1].shape) == [32, 32]
    assert response.mx_source_id == SID
    assert response.worker_id == "w-new"
    assert (response.metadata_endpoint, response.agent_name) == ("127.0.0.1:5557", "mx-auto-worker2-abcd1234")
    assert (response.worker_rank, response.accelerator) == (2, "cpu")
    assert fetch_tensor_manifest(endpoint, SID, "", timeout_s=5).worker_id == "w-new"  # no worker_id: any
    assert count(metrics, "ok") == 2


def test_empty_source_id_is_invalid_argument(endpoint: str, servicer: WorkerServicer) -> None:
    servicer.set_manifest(MANIFEST.published_as(SID))
    error = refusal(endpoint, sid="")
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "mx_source_id is empty" in str(error)


def test_other_source_id_is_failed_precondition(endpoint: str, servicer: WorkerServicer) -> None:
    servicer.set_manifest(MANIFEST.published_as(SID))
    error = refusal(endpoint, sid="fedcba9876543210")
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert not isinstance(error, WorkerIdMismatch)
    assert "'fedcba9876543210' is not served here" in str(error)


def test_reused_endpoint_raises_worker_id_mismatch(endpoint: str, servicer: WorkerServicer, metrics: SourceMetrics) -> None:
    """The reader listed the old worker; a new process now owns its address (ModelExpress #502)."""
    servicer.set_manifest(MANIFEST.published_as(SID))
    error = refusal(endpoint, worker_id="w-old")
    assert isinstance(error, WorkerIdMismatch)
    assert isinstance(error, SourceError)
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert error.requested == "w-old"
    assert "'w-old' is not this worker" in str(error)
    assert count(metrics, "worker_id_mismatch") == 1


def test_draining_is_unavailable(endpoint: str, servicer: WorkerServicer, metrics: SourceMetrics) -> None:
    servicer.set_manifest(MANIFEST.published_as(SID))
    servicer.drain()
    assert servicer.is_draining
    error = refusal(endpoint)
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert "draining" in str(error)
    assert count(metrics, "draining") == 1


def test_a_callable_provider_is_read_on_every_request() -> None:
    current = {"manifest": MANIFEST}
    servicer = WorkerServicer(lambda: current["manifest"])
    server, port = start_worker_server(servicer, "127.0.0.1", 0)
    try:
        assert refusal(f"127.0.0.1:{port}").code == grpc.StatusCode.FAILED_PRECONDITION
        current["manifest"] = MANIFEST.published_as(SID)
        assert fetch_tensor_manifest(f"127.0.0.1:{port}", SID, "w-new", timeout_s=5).mx_source_id == SID
    finally:
        server.stop(0).wait(5)


def test_a_failing_provider_is_internal_and_counted(metrics: SourceMetrics) -> None:
    def broken() -> WorkerManifest:
        raise RuntimeError("manifest unavailable")

    server, port = start_worker_server(WorkerServicer(broken, metrics=metrics.source), "127.0.0.1", 0)
    try:
        error = refusal(f"127.0.0.1:{port}")
        assert error.code == grpc.StatusCode.INTERNAL
        assert "manifest unavailable" in str(error)
        assert count(metrics, "error") == 1
    finally:
        server.stop(0).wait(5)


class CarelessSource(p2p_pb2_grpc.WorkerServiceServicer):
    """A source that does not check worker_id (as an older ModelExpress would not)."""

    def __init__(self, response: p2p_pb2.GetTensorManifestResponse) -> None:
        self.response = response

    def GetTensorManifest(
        self, request: p2p_pb2.GetTensorManifestRequest, context: grpc.ServicerContext
    ) -> p2p_pb2.GetTensorManifestResponse:
        return self.response


@pytest.fixture
def careless() -> Iterator[tuple[CarelessSource, str]]:
    source = CarelessSource(MANIFEST.published_as(SID).to_response())
    server, port = start_grpc_server(p2p_pb2_grpc.add_WorkerServiceServicer_to_server, source, "127.0.0.1", 0,
                                     threads=2, what="careless source")
    try:
        yield source, f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait(5)


def test_echoed_worker_id_is_checked_by_the_client(careless: tuple[CarelessSource, str]) -> None:
    _source, endpoint = careless
    with pytest.raises(WorkerIdMismatch) as caught:
        fetch_tensor_manifest(endpoint, SID, "w-old", timeout_s=5)
    assert (caught.value.requested, caught.value.actual) == ("w-old", "w-new")
    assert caught.value.code is None


def test_echoed_source_id_is_checked_by_the_client(careless: tuple[CarelessSource, str]) -> None:
    source, endpoint = careless
    source.response = MANIFEST.published_as("fedcba9876543210").to_response()
    with pytest.raises(ManifestError, match="answered for source 'fedcba9876543210'") as caught:
        fetch_tensor_manifest(endpoint, SID, "w-new", timeout_s=5)
    assert not isinstance(caught.value, WorkerIdMismatch)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_source_is_a_manifest_error() -> None:
    error = refusal(f"127.0.0.1:{free_port()}")
    assert error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_nonpositive_timeout_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="finite number of seconds > 0"):
        fetch_tensor_manifest("127.0.0.1:1", SID, "w", timeout_s=0)


@pytest.mark.parametrize("start", ["worker", "metadata"])
def test_binding_a_port_in_use_is_a_local_error(start: str) -> None:
    """gRPC's default SO_REUSEPORT would let a second server share the port silently."""
    first, port = start_worker_server(WorkerServicer(MANIFEST), "127.0.0.1", 0)
    try:
        with pytest.raises(LocalError, match=f"cannot bind 127.0.0.1:{port}"):
            if start == "worker":
                start_worker_server(WorkerServicer(MANIFEST), "127.0.0.1", port)
            else:
                start_metadata_server(P2pServicer(Store(), ServerTimers()), "127.0.0.1", port)
    finally:
        first.stop(0).wait(5)


@pytest.mark.parametrize(
    ("sid", "worker_id", "draining", "published", "expected"),
    [
        ("", None, True, True, RejectReason.EMPTY_SOURCE_ID),
        (SID, None, True, True, RejectReason.DRAINING),
        (SID, None, False, False, RejectReason.NOT_PUBLISHED),
        ("x", None, False, True, RejectReason.SOURCE_ID_MISMATCH),
        (SID, "w-old", False, True, RejectReason.WORKER_ID_MISMATCH),
        (SID, "w-new", False, True, None),
        (SID, "", False, True, None),
        (SID, None, False, True, None),
    ],
)
def test_check_request_order(
    sid: str, worker_id: str | None, draining: bool, published: bool, expected: RejectReason | None
) -> None:
    request = p2p_pb2.GetTensorManifestRequest(mx_source_id=sid)
    if worker_id is not None:
        request.worker_id = worker_id
    manifest = MANIFEST.published_as(SID) if published else MANIFEST
    rejection = check_request(request, manifest, draining)
    assert (rejection.reason if rejection else None) == expected


def test_manifest_messages_may_exceed_the_grpc_default_of_4_mb(servicer: WorkerServicer, endpoint: str) -> None:
    many = tuple(
        p2p_pb2.TensorDescriptor(name=f"layers.{i}.weight.{'x' * 40}", addr=i * 4096, size=4096, dtype="float16")
        for i in range(80_000)
    )
    servicer.set_manifest(WorkerManifest(worker_id="w-new", worker_rank=0, tensors=many, mx_source_id=SID))
    response = fetch_tensor_manifest(endpoint, SID, "w-new", timeout_s=20)
    assert response.ByteSize() > 4 * 1024 * 1024
    assert len(response.tensors) == len(many)
    assert config.MAX_GRPC_MESSAGE_BYTES == 100 * 1024 * 1024
