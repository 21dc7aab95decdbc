"""A byte-budget flood against a real ``python -m mxref server``, on both gRPC implementations.

Many connections publish megabyte records under new worker ids as fast as they can (the write
rates raised, so that only the byte budgets stand in the way), and send records over
``--max-record-bytes``. The store keeps at most ``--max-store-bytes`` of records, the server's
resident memory stays bounded (before the budgets, every record stayed: 240 MiB here), and an
honest source that published before the flood republishes, heartbeats and is listed after it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from procs import Cluster, Proc

from mxref.metadata.transport import GRPC_IMPLS
from mxref.roles.client import MxClient
from mxref.v1 import p2p_pb2

pytestmark = pytest.mark.integration

MIB = 1 << 20
STORE_BYTES = 32 * MIB
RECORD_BYTES = 2 * MIB
FLOOD_CONNECTIONS = 8
FLOOD_PER_CONNECTION = 30
FLOOD_BLOB = b"\xab" * MIB  # each flood record ~1 MiB: 240 MiB attempted, 32 MiB may stay
OVERSIZE_BLOB = b"\xcd" * (3 * MIB)  # over --max-record-bytes (under --max-blob-bytes)
RSS_GROWTH_LIMIT = 128 * MIB
"""The store's 32 MiB plus gRPC's buffers and the allocator's slack; the unbounded store grew ~240 MiB."""
CALL_TIMEOUT_S = 30.0


def rss_bytes(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid``: its resident memory now and at its peak."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def identity() -> p2p_pb2.SourceIdentity:
    return p2p_pb2.SourceIdentity(mx_version="0.7.0", model_name="acme/flood", dtype="float16")


def worker(endpoint: str, blob: bytes) -> p2p_pb2.WorkerMetadata:
    return p2p_pb2.WorkerMetadata(worker_rank=0, nixl_metadata=blob, agent_name=endpoint,
                                  metadata_endpoint=f"{endpoint}:5555", worker_grpc_endpoint=f"{endpoint}:6555")


@pytest.fixture(params=GRPC_IMPLS)
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Cluster, Proc, str]]:
    with Cluster(tmp_path) as cluster:
        proc = cluster.start("server", "server", "--grpc-impl", str(request.param),
                             "--max-store-bytes", str(STORE_BYTES), "--max-record-bytes", str(RECORD_BYTES),
                             "--publish-rate", "1e6", "--publish-burst", "1000000",
                             "--peer-publish-rate", "1e6", "--peer-publish-burst", "1000000")
        yield cluster, proc, f"127.0.0.1:{cluster.port(proc, 'grpc')}"


def flood(address: str, index: int, codes: Counter[str], lock: threading.Lock) -> None:
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 64 * MIB)]
    with grpc.insecure_channel(address, options=options) as channel:
        rpc = channel.unary_unary("/mxref.v1.P2pService/PublishMetadata", request_serializer=None,
                                  response_deserializer=None)
        for i in range(FLOOD_PER_CONNECTION):
            blob = OVERSIZE_BLOB if i % 10 == 9 else FLOOD_BLOB
            request = p2p_pb2.PublishMetadataRequest(identity=identity(), worker=worker("10.6.6.6", blob),
                                                     worker_id=f"flood-{index}-{i}")
            try:
                rpc(request.SerializeToString(), timeout=CALL_TIMEOUT_S)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            with lock:
                codes[code] += 1


def test_a_byte_flood_is_bounded_and_an_honest_source_goes_on(server: tuple[Cluster, Proc, str]) -> None:
    cluster, proc, address = server
    with MxClient(address, timeout_s=CALL_TIMEOUT_S) as honest:
        published = honest.publish_metadata(identity(), worker("10.0.0.1", b"h" * 100_000), "honest")
        assert published.success, published.message
        sid = published.mx_source_id
        assert honest.update_status(sid, "honest", 0, p2p_pb2.SOURCE_STATUS_READY).success
        before, _ = rss_bytes(proc.pid)

        codes: Counter[str] = Counter()
        lock = threading.Lock()
        threads = [threading.Thread(target=flood, args=(address, i, codes, lock)) for i in range(FLOOD_CONNECTIONS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads)
        after, peak = rss_bytes(proc.pid)
        print(f"byte flood: {dict(codes)}; server RSS {before / MIB:.0f} MiB before, {after / MIB:.0f} MiB after, "
              f"peak {peak / MIB:.0f} MiB; growth {(after - before) / MIB:.0f} MiB")

        oversize = FLOOD_CONNECTIONS * (FLOOD_PER_CONNECTION // 10)
        assert codes["INVALID_ARGUMENT"] == oversize  # over --max-record-bytes, every one
        assert 0 < codes["OK"] <= STORE_BYTES // len(FLOOD_BLOB)
        assert codes["RESOURCE_EXHAUSTED"] == FLOOD_CONNECTIONS * FLOOD_PER_CONNECTION - oversize - codes["OK"]
        assert after - before < RSS_GROWTH_LIMIT

        # the honest source: republishes (moving itself), heartbeats, is listed, its record its own
        assert honest.publish_metadata(identity(), worker("10.0.0.2", b"h" * 100_000), "honest").success
        assert honest.update_status(sid, "honest", 0, p2p_pb2.SOURCE_STATUS_READY).success
        got = honest.get_metadata(sid, "honest")
        assert got.found and got.worker.metadata_endpoint == "10.0.0.2:5555"
        ready = honest.list_sources(identity(), status_filter=p2p_pb2.SOURCE_STATUS_READY)
        assert [r.worker_id for r in ready] == ["honest"]
        families = cluster.scrape(proc)
        assert cluster.sample(families, "mxref_server_rejected_requests_total", method="PublishMetadata",
                              reason="store_full") == codes["RESOURCE_EXHAUSTED"]
