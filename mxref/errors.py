"""The exceptions mxref raises, as one tree.

Who is at fault decides what a reader does next: a ``SourceError`` moves it on
to the next candidate source, a ``LocalError`` propagates, and a
``MetadataServerError`` is the control plane's (the caller's policy decides)::

    MxError
     ├── SourceError               a source's fault; try the next candidate
     │    ├── ManifestError        GetTensorManifest refused or failed
     │    │    └── WorkerIdMismatch    the endpoint now belongs to another worker
     │    ├── ManifestMismatchError    the source's tensors do not fit ours
     │    ├── HandshakeTimeout     the source's NIXL metadata did not arrive in time (also a TimeoutError)
     │    ├── TransferTimeout      a READ did not finish within its budget (also a TimeoutError)
     │    │    └── TransferStalled     a chunked READ made no progress within its stall deadline
     │    ├── TransferFailed       a READ ended in an error status (also a RuntimeError)
     │    └── IntegrityError       bytes landed but a checksum differs from the manifest
     ├── MetadataServerError       the metadata server failed or was unreachable
     ├── LoadFailed                no source and no checkpoint gave a verified load
     └── LocalError                this process's own fault (bind, config, ...)
          └── NixlUnavailable      the nixl package cannot be imported

Messages state the value and the rule that it broke.
"""

from __future__ import annotations

from enum import StrEnum

import grpc

RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class MxError(Exception):
    """Root of every exception mxref raises on purpose."""


class SourceError(MxError):
    """A source misbehaved or is gone; the reader should try another candidate."""


class ManifestError(SourceError):
    """A source refused or failed ``GetTensorManifest``.

    ``code`` is the gRPC status the source answered with (``None`` when the
    answer itself was wrong, e.g. it named another source).
    """

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class WorkerIdMismatch(ManifestError):
    """The manifest endpoint answered for a different ``worker_id``: a reused endpoint."""

    def __init__(self, message: str, requested: str, actual: str | None, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message, code)
        self.requested = requested
        self.actual = actual


class ManifestMismatchError(SourceError):
    """The source's tensor catalog does not fit ours (size, dtype, or names under exact match)."""


class HandshakeTimeout(SourceError, TimeoutError):
    """The source's NIXL agent metadata did not arrive within the handshake budget."""


class ReadFailure(StrEnum):
    """How a READ from a source failed: one name from the chunked READ through the transfer
    manager's health and metric to the reader's event (each transfer error carries its own)."""

    STALLED = "stalled"  # a chunk window completed nothing within its stall deadline
    TIMED_OUT = "timed_out"  # the READ's whole budget ran out
    FAILED = "failed"  # NIXL raised or returned an error state

    @property
    def metric_kind(self) -> str:
        """The ``kind`` label of ``mxref_data_plane_errors_total``: timeout | status_error."""
        return "status_error" if self is ReadFailure.FAILED else "timeout"


class TransferTimeout(SourceError, TimeoutError):
    """A transfer from a source did not complete within its budget."""

    failure = ReadFailure.TIMED_OUT


class TransferStalled(TransferTimeout):
    """A chunked READ completed no chunk within its stall deadline: the source stopped serving.
    ``chunks_done`` of ``chunks`` had completed before it (a stall after progress has some)."""

    failure = ReadFailure.STALLED

    def __init__(self, message: str, chunks_done: int = 0, chunks: int = 0) -> None:
        super().__init__(message)
        self.chunks_done = chunks_done
        self.chunks = chunks


class TransferFailed(SourceError, RuntimeError):
    """A transfer from a source ended in an error status (NIXL 1.5.1 raises rather than returning ERR)."""

    failure = ReadFailure.FAILED


class IntegrityError(SourceError):
    """The bytes a source delivered do not match the checksums it published."""


class LoadFailed(MxError):
    """Neither a source nor the disk checkpoint produced a verified load."""


class MetadataServerError(MxError):
    """A metadata-server RPC failed at the transport or server level.

    ``code`` is the gRPC status; ``retryable`` is true for UNAVAILABLE and
    DEADLINE_EXCEEDED, the two codes ModelExpress's publisher retries on.
    """

    def __init__(self, message: str, method: str, code: grpc.StatusCode | None) -> None:
        super().__init__(message)
        self.method = method
        self.code = code

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES


class LocalError(MxError):
    """This process's own fault (cannot bind, bad configuration, ...): never retried elsewhere."""


class NixlUnavailable(LocalError):
    """The NIXL Python package is not installed or cannot be imported here."""
