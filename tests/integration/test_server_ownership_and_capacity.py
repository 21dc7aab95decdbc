"""Ownership that survives a restart and capacity shared fairly, against a real ``python -m mxref
server`` on both gRPC implementations (docs/security.md: Ownership and capacity).

- **A restart over Redis**: a source publishes (getting its owner secret), the server is stopped
  and started again over the same real ``redis-server``; a caller with no secret, one with a
  secret of its own and a ModelExpress client are then refused on that record, and the rightful
  source heartbeats and republishes with its secret. (Before: the first writer after the restart
  became the owner, and the source was locked out for good.)
- **A filler cannot shut out a new source**: one address (``127.0.0.2``, through a relay bound to
  it) publishes records until refused, then a second (``127.0.0.4``), under a record budget and
  then a byte budget; a new honest source (``127.0.0.3``) still publishes and heartbeats.
  (Before: the fillers took the whole budget, and the new source was refused.)
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fixtures.relay import Relay
from procs import Cluster, Proc

from harness.subjects.redisd import RedisServer, redis_available
from mxref.metadata.transport import GRPC_IMPLS
from mxref.mx import p2p_pb2 as mx_pb2
from mxref.v1 import p2p_pb2

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 15.0
KIB = 1024
WIDE_OPEN = ("--publish-rate", "1e6", "--publish-burst", "1000000", "--peer-publish-rate", "1e6",
             "--peer-publish-burst", "1000000")


@pytest.fixture(params=GRPC_IMPLS)
def grpc_impl(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def identity() -> p2p_pb2.SourceIdentity:
    return p2p_pb2.SourceIdentity(mx_version="0.7.0", model_name="acme/owned", dtype="float16")


def worker(endpoint: str, blob: bytes = b"nixl") -> p2p_pb2.WorkerMetadata:
    return p2p_pb2.WorkerMetadata(worker_rank=0, nixl_metadata=blob, agent_name=endpoint,
                                  metadata_endpoint=f"{endpoint}:5555", worker_grpc_endpoint=f"{endpoint}:6555")


class Caller:
    """One connection to ``address``, sending raw requests (with whatever secret the test says)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])

    def call(self, method: str, request: Any, response: Any, package: str = "mxref.v1") -> tuple[grpc.StatusCode, Any]:
        rpc = self.channel.unary_unary(f"/{package}.P2pService/{method}", request_serializer=None,
                                       response_deserializer=None)
        try:
            raw = rpc(request.SerializeToString(), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
        return grpc.StatusCode.OK, response.FromString(raw)

    def publish(self, worker_id: str, endpoint: str, secret: str = "", blob: bytes = b"nixl") -> tuple[grpc.StatusCode, Any]:
        request = p2p_pb2.PublishMetadataRequest(identity=identity(), worker=worker(endpoint, blob),
                                                 worker_id=worker_id, owner_secret=secret)
        return self.call("PublishMetadata", request, p2p_pb2.PublishMetadataResponse)

    def heartbeat(self, sid: str, worker_id: str, secret: str = "") -> tuple[grpc.StatusCode, Any]:
        request = p2p_pb2.UpdateStatusRequest(mx_source_id=sid, worker_id=worker_id, worker_rank=0,
                                              status=p2p_pb2.SOURCE_STATUS_READY, owner_secret=secret)
        return self.call("UpdateStatus", request, p2p_pb2.UpdateStatusResponse)

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def caller() -> Iterator[list[Caller]]:
    opened: list[Caller] = []
    yield opened
    for c in opened:
        c.close()


def connect(opened: list[Caller], address: str) -> Caller:
    c = Caller(address)
    opened.append(c)
    return c


def start_server(cluster: Cluster, grpc_impl: str, *args: str) -> tuple[Proc, str]:
    proc = cluster.start("server", "server", "--grpc-impl", grpc_impl, *WIDE_OPEN, *args)
    return proc, f"127.0.0.1:{cluster.port(proc, 'grpc')}"


def stop(cluster: Cluster, proc: Proc) -> None:
    cluster.signal(proc, signal.SIGTERM)
    assert cluster.wait_exit(proc, STOP_TIMEOUT_S) == 0, proc.tail()


def test_the_owner_survives_a_restart_over_redis(tmp_path: Path, grpc_impl: str, caller: list[Caller]) -> None:
    if redis_available() is None:
        pytest.skip("redis-server is not installed (.ci/bootstrap installs it)")
    with RedisServer() as redis_server, Cluster(tmp_path) as cluster:
        proc, address = start_server(cluster, grpc_impl, "--store", redis_server.url)
        code, published = connect(caller, address).publish("w0", "10.0.0.1")
        assert code == grpc.StatusCode.OK and published.success, published
        sid, secret = published.mx_source_id, published.owner_secret
        assert secret
        stop(cluster, proc)

        proc, address = start_server(cluster, grpc_impl, "--store", redis_server.url)
        thief = connect(caller, address)
        for attempt, code_and_answer in (
            ("a publish without a secret", thief.publish("w0", "10.6.6.6")),
            ("a publish with a secret of its own", thief.publish("w0", "10.6.6.6", secret="ab" * 32)),
            ("a heartbeat without a secret", thief.heartbeat(sid, "w0")),
            ("a heartbeat with a secret of its own", thief.heartbeat(sid, "w0", secret="cd" * 32)),
        ):
            code, answer = code_and_answer
            assert code == grpc.StatusCode.PERMISSION_DENIED, f"{attempt} after the restart: {code} {answer}"
        mx_publish = mx_pb2.PublishMetadataRequest(
            identity=mx_pb2.SourceIdentity(mx_version="0.7.0", model_name="acme/owned", dtype="float16"),
            worker=mx_pb2.WorkerMetadata(worker_rank=0, metadata_endpoint="10.6.6.6:5555"), worker_id="w0")
        code, answer = thief.call("PublishMetadata", mx_publish, mx_pb2.PublishMetadataResponse, "model_express.p2p")
        assert code == grpc.StatusCode.PERMISSION_DENIED, f"a ModelExpress publish after the restart: {code} {answer}"

        source = connect(caller, address)
        code, beat = source.heartbeat(sid, "w0", secret)
        assert code == grpc.StatusCode.OK and beat.success, beat
        code, again = source.publish("w0", "10.0.0.2", secret)
        assert code == grpc.StatusCode.OK and again.success, again
        code, got = source.call("GetMetadata", p2p_pb2.GetMetadataRequest(mx_source_id=sid, worker_id="w0"),
                                p2p_pb2.GetMetadataResponse)
        assert got.worker.metadata_endpoint == "10.0.0.2:5555"
        stop(cluster, proc)


@pytest.mark.parametrize("budget", ["records", "bytes"])
def test_a_filler_cannot_shut_out_a_new_source(tmp_path: Path, grpc_impl: str, budget: str,
                                               caller: list[Caller]) -> None:
    args: tuple[str, ...]
    if budget == "records":  # 20 records; each filler address may hold 10, and 1 is kept for new peers
        args, blob, most = ("--max-records", "20"), b"f", 20
    else:  # 1 MiB; each address may hold 512 KiB, and ~52 KiB are kept for new peers (the fillers
        # alone would leave ~21 KB, too little for the new source's 30 KiB)
        args, blob, most = ("--max-store-bytes", str(1024 * KIB), "--max-record-bytes", str(64 * KIB)), \
            b"f" * (40 * KIB), 1024 // 40
    with Cluster(tmp_path) as cluster:
        _proc, address = start_server(cluster, grpc_impl, *args)
        filled: dict[str, int] = {}
        for filler_ip in ("127.0.0.2", "127.0.0.4"):
            with Relay(address, filler_ip) as relay:
                filler = connect(caller, relay.address)
                filled[filler_ip] = 0
                for i in range(most + 1):
                    code, answer = filler.publish(f"fill-{filler_ip}-{i}", "10.6.6.6", blob=blob)
                    if code != grpc.StatusCode.OK:
                        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, answer
                        break
                    filled[filler_ip] += 1
                filler.close()
        print(f"fair capacity ({budget}, {grpc_impl}): the fillers published {filled} before refused")
        assert filled["127.0.0.2"] > 0

        with Relay(address, "127.0.0.3") as relay:
            honest = connect(caller, relay.address)
            code, published = honest.publish("honest", "10.0.0.1", blob=b"h" * (30 * KIB if budget == "bytes" else 1))
            assert code == grpc.StatusCode.OK, f"a new source refused after the fillers: {published}"
            code, beat = honest.heartbeat(published.mx_source_id, "honest", published.owner_secret)
            assert code == grpc.StatusCode.OK and beat.success, beat
            honest.close()
