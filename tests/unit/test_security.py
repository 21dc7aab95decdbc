"""``mxref.security``: the token check, reading credentials, and TLS + token on a real
in-process gRPC server (the WorkerService), certificates from ``mxref.pki``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mxref import pki, security
from mxref.errors import ManifestError
from mxref.metrics import SourceMetrics
from mxref.roles.client import fetch_tensor_manifest
from mxref.security import ClientCredentials, RefusalReason, SecurityError, ServerCredentials, check_authorization
from mxref.worker_service import WorkerManifest, WorkerServicer, start_worker_server

TOKEN = "s3cret-token_value"
SID = "sid-1"


def test_only_exactly_bearer_token_passes() -> None:
    assert check_authorization([f"Bearer {TOKEN}"], TOKEN) is None
    assert check_authorization([f"Bearer {TOKEN}".encode()], TOKEN) is None
    assert check_authorization([], TOKEN) is RefusalReason.MISSING_TOKEN
    for wrong in (f"bearer {TOKEN}", TOKEN, f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", "", "Bearer é"):
        assert check_authorization([wrong], TOKEN) is RefusalReason.WRONG_TOKEN, wrong
    # two authorization values: never "the right one among them"
    assert check_authorization([f"Bearer {TOKEN}", f"Bearer {TOKEN}"], TOKEN) is RefusalReason.WRONG_TOKEN


def test_read_token_strips_and_refuses_what_cannot_be_a_header(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    assert security.read_token(path) == TOKEN
    for bad in ("", "\n", "two words", "caf\u00e9", "x" * 5000):
        path.write_text(bad)
        with pytest.raises(SecurityError, match="token file"):
            security.read_token(path)
    with pytest.raises(SecurityError, match="token file"):
        security.read_token(tmp_path / "absent")


def test_a_token_never_goes_without_tls() -> None:
    with pytest.raises(SecurityError, match="needs TLS"):
        ClientCredentials(token=TOKEN)
    with pytest.raises(SecurityError, match="needs TLS"):
        ServerCredentials(token=TOKEN)
    with pytest.raises(SecurityError, match="both a certificate and its key"):
        ServerCredentials(cert_pem=b"x")


def test_plaintext_is_the_default() -> None:
    assert not security.client_default().tls and security.client_default().token is None
    assert not security.server_default().tls and security.server_default().interceptors() == []


@pytest.fixture
def creds(tmp_path: Path) -> pki.RunCredentials:
    return pki.generate(tmp_path, tls=True, token=True)


@pytest.fixture
def tls_worker(creds: pki.RunCredentials) -> Iterator[tuple[str, SourceMetrics]]:
    """A real WorkerService on loopback over TLS, requiring the run's token."""
    assert creds.server_cert and creds.server_key and creds.token
    metrics = SourceMetrics()
    manifest = WorkerManifest(worker_id="w-1", worker_rank=0).published_as(SID)
    server_creds = ServerCredentials.from_files(creds.server_cert, creds.server_key, creds.token)
    server, port = start_worker_server(WorkerServicer(manifest, metrics=metrics.source), "127.0.0.1", 0,
                                       credentials=server_creds)
    try:
        yield f"127.0.0.1:{port}", metrics
    finally:
        server.stop(None).wait(5)


def _refused(metrics: SourceMetrics) -> float:
    value = metrics.registry.get_sample_value("mxref_source_manifest_requests_total", {"result": "unauthenticated"})
    return value or 0.0


def test_tls_and_the_token_are_served(creds: pki.RunCredentials, tls_worker: tuple[str, SourceMetrics]) -> None:
    address, metrics = tls_worker
    client = ClientCredentials.from_files(creds.ca_cert, creds.token)
    assert fetch_tensor_manifest(address, SID, "w-1", timeout_s=10, credentials=client).worker_id == "w-1"
    assert _refused(metrics) == 0


@pytest.mark.parametrize("which", ["missing", "wrong"])
def test_a_client_without_the_token_is_refused_unauthenticated(
    creds: pki.RunCredentials, tls_worker: tuple[str, SourceMetrics], which: str
) -> None:
    address, metrics = tls_worker
    client = ClientCredentials.from_files(creds.ca_cert, creds.wrong_token if which == "wrong" else None)
    with pytest.raises(ManifestError) as info:
        fetch_tensor_manifest(address, SID, "w-1", timeout_s=10, credentials=client)
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert f"{which}_token" in str(info.value)
    assert _refused(metrics) == 1


def test_a_plaintext_client_cannot_reach_a_tls_server(tls_worker: tuple[str, SourceMetrics]) -> None:
    address, metrics = tls_worker
    with pytest.raises(ManifestError) as info:
        fetch_tensor_manifest(address, SID, "w-1", timeout_s=5, credentials=ClientCredentials())
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert _refused(metrics) == 0  # refused by the handshake, before any call


def test_a_client_trusting_another_ca_is_refused(tmp_path: Path, creds: pki.RunCredentials,
                                                 tls_worker: tuple[str, SourceMetrics]) -> None:
    address, _ = tls_worker
    other = pki.generate(tmp_path / "other", tls=True, token=False)
    assert creds.token is not None
    client = ClientCredentials.from_files(other.ca_cert, creds.token)
    with pytest.raises(ManifestError) as info:
        fetch_tensor_manifest(address, SID, "w-1", timeout_s=5, credentials=client)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_the_process_credentials_are_what_clients_and_worker_servers_use(
    creds: pki.RunCredentials, tls_worker: tuple[str, SourceMetrics]
) -> None:
    address, _ = tls_worker
    client = ClientCredentials.from_files(creds.ca_cert, creds.token)
    before = (security.client_default(), security.server_default())
    security.install(client, ServerCredentials())
    try:
        assert fetch_tensor_manifest(address, SID, "w-1", timeout_s=10).mx_source_id == SID
    finally:
        security.install(*before)
