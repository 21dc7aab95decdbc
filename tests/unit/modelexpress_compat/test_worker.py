"""ModelExpress's ``model_express.p2p.WorkerService`` on an mxref source, over loopback gRPC.

Requests and answers use the published client's message classes when its wheel is at hand
(else ours, pinned to it by ``test_mx_wire``). Pins the refusal codes the 0.7 client relies on
(INVALID_ARGUMENT, FAILED_PRECONDITION before publication / for another source / a reused
endpoint, UNAVAILABLE while draining), the tensor read leases (granted with the manifest,
NOT_FOUND once released or expired, none admitted while draining) and their lifetime rule,
and that both packages answer on the one port from the one manifest.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from harness.subjects import wire
from mxref.metrics import SourceMetrics
from mxref.modelexpress.worker import Leases, MxWorkerService, lease_seconds
from mxref.rpc import REASON_METADATA_KEY
from mxref.v1 import p2p_pb2, p2p_pb2_grpc
from mxref.worker_service import WorkerManifest, WorkerServicer, start_worker_server

SID = "0123456789abcdef"
MANIFEST = WorkerManifest(
    worker_id="w-1", worker_rank=0, metadata_endpoint="127.0.0.1:5555", agent_name="mxref-source-1", accelerator="cpu",
    tensors=(p2p_pb2.TensorDescriptor(name="w.0", addr=4096, size=64, device_id=0, dtype="float16", checksum="ab", shape=[32]),),
)
SERVICE = "/model_express.p2p.WorkerService/"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def mx() -> dict[str, type[Any]]:
    return wire.client_or_our_classes()


@dataclass
class Worker:
    classes: dict[str, type[Any]]
    channel: grpc.Channel
    servicer: WorkerServicer
    service: MxWorkerService
    clock: FakeClock
    metrics: SourceMetrics

    def call(self, method: str, response: str, **fields: Any) -> Any:
        rpc = self.channel.unary_unary(SERVICE + method, request_serializer=None,
                                       response_deserializer=self.classes[response].FromString)
        return rpc(self.classes[f"{method}Request"](**fields).SerializeToString(), timeout=5)

    def refusal(self, method: str, response: str, **fields: Any) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as caught:
            self.call(method, response, **fields)
        return caught.value

    def publish(self) -> None:
        self.servicer.set_manifest(MANIFEST.published_as(SID))

    def count(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value("mxref_source_manifest_requests_total", {"result": result})
        return value or 0.0


@pytest.fixture
def worker(mx: dict[str, type[Any]]) -> Iterator[Worker]:
    metrics = SourceMetrics()
    servicer = WorkerServicer(MANIFEST, metrics=metrics.source)
    clock = FakeClock()
    service = MxWorkerService(servicer, Leases(lease_seconds({}), clock=clock))
    server, port = start_worker_server(servicer, "127.0.0.1", 0, extra_handlers=(service.generic_handler(),))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Worker(mx, channel, servicer, service, clock, metrics)
    finally:
        server.stop(0).wait(5)


def _reason(error: grpc.RpcError) -> str | None:
    trailing = error.trailing_metadata() or ()
    return dict(trailing).get(REASON_METADATA_KEY)


def test_refusals_carry_the_codes_the_client_reads(worker: Worker) -> None:
    before = worker.refusal("GetTensorManifest", "GetTensorManifestResponse", mx_source_id=SID)
    assert before.code() == grpc.StatusCode.FAILED_PRECONDITION and _reason(before) == "not_published"
    worker.publish()
    empty = worker.refusal("GetTensorManifest", "GetTensorManifestResponse", mx_source_id="")
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT
    other = worker.refusal("GetTensorManifest", "GetTensorManifestResponse", mx_source_id="f" * 16)
    assert other.code() == grpc.StatusCode.FAILED_PRECONDITION and _reason(other) == "source_id_mismatch"
    reused = worker.refusal("PrepareTensorRead", "PrepareTensorReadResponse", mx_source_id=SID, worker_id="w-old")
    assert reused.code() == grpc.StatusCode.FAILED_PRECONDITION and _reason(reused) == "worker_id_mismatch"
    assert worker.count("worker_id_mismatch") == 1 and worker.count("not_published") == 1


def test_the_manifest_reads_the_same_in_both_packages(worker: Worker) -> None:
    worker.publish()
    theirs = worker.call("GetTensorManifest", "GetTensorManifestResponse", mx_source_id=SID, worker_id="w-1")
    ours = p2p_pb2_grpc.WorkerServiceStub(worker.channel).GetTensorManifest(  # type: ignore[no-untyped-call]
        p2p_pb2.GetTensorManifestRequest(mx_source_id=SID), timeout=5)
    assert (theirs.mx_source_id, theirs.worker_id, theirs.agent_name, theirs.metadata_endpoint) == (
        ours.mx_source_id, ours.worker_id, ours.agent_name, ours.metadata_endpoint) == (
        SID, "w-1", "mxref-source-1", "127.0.0.1:5555")
    (t,) = theirs.tensors
    assert (t.name, t.addr, t.size, t.device_id, t.dtype) == ("w.0", 4096, 64, 0, "torch.float16")  # the torch spelling
    assert ours.tensors[0].dtype == "float16"
    assert worker.count("ok") == 2


def test_a_lease_comes_with_the_manifest_and_goes_once(worker: Worker) -> None:
    worker.publish()
    granted = worker.call("PrepareTensorRead", "PrepareTensorReadResponse", mx_source_id=SID, worker_id="w-1")
    assert len(granted.lease_id) == 32 and granted.manifest.mx_source_id == SID and len(granted.manifest.tensors) == 1
    assert worker.service.leases.live() == 1
    worker.call("ReleaseTensorRead", "ReleaseTensorReadResponse", mx_source_id=SID, lease_id=granted.lease_id)
    assert worker.service.leases.live() == 0
    again = worker.refusal("ReleaseTensorRead", "ReleaseTensorReadResponse", mx_source_id=SID, lease_id=granted.lease_id)
    assert again.code() == grpc.StatusCode.NOT_FOUND and granted.lease_id in (again.details() or "")


def test_an_expired_lease_is_not_found(worker: Worker) -> None:
    worker.publish()
    granted = worker.call("PrepareTensorRead", "PrepareTensorReadResponse", mx_source_id=SID)
    worker.clock.now += lease_seconds({}) + 1
    expired = worker.refusal("ReleaseTensorRead", "ReleaseTensorReadResponse", mx_source_id=SID, lease_id=granted.lease_id)
    assert expired.code() == grpc.StatusCode.NOT_FOUND


def test_a_draining_worker_admits_no_lease_but_takes_its_leases_back(worker: Worker) -> None:
    worker.publish()
    granted = worker.call("PrepareTensorRead", "PrepareTensorReadResponse", mx_source_id=SID)
    worker.servicer.drain()
    refused = worker.refusal("PrepareTensorRead", "PrepareTensorReadResponse", mx_source_id=SID)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE and _reason(refused) == "draining"
    assert worker.refusal("GetTensorManifest", "GetTensorManifestResponse", mx_source_id=SID).code() == grpc.StatusCode.UNAVAILABLE
    worker.call("ReleaseTensorRead", "ReleaseTensorReadResponse", mx_source_id=SID, lease_id=granted.lease_id)


def test_artifact_rpcs_are_not_served(worker: Worker) -> None:
    worker.publish()
    refused = worker.refusal("GetArtifactManifestHeader", "GetArtifactManifestHeaderResponse", mx_source_id=SID)
    assert refused.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize(
    ("env", "seconds"),
    [({}, 1830), ({"MX_TRANSFER_TIMEOUT": "900"}, 1830), ({"MX_TRANSFER_TIMEOUT": "300"}, 630),
     ({"MX_TRANSFER_TIMEOUT": "60"}, 270), ({"MX_TRANSFER_TIMEOUT": "0.5"}, 270),
     ({"MX_TRANSFER_TIMEOUT": "soon"}, 1830), ({"MX_TRANSFER_TIMEOUT": "inf"}, 1830)],
)
def test_lease_lifetime_covers_a_handshake_and_a_receive(env: dict[str, str], seconds: int) -> None:
    assert lease_seconds(env) == seconds


def test_drain_waits_for_release_and_reopens_on_timeout() -> None:
    clock = FakeClock()
    leases = Leases(60, clock=clock)
    held = leases.prepare()
    with pytest.raises(TimeoutError, match="1 tensor read lease"):
        leases.drain(0.05)
    assert leases.accepting, "a drain that timed out must admit leases again"
    releaser = threading.Timer(0.05, leases.release, args=(held,))
    releaser.start()
    try:
        leases.drain(5.0)  # returns once the lease is released
    finally:
        releaser.join(5.0)
    assert not leases.accepting and leases.live() == 0
    with pytest.raises(RuntimeError, match="draining"):
        leases.prepare()


def test_drain_ends_when_the_last_lease_expires() -> None:
    clock = FakeClock()
    leases = Leases(60, clock=clock)
    leases.prepare()
    clock.now += 61
    leases.drain(0.05)
    assert leases.live() == 0
    with pytest.raises(ValueError, match="positive"):
        Leases(0)
