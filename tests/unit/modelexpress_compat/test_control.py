"""mxref's client speaks ModelExpress's ``model_express.p2p`` to a server that serves only that
(the real ModelExpress server; here mxref's own ``MxP2pService`` alone, over real loopback gRPC).

Pins: the four calls work on ``model_express.p2p`` with ``mxref.v1`` messages in and out; the
listing request is renumbered (``limit`` and ``min_updated_at`` land on MX's numbers, not on
``min_training_step``); ``auto`` switches after the first UNIMPLEMENTED and stays switched;
``mxref.v1`` forced gets UNIMPLEMENTED as an error; a bad wire value is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from mxref.config import ServerTimers
from mxref.errors import MetadataServerError
from mxref.metadata.modelexpress import MxP2pService
from mxref.metadata.servicer import P2pServicer
from mxref.metadata.store import Store
from mxref.metrics import ServerMetrics
from mxref.modelexpress import control as mx_control
from mxref.mx import p2p_pb2 as mx_pb2
from mxref.roles.client import MxClient
from mxref.v1 import p2p_pb2

TIMERS = ServerTimers(heartbeat_timeout_s=90, reaper_scan_interval_s=30, gc_timeout_s=3600)


@pytest.fixture
def mx_only() -> Iterator[str]:
    """A gRPC server answering only ``model_express.p2p.P2pService`` (as ModelExpress's does)."""
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((MxP2pService(servicer).generic_handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait(5)


def identity(model: str = "acme/model-a") -> p2p_pb2.SourceIdentity:
    return p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name=model, backend_framework=p2p_pb2.VLLM,
                                  tensor_parallel_size=1, dtype="float16")


def publish(client: MxClient, worker_id: str, rank: int = 0) -> str:
    worker = p2p_pb2.WorkerMetadata(worker_rank=rank, agent_name=f"agent-{worker_id}", metadata_endpoint="127.0.0.1:5555",
                                    worker_grpc_endpoint="127.0.0.1:6555", accelerator="cpu",
                                    status=p2p_pb2.SOURCE_STATUS_INITIALIZING)
    response = client.publish_metadata(identity(), worker, worker_id)
    assert response.success, response.message
    return response.mx_source_id


def test_every_call_on_model_express_p2p(mx_only: str) -> None:
    with MxClient(mx_only, timeout_s=5, wire="model_express.p2p") as client:
        sid = publish(client, "w1")
        assert client.list_sources(identity=identity(), status_filter=p2p_pb2.SOURCE_STATUS_READY) == []
        assert client.update_status(sid, "w1", 0, p2p_pb2.SOURCE_STATUS_READY).success
        listed = client.list_sources(identity=identity(), status_filter=p2p_pb2.SOURCE_STATUS_READY)
        assert [(r.mx_source_id, r.worker_id, r.status) for r in listed] == [(sid, "w1", p2p_pb2.SOURCE_STATUS_READY)]
        found = client.get_metadata(sid, "w1")
        assert found.found and found.worker.agent_name == "agent-w1"
        refused = client.update_status(sid, "nobody", 0, p2p_pb2.SOURCE_STATUS_READY)
        assert not refused.success  # the server's verdict, not an error


def test_listing_limit_lands_on_mx_numbers(mx_only: str) -> None:
    """``limit`` is field 6 in mxref.v1 and 7 in MX (6 is ``min_updated_at``): sent unrenumbered, a
    limit of 1 would read as "updated after 1 ms" and list both."""
    with MxClient(mx_only, timeout_s=5, wire="model_express.p2p") as client:
        for worker in ("w1", "w2"):
            assert client.update_status(publish(client, worker), worker, 0, p2p_pb2.SOURCE_STATUS_READY).success
        assert len(client.list_sources(identity=identity(), status_filter=p2p_pb2.SOURCE_STATUS_READY)) == 2
        assert len(client.list_sources(identity=identity(), status_filter=p2p_pb2.SOURCE_STATUS_READY, limit=1)) == 1


def test_list_request_renumbered() -> None:
    ours = p2p_pb2.ListSourcesRequest(limit=3, min_updated_at=7, worker_rank_filter=2,
                                      status_filter=p2p_pb2.SOURCE_STATUS_READY)
    theirs = mx_control.list_request(ours)
    assert (theirs.limit, theirs.min_updated_at, theirs.worker_rank_filter) == (3, 7, 2)
    assert not theirs.HasField("min_training_step")
    assert theirs.status_filter == mx_pb2.SOURCE_STATUS_READY
    unbounded = mx_control.list_request(p2p_pb2.ListSourcesRequest())
    assert not unbounded.HasField("limit") and not unbounded.HasField("min_updated_at")


def test_auto_switches_once_on_unimplemented(mx_only: str) -> None:
    with MxClient(mx_only, timeout_s=5) as client:
        assert client.wire == "auto"
        publish(client, "w1")
        assert client.wire == "model_express.p2p"
        assert isinstance(client._stub, mx_control.MxP2pStub)


def test_forced_mxref_wire_is_unimplemented_there(mx_only: str) -> None:
    with MxClient(mx_only, timeout_s=5, wire="mxref.v1") as client, pytest.raises(MetadataServerError) as caught:
        publish(client, "w1")
    assert caught.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_wire_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mx_control.ENV_WIRE, "model_express.p2p")
    assert mx_control.wire() == "model_express.p2p"
    assert mx_control.wire("mxref.v1") == "mxref.v1"
    monkeypatch.setenv(mx_control.ENV_WIRE, "grpc")
    with pytest.raises(ValueError, match=r"'grpc' \(\$MXREF_SERVER_WIRE\): expected one of auto"):
        mx_control.wire()
