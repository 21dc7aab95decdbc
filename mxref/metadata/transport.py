"""How the metadata server speaks gRPC: the implementation (``native``, the calls framed in Rust,
or ``grpcio``), its options, and the report of refused calls. Both serve ``mxref.v1.P2pService``
and ModelExpress's ``model_express.p2p.P2pService`` over one servicer."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import grpc

from mxref import config, front_door, security
from mxref.errors import LocalError
from mxref.metadata.modelexpress import MxP2pService
from mxref.metadata.native import FRONT_DOOR, NativeMetadataServer, native_available
from mxref.metadata.servicer import SERVER_THREADS, P2pServicer
from mxref.metrics import ServerFamilies
from mxref.rpc import start_grpc_server

GRPC_IMPLS = ("grpcio", "native")
"""How the metadata server speaks gRPC: native (``mxref.metadata.native``: the calls framed in Rust,
decided by the same servicer) or grpcio (Python's gRPC)."""
DEFAULT_GRPC_IMPL = "native"
"""The metadata server's gRPC unless told (``--grpc-impl``): native, several times grpcio's calls
per second on the same servicer (docs/mxref.md: Server at fleet scale)."""

FULL_COLLECTION_EVERY = 360
"""Young (generation 1) collections between two full ones in a server's process (Python's
default: 10). A fleet's records are long lived and a heartbeat replaces one, so at Python's
default a full collection came every few seconds under 10k heartbeats/s, each walking every
record (80k workers: ~160k objects, 100-490 ms on a loaded 2-core machine) while every call
waits for the GIL; the young collections, which free almost everything, are unchanged, and so
is Python's own rule that a full one waits for a quarter of the old objects to be new."""


def spread_full_collections(every: int = FULL_COLLECTION_EVERY) -> None:
    """Set this process's full collections to ``every`` young ones (``gc.set_threshold``): called
    by a process that is a metadata server (``python -m mxref server``, the fleet bench), never by
    ``start_metadata_server``, so a process that only hosts one (a test) keeps its own."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, every)


def metadata_server_options(limits: config.ServerLimits) -> list[tuple[str, int]]:
    """The metadata server's gRPC options: its receive limit, one connection's concurrent
    streams (a flooding client holds at most that many handler threads), no SO_REUSEPORT
    (a second process must not silently share a port still in use), and the native server's
    keepalive, idle and age limits (``mxref.metadata.native.FRONT_DOOR``)."""
    def ms(key: str) -> int:
        return int(FRONT_DOOR[key] * 1000)

    return [
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.max_send_message_length", config.MAX_GRPC_MESSAGE_BYTES),
        ("grpc.max_concurrent_streams", config.MAX_STREAMS_PER_CONNECTION),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_time_ms", ms("keepalive_interval_s")),
        ("grpc.keepalive_timeout_ms", ms("keepalive_timeout_s")),
        ("grpc.max_connection_idle_ms", ms("idle_timeout_s")),
        ("grpc.max_connection_age_ms", ms("max_connection_age_s")),
        ("grpc.max_connection_age_grace_ms", 30_000),
    ]


def start_metadata_server(
    servicer: P2pServicer,
    host: str,
    port: int,
    *,
    credentials: security.ServerCredentials | None = None,
    on_refused: Callable[[security.Refusal], None] | None = None,
    grpc_impl: str = DEFAULT_GRPC_IMPL,
) -> tuple[Any, int]:
    """Serve ``servicer`` on ``host:port`` (``port=0`` picks one); returns (server, bound port).
    It answers ``mxref.v1.P2pService`` and ModelExpress's ``model_express.p2p.P2pService``
    (``mxref.metadata.modelexpress``) over the same store. The server has ``stop(grace).wait(timeout)``.

    ``credentials`` (default plaintext): TLS and the bearer-token check (``mxref.security``);
    ``on_refused`` hears of every call refused as unauthenticated. ``grpc_impl``: ``native``
    (the default, ``mxref.metadata.native``) or ``grpcio``.
    Raises ``LocalError`` when the address cannot be bound or the implementation cannot serve.
    The process's open-files limit is raised to its hard limit first (``mxref.front_door``).
    """
    if grpc_impl not in GRPC_IMPLS:
        raise LocalError(f"metadata server: gRPC implementation {grpc_impl!r}: must be one of {', '.join(GRPC_IMPLS)}")
    front_door.raise_open_files_limit()
    if grpc_impl == "native":
        missing = native_available()
        if missing is not None:
            raise LocalError(f"metadata server: --grpc-impl native: {missing}")
        native = NativeMetadataServer(servicer, host, port, credentials=credentials, on_refused=on_refused)
        return native, native.port

    def register(s: P2pServicer, srv: grpc.Server) -> None:  # mxref.v1 and model_express.p2p, one store
        srv.add_generic_rpc_handlers((s.generic_handler(), MxP2pService(s).generic_handler()))

    return start_grpc_server(register, servicer, host, port,
                             threads=SERVER_THREADS, what="metadata server", credentials=credentials,
                             on_refused=on_refused, options=metadata_server_options(servicer.limits))


def refusal_reporter(emit: Callable[..., None], metrics: ServerFamilies) -> front_door.RefusalEvents:
    """Counts each refused call as ``mxref_server_rpcs_total{result="unauthenticated"}`` and
    emits ``unauthenticated`` events naming the method, the peer address, the reason and how
    many, at most one per (peer address, method, reason) a second (``front_door.RefusalEvents``;
    its ``report`` is the servers' ``on_refused``; ``close`` it when done)."""

    def count(method: str, n: int) -> None:
        metrics.rpcs.labels(method, "unauthenticated").inc(n)

    return front_door.RefusalEvents(lambda **fields: emit("unauthenticated", **fields), count).start()


# --- reaper -------------------------------------------------------------------
