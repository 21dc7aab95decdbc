"""ModelExpress's ``model_express.p2p.WorkerService`` on an mxref source, with tensor read leases.

Every mxref source serves ``mxref.v1.WorkerService`` (``mxref.worker_service``); the real
ModelExpress client (0.7.0) asks ``model_express.p2p.WorkerService`` on the same port.
``MxWorkerService`` answers it from the same ``WorkerServicer`` (the same manifest, the same
draining flag, the same refusal rules of ``worker_service.check_request`` with their reason
in the trailing metadata, the same ``mxref_source_manifest_requests_total`` counts):

- ``GetTensorManifest``: INVALID_ARGUMENT for an empty ``mx_source_id``; UNAVAILABLE while
  draining; FAILED_PRECONDITION before publication, for another source id, or for a given
  ``worker_id`` that is not this worker's. The answer is the manifest in MX's numbering
  (identical to mxref's; mxref's ``checksum``/``shape`` ride along as fields an MX client ignores),
  each dtype spelled the torch way (``torch.float16``: ModelExpress readers compare the spelling).
- ``PrepareTensorRead``: the same checks, then a lease (``uuid4().hex``) that lives
  ``lease_seconds()`` = ceil(2 * max(120, MX_TRANSFER_TIMEOUT) + 30) s (1830 s with
  ModelExpress's env default of 900), answered with the manifest. A draining worker admits no new lease.
- ``ReleaseTensorRead``: the same source checks, then NOT_FOUND for a lease that is unknown
  or expired.
- The artifact RPCs are not served (UNIMPLEMENTED): they move file caches, not weights.

``Leases`` is the bookkeeping alone (pure, clock injected): ``prepare`` / ``release`` /
``live`` and ``drain(timeout)``, which stops admission and waits for the live leases to be
released or expire; if they outlast the timeout it re-opens admission and raises
``DrainTimeout`` (a ``TimeoutError``: ModelExpress's rule, so the owner can retry the mutation
later). A drain that ends returns a ``DrainReport`` (how long it waited, how many leases were live
when it began, how many of those were released and how many expired) and leaves admission closed
until the owner, its mutation done, calls ``reopen``. ``on_change(kind, lease_id)`` hears every
lease ``granted``, ``released`` and ``expired`` (an expiry is noticed at the next call that looks,
and at once by a drain that waits for it).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from mxref.mx import p2p_pb2 as mx_pb2
from mxref.rpc import REASON_METADATA_KEY
from mxref.v1 import p2p_pb2
from mxref.worker_service import WorkerServicer, check_request

__all__ = ["MX_WORKER_SERVICE_NAME", "DrainReport", "DrainTimeout", "Leases", "MxWorkerService", "lease_seconds", "torch_dtype"]

MX_WORKER_SERVICE_NAME = "model_express.p2p.WorkerService"
MX_ENV_TRANSFER_TIMEOUT_S = 900.0  # ModelExpress's env default (its RDMA path uses 300; leases use this)
MIN_HANDSHAKE_S = 120.0
LEASE_MARGIN_S = 30.0


def torch_dtype(dtype: str) -> str:
    """A dtype as ModelExpress spells it (``str(torch.float16)``: ``torch.float16``); its readers
    compare the spelling, so mxref's ``float16`` would be a dtype mismatch."""
    return dtype if not dtype or dtype.startswith("torch.") else f"torch.{dtype}"


def lease_seconds(env: Mapping[str, str] | None = None) -> int:
    """How long a tensor read lease lives: one NIXL handshake and one bounded receive."""
    raw = (os.environ if env is None else env).get("MX_TRANSFER_TIMEOUT", "")
    try:
        timeout = float(raw) if raw.strip() else MX_ENV_TRANSFER_TIMEOUT_S
    except ValueError:
        timeout = MX_ENV_TRANSFER_TIMEOUT_S
    if not math.isfinite(timeout):
        timeout = MX_ENV_TRANSFER_TIMEOUT_S
    timeout = max(1.0, timeout)
    return math.ceil(2 * max(MIN_HANDSHAKE_S, timeout) + LEASE_MARGIN_S)


@dataclass(frozen=True)
class DrainReport:
    """A drain that ended: it waited ``waited_s``; ``outstanding`` leases were live when it began,
    of which ``released`` were given back and ``expired`` ran out while it waited."""

    waited_s: float
    outstanding: int
    released: int
    expired: int


class DrainTimeout(TimeoutError):
    """Live leases outlasted a drain's timeout; admission is open again."""

    def __init__(self, live: int, waited_s: float, timeout_s: float) -> None:
        super().__init__(f"{live} tensor read lease(s) still live after {timeout_s:g}s")
        self.live = live
        self.waited_s = waited_s


LeaseObserver = Callable[[str, str], None]


