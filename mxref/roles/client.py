"""Typed clients for the control plane.

``MxClient`` wraps the metadata server's ``P2pService``: every call carries a
deadline (30 s by default) and message limits of 100 MB, and a failed RPC comes
back as ``MetadataServerError`` carrying the gRPC code (``retryable`` for
UNAVAILABLE / DEADLINE_EXCEEDED). Negative answers (``success=false``,
``found=false``) are returned, not raised: they are the server's verdict.

``fetch_tensor_manifest`` asks one source's ``WorkerService`` for its tensors
(5 s by default). Anything but a manifest for exactly the requested source and
worker is the source's fault and raises ``ManifestError``; a manifest answered
by a different worker (a reused endpoint) raises its subclass ``WorkerIdMismatch``.

``MxClient`` speaks ``mxref.v1`` unless its server answers UNIMPLEMENTED (the real ModelExpress
server), then ``model_express.p2p`` (``mxref.modelexpress.control``); ``wire=`` or ``$MXREF_SERVER_WIRE``
chooses one outright.

Both dial with ``mxref.security`` credentials: the ones given, else the process's
(``security.install``), which are plaintext unless the process was started with TLS flags.
A server that refuses the token answers UNAUTHENTICATED (not retryable).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import TracebackType
from typing import Any

import grpc

from mxref import config, security
from mxref.errors import ManifestError, MetadataServerError, WorkerIdMismatch
from mxref.identity import mx_source_id
from mxref.modelexpress import control as mx_control
from mxref.rpc import REASON_METADATA_KEY, call_status
from mxref.v1 import p2p_pb2, p2p_pb2_grpc
from mxref.worker_service import RejectReason


def _check_timeout(timeout_s: float) -> float:
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s!r}: an RPC deadline must be a finite number of seconds > 0")
    return float(timeout_s)


# The generated stubs carry no annotations (protoc's grpc plugin writes none); typed here.
_P2P_STUB: Callable[[grpc.Channel], Any] = p2p_pb2_grpc.P2pServiceStub
_WORKER_STUB: Callable[[grpc.Channel], Any] = p2p_pb2_grpc.WorkerServiceStub


class MxClient:
    """Client of one metadata server at ``address`` (``host:port``). Close it, or use ``with``.

    It keeps the ``owner_secret`` each successful publish returns, per ``(mx_source_id,
    worker_id)``, and sends it with every republish and ``UpdateStatus`` of that record (the
    server refuses either without it: ``mxref.metadata.ownership``)."""

    def __init__(
        self,
        address: str,
        timeout_s: float = config.DEFAULT_RPC_TIMEOUT_S,
        *,
        credentials: security.ClientCredentials | None = None,
        wire: str | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = _check_timeout(timeout_s)
        self._owner_secrets: dict[tuple[str, str], str] = {}
        creds = credentials if credentials is not None else security.client_default()
        self._channel = creds.channel(address, config.grpc_client_options())
        # mxref.v1, or ModelExpress's model_express.p2p on its own server (mxref.modelexpress.control)
        self.wire = mx_control.wire(wire)
        self._stub = mx_control.MxP2pStub(self._channel) if self.wire == "model_express.p2p" else _P2P_STUB(self._channel)

    def publish_metadata(
        self, identity: p2p_pb2.SourceIdentity, worker: p2p_pb2.WorkerMetadata, worker_id: str
    ) -> p2p_pb2.PublishMetadataResponse:
        key = (mx_source_id(identity), worker_id)
        request = p2p_pb2.PublishMetadataRequest(identity=identity, worker=worker, worker_id=worker_id,
                                                 owner_secret=self._owner_secrets.get(key, ""))
        response: p2p_pb2.PublishMetadataResponse = self._call("PublishMetadata", request)
        if response.success and response.owner_secret:
            self._owner_secrets[key] = response.owner_secret
        return response

    def owner_secret(self, mx_source_id: str, worker_id: str) -> str:
        """The secret this client holds for the record ("" when it published none there)."""
        return self._owner_secrets.get((mx_source_id, worker_id), "")

    def list_sources(
        self,
        identity: p2p_pb2.SourceIdentity | None = None,
        status_filter: p2p_pb2.SourceStatus | None = None,
        worker_rank: int | None = None,
        limit: int = 0,
        *,
        model_name: str | None = None,
        min_updated_at: int = 0,
    ) -> list[p2p_pb2.SourceInstanceRef]:
        """Sources matching every given filter, newest first (``limit=0``: all of them)."""
        request = p2p_pb2.ListSourcesRequest(limit=limit, min_updated_at=min_updated_at)
        if identity is not None:
            request.identity.CopyFrom(identity)
        if status_filter is not None:
            request.status_filter = status_filter
        if worker_rank is not None:
            request.worker_rank_filter = worker_rank
        if model_name is not None:
            request.model_name_filter = model_name
        response: p2p_pb2.ListSourcesResponse = self._call("ListSources", request)
        return list(response.instances)

    def get_metadata(self, mx_source_id: str, worker_id: str) -> p2p_pb2.GetMetadataResponse:
        request = p2p_pb2.GetMetadataRequest(mx_source_id=mx_source_id, worker_id=worker_id)
        response: p2p_pb2.GetMetadataResponse = self._call("GetMetadata", request)
        return response

    def update_status(
        self,
        mx_source_id: str,
        worker_id: str,
        worker_rank: int,
        status: p2p_pb2.SourceStatus,
        timeout_s: float | None = None,
    ) -> p2p_pb2.UpdateStatusResponse:
        """Set the worker's status; every call is also a heartbeat (the server stamps ``updated_at``).

        ``timeout_s`` overrides the client's deadline for this call (a shutdown's last
        STALE must not hold a terminating process for the default 30 s).
        """
        request = p2p_pb2.UpdateStatusRequest(
            mx_source_id=mx_source_id, worker_id=worker_id, worker_rank=worker_rank, status=status,
            owner_secret=self._owner_secrets.get((mx_source_id, worker_id), ""),
        )
        response: p2p_pb2.UpdateStatusResponse = self._call("UpdateStatus", request, timeout_s)
        return response

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> MxClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        rpc = getattr(self._stub, method)
        timeout = self.timeout_s if timeout_s is None else _check_timeout(timeout_s)
        try:
            try:
                return rpc(request, timeout=timeout)
            except grpc.RpcError as exc:
                if self.wire != "auto" or call_status(exc)[0] != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                # no mxref.v1 here: a ModelExpress server; speak its package from now on
                self.wire = "model_express.p2p"
                self._stub = mx_control.MxP2pStub(self._channel)
                return getattr(self._stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            code, details = call_status(exc)
            name = code.name if code is not None else "UNKNOWN"
            raise MetadataServerError(
                f"{method} to metadata server {self.address} failed: {name}: {details}", method, code
            ) from exc


MX_MANIFEST_METHOD = "/model_express.p2p.WorkerService/GetTensorManifest"
"""Where a ModelExpress source answers the manifest (``fetch_tensor_manifest`` falls back to it)."""


def fetch_tensor_manifest(
    endpoint: str,
    mx_source_id: str,
    worker_id: str,
    timeout_s: float = config.DEFAULT_MANIFEST_TIMEOUT_S,
    *,
    credentials: security.ClientCredentials | None = None,
) -> p2p_pb2.GetTensorManifestResponse:
    """The manifest of source ``mx_source_id`` / worker ``worker_id`` served at ``endpoint``.

    An empty ``worker_id`` asks for whichever worker serves the source there. A worker that
    does not serve ``mxref.v1`` (UNIMPLEMENTED: a ModelExpress source) is asked again in
    ``model_express.p2p``, whose request and answer are numbered alike.
    Raises ``WorkerIdMismatch`` when another worker answers (or refuses because it
    is another worker) and ``ManifestError`` for every other refusal or failure.
    """
    request = p2p_pb2.GetTensorManifestRequest(mx_source_id=mx_source_id)
    if worker_id:
        request.worker_id = worker_id
    where = f"source {mx_source_id}/{worker_id or '*'} at {endpoint}"
    creds = credentials if credentials is not None else security.client_default()
    with creds.channel(endpoint, config.grpc_message_options()) as channel:
        stub = _WORKER_STUB(channel)
        try:
            try:
                response: p2p_pb2.GetTensorManifestResponse = stub.GetTensorManifest(
                    request, timeout=_check_timeout(timeout_s)
                )
            except grpc.RpcError as exc:
                if call_status(exc)[0] != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                # A ModelExpress source serves only model_express.p2p: the same message, numbered alike.
                mx_manifest = channel.unary_unary(
                    MX_MANIFEST_METHOD, request_serializer=p2p_pb2.GetTensorManifestRequest.SerializeToString,
                    response_deserializer=p2p_pb2.GetTensorManifestResponse.FromString,
                )
                response = mx_manifest(request, timeout=_check_timeout(timeout_s))
        except grpc.RpcError as exc:
            code, details = call_status(exc)
            name = code.name if code is not None else "UNKNOWN"
            message = f"GetTensorManifest from {where} refused: {name}: {details}"
            if _reject_reason(exc) == RejectReason.WORKER_ID_MISMATCH:
                raise WorkerIdMismatch(message, requested=worker_id, actual=None, code=code) from exc
            raise ManifestError(message, code) from exc
    if response.mx_source_id != mx_source_id:
        raise ManifestError(f"GetTensorManifest from {where} answered for source {response.mx_source_id!r}")
    if worker_id and response.HasField("worker_id") and response.worker_id != worker_id:
        raise WorkerIdMismatch(
            f"GetTensorManifest from {where} answered as worker {response.worker_id!r}; the endpoint was reused",
            requested=worker_id,
            actual=response.worker_id,
        )
    return response


def _reject_reason(exc: grpc.RpcError) -> str | None:
    if not isinstance(exc, grpc.Call):
        return None
    for key, value in exc.trailing_metadata() or ():
        if key == REASON_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return None
