"""gRPC plumbing both servers share: start a grpcio server for one servicer, bind its address
(a clear error naming it), the default options, and the trailing-metadata key that carries a
refusal's reason."""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from mxref import config, security
from mxref.errors import LocalError

REASON_METADATA_KEY = "mxref-reject-reason"
"""The trailing-metadata key in which a server names why it refused a call."""


def start_grpc_server(
    register: Callable[[Any, grpc.Server], None],
    servicer: Any,
    host: str,
    port: int,
    *,
    threads: int,
    what: str,
    credentials: security.ServerCredentials | None = None,
    on_refused: Callable[[security.Refusal], None] | None = None,
    options: list[tuple[str, int]] | None = None,
) -> tuple[grpc.Server, int]:
    """A started gRPC server for one servicer on ``host:port``; returns (server, bound port).

    ``credentials`` (default: plaintext, no token) decide TLS and the token check;
    ``on_refused`` hears of every call the token check refuses; ``options``: gRPC server
    options (default ``server_options()``).
    ``LocalError`` naming ``what`` and the address when it cannot be bound.
    """
    creds = credentials if credentials is not None else security.ServerCredentials()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=what.replace(" ", "-")),
        options=options if options is not None else server_options(),
        interceptors=creds.interceptors(on_refused),
    )
    register(servicer, server)
    bound = bind(server, host, port, what=what, credentials=creds.grpc_credentials())
    server.start()
    return server, bound


def server_options() -> list[tuple[str, int]]:
    """Message limits, and no SO_REUSEPORT: gRPC sets it by default, which would let a
    second process bind a port still in use and silently share its traffic."""
    return [*config.grpc_message_options(), ("grpc.so_reuseport", 0)]


def bind(
    server: grpc.Server, host: str, port: int, *, what: str, credentials: grpc.ServerCredentials | None = None
) -> int:
    """Add a port (TLS with ``credentials``, else plaintext); ``LocalError`` naming the address
    when it cannot be bound."""
    address = endpoint(host, port)
    try:
        if credentials is None:
            bound: int = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise LocalError(f"{what}: cannot bind {address}: {exc}") from exc
    if bound == 0:
        raise LocalError(f"{what}: cannot bind {address}")
    return bound


def call_status(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    """(code, details) of a failed call; RpcError raised by a stub is also a ``grpc.Call``."""
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return code, details or ""


def endpoint(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal bracketed."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"

