"""The ``P2pService`` RPCs (``P2pServicer``), trusting no client.

Before a request touches the store it must pass the client's write rate (token buckets per
connection and per peer address; RESOURCE_EXHAUSTED), a write must come from a caller allowed to
write that record (``mxref.metadata.ownership``: its publisher's secret, no reader token;
PERMISSION_DENIED) and fit the byte budgets, and every request must pass the limits of
``config.ServerLimits`` checked on the wire (``mxref.metadata.limits``: sizes, counts, uint32
ranges seen before protobuf truncates them, enum numbers; INVALID_ARGUMENT); the message names the
field, its size and the limit, and ``mxref_server_rejected_requests_total`` counts it. A request
within the limits but wrong by ModelExpress's rules gets a negative answer with a message naming the
field and the rule (``success=false``, ``found=false``), as ModelExpress does; an unexpected
exception becomes INTERNAL with a message. Every call is counted as ``ok`` (did what was asked),
``rejected`` (refused or a negative answer) or ``error``."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError, EncodeError  # type: ignore[import-untyped]
from prometheus_client import CollectorRegistry

from mxref import config
from mxref.front_door import peer_holder
from mxref.identity import mx_source_id
from mxref.metadata.limits import MX_REQUESTS, Capacity, RejectReason, RequestChecker, Violation, WriteRates
from mxref.metadata.ownership import BudgetExceeded, Claims, NotAllowed, OwnerBook, WriteGate
from mxref.metadata.query import SourceQuery
from mxref.metadata.records import (
    ALL_STATUSES,
    INITIALIZING,
    LISTED,
    REPORTABLE_STATUSES,
    UNKNOWN,
    SourceRecord,
    SourceStatus,
    StatusChange,
    StoreFull,
    StoreUnavailable,
    UpdateRejected,
    status_name,
)
from mxref.metadata.store import SourceStore
from mxref.metrics import ServerFamilies
from mxref.rpc import REASON_METADATA_KEY
from mxref.v1 import p2p_pb2, p2p_pb2_grpc
from mxref.wire import wire_bytes

logger = logging.getLogger("mxref.metadata")


SERVER_THREADS = 16
RATE_LIMIT_DELAY_S = 0.25
"""How long a rate-limited write waits before its RESOURCE_EXHAUSTED (``P2pServicer._hold_back``)."""
HELD_BACK_CALLS = SERVER_THREADS // 2
"""Handler threads that may wait out a rate-limited write at once; the others serve everyone."""



class Outcome(StrEnum):
    """The ``result`` label of ``mxref_server_rpcs_total``."""

    OK = "ok"
    REJECTED = "rejected"
    ERROR = "error"


RESERVED_WORKER_IDS = frozenset({"__attributes__"})
"""Worker ids no store accepts: ``mxref.metadata.redis_store`` keeps the identity in the field of that name."""


def publish_problems(request: p2p_pb2.PublishMetadataRequest) -> list[str]:
    """Every reason to answer this publish ``success=false`` (empty: acceptable).

    These are ModelExpress's negative answers; a request breaking a limit (sizes, ranges,
    enum numbers) never gets here: ``RequestChecker`` refuses it with a gRPC error first.
    """
    problems = []
    if not request.HasField("identity"):
        problems.append("identity is missing; a source must say what it holds")
    elif not request.identity.model_name.strip():
        problems.append("identity.model_name is empty; a source must name its model")
    if not request.worker_id.strip():
        problems.append("worker_id is empty; each worker process needs its own id")
    elif request.worker_id in RESERVED_WORKER_IDS:
        problems.append(f"worker_id {request.worker_id!r} is reserved (ModelExpress's Redis layout keeps a "
                        "source's identity under that name)")
    if not request.HasField("worker"):
        problems.append("worker is missing; a source must publish its WorkerMetadata")
    return problems


@dataclass(frozen=True)
class _Rpc:
    """One ``P2pService`` method as the servicer serves it from raw bytes."""

    request: type[Any]  # a generated message class (protobuf ships no type stubs)
    response: type[Any]
    writes: bool  # counted against the client's write rate


SERVICE_NAME = "mxref.v1.P2pService"
RPCS: dict[str, _Rpc] = {
    "PublishMetadata": _Rpc(p2p_pb2.PublishMetadataRequest, p2p_pb2.PublishMetadataResponse, writes=True),
    "ListSources": _Rpc(p2p_pb2.ListSourcesRequest, p2p_pb2.ListSourcesResponse, writes=False),
    "GetMetadata": _Rpc(p2p_pb2.GetMetadataRequest, p2p_pb2.GetMetadataResponse, writes=False),
    "UpdateStatus": _Rpc(p2p_pb2.UpdateStatusRequest, p2p_pb2.UpdateStatusResponse, writes=True),
}


def client_key(context: grpc.ServicerContext) -> str:
    """The rate-limit key of a caller: its connection (``ipv4:10.0.0.7:51234``).

    Not the address alone: every source of one host, or behind one proxy, would share a
    bucket. Not the ``worker_id``: the client chooses it, so a flood could rotate it for
    free, while a new connection costs the flooder a TCP and HTTP/2 handshake.
    """
    peer: str = context.peer()
    return peer


class P2pServicer(p2p_pb2_grpc.P2pServiceServicer):
    """``P2pService`` over a ``Store`` (whose listener reports the changes).

    Served from raw bytes (``generic_handler``), so that a write over the client's rate
    is refused before it is parsed, and a request is checked against ``limits`` on the
    wire (``RequestChecker``) before any of it is believed. A refusal is a gRPC error
    (``Violation.code``) naming the field, its size and the limit, and is counted in
    ``mxref_server_rejected_requests_total{method,reason}``.
    """

    def __init__(
        self,
        store: SourceStore,
        timers: config.ServerTimers,
        *,
        metrics: ServerFamilies | None = None,
        limits: config.ServerLimits | None = None,
        rate_clock: Callable[[], float] = time.monotonic,
        rate_limit_delay_s: float = RATE_LIMIT_DELAY_S,
        owners: OwnerBook | None = None,
        write_gate: WriteGate | None = None,
    ) -> None:
        self._store = store
        self._timers = timers
        self.limits = limits if limits is not None else config.ServerLimits()
        self._metrics = metrics if metrics is not None else ServerFamilies(CollectorRegistry())
        self._checker = RequestChecker(self.limits)
        self._writes = WriteRates(self.limits, clock=rate_clock)
        self.claims = Claims(owners if owners is not None else OwnerBook(max_entries=2 * self.limits.max_records),
                             Capacity(self.limits), holds=store.holds, owner_of=store.owner)
        self._write_gate = write_gate if write_gate is not None else WriteGate()
        self._rate_limit_delay_s = rate_limit_delay_s
        self._held_back = threading.BoundedSemaphore(HELD_BACK_CALLS)
        self._counted: dict[tuple[str, Outcome], tuple[Any, Any]] = {}
        self._handlers: dict[str, Callable[[Any, _Call], tuple[Any, Outcome]]] = {
            "PublishMetadata": self._publish,
            "ListSources": self._list,
            "GetMetadata": self._get,
            "UpdateStatus": self._update,
        }
        for status in ALL_STATUSES:
            self._metrics.sources.labels(status_name(status)).set_function(functools.partial(store.count, status))

    @property
    def store(self) -> SourceStore:
        return self._store

    def serve(self, method: str, raw: bytes, context: grpc.ServicerContext, *, mx: bool = False) -> Any:
        """Serve one call of ``method`` from its raw bytes, answering with a message
        (``mxref.metadata.modelexpress`` serves ModelExpress's package through this, ``mx=True``: the request
        is checked as ModelExpress's message, and its writes follow ``OwnerBook.mx_writes``)."""
        response = self._serve(method, raw, context, mx=mx)
        return response.message() if isinstance(response, Listing) else response

    def forget(self, key: tuple[str, str]) -> None:
        """The record at ``key`` is gone (the reaper deleted it): its owner and bytes go too, unless
        a publish put it back since (``Claims.forget``); a store that cannot say keeps them."""
        try:
            self.claims.forget(key)
        except StoreUnavailable as exc:
            logger.warning("the reaper deleted worker %r of source %r; its owner is kept: %s", key[1][:64],
                           key[0][:32], exc)

    def serve_encoded(self, method: str, raw: bytes, context: grpc.ServicerContext) -> bytes:
        """Serve one call, answering with the response's bytes (a transport's entry point)."""
        return wire_bytes(self._serve(method, raw, context))

    def serve_listing(self, raw: bytes, context: grpc.ServicerContext) -> list[SourceRecord]:
        """Serve one ``ListSources`` call (every check and count of ``serve``), answering with the
        records listed, in order (none when the store failed)."""
        response = self._serve("ListSources", raw, context)
        return response.records if isinstance(response, Listing) else []

    def generic_handler(self) -> grpc.GenericRpcHandler:
        """The handler to register: every method takes the request's raw bytes (and a listing is
        sent as its records' encoded entries: ``Listing``)."""
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                functools.partial(self._serve, name),
                request_deserializer=None,  # raw bytes: checked on the wire, parsed by _serve
                response_serializer=wire_bytes,
            )
            for name in RPCS
        }
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    # The generated base class's entry points, for a server that registers this servicer with
    # ``add_P2pServiceServicer_to_server``: the same checks, from the re-serialized request.
    def PublishMetadata(
        self, request: p2p_pb2.PublishMetadataRequest, context: grpc.ServicerContext
    ) -> p2p_pb2.PublishMetadataResponse:
        response: p2p_pb2.PublishMetadataResponse = self.serve("PublishMetadata", request.SerializeToString(), context)
        return response

    def ListSources(
        self, request: p2p_pb2.ListSourcesRequest, context: grpc.ServicerContext
    ) -> p2p_pb2.ListSourcesResponse:
        response: p2p_pb2.ListSourcesResponse = self.serve("ListSources", request.SerializeToString(), context)
        return response

    def GetMetadata(
        self, request: p2p_pb2.GetMetadataRequest, context: grpc.ServicerContext
    ) -> p2p_pb2.GetMetadataResponse:
        response: p2p_pb2.GetMetadataResponse = self.serve("GetMetadata", request.SerializeToString(), context)
        return response

    def UpdateStatus(
        self, request: p2p_pb2.UpdateStatusRequest, context: grpc.ServicerContext
    ) -> p2p_pb2.UpdateStatusResponse:
        response: p2p_pb2.UpdateStatusResponse = self.serve("UpdateStatus", request.SerializeToString(), context)
        return response

    def _serve(self, method: str, raw: bytes, context: grpc.ServicerContext, *, mx: bool = False) -> Any:
        """Serve one call: the write rate first (cheapest), then the wire checks, then the handler;
        time it, count its outcome, turn a refusal into its gRPC code and an exception into INTERNAL."""
        started = time.perf_counter()
        rpc = RPCS[method]
        if rpc.writes:
            refused = self._write_refusal(method, raw, context)
            if refused is not None:
                self._refuse(method, refused, context, started)
        request = self._checker.parse(rpc.request, raw, via=MX_REQUESTS.get(method) if mx else None)
        if isinstance(request, Violation):
            self._refuse(method, request, context, started)
        try:
            response, outcome = self._handlers[method](request, _Call(len(raw), mx, context))
        except NotAllowed as exc:
            self._refuse(method, exc.violation, context, started)
        except StoreFull as exc:
            self._refuse(method, Violation(RejectReason.STORE_FULL, "store", str(exc)), context, started)
        except StoreUnavailable as exc:  # ModelExpress's answer to a backend error: negative, not an RPC error
            logger.warning("%s: %s", method, exc)
            response, outcome = store_failure_response(method, request, str(exc)), Outcome.ERROR
        except Exception as exc:
            logger.exception("%s failed", method)
            self._count(method, Outcome.ERROR, started)
            context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error: {type(exc).__name__}: {exc}")
            raise  # not reached: abort() raises
        self._count(method, outcome, started)
        return response

    def _write_refusal(self, method: str, raw: bytes, context: grpc.ServicerContext) -> Violation | None:
        """Why a write is refused before it is parsed: a reader's token, the write rate (per
        connection, then per peer address), a record over ``max_record_bytes``; else None."""
        refused = self._write_gate.refusal(method, context)
        if refused is not None:
            return refused
        refused = self._writes.refusal(client_key(context))
        if refused is not None:
            self._hold_back(context)
            return refused
        return self._writes.record_refusal(len(raw)) if method == "PublishMetadata" else None

    def _hold_back(self, context: grpc.ServicerContext) -> None:
        """Delay a rate-limited answer by ``rate_limit_delay_s`` while a hold slot is free.

        Refusing at once would let a flooding connection cycle its streams as fast as the
        server can refuse (each refusal still costs the server's Python, and the GIL that
        other clients need); held back, it gets at most ``MAX_STREAMS_PER_CONNECTION``
        refusals per delay. At most ``HELD_BACK_CALLS`` threads wait here, so floods on
        many connections cannot take the whole pool: beyond it a refusal is immediate.
        A context that can delay its own answer (the native gRPC's: the delay holds
        the caller's stream, not a thread) is asked to, every time.
        """
        delay_answer = getattr(context, "delay_answer", None)
        if delay_answer is not None:
            delay_answer(self._rate_limit_delay_s)
            return
        if self._held_back.acquire(blocking=False):
            try:
                time.sleep(self._rate_limit_delay_s)
            finally:
                self._held_back.release()

    def _refuse(self, method: str, violation: Violation, context: grpc.ServicerContext, started: float) -> NoReturn:
        """Count the refusal and abort the call with its code."""
        self._metrics.rejected_requests.labels(method, violation.reason.value).inc()
        self._count(method, Outcome.REJECTED, started)
        context.set_trailing_metadata(((REASON_METADATA_KEY, violation.reason.value),))
        context.abort(violation.code, f"{method}: {violation.message}")
        raise AssertionError("context.abort() returned")  # not reached: abort() raises

    def _count(self, method: str, outcome: Outcome, started: float) -> None:
        counted = self._counted.get((method, outcome))
        if counted is None:  # each (method, outcome)'s children, looked up once
            counted = self._counted[(method, outcome)] = (
                self._metrics.rpcs.labels(method, outcome.value), self._metrics.rpc_seconds.labels(method))
        counted[0].inc()
        counted[1].observe(time.perf_counter() - started)

    def _publish(
        self, request: p2p_pb2.PublishMetadataRequest, call: _Call
    ) -> tuple[p2p_pb2.PublishMetadataResponse, Outcome]:
        problems = publish_problems(request)
        if problems:
            self._metrics.rejected_requests.labels("PublishMetadata", RejectReason.INVALID.value).inc()
            message = "publish rejected: " + "; ".join(problems)
            return p2p_pb2.PublishMetadataResponse(success=False, message=message, worker_id=request.worker_id), (
                Outcome.REJECTED
            )
        status = request.worker.status if request.worker.status != UNKNOWN else INITIALIZING
        try:
            record, secret = self._write_record(request, status, call)
        except UpdateRejected as exc:  # the store's own rule (a reserved name)
            return p2p_pb2.PublishMetadataResponse(success=False, message=f"publish rejected: {exc}",
                                                   worker_id=request.worker_id), Outcome.REJECTED
        response = p2p_pb2.PublishMetadataResponse(
            success=True,
            message=f"published worker {record.worker_id} of source {record.mx_source_id} as {status_name(status)}",
            mx_source_id=record.mx_source_id,
            worker_id=record.worker_id,
            owner_secret=secret,
        )
        return response, Outcome.OK

    def _write_record(
        self, request: p2p_pb2.PublishMetadataRequest, status: SourceStatus, call: _Call
    ) -> tuple[SourceRecord, str]:
        """The publish's claim (``OwnerBook``), byte budget and store write, as one step; returns the
        record and its owner secret. ``NotAllowed``, ``StoreFull`` or the store's error otherwise."""
        key = (mx_source_id(request.identity), request.worker_id)
        try:
            return self.claims.publish(
                key, request.owner_secret, mx=call.mx, size=call.size, peer=call.peer,
                write=lambda owner: self._store.publish(request.identity, request.worker, request.worker_id, status,
                                                        owner))
        except BudgetExceeded as exc:
            raise StoreFull(str(exc)) from None

    def _list(
        self, request: p2p_pb2.ListSourcesRequest, call: _Call
    ) -> tuple[p2p_pb2.ListSourcesResponse | Listing, Outcome]:
        query = SourceQuery.from_request(request)
        try:
            chosen = self._store.listing(query, self._timers.heartbeat_timeout_s)
        except Exception:
            # As in ModelExpress: a backend failure reads as "no sources", not an RPC error.
            logger.exception("ListSources: the store failed; answering with no sources")
            return p2p_pb2.ListSourcesResponse(), Outcome.ERROR
        return Listing(listable(chosen, LISTED, self.skipped_listing)), Outcome.OK

    def skipped_listing(self, package: str, record: SourceRecord, exc: Exception) -> None:
        """A record that cannot be listed (it does not encode) was left out of a listing: counted."""
        self._metrics.listing_skipped.labels(package).inc()
        logger.warning("listing (%s): left out worker %r of source %r, which does not encode: %s",
                       package, record.worker_id[:64], record.mx_source_id[:32], exc)

    def _get(self, request: p2p_pb2.GetMetadataRequest, call: _Call) -> tuple[p2p_pb2.GetMetadataResponse, Outcome]:
        sid, wid = request.mx_source_id, request.worker_id
        if not sid or not wid:
            return p2p_pb2.GetMetadataResponse(found=False, mx_source_id=sid, worker_id=wid), Outcome.REJECTED
        record = self._store.get(sid, wid)
        if record is None:
            return p2p_pb2.GetMetadataResponse(found=False, mx_source_id=sid, worker_id=wid), Outcome.REJECTED
        response = p2p_pb2.GetMetadataResponse(
            found=True, worker=record.worker_metadata(), identity=record.identity, mx_source_id=sid, worker_id=wid
        )
        return response, Outcome.OK

    def _update(self, request: p2p_pb2.UpdateStatusRequest, call: _Call) -> tuple[p2p_pb2.UpdateStatusResponse, Outcome]:
        key = (request.mx_source_id, request.worker_id)
        try:
            change = self.claims.heartbeat(key, request.owner_secret, mx=call.mx,
                                           write=functools.partial(self._apply_update, request))
        except UpdateRejected as exc:
            return p2p_pb2.UpdateStatusResponse(success=False, message=f"update rejected: {exc}"), Outcome.REJECTED
        return p2p_pb2.UpdateStatusResponse(success=True, message=status_name(change.record.status)), Outcome.OK

    def _apply_update(self, request: p2p_pb2.UpdateStatusRequest) -> StatusChange:
        if not request.mx_source_id or not request.worker_id:
            raise UpdateRejected("mx_source_id and worker_id are both required")
        if request.status not in REPORTABLE_STATUSES:
            raise UpdateRejected(
                f"status {status_name(request.status)} cannot be reported (use INITIALIZING, READY or STALE)"
            )
        return self._store.update_status(request.mx_source_id, request.worker_id, request.worker_rank, request.status)


