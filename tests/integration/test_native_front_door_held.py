"""The native server's front door against peers that hold it, as a real ``python -m mxref server
--grpc-impl native`` with its default limits (docs/security.md: A front door a few addresses
cannot shut). Every load is bounded and every server is our own.

- **Idle connections from several addresses**: 1024 from each of 127.0.0.2..5 (what used to fill
  the 4096 cap: every other client got UNAVAILABLE for as long as they were held) and 1024 from
  each of 127.0.1.2..3; an honest client from 127.0.3.1 is answered, and its latency is printed.
  The per-block cap (2048 per /24) refuses the rest of 127.0.0.x; at the global cap the oldest
  silent connection makes room for the honest one.
- **Bytes in flight**: request bodies stopped half-way on 96 connections (~720 MiB sent), then
  answers of ~4 MiB that are never read (the client grants no window) on 24 connections x 8
  streams (~768 MiB asked for). The server's resident memory grows by less than
  ``RSS_GROWTH_LIMIT`` (before: every byte stayed); once the peers go, an honest call is answered.
  The RSS figures are printed.

grpcio's server is not tested here: the caps, deadlines and budgets are the native front door's
(grpcio's C core has its own, and none of these).
"""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.h2raw import RawH2, grpc_message
from fixtures.relay import Relay
from procs import Cluster, Proc

from mxref.roles.client import MxClient
from mxref.v1 import p2p_pb2

pytestmark = [pytest.mark.integration]

MIB = 1 << 20
PER_ADDRESS = 1024
HOLDERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.1.2", "127.0.1.3")
HONEST_FROM = "127.0.3.1"
CALL_TIMEOUT_S = 10.0
RSS_GROWTH_LIMIT = 400 * MIB
"""The received-and-queued budget (256 MiB) or the unsent-answer budget (256 MiB), whichever a
flood meets, plus the allocator's slack; before, the half-sent bodies alone grew it ~720 MiB."""
HALF_SENT_CONNECTIONS = 96
HALF_SENT_BYTES = (15 * MIB) // 2  # of a message that declares 15 MiB
UNREAD_CONNECTIONS = 24
UNREAD_STREAMS = 8  # the server's max_concurrent_streams
BLOB = b"\xab" * (4 * MIB - 4096)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Cluster, Proc, int]]:
    with Cluster(tmp_path) as cluster:
        proc = cluster.start("server", "server", "--grpc-impl", "native", "--publish-rate", "1e6",
                             "--publish-burst", "1000000")
        yield cluster, proc, cluster.port(proc, "grpc")


@contextlib.contextmanager
def descriptors(n: int) -> Iterator[None]:
    """This process may hold ``n`` descriptors (the soft limit raised, then put back)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < n:
        pytest.skip(f"the open-files hard limit is {hard}, below the {n} this test holds")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, n), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.contextmanager
def peers() -> Iterator[list[RawH2]]:
    """Raw HTTP/2 peers, every one closed at the end."""
    held: list[RawH2] = []
    try:
        yield held
    finally:
        for peer in held:
            peer.close()


def honest_call(port: int) -> float:
    """Seconds one honest ListSources took, from ``HONEST_FROM`` through a relay (a new connection)."""
    with Relay(f"127.0.0.1:{port}", HONEST_FROM) as relay, MxClient(relay.address, timeout_s=CALL_TIMEOUT_S) as client:
        started = time.monotonic()
        client.list_sources()
        return time.monotonic() - started


def test_idle_connections_from_a_few_addresses_do_not_shut_the_door(server: tuple[Cluster, Proc, int]) -> None:
    _cluster, proc, port = server
    held: list[socket.socket] = []
    with descriptors(len(HOLDERS) * PER_ADDRESS + 256):
        try:
            for ip in HOLDERS:
                for _ in range(PER_ADDRESS):
                    held.append(socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(ip, 0)))
            time.sleep(1.0)  # the server has accepted (or refused) them all by now
            latency = honest_call(port)
            print(f"front door: {len(held)} idle connections held from {len(HOLDERS)} addresses; an honest "
                  f"ListSources from {HONEST_FROM} answered in {latency * 1000:.0f} ms")
            assert latency < CALL_TIMEOUT_S
        finally:
            for s in held:
                s.close()
    assert proc.returncode is None, proc.tail()


def test_bytes_in_flight_are_bounded(server: tuple[Cluster, Proc, int]) -> None:
    _cluster, proc, port = server
    with MxClient(f"127.0.0.1:{port}", timeout_s=CALL_TIMEOUT_S) as source:
        published = source.publish_metadata(
            p2p_pb2.SourceIdentity(mx_version="0.7.0", model_name="acme/big", dtype="float16"),
            p2p_pb2.WorkerMetadata(worker_rank=0, nixl_metadata=BLOB, metadata_endpoint="10.0.0.1:5555"), "w0")
        assert published.success, published.message
    get = grpc_message(p2p_pb2.GetMetadataRequest(mx_source_id=published.mx_source_id, worker_id="w0").SerializeToString())
    growth: dict[str, int] = {}
    with descriptors(HALF_SENT_CONNECTIONS + UNREAD_CONNECTIONS + 256):
        before = rss_bytes(proc.pid)
        with peers() as held:
            half = grpc_message(b"\x0a" * (HALF_SENT_BYTES - 5), declared=15 * MIB)
            for _ in range(HALF_SENT_CONNECTIONS):
                peer = RawH2(port)
                held.append(peer)
                with contextlib.suppress(OSError):  # a server that stops reading (budget spent) may time us out
                    peer.data(peer.open("/mxref.v1.P2pService/PublishMetadata"), half)
            time.sleep(2.0)
            growth["half-sent"] = rss_bytes(proc.pid) - before
        time.sleep(1.0)  # the peers are gone: their bodies are dropped
        before = rss_bytes(proc.pid)
        with peers() as held:
            for _ in range(UNREAD_CONNECTIONS):
                peer = RawH2(port, window=0)
                held.append(peer)
                for _ in range(UNREAD_STREAMS):
                    peer.data(peer.open("/mxref.v1.P2pService/GetMetadata"), get, end=True)
            time.sleep(5.0)  # Python answers them all (each ~4 MiB), and none is read
            growth["unread"] = rss_bytes(proc.pid) - before
    print(f"bytes in flight: server RSS grew {growth['half-sent'] / MIB:.0f} MiB under {HALF_SENT_CONNECTIONS} "
          f"half-sent bodies (~{HALF_SENT_CONNECTIONS * HALF_SENT_BYTES / MIB:.0f} MiB sent), "
          f"{growth['unread'] / MIB:.0f} MiB under {UNREAD_CONNECTIONS * UNREAD_STREAMS} unread answers "
          f"(~{UNREAD_CONNECTIONS * UNREAD_STREAMS * len(BLOB) / MIB:.0f} MiB asked for)")
    assert growth["half-sent"] < RSS_GROWTH_LIMIT
    assert growth["unread"] < RSS_GROWTH_LIMIT
    deadline = time.monotonic() + 30
    while True:  # the peers are gone: what they held is given back
        try:
            honest_call(port)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert proc.returncode is None, proc.tail()
