"""mxref's sources and readers on ModelExpress's own metadata server: ``model_express.p2p`` on the wire.

mxref speaks ``mxref.v1`` to its server; the real ModelExpress server serves only
``model_express.p2p.P2pService`` (a ``mxref.v1`` call is UNIMPLEMENTED). ``MxP2pStub`` is a
stub with the same four methods as ``mxref.v1``'s, taking and returning ``mxref.v1`` messages,
that calls ``model_express.p2p`` (the inverse of the server side's ``mxref.metadata.modelexpress``):

- ``PublishMetadata``, ``GetMetadata``, ``UpdateStatus``: the two packages number these
  messages alike (``proto/mxref/mx/p2p.proto``), so the ``mxref.v1`` bytes are sent as they are
  and the answer parsed as ``mxref.v1``. What only mxref knows (a descriptor's ``checksum`` and
  ``shape``) is an unknown field to ModelExpress and may not survive its store; a reader in
  P2P mode takes them from the source's manifest, not from the server.
- ``ListSources``: numbered differently; the request is rebuilt in MX's numbering (``limit`` 0
  and ``min_updated_at`` 0, "no bound" in ``mxref.v1``, are left unset) and each MX ref becomes
  an ``mxref.v1`` ref. MX's ref carries no status; a listing filtered by status lists only that
  status, so the filter's status is what each ref gets (else UNKNOWN).

``wire(value)`` reads which to speak: ``mxref.v1``, ``model_express.p2p``, or ``auto`` (the
default: ``mxref.v1``, and ``model_express.p2p`` from the first call a server answers
UNIMPLEMENTED on); ``$MXREF_SERVER_WIRE`` when no value is given.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import grpc

from mxref.mx import p2p_pb2 as mx_pb2
from mxref.v1 import p2p_pb2

__all__ = ["ENV_WIRE", "MX_P2P_SERVICE", "WIRES", "MxP2pStub", "list_request", "v1_ref", "wire"]

ENV_WIRE = "MXREF_SERVER_WIRE"
WIRES = ("auto", "mxref.v1", "model_express.p2p")
MX_P2P_SERVICE = "model_express.p2p.P2pService"

# method -> (mxref.v1 request, mxref.v1 response): numbered alike in both packages
_SAME_NUMBERS: dict[str, tuple[type[Any], type[Any]]] = {
    "PublishMetadata": (p2p_pb2.PublishMetadataRequest, p2p_pb2.PublishMetadataResponse),
    "GetMetadata": (p2p_pb2.GetMetadataRequest, p2p_pb2.GetMetadataResponse),
    "UpdateStatus": (p2p_pb2.UpdateStatusRequest, p2p_pb2.UpdateStatusResponse),
}


def wire(value: str | None = None) -> str:
    """Which package to speak (module docstring); ``ValueError`` naming the value and the choices."""
    chosen = (value if value is not None else os.environ.get(ENV_WIRE, "")).strip() or "auto"
    if chosen not in WIRES:
        source = "" if value is not None else f" (${ENV_WIRE})"
        raise ValueError(f"server wire {chosen!r}{source}: expected one of {', '.join(WIRES)}")
    return chosen


def list_request(request: p2p_pb2.ListSourcesRequest) -> mx_pb2.ListSourcesRequest:
    """An ``mxref.v1`` listing request in MX's numbering."""
    out = mx_pb2.ListSourcesRequest()
    if request.HasField("identity"):
        out.identity.ParseFromString(request.identity.SerializeToString())
    if request.HasField("status_filter"):
        out.status_filter = mx_pb2.SourceStatus.Value(p2p_pb2.SourceStatus.Name(request.status_filter))
    if request.HasField("model_name_filter"):
        out.model_name_filter = request.model_name_filter
    if request.HasField("worker_rank_filter"):
        out.worker_rank_filter = request.worker_rank_filter
    if request.min_updated_at:
        out.min_updated_at = request.min_updated_at
    if request.limit:
        out.limit = request.limit
    return out


def v1_ref(ref: mx_pb2.SourceInstanceRef, status: p2p_pb2.SourceStatus) -> p2p_pb2.SourceInstanceRef:
    """An MX listing entry as ``mxref.v1``'s, with ``status`` (MX's carries none)."""
    return p2p_pb2.SourceInstanceRef(
        mx_source_id=ref.mx_source_id, worker_id=ref.worker_id, model_name=ref.model_name,
        worker_rank=ref.worker_rank, accelerator=ref.accelerator, updated_at=ref.updated_at, status=status,
    )


class MxP2pStub:
    """``mxref.v1``'s ``P2pServiceStub`` surface over ``model_express.p2p`` (module docstring)."""

    def __init__(self, channel: grpc.Channel) -> None:
        for method, (request, response) in _SAME_NUMBERS.items():
            setattr(self, method, channel.unary_unary(
                f"/{MX_P2P_SERVICE}/{method}", request_serializer=request.SerializeToString,
                response_deserializer=response.FromString,
            ))
        self._list: Callable[..., mx_pb2.ListSourcesResponse] = channel.unary_unary(
            f"/{MX_P2P_SERVICE}/ListSources", request_serializer=mx_pb2.ListSourcesRequest.SerializeToString,
            response_deserializer=mx_pb2.ListSourcesResponse.FromString,
        )

    def ListSources(self, request: p2p_pb2.ListSourcesRequest, timeout: float | None = None) -> p2p_pb2.ListSourcesResponse:
        status = request.status_filter if request.HasField("status_filter") else p2p_pb2.SOURCE_STATUS_UNKNOWN
        answer = self._list(list_request(request), timeout=timeout)
        return p2p_pb2.ListSourcesResponse(instances=[v1_ref(ref, status) for ref in answer.instances])
