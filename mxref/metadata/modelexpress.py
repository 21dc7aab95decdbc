"""ModelExpress's ``model_express.p2p.P2pService``, served by the mxref metadata server.

The real ModelExpress client (0.7.0) speaks ``model_express.p2p``; mxref's own contract is
``mxref.v1``. ``MxP2pService`` answers the former on the same port, over the same store and
the same servicer (``mxref.metadata.P2pServicer``), so the write rate, the wire limits, the
ModelExpress negative answers, the metrics and the ``source_*`` events are the ones every
mxref call gets, and an MX worker and an mxref worker that hold the same thing see each
other. How each method maps (``proto/mxref/mx/p2p.proto`` pins the client's field numbers):

- ``PublishMetadata``, ``GetMetadata``, ``UpdateStatus``: the two packages give these
  messages (and ``SourceIdentity``, ``WorkerMetadata``, ``TensorDescriptor``) the same
  numbers and wire types, so the request's bytes are served as they came and the answer's
  bytes are the MX answer. What only one side knows travels as unknown fields and survives
  the store (MX ``topology`` and ``artifact_source``; mxref's descriptor ``checksum`` and
  ``shape``, which an MX client ignores). ``mx_source_id`` is computed by the server
  (``mxref.identity``: ModelExpress's canonical JSON). ``UpdateStatus`` is the heartbeat;
  its ``source_load`` (0.7) is kept beside the store and listed with the worker.
- ``ListSources``: numbered differently (MX: ``min_training_step=5``, ``min_updated_at=6``,
  ``limit=7``; its ``SourceInstanceRef`` has ``training_step`` where mxref has ``status``), so
  the request is translated and every ref built in MX's form: ``training_step`` (extra
  parameter ``training_step``, else ``version``) and ``layout_signature`` from the stored
  identity, ``topology`` from the stored worker, ``source_load`` from the last heartbeat. A
  ref's encoding is kept for the next listing while its record and reading stay (5000 refs:
  ~80 ms built each time, ~6 ms kept). READY
  freshness, newest-first order, ``limit`` and "a store failure reads as no sources" are
  the servicer's; ``min_training_step`` filters before ``limit``. A record whose ref does
  not encode (written to a shared Redis by another writer) is left out of the listing and
  counted (``mxref_server_listing_skipped_total``), never an error for the whole listing.

Every request is checked as the ModelExpress message it is (``RequestChecker.parse(via=)``):
its own fields (``topology``, ``artifact_source``, ``transfer_engine_session_id``) meet the
same UTF-8, size and count limits as ours. Writes carry no owner secret; ``--mx-writes``
(``mxref.metadata.ownership``) says what they may touch.

A request that does not parse as the MX message is INVALID_ARGUMENT naming the method.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from mxref.mx import p2p_pb2 as mx_pb2
from mxref.v1 import p2p_pb2
from mxref.wire import wire_bytes

if TYPE_CHECKING:
    from mxref.metadata.records import SourceRecord
    from mxref.metadata.servicer import P2pServicer

_ENCODE_ERRORS = (DecodeError, ValueError, TypeError)

__all__ = ["MX_METHODS", "MX_SERVICE_NAME", "MxP2pService", "lifted_extras"]

MX_SERVICE_NAME = "model_express.p2p.P2pService"
TRAINING_STEP_KEYS = ("training_step", "version")
LAYOUT_SIGNATURE_KEY = "layout_signature"
UINT64_MAX = (1 << 64) - 1

_RESPONSES: dict[str, type[Any]] = {
    "PublishMetadata": mx_pb2.PublishMetadataResponse,
    "ListSources": mx_pb2.ListSourcesResponse,
    "GetMetadata": mx_pb2.GetMetadataResponse,
    "UpdateStatus": mx_pb2.UpdateStatusResponse,
}
MX_METHODS = tuple(_RESPONSES)
"""The methods of ``model_express.p2p.P2pService`` served here (each as its ``mxref.v1`` namesake)."""


def lifted_extras(extra: Any) -> tuple[int | None, str | None]:
    """``(training_step, layout_signature)`` as ModelExpress lifts them from ``extra_parameters``:
    ``training_step`` (else ``version``) when it is a uint64 in decimal; the signature as is."""
    step = None
    for key in TRAINING_STEP_KEYS:
        text = extra.get(key)
        if text is not None and text.strip().isdigit() and int(text) <= UINT64_MAX:
            step = int(text)
            break
    signature = extra.get(LAYOUT_SIGNATURE_KEY)
    return step, signature


class MxP2pService:
    """``model_express.p2p.P2pService`` over an mxref ``P2pServicer`` (see the module docstring)."""

    def __init__(self, servicer: P2pServicer, *, max_loads: int | None = None) -> None:
        self._servicer = servicer
        self._loads: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._loads_lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._entries_lock = threading.Lock()
        self._max_loads = max_loads if max_loads is not None else servicer.limits.max_records

    def generic_handler(self) -> grpc.GenericRpcHandler:
        """The handler to register beside the servicer's own (raw bytes in, MX message out)."""
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                functools.partial(self._serve, name),
                request_deserializer=None,
                response_serializer=wire_bytes,
            )
            for name in _RESPONSES
        }
        return grpc.method_handlers_generic_handler(MX_SERVICE_NAME, handlers)

    def serve_encoded(self, method: str, raw: bytes, context: grpc.ServicerContext) -> bytes:
        """Serve one call, answering with the response's bytes (a transport's entry point)."""
        return wire_bytes(self._serve(method, raw, context))

    def source_load(self, mx_source_id: str, worker_id: str) -> float | None:
        with self._loads_lock:
            return self._loads.get((mx_source_id, worker_id))

    def _serve(self, method: str, raw: bytes, context: grpc.ServicerContext) -> Any:
        if method == "ListSources":
            return self._list(raw, context)
        response = self._servicer.serve(method, raw, context, mx=True)
        if method == "UpdateStatus":
            self._heard(raw, bool(response.success))
        return response  # same numbers and wire types as the MX answer: serialized as is

    def _parse(self, cls: type[Any], raw: bytes, method: str, context: grpc.ServicerContext) -> Any:
        try:
            return cls.FromString(raw)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: not a {MX_SERVICE_NAME} request: {exc}")
            raise  # not reached: abort() raises

    def _heard(self, raw: bytes, accepted: bool) -> None:
        """Keep (or, when refused, forget) the heartbeat's ``source_load``."""
        try:
            request = mx_pb2.UpdateStatusRequest.FromString(raw)
        except DecodeError:  # the servicer already judged the request; nothing to keep
            return
        key = (request.mx_source_id, request.worker_id)
        with self._loads_lock:
            if accepted and request.HasField("source_load"):
                self._loads[key] = request.source_load
                self._loads.move_to_end(key)
                while len(self._loads) > self._max_loads:
                    self._loads.popitem(last=False)
            else:  # refused, or a heartbeat without a reading: no load to list
                self._loads.pop(key, None)

    def _list(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        request = self._parse(mx_pb2.ListSourcesRequest, raw, "ListSources", context)
        ours = p2p_pb2.ListSourcesRequest()
        if request.HasField("identity"):
            ours.identity.ParseFromString(request.identity.SerializeToString())
        if request.HasField("status_filter"):
            ours.status_filter = request.status_filter
        if request.HasField("model_name_filter"):
            ours.model_name_filter = request.model_name_filter
        if request.HasField("worker_rank_filter"):
            ours.worker_rank_filter = request.worker_rank_filter
        if request.HasField("min_updated_at"):
            ours.min_updated_at = request.min_updated_at
        by_step = request.HasField("min_training_step")
        if request.HasField("limit") and not by_step:
            ours.limit = request.limit
        records = self._servicer.serve_listing(ours.SerializeToString(), context)
        entries = self._entries_of(records)
        if by_step:
            entries = [e for e in entries if e.training_step is not None and e.training_step >= request.min_training_step]
            if request.HasField("limit") and request.limit > 0:
                entries = entries[: request.limit]
        return b"".join(e.encoded for e in entries)  # the MX response, encoded (sent as is)

    def _entries_of(self, records: list[SourceRecord]) -> list[_Entry]:
        """Each record's MX listing entry: kept from an earlier listing while the record (replaced
        on every change) and its ``source_load`` are the ones it was built from, else built now."""
        with self._loads_lock:
            loads = [self._loads.get(r.key) for r in records]
        out: list[_Entry] = []
        with self._entries_lock:
            kept = self._entries
            for record, load in zip(records, loads, strict=True):
                entry = kept.get(record.key)
                if entry is None or entry.record is not record or entry.load != load:
                    try:
                        entry = _Entry.of(record, load)
                    except _ENCODE_ERRORS as exc:  # one record that does not encode never fails a listing
                        self._servicer.skipped_listing(MX_SERVICE_NAME, record, exc)
                        continue
                    kept[record.key] = entry
                    kept.move_to_end(record.key)
                    while len(kept) > self._max_loads:
                        kept.popitem(last=False)
                out.append(entry)
        return out


@dataclass(frozen=True)
class _Entry:
    """One worker in an MX listing: its ref, encoded as a one-ref ``ListSourcesResponse``
    (these concatenate into the response), built from ``record`` and ``load``."""

    record: SourceRecord
    load: float | None
    training_step: int | None
    encoded: bytes

    @classmethod
    def of(cls, record: SourceRecord, load: float | None) -> _Entry:
        mx_ref = mx_pb2.SourceInstanceRef(**record.ref_fields())
        step, signature = lifted_extras(record.identity.extra_parameters)
        if step is not None:
            mx_ref.training_step = step
        if signature is not None:
            mx_ref.layout_signature = signature
        worker = mx_pb2.WorkerMetadata.FromString(record.worker.SerializeToString())
        mx_ref.topology.update(worker.topology)
        if load is not None:
            mx_ref.source_load = load
        encoded: bytes = mx_pb2.ListSourcesResponse(instances=[mx_ref]).SerializeToString()
        return cls(record, load, step, encoded)