@dataclass(frozen=True)
class _Call:
    """What a handler knows of its call beyond the request: its size, its package and its context."""

    size: int
    mx: bool
    context: grpc.ServicerContext

    @property
    def peer(self) -> str:
        """Whose share a publish counts in: the caller's address (``mxref.front_door.peer_holder``)."""
        return peer_holder(client_key(self.context))


ENCODE_ERRORS: tuple[type[Exception], ...] = (DecodeError, EncodeError, ValueError, TypeError)
"""What encoding a stored record for a listing can raise (a string that is not UTF-8, a value out of range)."""


def listable(records: list[SourceRecord], encode: Callable[[SourceRecord], Any],
             skipped: Callable[[str, SourceRecord, Exception], None]) -> list[SourceRecord]:
    """The records whose ``encode`` succeeds (a record keeps its encoding), the others left out and
    reported to ``skipped``: one bad record (written to a shared Redis by anyone) never fails a listing."""
    out = []
    for record in records:
        try:
            encode(record)
        except ENCODE_ERRORS as exc:
            skipped(SERVICE_NAME, record, exc)
        else:
            out.append(record)
    return out


@dataclass(frozen=True)
class Listing:
    """A ``ListSources`` answer as the records it lists, in order. On the wire it is their
    ``SourceRecord.listed`` entries joined (no message is built; ``SerializeToString``, as a
    message would, so ``mxref.wire`` sends it like one); ``message`` parses that."""

    records: list[SourceRecord]

    def SerializeToString(self) -> bytes:
        return b"".join(map(LISTED, self.records))

    def message(self) -> p2p_pb2.ListSourcesResponse:
        message: p2p_pb2.ListSourcesResponse = p2p_pb2.ListSourcesResponse.FromString(self.SerializeToString())
        return message


def store_failure_response(method: str, request: Any, message: str) -> Any:
    """The negative answer to ``method`` when the store failed: no sources, not found, or
    ``success=false`` with the store's message."""
    if method == "ListSources":
        return p2p_pb2.ListSourcesResponse()
    if method == "GetMetadata":
        return p2p_pb2.GetMetadataResponse(found=False, mx_source_id=request.mx_source_id, worker_id=request.worker_id)
    if method == "PublishMetadata":
        return p2p_pb2.PublishMetadataResponse(success=False, message=message, worker_id=request.worker_id)
    return p2p_pb2.UpdateStatusResponse(success=False, message=message)

