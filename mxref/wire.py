"""How a metadata-server answer goes on the wire: one rule for both packages (``mxref.v1`` and
ModelExpress's) and both gRPC implementations (grpcio's serializer, the native server's answer)."""

from __future__ import annotations

from typing import Any


def wire_bytes(response: Any) -> bytes:
    """``bytes`` as they are (an answer encoded ahead of time, as ModelExpress's listing is);
    anything else serializes itself: a protobuf message, or ``mxref.metadata.servicer.Listing``."""
    if isinstance(response, bytes):
        return response
    data: bytes = response.SerializeToString()
    return data
