"""ModelExpress's wire against real mxref processes, spoken with the published client's own classes.

A real ``python -m mxref server`` and a real ``python -m mxref source`` (real NIXL, real gRPC);
the requests are built and the answers read with the message classes of the
``modelexpress==0.7.0`` wheel (its descriptor, in a pool of its own: no torch needed), the way
the client's RDMA path walks them: ListSources(READY) -> GetMetadata -> GetTensorManifest on the
source's ``worker_grpc_endpoint`` -> a tensor read lease, released once. The real client itself
runs in ``scenarios/mixed_fleet.yaml`` (it needs the subject's environment).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from procs import Cluster

from harness.subjects import wire

pytestmark = pytest.mark.integration

MODEL = ("--tensors", "4", "--tensor-mib", "0.25", "--dtype", "float16", "--seed", "5")
READY = 2


@pytest.fixture(scope="module")
def mx() -> dict[str, type[Any]]:
    wheel, how = wire.client_wheel("0.7.0")
    if wheel is None:
        pytest.skip(f"the modelexpress==0.7.0 wheel is not available: {how}")
    return wire.message_classes(wire.client_descriptor(wheel))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster") as c:
        yield c


def call(channel: grpc.Channel, mx: dict[str, type[Any]], service: str, method: str, response: str, **fields: Any) -> Any:
    rpc = channel.unary_unary(f"/model_express.p2p.{service}/{method}", request_serializer=None,
                              response_deserializer=mx[response].FromString)
    return rpc(mx[f"{method}Request"](**fields).SerializeToString(), timeout=10)


def test_the_client_s_messages_walk_an_mxref_fleet(cluster: Cluster, mx: dict[str, type[Any]]) -> None:
    cluster.start_server(heartbeat_timeout=5.0)
    source = cluster.start_source("source-1", model=MODEL)
    assert cluster.server_address is not None
    with grpc.insecure_channel(cluster.server_address) as channel:
        listed = call(channel, mx, "P2pService", "ListSources", "ListSourcesResponse",
                      identity=mx["SourceIdentity"](), status_filter=READY)
        (ref,) = listed.instances
        assert (ref.mx_source_id, ref.worker_id) == (source.info["mx_source_id"], source.info["worker_id"])
        assert ref.accelerator == "cpu" and ref.updated_at > 0
        got = call(channel, mx, "P2pService", "GetMetadata", "GetMetadataResponse",
                   mx_source_id=ref.mx_source_id, worker_id=ref.worker_id)
        assert got.found and got.worker.status == READY and got.worker.worker_grpc_endpoint
        assert got.identity.model_name == "mxref/synthetic"
    with grpc.insecure_channel(got.worker.worker_grpc_endpoint) as channel:
        manifest = call(channel, mx, "WorkerService", "GetTensorManifest", "GetTensorManifestResponse",
                        mx_source_id=ref.mx_source_id, worker_id=ref.worker_id)
        assert manifest.agent_name == got.worker.agent_name and manifest.worker_id == ref.worker_id
        assert [t.dtype for t in manifest.tensors] == ["torch.float16"] * 4  # the spelling the client compares
        assert all(t.size == 262144 and t.addr > 0 for t in manifest.tensors)
        lease = call(channel, mx, "WorkerService", "PrepareTensorRead", "PrepareTensorReadResponse",
                     mx_source_id=ref.mx_source_id, worker_id=ref.worker_id)
        assert lease.lease_id and list(lease.manifest.tensors) == list(manifest.tensors)
        call(channel, mx, "WorkerService", "ReleaseTensorRead", "ReleaseTensorReadResponse",
             mx_source_id=ref.mx_source_id, lease_id=lease.lease_id)
        with pytest.raises(grpc.RpcError) as again:
            call(channel, mx, "WorkerService", "ReleaseTensorRead", "ReleaseTensorReadResponse",
                 mx_source_id=ref.mx_source_id, lease_id=lease.lease_id)
        assert again.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as reused:
            call(channel, mx, "WorkerService", "GetTensorManifest", "GetTensorManifestResponse",
                 mx_source_id=ref.mx_source_id, worker_id="not-this-one")
        assert reused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # the client's heartbeat for a worker the server does not know is a negative answer, not an error
    with grpc.insecure_channel(cluster.server_address) as channel:
        refused = call(channel, mx, "P2pService", "UpdateStatus", "UpdateStatusResponse",
                       mx_source_id=ref.mx_source_id, worker_id="gone", worker_rank=0, status=READY, source_load=0.5)
        assert not refused.success and "gone" in refused.message
