"""Control-plane credentials: TLS and a bearer token on both gRPC services.

Plaintext is the embedded default: with no flags every channel is ``grpc.insecure_channel``
and every port ``add_insecure_port``, as before. The options, each optional:

- a server (``mxref server``, a source's WorkerService) given a certificate and key serves
  TLS (``grpc.ssl_server_credentials``);
- a client given a CA certificate opens TLS channels that verify the server against it
  (``grpc.ssl_channel_credentials``); the address it dials must be in the certificate's SAN;
- a server given a token file refuses every call whose ``authorization`` metadata is not
  ``Bearer <token>`` with UNAUTHENTICATED (compared in constant time, ``hmac.compare_digest``),
  and reports each refusal to a callback (metrics, events); a client given a token file sends
  it as gRPC access-token call credentials (``grpc.access_token_call_credentials``).

A token only ever travels over TLS: gRPC does not send call credentials on an insecure
channel, and a bearer token in cleartext is anyone's. So a token without TLS is refused when
the credentials are built (``SecurityError``), on both sides. Tokens come from files, never
from the command line, so they do not show in ``ps``.

NIXL's data plane (UCX) is not covered: none of this encrypts or authenticates the READs.

Sources and readers build their clients and the WorkerService deep inside; ``__main__``
installs the process's credentials once (``install``) and ``MxClient``,
``fetch_tensor_manifest`` and ``start_worker_server`` use them unless given their own.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import grpc

__all__ = [
    "AUTHORIZATION_KEY",
    "ClientCredentials",
    "Refusal",
    "RefusalReason",
    "SecurityError",
    "ServerCredentials",
    "TokenInterceptor",
    "check_authorization",
    "client_default",
    "install",
    "read_token",
    "refusal_details",
    "server_default",
]

AUTHORIZATION_KEY = "authorization"
BEARER_PREFIX = "Bearer "
MAX_TOKEN_BYTES = 4096


class SecurityError(ValueError):
    """Credentials that cannot be used as given (a missing file, a token without TLS)."""


class RefusalReason(StrEnum):
    """Why a call was refused as unauthenticated (the ``reason`` of the ``unauthenticated`` event)."""

    MISSING_TOKEN = "missing_token"
    WRONG_TOKEN = "wrong_token"


@dataclass(frozen=True)
class Refusal:
    """Refused calls: the full gRPC method, the reason, the peer as gRPC names it, and how
    many (the native server counts refusals per peer address before it reports them)."""

    method: str
    reason: RefusalReason
    peer: str
    count: int = 1

    @property
    def short_method(self) -> str:
        """``PublishMetadata`` for ``/mxref.v1.P2pService/PublishMetadata``."""
        return self.method.rsplit("/", 1)[-1]


def read_token(path: str | Path) -> str:
    """The token in file ``path``, surrounding whitespace stripped; ``SecurityError`` when the
    file cannot be read, is empty, too long, or holds what an HTTP/2 header value cannot."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SecurityError(f"token file {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_TOKEN_BYTES:
        raise SecurityError(f"token file {path}: longer than {MAX_TOKEN_BYTES} bytes")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise SecurityError(f"token file {path}: not ASCII") from None
    if not token:
        raise SecurityError(f"token file {path}: empty")
    if not all(0x21 <= ord(c) <= 0x7E for c in token):
        raise SecurityError(f"token file {path}: a token is printable ASCII without spaces")
    return token


def _read(path: str | Path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SecurityError(f"{what} {path}: {exc.strerror or exc}") from exc
    if not data.strip():
        raise SecurityError(f"{what} {path}: empty")
    return data


def check_authorization(values: Sequence[str | bytes], token: str | Sequence[str]) -> RefusalReason | None:
    """The refusal a call with these ``authorization`` metadata values earns, or ``None``.

    Exactly one value ``Bearer <token>`` passes, for ``token`` or any of several accepted tokens
    (the source's and the reader's: ``ServerCredentials.accepted_tokens``); each comparison takes
    the same time wherever the first wrong byte is, and every token is compared. No value is
    ``missing_token``; anything else ``wrong_token``.
    """
    if not values:
        return RefusalReason.MISSING_TOKEN
    if len(values) != 1:
        return RefusalReason.WRONG_TOKEN
    (value,) = values
    given = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    tokens = (token,) if isinstance(token, str) else tuple(token)
    matched = False
    for one in tokens:
        matched |= hmac.compare_digest(given, (BEARER_PREFIX + one).encode("ascii"))
    return None if matched else RefusalReason.WRONG_TOKEN


# --- client side ----------------------------------------------------------------


@dataclass(frozen=True)
class ClientCredentials:
    """How a client dials: plaintext (the default), TLS against ``ca_pem``, plus a token."""

    ca_pem: bytes | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None and self.ca_pem is None:
            raise SecurityError("a bearer token needs TLS (--tls-ca): gRPC sends no call credentials in plaintext")

    @classmethod
    def from_files(cls, ca: str | Path | None = None, token_file: str | Path | None = None) -> ClientCredentials:
        return cls(
            ca_pem=_read(ca, "CA certificate") if ca else None,
            token=read_token(token_file) if token_file else None,
        )

    @property
    def tls(self) -> bool:
        return self.ca_pem is not None

    def channel(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A channel to ``address`` with these credentials."""
        if self.ca_pem is None:
            return grpc.insecure_channel(address, options=list(options))
        creds = grpc.ssl_channel_credentials(root_certificates=self.ca_pem)
        if self.token is not None:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(self.token))
        return grpc.secure_channel(address, creds, options=list(options))


# --- server side ----------------------------------------------------------------


@dataclass(frozen=True)
class ServerCredentials:
    """How a server listens: plaintext (the default), TLS with ``cert_pem``/``key_pem``,
    and, over TLS, a required token."""

    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None
    reader_token: str | None = None
    """A second accepted token that may only read (``mxref.metadata.ownership.WriteGate`` refuses its writes)."""

    def __post_init__(self) -> None:
        if (self.cert_pem is None) != (self.key_pem is None):
            raise SecurityError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
        if self.token is not None and self.cert_pem is None:
            raise SecurityError("a bearer token needs TLS (--tls-cert, --tls-key): it must not cross the wire in plaintext")
        if self.reader_token is not None and self.token is None:
            raise SecurityError("a reader token needs the source token too (--token-file): without it every "
                                "caller could write")
        if self.reader_token is not None and hmac.compare_digest(self.reader_token, self.token or ""):
            raise SecurityError("the reader token and the source token are the same: a reader could write")

    @classmethod
    def from_files(
        cls, cert: str | Path | None = None, key: str | Path | None = None, token_file: str | Path | None = None,
        reader_token_file: str | Path | None = None,
    ) -> ServerCredentials:
        return cls(
            cert_pem=_read(cert, "TLS certificate") if cert else None,
            key_pem=_read(key, "TLS key") if key else None,
            token=read_token(token_file) if token_file else None,
            reader_token=read_token(reader_token_file) if reader_token_file else None,
        )

    @property
    def accepted_tokens(self) -> tuple[str, ...]:
        """Every token a call may carry (empty: no token check)."""
        return tuple(t for t in (self.token, self.reader_token) if t is not None)

    @property
    def tls(self) -> bool:
        return self.cert_pem is not None

    def bearer_values(self) -> list[bytes] | None:
        """The ``authorization`` values a call may carry to get past the front door (None: no
        token, every call passes); what each may then call is ``TokenInterceptor``'s rule."""
        tokens = self.accepted_tokens
        return [(BEARER_PREFIX + t).encode("ascii") for t in tokens] if tokens else None

    def grpc_credentials(self) -> grpc.ServerCredentials | None:
        """``None`` for plaintext."""
        if self.cert_pem is None or self.key_pem is None:
            return None
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)])

    def interceptors(self, on_refused: Callable[[Refusal], None] | None = None) -> list[grpc.ServerInterceptor]:
        return [] if self.token is None else [TokenInterceptor(self.accepted_tokens, on_refused)]


class TokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc ships no type stubs
    """Refuses, with UNAUTHENTICATED, every call without ``authorization: Bearer <token>``.

    The refusal is decided before the handler runs; ``on_refused`` is called once per refused
    call (from the server's thread pool) and must not raise.
    """

    def __init__(self, token: str | Sequence[str], on_refused: Callable[[Refusal], None] | None = None) -> None:
        self._token = token
        self._on_refused = on_refused

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        metadata = handler_call_details.invocation_metadata or ()
        values = [value for key, value in metadata if key == AUTHORIZATION_KEY]
        reason = check_authorization(values, self._token)
        handler = continuation(handler_call_details)
        if reason is None or handler is None:
            return handler
        return _refusing(handler, handler_call_details.method, reason, self._on_refused)


def refusal_details(reason: RefusalReason) -> str:
    """The details of an UNAUTHENTICATED answer (both gRPC implementations of the metadata server)."""
    return f"{reason.value}: this service needs a valid bearer token"


def _refusing(
    handler: grpc.RpcMethodHandler, method: str, reason: RefusalReason, on_refused: Callable[[Refusal], None] | None
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that reports and aborts every call."""

    def deny(request: Any, context: grpc.ServicerContext) -> Any:
        if on_refused is not None:
            on_refused(Refusal(method, reason, context.peer()))
        context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal_details(reason))

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
    refused: grpc.RpcMethodHandler = make(
        deny, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )
    return refused


# --- the process's own credentials ---------------------------------------------------

_lock = threading.Lock()
_client = ClientCredentials()
_server = ServerCredentials()


def install(client: ClientCredentials, server: ServerCredentials) -> None:
    """The credentials this process's clients and WorkerService use unless given their own
    (``__main__`` calls it once, after reading the flags)."""
    global _client, _server
    with _lock:
        _client, _server = client, server


def client_default() -> ClientCredentials:
    with _lock:
        return _client


def server_default() -> ServerCredentials:
    with _lock:
        return _server