class Leases:
    """Live tensor read leases: id -> expiry (monotonic seconds)."""

    def __init__(self, lifetime_s: float, clock: Callable[[], float] = time.monotonic,
                 on_change: LeaseObserver | None = None) -> None:
        if not lifetime_s > 0 or not math.isfinite(lifetime_s):
            raise ValueError(f"a lease lifetime must be positive and finite (got {lifetime_s})")
        self._lifetime_s = lifetime_s
        self._clock = clock
        self._on_change = on_change
        self._cond = threading.Condition()
        self._accepting = True
        self._leases: dict[str, float] = {}
        self._released = 0  # leases given back (ever): a drain reports its share
        self._expired = 0

    @property
    def lifetime_s(self) -> float:
        return self._lifetime_s

    @property
    def accepting(self) -> bool:
        with self._cond:
            return self._accepting

    def prepare(self) -> str:
        """A new lease id; ``RuntimeError`` while draining."""
        with self._cond:
            if not self._accepting:
                raise RuntimeError("the worker is draining its tensor reads and admits no new lease")
            self._expire()
            lease_id = uuid.uuid4().hex
            self._leases[lease_id] = self._clock() + self._lifetime_s
            self._tell("granted", lease_id)
            return lease_id

    def release(self, lease_id: str) -> None:
        """End a lease; ``KeyError`` when it is unknown or has expired."""
        with self._cond:
            self._expire()
            if self._leases.pop(lease_id, None) is None:
                raise KeyError(lease_id)
            self._released += 1
            self._tell("released", lease_id)
            self._cond.notify_all()

    def live(self) -> int:
        with self._cond:
            self._expire()
            return len(self._leases)

    def drain(self, timeout_s: float) -> DrainReport:
        """Stop admitting leases and wait until none is live; on timeout re-admit and raise
        ``DrainTimeout``. Admission stays closed after a drain that ended (``reopen``)."""
        start = time.monotonic()
        deadline = start + timeout_s
        with self._cond:
            self._accepting = False
            self._expire()
            outstanding, released, expired = len(self._leases), self._released, self._expired
            while True:
                self._expire()
                if not self._leases:
                    return DrainReport(time.monotonic() - start, outstanding, self._released - released,
                                       self._expired - expired)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._accepting = True
                    raise DrainTimeout(len(self._leases), time.monotonic() - start, timeout_s)
                next_expiry = min(self._leases.values()) - self._clock()
                self._cond.wait(max(0.001, min(remaining, next_expiry)))

    def reopen(self) -> None:
        """Admit leases again (after the mutation a drain made way for)."""
        with self._cond:
            self._accepting = True

    def _expire(self) -> None:
        now = self._clock()
        for lease_id in [k for k, expiry in self._leases.items() if expiry <= now]:
            del self._leases[lease_id]
            self._expired += 1
            self._tell("expired", lease_id)

    def _tell(self, kind: str, lease_id: str) -> None:
        if self._on_change is not None:
            self._on_change(kind, lease_id)


_METHODS: dict[str, tuple[type[Any], type[Any]]] = {
    "GetTensorManifest": (mx_pb2.GetTensorManifestRequest, mx_pb2.GetTensorManifestResponse),
    "PrepareTensorRead": (mx_pb2.PrepareTensorReadRequest, mx_pb2.PrepareTensorReadResponse),
    "ReleaseTensorRead": (mx_pb2.ReleaseTensorReadRequest, mx_pb2.ReleaseTensorReadResponse),
}


class MxWorkerService:
    """``model_express.p2p.WorkerService`` over an mxref ``WorkerServicer`` (module docstring)."""

    def __init__(self, servicer: WorkerServicer, leases: Leases | None = None) -> None:
        self._servicer = servicer
        self.leases = leases if leases is not None else Leases(lease_seconds())

    def generic_handler(self) -> grpc.GenericRpcHandler:
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                functools.partial(self._serve, name),
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )
            for name, (request, response) in _METHODS.items()
        }
        return grpc.method_handlers_generic_handler(MX_WORKER_SERVICE_NAME, handlers)

    def _serve(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        manifest_request = p2p_pb2.GetTensorManifestRequest(mx_source_id=request.mx_source_id)
        if request.HasField("worker_id"):
            manifest_request.worker_id = request.worker_id
        try:
            manifest = self._servicer.current_manifest()
            # A release is judged without the draining flag: a draining worker still takes its leases back.
            rejection = check_request(manifest_request, manifest, self._servicer.is_draining and method != "ReleaseTensorRead")
        except Exception as exc:
            self._servicer.count("error")
            context.abort(grpc.StatusCode.INTERNAL, f"{method}: {type(exc).__name__}: {exc}")
            raise  # not reached: abort() raises
        if rejection is not None:
            self._servicer.count(rejection.reason.value)
            context.set_trailing_metadata(((REASON_METADATA_KEY, rejection.reason.value),))
            context.abort(rejection.code, rejection.message)
        if method == "ReleaseTensorRead":
            try:
                self.leases.release(request.lease_id)
            except KeyError:
                context.abort(grpc.StatusCode.NOT_FOUND, f"tensor read lease not found or expired: {request.lease_id!r}")
            return mx_pb2.ReleaseTensorReadResponse()
        answer = mx_pb2.GetTensorManifestResponse.FromString(manifest.to_response().SerializeToString())
        for tensor in answer.tensors:
            tensor.dtype = torch_dtype(tensor.dtype)
        if method == "GetTensorManifest":
            self._servicer.count("ok")
            return answer
        try:
            lease_id = self.leases.prepare()
        except RuntimeError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        self._servicer.count("ok")
        return mx_pb2.PrepareTensorReadResponse(lease_id=lease_id, manifest=answer)
