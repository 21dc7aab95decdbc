"""The reader's lease calls (``mxref.roles.lease``) against a source's real ModelExpress WorkerService
over loopback gRPC: a lease comes with the source's manifest and goes once; a draining source, another
worker behind the endpoint, or a dead endpoint is a ``LeaseRefused`` carrying the source's code."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from mxref.modelexpress.worker import Leases, MxWorkerService
from mxref.roles.lease import LeaseRefused, prepare_tensor_read, release_tensor_read
from mxref.v1 import p2p_pb2
from mxref.worker_service import WorkerManifest, WorkerServicer, start_worker_server

SID = "0123456789abcdef"
MANIFEST = WorkerManifest(
    worker_id="w-1", worker_rank=0, metadata_endpoint="127.0.0.1:5555", agent_name="src-1", accelerator="cpu",
    tensors=(p2p_pb2.TensorDescriptor(name="w.0", addr=4096, size=64, device_id=0, dtype="float16", checksum="ab",
                                      shape=[32]),),
).published_as(SID)


@pytest.fixture
def source() -> Iterator[tuple[str, MxWorkerService]]:
    servicer = WorkerServicer(MANIFEST)
    service = MxWorkerService(servicer, Leases(60))
    server, port = start_worker_server(servicer, "127.0.0.1", 0, extra_handlers=(service.generic_handler(),))
    try:
        yield f"127.0.0.1:{port}", service
    finally:
        server.stop(0).wait(5)


def test_a_lease_comes_with_the_manifest_and_goes_once(source: tuple[str, MxWorkerService]) -> None:
    endpoint, service = source
    lease = prepare_tensor_read(endpoint, SID, "w-1", 5.0)
    assert (lease.mx_source_id, lease.worker_id, lease.endpoint) == (SID, "w-1", endpoint)
    assert [(t.name, t.size, t.checksum) for t in lease.manifest.tensors] == [("w.0", 64, "ab")]
    assert lease.manifest.tensors[0].dtype == "torch.float16"  # ModelExpress's spelling, read as is
    assert service.leases.live() == 1
    release_tensor_read(lease, 5.0)
    assert service.leases.live() == 0
    with pytest.raises(LeaseRefused, match="NOT_FOUND") as again:
        release_tensor_read(lease, 5.0)
    assert again.value.code == grpc.StatusCode.NOT_FOUND


def test_a_second_lease_is_a_new_one(source: tuple[str, MxWorkerService]) -> None:
    endpoint, service = source
    first, second = prepare_tensor_read(endpoint, SID, "w-1", 5.0), prepare_tensor_read(endpoint, SID, "", 5.0)
    assert first.lease_id != second.lease_id and service.leases.live() == 2
    assert second.worker_id == "w-1"  # learnt from the answer when not asked for


def test_refusals_carry_the_sources_code(source: tuple[str, MxWorkerService]) -> None:
    endpoint, service = source
    with pytest.raises(LeaseRefused) as reused:
        prepare_tensor_read(endpoint, SID, "w-old", 5.0)
    assert reused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    held = prepare_tensor_read(endpoint, SID, "w-1", 5.0)
    drain = threading.Thread(target=service.leases.drain, args=(10.0,))
    drain.start()  # waits for the held lease
    try:
        deadline = time.monotonic() + 5.0
        while service.leases.accepting and time.monotonic() < deadline:
            time.sleep(0.005)
        with pytest.raises(LeaseRefused, match="draining") as draining:
            prepare_tensor_read(endpoint, SID, "w-1", 5.0)
        assert draining.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        release_tensor_read(held, 5.0)  # a draining source still takes its leases back
        drain.join(10.0)
    assert not drain.is_alive()


def test_a_dead_endpoint_is_refused_within_the_deadline() -> None:
    with pytest.raises(LeaseRefused, match=r"UNAVAILABLE|DEADLINE_EXCEEDED"):
        prepare_tensor_read("127.0.0.1:1", SID, "w-1", 1.0)
