"""The WorkerService every source runs: answers ``GetTensorManifest`` for itself.

A source starts this server *before* it publishes, so until it knows its
``mx_source_id`` every request is refused with FAILED_PRECONDITION. The rules,
checked in this order (``check_request`` is the pure form):

    empty mx_source_id                    -> INVALID_ARGUMENT   (empty_source_id)
    source is draining                    -> UNAVAILABLE        (draining)
    not yet published                     -> FAILED_PRECONDITION (not_published)
    mx_source_id is not ours              -> FAILED_PRECONDITION (source_id_mismatch)
    worker_id given and is not ours       -> FAILED_PRECONDITION (worker_id_mismatch)

Every refusal carries its reason in the trailing metadata key
``REASON_METADATA_KEY``, so a client can tell a reused endpoint (a new worker
behind an old address) from other refusals without parsing messages. The answer
always echoes this worker's ``mx_source_id`` and ``worker_id``.

With credentials (``mxref.security``: the process's unless given) the service listens on TLS
and refuses a call without the bearer token with UNAUTHENTICATED before any rule above,
counted as ``mxref_source_manifest_requests_total{result="unauthenticated"}``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import grpc

from mxref import security
from mxref.metrics import SourceFamilies
from mxref.rpc import REASON_METADATA_KEY, start_grpc_server
from mxref.v1 import p2p_pb2, p2p_pb2_grpc

logger = logging.getLogger("mxref.worker_service")

WORKER_SERVER_THREADS = 4


class RejectReason(StrEnum):
    """Why a manifest request was refused (also the metric's ``result`` label)."""

    EMPTY_SOURCE_ID = "empty_source_id"
    DRAINING = "draining"
    NOT_PUBLISHED = "not_published"
    SOURCE_ID_MISMATCH = "source_id_mismatch"
    WORKER_ID_MISMATCH = "worker_id_mismatch"


REASON_CODES: dict[RejectReason, grpc.StatusCode] = {
    RejectReason.EMPTY_SOURCE_ID: grpc.StatusCode.INVALID_ARGUMENT,
    RejectReason.DRAINING: grpc.StatusCode.UNAVAILABLE,
    RejectReason.NOT_PUBLISHED: grpc.StatusCode.FAILED_PRECONDITION,
    RejectReason.SOURCE_ID_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    RejectReason.WORKER_ID_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
}


@dataclass(frozen=True)
class WorkerManifest:
    """What this worker serves. ``mx_source_id`` is ``None`` until it has published."""

    worker_id: str
    worker_rank: int
    tensors: tuple[p2p_pb2.TensorDescriptor, ...] = ()
    metadata_endpoint: str = ""
    agent_name: str = ""
    accelerator: str = ""
    mx_source_id: str | None = None

    def published_as(self, mx_source_id: str) -> WorkerManifest:
        """The same manifest, now answering for ``mx_source_id``."""
        return dataclasses.replace(self, mx_source_id=mx_source_id)

    def to_response(self) -> p2p_pb2.GetTensorManifestResponse:
        return p2p_pb2.GetTensorManifestResponse(
            tensors=list(self.tensors),
            mx_source_id=self.mx_source_id or "",
            metadata_endpoint=self.metadata_endpoint,
            agent_name=self.agent_name,
            worker_rank=self.worker_rank,
            accelerator=self.accelerator,
            worker_id=self.worker_id,
        )


ManifestProvider = Callable[[], WorkerManifest]


@dataclass(frozen=True)
class Rejection:
    reason: RejectReason
    message: str

    @property
    def code(self) -> grpc.StatusCode:
        return REASON_CODES[self.reason]


def check_request(
    request: p2p_pb2.GetTensorManifestRequest, manifest: WorkerManifest, draining: bool
) -> Rejection | None:
    """The refusal this request earns from this worker, or ``None`` to serve it."""
    if not request.mx_source_id:
        return Rejection(RejectReason.EMPTY_SOURCE_ID, "mx_source_id is empty; ask for the source you listed")
    if draining:
        return Rejection(RejectReason.DRAINING, f"worker {manifest.worker_id} is draining and serves no new reads")
    if manifest.mx_source_id is None:
        return Rejection(
            RejectReason.NOT_PUBLISHED,
            f"worker {manifest.worker_id} has not published yet; it serves no source",
        )
    if request.mx_source_id != manifest.mx_source_id:
        return Rejection(
            RejectReason.SOURCE_ID_MISMATCH,
            f"mx_source_id {request.mx_source_id!r} is not served here (this worker serves {manifest.mx_source_id!r})",
        )
    if request.HasField("worker_id") and request.worker_id and request.worker_id != manifest.worker_id:
        return Rejection(
            RejectReason.WORKER_ID_MISMATCH,
            f"worker_id {request.worker_id!r} is not this worker ({manifest.worker_id!r}); the endpoint was reused",
        )
    return None


class WorkerServicer(p2p_pb2_grpc.WorkerServiceServicer):
    """``GetTensorManifest`` over a manifest that may change (publish) and a draining flag.

    ``manifest`` is either a fixed ``WorkerManifest`` (replace it with
    ``set_manifest``) or a callable returning the current one. ``draining`` is
    an event the owner may set directly; ``drain()`` sets it too.
    """

    def __init__(
        self,
        manifest: WorkerManifest | ManifestProvider,
        *,
        draining: threading.Event | None = None,
        metrics: SourceFamilies | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._provider: ManifestProvider = _fixed(manifest) if isinstance(manifest, WorkerManifest) else manifest
        self._draining = draining if draining is not None else threading.Event()
        self._metrics = metrics

    def set_manifest(self, manifest: WorkerManifest) -> None:
        """Serve ``manifest`` from now on (e.g. ``manifest.published_as(sid)`` after publishing)."""
        with self._lock:
            self._provider = _fixed(manifest)

    def current_manifest(self) -> WorkerManifest:
        with self._lock:
            provider = self._provider
        return provider()

    def drain(self) -> None:
        """Refuse every further request with UNAVAILABLE."""
        self._draining.set()

    @property
    def is_draining(self) -> bool:
        return self._draining.is_set()

    def GetTensorManifest(
        self, request: p2p_pb2.GetTensorManifestRequest, context: grpc.ServicerContext
    ) -> p2p_pb2.GetTensorManifestResponse:
        try:
            manifest = self.current_manifest()
            rejection = check_request(request, manifest, self.is_draining)
        except Exception as exc:
            logger.exception("GetTensorManifest failed")
            self._count("error")
            context.abort(grpc.StatusCode.INTERNAL, f"GetTensorManifest: {type(exc).__name__}: {exc}")
        if rejection is not None:
            self._count(rejection.reason.value)
            context.set_trailing_metadata(((REASON_METADATA_KEY, rejection.reason.value),))
            context.abort(rejection.code, rejection.message)
        self._count("ok")
        return manifest.to_response()

    def count(self, result: str) -> None:
        """Count one answer as ``mxref_source_manifest_requests_total{result}`` (``mxref.modelexpress.worker``
        counts ModelExpress's WorkerService calls here too)."""
        self._count(result)

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.manifest_requests.labels(result).inc()


def _fixed(manifest: WorkerManifest) -> ManifestProvider:
    return lambda: manifest


def start_worker_server(
    servicer: WorkerServicer, host: str, port: int, *, credentials: security.ServerCredentials | None = None,
    extra_handlers: Sequence[grpc.GenericRpcHandler] = (),
) -> tuple[grpc.Server, int]:
    """Serve ``servicer`` on ``host:port`` (``port=0`` picks one) with 4 threads; returns (server, port).
    ``extra_handlers`` are served on the same port (a source adds ModelExpress's WorkerService).

    ``credentials``: the process's (``security.server_default()``) unless given.
    Raises ``LocalError`` when the address cannot be bound.
    """
    creds = credentials if credentials is not None else security.server_default()

    def refused(refusal: security.Refusal) -> None:
        logger.warning("refused %s from %s: %s", refusal.method, refusal.peer, refusal.reason.value)
        servicer._count("unauthenticated")

    add_ours: Callable[[WorkerServicer, grpc.Server], None] = p2p_pb2_grpc.add_WorkerServiceServicer_to_server

    def register(s: WorkerServicer, server: grpc.Server) -> None:
        add_ours(s, server)
        if extra_handlers:
            server.add_generic_rpc_handlers(tuple(extra_handlers))

    return start_grpc_server(register, servicer, host, port,
                             threads=WORKER_SERVER_THREADS, what="worker gRPC server", credentials=creds,
                             on_refused=refused)
