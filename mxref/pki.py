"""Throwaway credentials: a CA, one server certificate, a bearer token (``cryptography``), for a
harness run (when a scenario sets ``security.tls`` its runner calls ``generate`` at setup, before
any process starts) or a benchmark of the server's refusals (``mxref.bench.refusals``). It writes, under ``<run_dir>/pki`` (mode 0700):

- ``ca.pem``: a self-signed CA (EC P-256, valid one day), the only trust anchor of the run;
  its key is used once, in memory, and never written;
- ``server.pem`` / ``server.key``: one certificate every mxref server process presents (the
  metadata server and each source's WorkerService), signed by the CA, whose SAN lists every
  address a process of the run listens on (loopback, each netns host, the bridge a proxy
  listens on) and ``localhost``;
- with ``security.token``, ``token`` (32 random bytes, URL-safe base64) and ``wrong-token``
  (another one, for processes a scenario makes present a wrong token).

Keys and tokens are written 0600. Nothing here is meant to outlive the run.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["RunCredentials", "generate", "issue_server_cert", "make_ca", "new_token"]

VALIDITY = dt.timedelta(days=1)
CLOCK_SKEW = dt.timedelta(minutes=5)
DNS_NAMES = ("localhost",)
LOOPBACK = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class RunCredentials:
    """Paths of what ``generate`` wrote (``None``: not asked for)."""

    directory: Path
    ca_cert: Path | None = None
    server_cert: Path | None = None
    server_key: Path | None = None
    token: Path | None = None
    wrong_token: Path | None = None

    @property
    def tls(self) -> bool:
        return self.ca_cert is not None


def make_ca(common_name: str = "mxchaos run CA") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A fresh self-signed CA: (key, certificate)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue_server_cert(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    addresses: Iterable[str],
    dns_names: Iterable[str] = DNS_NAMES,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server certificate signed by the CA whose SAN holds ``addresses`` (IP literals) and
    ``dns_names``: (key, certificate). ``ValueError`` for an address that is not an IP."""
    ips = sorted({ipaddress.ip_address(a) for a in addresses}, key=lambda ip: (ip.version, int(ip)))
    san: list[x509.GeneralName] = [x509.IPAddress(ip) for ip in ips]
    san += [x509.DNSName(name) for name in dict.fromkeys(dns_names)]
    if not san:
        raise ValueError("a server certificate needs at least one address or DNS name")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mxchaos run server")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def new_token() -> str:
    """32 random bytes, URL-safe base64 (printable ASCII, no spaces)."""
    return secrets.token_urlsafe(32)


def _write(path: Path, data: bytes, mode: int) -> Path:
    """Create ``path`` with ``mode`` from the start (a key is never readable by others, not even briefly)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # the umask may have narrowed it; never widened beyond ``mode``
    return path


def generate(run_dir: Path, *, tls: bool, token: bool, addresses: Iterable[str] = ()) -> RunCredentials:
    """Write the run's credentials under ``run_dir/pki`` (see the module docstring).

    ``addresses``: the IPs processes listen on besides loopback (netns hosts, the bridge).
    A token without TLS is refused (``ValueError``): mxref never sends one in plaintext.
    """
    if token and not tls:
        raise ValueError("security.token needs security.tls: a bearer token never travels in plaintext")
    directory = run_dir / "pki"
    directory.mkdir(mode=0o700, parents=True, exist_ok=False)
    if not tls:
        return RunCredentials(directory)
    ca_key, ca_cert = make_ca()
    key, cert = issue_server_cert(ca_key, ca_cert, [*LOOPBACK, *addresses])
    pem = serialization.Encoding.PEM
    ca_path = _write(directory / "ca.pem", ca_cert.public_bytes(pem), 0o644)
    cert_path = _write(directory / "server.pem", cert.public_bytes(pem), 0o644)
    key_bytes = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    key_path = _write(directory / "server.key", key_bytes, 0o600)
    token_path = wrong_path = None
    if token:
        token_path = _write(directory / "token", (new_token() + "\n").encode(), 0o600)
        wrong_path = _write(directory / "wrong-token", (new_token() + "\n").encode(), 0o600)
    return RunCredentials(directory, ca_path, cert_path, key_path, token_path, wrong_path)
