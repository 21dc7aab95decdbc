"""The metadata server against a hostile peer, as real processes, on both gRPC implementations.

- Descriptor exhaustion: a server started under ``prlimit --nofile=64:64`` gets more TCP
  connections than it has descriptors; once they are gone an honest ListSources is answered
  (the native server's accept loop used to end for good on the first EMFILE).
- An unauthenticated flood while a source heartbeats (TLS and a token; the flood, thousands of
  ListSources a second without the token, from this process): every heartbeat is answered
  within the reaper's timeout and the worker stays READY (the native server used to queue the
  refused reads ahead of every heartbeat until the reaper marked the worker STALE); the
  refusals cost a bounded number of event lines, whose counts add up to the metric's.
  The heartbeats' p99 idle vs flooded is measured by ``python -m mxref.bench.refusals``
  (its goal, 3x, is a benchmark's, not an assert here).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import Cluster, Proc

from mxref import pki
from mxref.bench import refusals as bench_refusals
from mxref.errors import MetadataServerError
from mxref.metadata.transport import GRPC_IMPLS
from mxref.roles.client import MxClient
from mxref.security import ClientCredentials

pytestmark = pytest.mark.integration

NOFILE = 64
CONNECTIONS = 90  # more than NOFILE: the server meets EMFILE
ANSWER_WITHIN_S = 20.0
HEARTBEAT_TIMEOUT_S = 5.0  # the reaper's: a heartbeat starved this long would make the worker STALE
FLOOD_S = 4.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster") as c:
        yield c


def list_until_answered(address: str, within_s: float) -> float:
    """Seconds until an honest ListSources (a fresh connection each try) is answered; fails after ``within_s``."""
    started = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - started < within_s:
        try:
            with MxClient(address, timeout_s=2) as client:
                client.list_sources()
            return time.monotonic() - started
        except MetadataServerError as exc:
            last = exc
            time.sleep(0.2)
    raise AssertionError(f"no ListSources answered within {within_s}s after the connections closed: {last}")


@pytest.mark.parametrize("grpc_impl", GRPC_IMPLS)
def test_the_server_serves_again_after_running_out_of_descriptors(cluster: Cluster, grpc_impl: str) -> None:
    server = cluster.start("server", "server", "--port", "0", "--metrics-port", "0", "--grpc-impl", grpc_impl,
                           wrap=("prlimit", f"--nofile={NOFILE}:{NOFILE}"))
    address = f"127.0.0.1:{cluster.port(server, 'grpc')}"
    list_until_answered(address, ANSWER_WITHIN_S)
    held: list[socket.socket] = []
    try:
        for _ in range(CONNECTIONS):  # the kernel completes them (backlog); the server runs out accepting
            held.append(socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), timeout=5))
        time.sleep(1.0)  # the server has tried to accept them all by now
    finally:
        for s in held:
            s.close()
    list_until_answered(address, ANSWER_WITHIN_S)
    assert server.returncode is None, server.tail()
    with MxClient(address, timeout_s=5) as client:  # and keeps answering
        assert client.list_sources() == []


def creds_of(tmp_path: Path) -> bench_refusals.Creds:
    made = pki.generate(tmp_path / "pki", tls=True, token=True)
    assert made.server_cert and made.server_key and made.ca_cert and made.token
    return bench_refusals.Creds(made.server_cert, made.server_key, made.ca_cert, made.token)


def start_tls_server(cluster: Cluster, creds: bench_refusals.Creds, grpc_impl: str) -> tuple[Proc, str]:
    server = cluster.start("server", "server", "--port", "0", "--metrics-port", "0", "--grpc-impl", grpc_impl,
                           "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S), "--reaper-interval", "0.25",
                           *creds.server_flags())
    return server, f"127.0.0.1:{cluster.port(server, 'grpc')}"


@pytest.mark.parametrize("grpc_impl", GRPC_IMPLS)
def test_an_unauthenticated_flood_neither_starves_heartbeats_nor_floods_the_event_log(
        cluster: Cluster, tmp_path: Path, grpc_impl: str) -> None:
    creds = creds_of(tmp_path)
    server, address = start_tls_server(cluster, creds, grpc_impl)
    record = bench_refusals.publish(address, creds)
    idle, _ = bench_refusals.heartbeats(address, creds, record, 1.0, 0.05)
    window = bench_refusals.flooded(address, creds, record, FLOOD_S, 0.05, connections=8, window=64)
    refused = window.flood.get(f"status:{bench_refusals.UNAUTHENTICATED}", 0.0)
    print(f"{grpc_impl}: idle max {max(idle) * 1000:.1f} ms; flooded: {len(window.latencies)} heartbeats, "
          f"max {max(window.latencies, default=0) * 1000:.1f} ms; flood {window.flood}")
    assert window.error is None, f"a heartbeat failed under the flood: {window.error}"
    assert refused > 100, window.flood  # it was a flood, and it was refused
    assert window.latencies and max(window.latencies) < HEARTBEAT_TIMEOUT_S, window.latencies
    assert window.status == bench_refusals.READY
    # heartbeating on: the reaper (every 0.25 s) has had its chance, and the last refusals' line is out
    _, status = bench_refusals.heartbeats(address, creds, record, 1.5, 0.05)
    assert status == bench_refusals.READY
    assert not server.events("source_status", where=lambda e: e["status"] == "STALE")

    lines = server.events("unauthenticated")
    families = cluster.scrape(server)
    metric = cluster.sample(families, "mxref_server_rpcs_total", method="ListSources", result="unauthenticated")
    assert metric is not None and metric >= refused
    assert sum(e.get("count", 1) for e in lines) == metric  # every refusal counted in some line
    seconds = window.flood["seconds"] + 1
    keys = {(e["peer"], e["method"], e["reason"]) for e in lines}
    assert keys == {("ipv4:127.0.0.1", "ListSources", "missing_token")}
    assert len(lines) <= 2 * (seconds + 2), len(lines)  # about one a second, not one per refusal
    assert server.returncode is None


@pytest.mark.parametrize("grpc_impl", GRPC_IMPLS)
def test_a_client_with_the_token_is_still_served_while_the_flood_runs(
        cluster: Cluster, tmp_path: Path, grpc_impl: str) -> None:
    """The flood is refused, not the service: a listing with the token answers during it."""
    creds = creds_of(tmp_path)
    _, address = start_tls_server(cluster, creds, grpc_impl)
    result: dict[str, float] = {}
    flood = threading.Thread(target=lambda: result.update(bench_refusals.unauthenticated_flood(
        address, creds, FLOOD_S, connections=4, window=64)), daemon=True)
    flood.start()
    time.sleep(0.5)
    with MxClient(address, timeout_s=HEARTBEAT_TIMEOUT_S,
                  credentials=ClientCredentials.from_files(creds.ca, creds.token)) as client:
        for _ in range(10):
            assert client.list_sources() == []
    flood.join(FLOOD_S + 30)
    assert result.get(f"status:{bench_refusals.UNAUTHENTICATED}", 0) > 0, result
