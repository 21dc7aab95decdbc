"""The reader's tensor read leases: ModelExpress's ``PrepareTensorRead`` / ``ReleaseTensorRead``.

A donor that updates its weights in place (RL refit) first drains: it admits no new lease and
waits until the leases it granted are given back or run out, so a READ made under a lease never
sees half-written weights. A reader started with ``--lease`` takes part (``LeaseHolder``):

- per attempt, instead of ``GetTensorManifest``, it asks the source's
  ``model_express.p2p.WorkerService`` for a lease (``PrepareTensorRead``). The manifest that
  comes with the lease is the one checked against the reference and read from. A refusal (the
  source drains, it is another worker now, it serves no WorkerService at all: a central-mode
  source) ends the attempt before any READ (``lease_refused``); the next candidate, or a later
  attempt at the same source, asks for a lease of its own;
- ``lease_for_read`` is asked just before the READ is posted: no lease held, no READ;
- the lease is given back (``ReleaseTensorRead``) in the attempt's ``finally``, however it ended
  (``lease_released``, ``ok: false`` with the source's answer when it had expired or the source
  was gone). A reader killed while it holds one gives nothing back: the lease runs out on the
  source after its lifetime.

Every RPC is bounded by the manifest deadline; a lease id is never reused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from mxref import config, security
from mxref.events import EventLog
from mxref.mx import p2p_pb2 as mx_pb2
from mxref.rpc import call_status
from mxref.v1 import p2p_pb2

__all__ = ["Lease", "LeaseHolder", "LeaseRefused", "prepare_tensor_read", "release_tensor_read"]

MX_WORKER = "/model_express.p2p.WorkerService/"


class LeaseRefused(Exception):
    """No lease: the source refused or failed ``PrepareTensorRead``, or cannot grant one."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Lease:
    lease_id: str
    endpoint: str
    mx_source_id: str
    worker_id: str
    manifest: p2p_pb2.GetTensorManifestResponse  # in mxref's numbering (ModelExpress's is the same)


def _call(endpoint: str, method: str, request: Any, response: Any, timeout_s: float,
          credentials: security.ClientCredentials | None) -> Any:
    creds = credentials if credentials is not None else security.client_default()
    with creds.channel(endpoint, config.grpc_message_options()) as channel:
        rpc = channel.unary_unary(MX_WORKER + method, request_serializer=type(request).SerializeToString,
                                  response_deserializer=response.FromString)
        return rpc(request, timeout=timeout_s)


def _refusal(what: str, exc: grpc.RpcError) -> LeaseRefused:
    code, details = call_status(exc)
    return LeaseRefused(f"{what}: {code.name if code else 'UNKNOWN'}: {details}", code)


def prepare_tensor_read(endpoint: str, mx_source_id: str, worker_id: str, timeout_s: float, *,
                        credentials: security.ClientCredentials | None = None) -> Lease:
    """A lease on source ``mx_source_id`` / worker ``worker_id`` at ``endpoint`` with its manifest;
    ``LeaseRefused`` for a refusal, a failure, or an answer for another source or worker."""
    where = f"PrepareTensorRead from source {mx_source_id}/{worker_id or '*'} at {endpoint}"
    request = mx_pb2.PrepareTensorReadRequest(mx_source_id=mx_source_id)
    if worker_id:
        request.worker_id = worker_id
    try:
        answer = _call(endpoint, "PrepareTensorRead", request, mx_pb2.PrepareTensorReadResponse, timeout_s, credentials)
    except grpc.RpcError as exc:
        raise _refusal(where, exc) from None
    manifest = p2p_pb2.GetTensorManifestResponse.FromString(answer.manifest.SerializeToString())
    if not answer.lease_id:
        raise LeaseRefused(f"{where}: answered without a lease id")
    if manifest.mx_source_id != mx_source_id or (worker_id and manifest.worker_id != worker_id):
        raise LeaseRefused(f"{where}: answered for {manifest.mx_source_id!r}/{manifest.worker_id!r}")
    return Lease(answer.lease_id, endpoint, mx_source_id, manifest.worker_id or worker_id, manifest)


def release_tensor_read(lease: Lease, timeout_s: float, *,
                        credentials: security.ClientCredentials | None = None) -> None:
    """Give ``lease`` back; ``LeaseRefused`` when the source does not take it (NOT_FOUND: expired)."""
    request = mx_pb2.ReleaseTensorReadRequest(mx_source_id=lease.mx_source_id, lease_id=lease.lease_id)
    if lease.worker_id:
        request.worker_id = lease.worker_id
    try:
        _call(lease.endpoint, "ReleaseTensorRead", request, mx_pb2.ReleaseTensorReadResponse, timeout_s, credentials)
    except grpc.RpcError as exc:
        raise _refusal(f"ReleaseTensorRead of lease {lease.lease_id} at {lease.endpoint}", exc) from None


Prepare = Callable[[str, str, str, float], Lease]
Release = Callable[[Lease, float], None]


class LeaseHolder:
    """The one lease a reader holds during an attempt (module docstring)."""

    def __init__(self, events: EventLog, timeout_s: float, prepare: Prepare = prepare_tensor_read,
                 release: Release = release_tensor_read) -> None:
        self.events = events
        self.timeout_s = timeout_s
        self._prepare = prepare
        self._release = release
        self.held: Lease | None = None

    def acquire(self, index: int, worker: p2p_pb2.WorkerMetadata, mx_source_id: str,
                worker_id: str) -> p2p_pb2.GetTensorManifestResponse:
        """Take a lease for attempt ``index``; its manifest. ``LeaseRefused`` when there is none."""
        assert self.held is None, "a lease is given back before the next is taken"
        endpoint = worker.worker_grpc_endpoint
        try:
            if not endpoint:
                raise LeaseRefused("the source serves no WorkerService (central mode): it cannot grant a lease")
            lease = self._prepare(endpoint, mx_source_id, worker_id, self.timeout_s)
        except LeaseRefused as exc:
            self.events.emit("lease_refused", index=index, mx_source_id=mx_source_id, worker_id=worker_id,
                             code=exc.code.name if exc.code else None, error=str(exc))
            raise
        self.held = lease
        self.events.emit("lease_acquired", index=index, lease_id=lease.lease_id, mx_source_id=mx_source_id,
                         worker_id=lease.worker_id)
        return lease.manifest

    def lease_for_read(self) -> str:
        """The lease the READ about to be posted is made under; ``LeaseRefused`` when none is held."""
        if self.held is None:
            raise LeaseRefused("no tensor read lease is held: no READ is posted without one")
        return self.held.lease_id

    def release(self, index: int) -> None:
        """Give the held lease back (nothing when none is held). Never raises."""
        lease, self.held = self.held, None
        if lease is None:
            return
        try:
            self._release(lease, self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - an expired lease or a gone source: reported, the load goes on
            self.events.emit("lease_released", index=index, lease_id=lease.lease_id, ok=False, error=str(exc))
            return
        self.events.emit("lease_released", index=index, lease_id=lease.lease_id, ok=True, error=None)
