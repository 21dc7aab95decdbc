"""The control plane with credentials, as real processes: ``python -m mxref server`` with
TLS and a bearer token (a throwaway CA from ``mxref.pki``), reached over real gRPC.

A client without the CA cannot connect; one without the token (or with a wrong one) is
refused UNAUTHENTICATED, counted and logged as an event, and its publish never lands; one
with both is served. Without flags the server stays plaintext, as before. A source and a
reader given the run's credentials load over NIXL with TLS on both gRPC services.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from procs import Cluster

from mxref import pki
from mxref.errors import MetadataServerError
from mxref.process import EXIT_USAGE
from mxref.roles.client import MxClient
from mxref.security import ClientCredentials
from mxref.v1 import p2p_pb2

pytestmark = pytest.mark.integration

IDENTITY = p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name="acme/tiny", dtype="float16")
WORKER = p2p_pb2.WorkerMetadata(worker_rank=0, worker_grpc_endpoint="127.0.0.1:6555", accelerator="cpu")
MODEL = ("--tensors", "4", "--tensor-mib", "0.25")


@pytest.fixture
def creds(tmp_path: Path) -> pki.RunCredentials:
    return pki.generate(tmp_path, tls=True, token=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster") as c:
        yield c


@pytest.fixture(params=["grpcio", "native"])
def grpc_impl(request: pytest.FixtureRequest) -> list[str]:
    """The metadata server's flag for each gRPC implementation: both serve TLS and the token."""
    return ["--grpc-impl", str(request.param)]


def _server_flags(creds: pki.RunCredentials) -> list[str]:
    return ["--tls-cert", str(creds.server_cert), "--tls-key", str(creds.server_key), "--token-file", str(creds.token)]


def _peer_flags(creds: pki.RunCredentials) -> list[str]:
    return ["--tls-ca", str(creds.ca_cert), *_server_flags(creds)]


def _publish(address: str, credentials: ClientCredentials) -> p2p_pb2.PublishMetadataResponse:
    with MxClient(address, timeout_s=5, credentials=credentials) as client:
        return client.publish_metadata(IDENTITY, WORKER, "w-rogue")


def test_a_client_without_ca_or_token_is_refused_and_one_with_both_is_served(
    cluster: Cluster, creds: pki.RunCredentials, grpc_impl: list[str]
) -> None:
    server = cluster.start("server", "server", *_server_flags(creds), *grpc_impl)
    address = f"127.0.0.1:{cluster.port(server, 'grpc')}"
    assert [e["grpc_impl"] for e in server.events("listening") if e.get("what") == "grpc"] == [grpc_impl[1]]

    with pytest.raises(MetadataServerError) as plaintext:  # no CA: the TLS handshake never happens
        _publish(address, ClientCredentials())
    assert plaintext.value.code == grpc.StatusCode.UNAVAILABLE

    for token, reason in ((None, "missing_token"), (creds.wrong_token, "wrong_token")):
        with pytest.raises(MetadataServerError) as refused:
            _publish(address, ClientCredentials.from_files(creds.ca_cert, token))
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert not refused.value.retryable
        assert reason in str(refused.value)

    honest = ClientCredentials.from_files(creds.ca_cert, creds.token)
    with MxClient(address, timeout_s=5, credentials=honest) as client:
        assert client.list_sources() == []  # the refused publishes never landed
        assert client.publish_metadata(IDENTITY, WORKER, "w-honest").success
        assert [ref.worker_id for ref in client.list_sources()] == ["w-honest"]

    # the native server reports its refusals from a thread, counted per peer address, method and reason
    cluster.wait_event(server, "unauthenticated", where=lambda e: e["reason"] == "missing_token")
    cluster.wait_event(server, "unauthenticated", where=lambda e: e["reason"] == "wrong_token")
    events = server.events("unauthenticated")
    assert sorted((e["method"], e["reason"], e["count"]) for e in events) == [
        ("PublishMetadata", "missing_token", 1), ("PublishMetadata", "wrong_token", 1),
    ]
    assert all(e["peer"] for e in events)
    families = cluster.scrape(server)
    assert cluster.sample(families, "mxref_server_rpcs_total", method="PublishMetadata", result="unauthenticated") == 2
    assert cluster.sample(families, "mxref_server_rpcs_total", method="PublishMetadata", result="ok") == 1
    assert creds.token is not None and creds.token.read_text().strip() not in " ".join(server.argv)


def test_without_flags_the_server_stays_plaintext(cluster: Cluster, creds: pki.RunCredentials) -> None:
    server = cluster.start("server", "server")
    address = f"127.0.0.1:{cluster.port(server, 'grpc')}"
    with MxClient(address, timeout_s=5) as client:
        assert client.publish_metadata(IDENTITY, WORKER, "w-plain").success
    with pytest.raises(MetadataServerError) as tls:  # a TLS client does not fall back to plaintext
        _publish(address, ClientCredentials.from_files(creds.ca_cert, creds.token))
    assert tls.value.code == grpc.StatusCode.UNAVAILABLE
    assert server.events("unauthenticated") == []


def test_a_token_without_tls_stops_the_server_at_once(cluster: Cluster, creds: pki.RunCredentials) -> None:
    server = cluster.start("server", "server", "--token-file", str(creds.token))
    assert cluster.wait_exit(server, 20) == EXIT_USAGE
    assert "needs TLS" in server.log()
    assert cluster.wait_event(server, "exit")["code"] == EXIT_USAGE


def test_a_reader_loads_over_tls_from_a_source_with_the_run_credentials(
    cluster: Cluster, creds: pki.RunCredentials, grpc_impl: list[str]
) -> None:
    server = cluster.start("server", "server", "--heartbeat-timeout", "5", "--reaper-interval", "0.5",
                           *_server_flags(creds), *grpc_impl)
    cluster.server, cluster.server_address = server, f"127.0.0.1:{cluster.port(server, 'grpc')}"
    source = cluster.start_source("source-1", *_peer_flags(creds), model=MODEL)
    reader = cluster.run_reader("reader-1", "--transfer-timeout", "20", *_peer_flags(creds), model=MODEL)
    assert reader.returncode == 0, reader.tail()
    result = reader.result()
    assert result["path"] == "rdma" and result["integrity"] == "verified", result
    families = cluster.scrape(source)
    assert cluster.sample(families, "mxref_source_manifest_requests_total", result="ok") == 1
    assert cluster.sample(families, "mxref_source_manifest_requests_total", result="unauthenticated") is None
    assert server.events("unauthenticated") == []
