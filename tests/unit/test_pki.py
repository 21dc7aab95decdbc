"""``mxref.pki``: a run's throwaway CA, server certificate and tokens."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509

from mxref import pki


def _mode(path: Path | None) -> int:
    assert path is not None
    return stat.S_IMODE(path.stat().st_mode)


def test_the_server_certificate_is_signed_by_the_run_ca_for_every_address(tmp_path: Path) -> None:
    creds = pki.generate(tmp_path, tls=True, token=True, addresses=["10.77.0.2", "10.77.0.1"])
    assert creds.ca_cert and creds.server_cert and creds.server_key and creds.token and creds.wrong_token
    ca = x509.load_pem_x509_certificate(creds.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(creds.server_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "10.77.0.1", "10.77.0.2")
    }
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]


def test_keys_and_tokens_are_private_and_tokens_differ(tmp_path: Path) -> None:
    creds = pki.generate(tmp_path, tls=True, token=True)
    assert _mode(creds.directory) == 0o700
    assert _mode(creds.server_key) == 0o600
    assert _mode(creds.token) == 0o600 and _mode(creds.wrong_token) == 0o600
    assert creds.token is not None and creds.wrong_token is not None
    token, wrong = creds.token.read_text().strip(), creds.wrong_token.read_text().strip()
    assert token != wrong and len(token) >= 40
    assert not (creds.directory / "ca.key").exists()  # the CA key is never written


def test_two_runs_get_two_cas(tmp_path: Path) -> None:
    one = pki.generate(tmp_path / "a", tls=True, token=False)
    two = pki.generate(tmp_path / "b", tls=True, token=False)
    assert one.ca_cert and two.ca_cert and one.ca_cert.read_bytes() != two.ca_cert.read_bytes()
    assert one.token is None


def test_a_token_without_tls_is_refused_and_nothing_is_overwritten(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"needs security\.tls"):
        pki.generate(tmp_path, tls=False, token=True)
    pki.generate(tmp_path, tls=True, token=False)
    with pytest.raises(FileExistsError):
        pki.generate(tmp_path, tls=True, token=False)


def test_an_address_that_is_not_an_ip_is_refused() -> None:
    key, ca = pki.make_ca()
    with pytest.raises(ValueError):
        pki.issue_server_cert(key, ca, ["not-an-ip"])
