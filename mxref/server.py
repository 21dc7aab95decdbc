"""The metadata server: where sources publish themselves and readers find them.

Three parts, each usable alone:

- ``Store``: the in-memory, thread-safe record of every published worker, keyed
  by ``(mx_source_id, worker_id)``. It owns the clock (injectable, wall seconds),
  stamps ``updated_at`` in unix ms, and applies the reaper's decisions atomically.
  It reports every change to a ``StoreListener`` *under its lock*, so the
  ``source_*`` events (``EventJournal``) appear in the order the changes happened.
- ``P2pServicer``: the ``P2pService`` RPCs, trusting no client. Before a request
  touches the store it must pass the client's write rate (token buckets per
  connection and per peer address; RESOURCE_EXHAUSTED), a write must come from a
  caller allowed to write that record (``mxref.ownership``: its publisher's secret,
  no reader token; PERMISSION_DENIED) and fit the byte budgets, and every request
  must pass the limits of ``config.ServerLimits``
  checked on the wire (``mxref.request_limits``: sizes, counts, uint32 ranges seen
  before protobuf truncates them, enum numbers; INVALID_ARGUMENT); the message
  names the field, its size and the limit, and ``mxref_server_rejected_requests_total``
  counts it. A request within the limits but wrong by ModelExpress's rules gets a
  negative answer with a message naming the field and the rule (``success=false``,
  ``found=false``), as ModelExpress does; an unexpected exception becomes INTERNAL
  with a message. Every call is counted as ``ok`` (did what was asked),
  ``rejected`` (refused or a negative answer) or ``error``.
- ``Reaper``: a thread that every scan interval marks READY/INITIALIZING
  records STALE once older than the heartbeat timeout and deletes STALE records
  older than the GC timeout (ages always count from the last publish, status
  update or heartbeat; marking STALE does not restart the clock).

Freshness also applies at query time: ``ListSources`` with ``status_filter=READY``
hides records with no ``updated_at`` or older than the heartbeat timeout, even
before the reaper has run. ``run_server`` / ``main`` wire it all into a process
that writes lifecycle events and serves /metrics, and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import math
import operator
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NoReturn, Protocol, TypeAlias, TypeVar

import grpc
from google.protobuf.message import DecodeError, EncodeError  # type: ignore[import-untyped]
from prometheus_client import CollectorRegistry
from sortedcontainers import SortedKeyList

from mxref import __version__, config, front_door, security
from mxref.errors import LocalError
from mxref.events import EventLog, log_to_stderr
from mxref.identity import mx_source_id
from mxref.metrics import ServerFamilies, ServerMetrics
from mxref.mx_service import MX_REQUESTS, MxP2pService
from mxref.ownership import MX_WRITES, BudgetExceeded, Claims, MxWrites, NotAllowed, OwnerBook, WriteGate
from mxref.process import EXIT_OK, EXIT_SERVING_ENDED, EXIT_STARTUP_FAILED, EXIT_USAGE, StopSignals
from mxref.request_limits import ByteBudget, RejectReason, RequestChecker, Violation, WriteRates
from mxref.v1 import p2p_pb2, p2p_pb2_grpc
from mxref.wire import wire_bytes
from mxref.worker_server import REASON_METADATA_KEY, endpoint, start_grpc_server

logger = logging.getLogger("mxref.server")

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")

Clock = Callable[[], float]
"""Wall-clock seconds since the epoch (``time.time`` unless a test injects one)."""

SourceStatus: TypeAlias = p2p_pb2.SourceStatus
"""A ``SourceStatus`` enum value (protoc's ``.pyi`` types enum values as the enum class)."""
UNKNOWN = p2p_pb2.SOURCE_STATUS_UNKNOWN
INITIALIZING = p2p_pb2.SOURCE_STATUS_INITIALIZING
READY = p2p_pb2.SOURCE_STATUS_READY
STALE = p2p_pb2.SOURCE_STATUS_STALE
ALL_STATUSES: tuple[SourceStatus, ...] = (UNKNOWN, INITIALIZING, READY, STALE)
LIVE_STATUSES = frozenset({INITIALIZING, READY})
"""Statuses the reaper demotes to STALE when their heartbeat stops."""
REPORTABLE_STATUSES = frozenset({INITIALIZING, READY, STALE})
"""Statuses a worker may set; UNKNOWN is only what an unset field reads as."""

GRPC_IMPLS = ("grpcio", "native")
"""How the metadata server speaks gRPC: native (``mxref.native_grpc``: the calls framed in Rust,
decided by the same servicer) or grpcio (Python's gRPC)."""
DEFAULT_GRPC_IMPL = "native"
"""The metadata server's gRPC unless told (``--grpc-impl``): native, several times grpcio's calls
per second on the same servicer (docs/mxref.md: Server at fleet scale)."""

SERVER_THREADS = 16
RATE_LIMIT_DELAY_S = 0.25
"""How long a rate-limited write waits before its RESOURCE_EXHAUSTED (``P2pServicer._hold_back``)."""
HELD_BACK_CALLS = SERVER_THREADS // 2
"""Handler threads that may wait out a rate-limited write at once; the others serve everyone."""
SHUTDOWN_GRACE_S = 2.0
RUN_LOOP_TICK_S = 0.5


def status_name(status: int) -> str:
    """``READY`` for ``SOURCE_STATUS_READY``; the number itself for a value outside the enum."""
    try:
        name: str = p2p_pb2.SourceStatus.Name(status)
        return name.removeprefix("SOURCE_STATUS_")
    except ValueError:
        return str(status)


# --- store --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One published worker. ``status``/``updated_at_ms`` are authoritative; the
    same fields inside ``worker`` are ignored. Treat the protos as read-only.

    Slotted, with no ``__dict__``: a fleet's store holds one of these per worker and makes one
    per heartbeat, and each object more per record is one more for the cyclic garbage
    collector to walk (10k sources x 8 ranks: 84k fewer)."""

    mx_source_id: str
    worker_id: str
    identity: p2p_pb2.SourceIdentity
    worker: p2p_pb2.WorkerMetadata
    status: SourceStatus
    updated_at_ms: int
    listing_order: tuple[int, str, str] = field(init=False, repr=False, compare=False)
    """Where this record comes in a listing: newest stamp first, then by name (set once: a
    record is replaced on every change)."""
    _listed: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "listing_order", (-self.updated_at_ms, self.mx_source_id, self.worker_id))

    @property
    def key(self) -> tuple[str, str]:
        return (self.mx_source_id, self.worker_id)

    def age_ms(self, now_ms: int) -> int:
        return now_ms - self.updated_at_ms

    def worker_metadata(self) -> p2p_pb2.WorkerMetadata:
        """A copy of the published metadata with the current status and ``updated_at``."""
        worker = p2p_pb2.WorkerMetadata()
        worker.CopyFrom(self.worker)
        worker.status = self.status
        worker.updated_at = self.updated_at_ms
        return worker

    @property
    def listed(self) -> bytes:
        """A ``ListSourcesResponse`` holding this record's ref alone, serialized on first use and
        kept (a record is replaced on every change, never changed, so this stays true).
        Serialized messages concatenate into their merge, so a listing is these bytes joined and
        parsed once: at 5000 refs 0.7 ms against 8.6 ms for building the messages one by one."""
        encoded = self._listed
        if encoded is None:  # two threads may both encode it: the same bytes either way
            encoded = p2p_pb2.ListSourcesResponse(instances=[self.instance_ref()]).SerializeToString()
            object.__setattr__(self, "_listed", encoded)
        return encoded

    def ref_fields(self) -> dict[str, Any]:
        """What a listing says of this worker in both packages' ``SourceInstanceRef`` (mxref's
        adds ``status``; ModelExpress's, what ``mxref.mx_service`` lifts)."""
        return {"mx_source_id": self.mx_source_id, "worker_id": self.worker_id,
                "model_name": self.identity.model_name, "worker_rank": self.worker.worker_rank,
                "accelerator": self.worker.accelerator, "updated_at": self.updated_at_ms}

    def instance_ref(self) -> p2p_pb2.SourceInstanceRef:
        return p2p_pb2.SourceInstanceRef(**self.ref_fields(), status=self.status)


@dataclass(frozen=True)
class StatusChange:
    record: SourceRecord
    previous: SourceStatus


class UpdateRejected(Exception):
    """The store refused a status update; the message says why (unknown worker, wrong rank)."""


class StoreFull(Exception):
    """The store holds ``max_records`` records and was asked to add one more."""


class StoreUnavailable(Exception):
    """The store's backend failed (Redis down, paused, timed out); the message names the
    operation and the store. The servicer answers as ModelExpress does on a backend error."""


class ReapAction(StrEnum):
    MARK_STALE = "mark_stale"
    DELETE = "delete"


@dataclass(frozen=True)
class Reaped:
    """One thing a sweep did: ``record`` is the record as it was before."""

    action: ReapAction
    record: SourceRecord


class StoreListener(Protocol):
    """Told of every change, in order, while the store's lock is held (so: be quick)."""

    def published(self, record: SourceRecord) -> None: ...

    def status_changed(self, record: SourceRecord, previous: SourceStatus, by: str) -> None: ...

    def deleted(self, record: SourceRecord, by: str) -> None: ...


class EventJournal:
    """A ``StoreListener`` writing ``source_published`` / ``source_status`` / ``source_deleted``."""

    def __init__(self, events: EventLog) -> None:
        self._events = events

    def published(self, record: SourceRecord) -> None:
        self._events.emit(
            "source_published",
            mx_source_id=record.mx_source_id,
            worker_id=record.worker_id,
            worker_rank=record.worker.worker_rank,
            status=status_name(record.status),
        )

    def status_changed(self, record: SourceRecord, previous: SourceStatus, by: str) -> None:
        self._events.emit(
            "source_status",
            mx_source_id=record.mx_source_id,
            worker_id=record.worker_id,
            status=status_name(record.status),
            previous=status_name(previous),
            by=by,
        )

    def deleted(self, record: SourceRecord, by: str) -> None:
        self._events.emit("source_deleted", mx_source_id=record.mx_source_id, worker_id=record.worker_id, by=by)


class _Silent:
    """The listener of a store nobody watches."""

    def published(self, record: SourceRecord) -> None:
        pass

    def status_changed(self, record: SourceRecord, previous: SourceStatus, by: str) -> None:
        pass

    def deleted(self, record: SourceRecord, by: str) -> None:
        pass


Key: TypeAlias = tuple[str, str]

REAP_BATCH = 1024
"""Most reaper actions applied under one hold of the store's lock (``Store.reap``)."""


class _AgeOrder:
    """Keys with their last stamp, oldest first: a stamp moves its key to the end (O(1)).

    The order holds while stamps arrive in time order. A stamp older than the newest one
    (the wall clock stepped back, or a record the reaper marks STALE joins the STALE order
    with its old stamp) marks the order unsorted; ``oldest`` sorts it again first (O(n log n),
    only then).
    """

    def __init__(self) -> None:
        self._stamps: dict[Key, int] = {}
        self._sorted = True

    def touch(self, key: Key, stamp_ms: int) -> None:
        stamps = self._stamps
        stamps.pop(key, None)
        if self._sorted and stamps and stamps[next(reversed(stamps))] > stamp_ms:
            self._sorted = False
        stamps[key] = stamp_ms

    def discard(self, key: Key) -> None:
        self._stamps.pop(key, None)

    def __len__(self) -> int:
        return len(self._stamps)

    def oldest(self, older: Callable[[int], bool], most: int) -> list[Key]:
        """Up to ``most`` keys, oldest first, whose stamp satisfies ``older`` (a threshold test)."""
        if not self._sorted:
            self._stamps = dict(sorted(self._stamps.items(), key=lambda item: item[1]))
            self._sorted = True
        found: list[Key] = []
        for key, stamp in self._stamps.items():
            if not older(stamp) or len(found) >= most:
                break
            found.append(key)
        return found


class _ListingOrder:
    """One index bucket's records in the order a listing gives them (``listing_order``: newest
    stamp first, then by name), kept sorted as records come and go (O(log n) each).

    A listing is then a slice: the records the stamp floor and freshness keep are a prefix
    (``SourceQuery.first_kept_stamp``), and ``limit`` cuts it.
    """

    def __init__(self) -> None:
        self._records: SortedKeyList[SourceRecord, tuple[int, str, str]] = SortedKeyList(key=_LISTING_ORDER)

    def put(self, record: SourceRecord) -> None:
        self._records.add(record)

    def discard(self, record: SourceRecord) -> None:
        self._records.discard(record)

    def __len__(self) -> int:
        return len(self._records)

    def all(self) -> list[SourceRecord]:
        return list(self._records)

    def stamped_from(self, stamp_ms: int | None) -> list[SourceRecord]:
        """The records stamped ``stamp_ms`` or later (all of them for ``None``), in listing order."""
        if stamp_ms is None:
            return self.all()
        return self._records[: self._records.bisect_key_left((1 - stamp_ms, "", ""))]  # before stamp_ms - 1


class Store:
    """In-memory records keyed by ``(mx_source_id, worker_id)``; every method is atomic.

    Indexed so that a fleet costs nothing it does not ask for: records by source id, by
    (source id, status) and by status (``candidates``: a query reads only its bucket;
    ``count``: O(1)); live (INITIALIZING/READY) and STALE records each in the order of their
    last stamp (``reap``: reads only the records old enough to act on, in batches of
    ``REAP_BATCH`` per hold of the lock). A heartbeat is O(1).
    """

    def __init__(
        self, clock: Clock = time.time, listener: StoreListener | None = None, *, max_records: int | None = None
    ) -> None:
        self._clock = clock
        self._listener: StoreListener = listener if listener is not None else _Silent()
        self._max_records = max_records
        self._lock = threading.Lock()
        self._records: dict[Key, SourceRecord] = {}
        self._by_source: dict[str, dict[str, SourceRecord]] = {}
        self._by_source_status: dict[tuple[str, int], _ListingOrder] = {}
        self._by_status: dict[int, dict[Key, SourceRecord]] = {}
        self._live_age = _AgeOrder()
        self._stale_age = _AgeOrder()

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- indexes (the lock held) --

    def _put(self, record: SourceRecord, previous: SourceRecord | None) -> None:
        if previous is not None:
            self._unindex(previous)
        sid, wid, status = record.mx_source_id, record.worker_id, int(record.status)
        key = (sid, wid)
        self._records[key] = record
        self._by_source.setdefault(sid, {})[wid] = record
        bucket = self._by_source_status.get((sid, status))
        if bucket is None:
            bucket = self._by_source_status[(sid, status)] = _ListingOrder()
        bucket.put(record)
        self._by_status.setdefault(status, {})[key] = record
        if record.status in LIVE_STATUSES:
            self._live_age.touch(key, record.updated_at_ms)
        elif record.status == STALE:
            self._stale_age.touch(key, record.updated_at_ms)

    def _unindex(self, record: SourceRecord) -> None:
        sid, wid, status = record.mx_source_id, record.worker_id, int(record.status)
        key = (sid, wid)
        _discard(self._by_source, sid, wid)
        bucket = self._by_source_status.get((sid, status))
        if bucket is not None:
            bucket.discard(record)
            if not bucket:
                del self._by_source_status[(sid, status)]
        _discard(self._by_status, status, key)
        if record.status in LIVE_STATUSES:
            self._live_age.discard(key)
        elif record.status == STALE:
            self._stale_age.discard(key)

    def _drop(self, record: SourceRecord) -> None:
        self._unindex(record)
        del self._records[record.key]

    # -- the API --

    def publish(
        self,
        identity: p2p_pb2.SourceIdentity,
        worker: p2p_pb2.WorkerMetadata,
        worker_id: str,
        status: SourceStatus,
    ) -> SourceRecord:
        """Store (or replace) the worker's record, stamped now; returns it.

        ``StoreFull`` when it would add a record beyond ``max_records`` (a replacement always fits).
        """
        stored_identity = p2p_pb2.SourceIdentity()
        stored_identity.CopyFrom(identity)
        stored_worker = p2p_pb2.WorkerMetadata()
        stored_worker.CopyFrom(worker)
        source_id = mx_source_id(identity)
        with self._lock:
            stored_identity = self._shared_identity(source_id, stored_identity)
            previous = self._records.get((source_id, worker_id))
            if self._max_records is not None and len(self._records) >= self._max_records and previous is None:
                raise StoreFull(f"the store holds {len(self._records)} records, its limit (--max-records)")
            record = SourceRecord(
                mx_source_id=source_id,
                worker_id=worker_id,
                identity=stored_identity,
                worker=stored_worker,
                status=status,
                updated_at_ms=self.now_ms(),
            )
            self._put(record, previous)
            self._listener.published(record)
        return record

    def _shared_identity(self, source_id: str, identity: p2p_pb2.SourceIdentity) -> p2p_pb2.SourceIdentity:
        """The identity object the source's other records hold when it is equal (the lock held):
        the workers of one source share one message, so a fleet's records are fewer objects for
        the garbage collector to walk (protos are read-only here)."""
        same_source = self._by_source.get(source_id)
        if same_source:
            held: p2p_pb2.SourceIdentity = next(iter(same_source.values())).identity
            if held == identity:
                return held
        return identity

    def get(self, mx_source_id: str, worker_id: str) -> SourceRecord | None:
        with self._lock:
            return self._records.get((mx_source_id, worker_id))

    def update_status(
        self, mx_source_id: str, worker_id: str, worker_rank: int, status: SourceStatus
    ) -> StatusChange:
        """Set the status and stamp ``updated_at`` (a heartbeat); ``UpdateRejected`` if unknown."""
        with self._lock:
            record = self._records.get((mx_source_id, worker_id))
            if record is None:
                raise UpdateRejected(f"no worker {worker_id!r} is published under source {mx_source_id!r}")
            if record.worker.worker_rank != worker_rank:
                raise UpdateRejected(
                    f"worker_rank {worker_rank} does not match the rank {record.worker.worker_rank} "
                    f"worker {worker_id!r} published"
                )
            updated = SourceRecord(record.mx_source_id, record.worker_id, record.identity, record.worker, status,
                                   self.now_ms())  # (dataclasses.replace, without its cost on every heartbeat)
            self._put(updated, record)
            if updated.status != record.status:
                self._listener.status_changed(updated, record.status, by="rpc")
        return StatusChange(updated, record.status)

    def snapshot(self) -> list[SourceRecord]:
        with self._lock:
            return list(self._records.values())

    def candidates(self, query: SourceQuery) -> list[SourceRecord]:
        """The records ``query`` may match: its index bucket (source id and/or status), else all.

        A superset of the answer, never a subset: ``query.select`` still applies every filter.
        """
        with self._lock:
            if query.mx_source_id is not None and query.status is not None:
                bucket = self._by_source_status.get((query.mx_source_id, int(query.status)))
                return bucket.all() if bucket is not None else []
            if query.mx_source_id is not None:
                return list(self._by_source.get(query.mx_source_id, {}).values())
            if query.status is not None:
                return list(self._by_status.get(int(query.status), {}).values())
            return list(self._records.values())

    def listing(self, query: SourceQuery, heartbeat_timeout_s: float) -> list[SourceRecord]:
        """``query``'s answer (``SourceQuery.select`` over ``candidates``, now).

        A query naming a source and a status (a reader's: an identity, READY) reads its bucket,
        kept in listing order (``SourceQuery.select_from_bucket``): a slice, no filter pass or
        sort of the whole bucket in Python.
        """
        with self._lock:
            now_ms = self.now_ms()
            if query.mx_source_id is not None and query.status is not None:
                bucket = self._by_source_status.get((query.mx_source_id, int(query.status)))
                if bucket is None:
                    return []
                return query.select_from_bucket(bucket, now_ms, heartbeat_timeout_s)
        return query.select(self.candidates(query), now_ms, heartbeat_timeout_s)

    def count(self, status: SourceStatus) -> int:
        with self._lock:
            return len(self._by_status.get(int(status), ()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def _mark_stale(self, record: SourceRecord, by: str) -> SourceRecord:
        stale = dataclasses.replace(record, status=STALE)
        self._put(stale, record)
        self._listener.status_changed(stale, record.status, by=by)
        return stale

    def sweep(self, decide: Callable[[SourceRecord, int], ReapAction | None]) -> list[Reaped]:
        """Apply ``decide(record, now_ms)`` to every record under one lock (O(n); ``reap`` is the
        indexed way to apply the reaper's rules)."""
        done: list[Reaped] = []
        with self._lock:
            now_ms = self.now_ms()
            for record in list(self._records.values()):
                action = decide(record, now_ms)
                if action is ReapAction.MARK_STALE:
                    self._mark_stale(record, by="reaper")
                elif action is ReapAction.DELETE:
                    self._drop(record)
                    self._listener.deleted(record, by="reaper")
                else:
                    continue
                done.append(Reaped(action, record))
        return done

    def reap(self, timers: config.ServerTimers, batch: int = REAP_BATCH) -> list[Reaped]:
        """What ``sweep(reap_action)`` does, reading only the records old enough to act on.

        Deletions first, then demotions, so that a record demoted now is not also deleted now
        (as in one pass over every record); at most ``batch`` actions per hold of the lock, so
        a mass expiry does not stall the RPCs. Every action is decided on the record as it is
        when the action is applied (``reap_action`` at the sweep's ``now``).
        """
        done: list[Reaped] = []
        with self._lock:
            now_ms = self.now_ms()
        gc_ms, heartbeat_ms = timers.gc_timeout_s * 1000, timers.heartbeat_timeout_s * 1000
        for order, limit_ms in ((self._stale_age, gc_ms), (self._live_age, heartbeat_ms)):
            while True:
                with self._lock:
                    keys = order.oldest(_older_than(now_ms, limit_ms), batch)
                    for key in keys:
                        record = self._records[key]
                        action = reap_action(record, now_ms, timers)
                        if action is ReapAction.MARK_STALE:
                            self._mark_stale(record, by="reaper")
                        elif action is ReapAction.DELETE:
                            self._drop(record)
                            self._listener.deleted(record, by="reaper")
                        else:  # not reached: the orders hold exactly the live and the STALE records
                            raise AssertionError(f"reap: no action for {key} in the age order")
                        done.append(Reaped(action, record))
                if len(keys) < batch:
                    break
        return done


class SourceStore(Protocol):
    """What the servicer and the reaper need of a store: ``Store`` (in memory, the default) and
    ``mxref.redis_store.RedisStore`` (``--store redis://...``). A backend failure raises
    ``StoreUnavailable``; ``count``/``len`` never block on a backend."""

    def now_ms(self) -> int: ...

    def publish(
        self, identity: p2p_pb2.SourceIdentity, worker: p2p_pb2.WorkerMetadata, worker_id: str, status: SourceStatus
    ) -> SourceRecord: ...

    def get(self, mx_source_id: str, worker_id: str) -> SourceRecord | None: ...

    def update_status(
        self, mx_source_id: str, worker_id: str, worker_rank: int, status: SourceStatus
    ) -> StatusChange: ...

    def snapshot(self) -> list[SourceRecord]: ...

    def candidates(self, query: SourceQuery) -> list[SourceRecord]: ...

    def listing(self, query: SourceQuery, heartbeat_timeout_s: float) -> list[SourceRecord]: ...

    def count(self, status: SourceStatus) -> int: ...

    def __len__(self) -> int: ...

    def sweep(self, decide: Callable[[SourceRecord, int], ReapAction | None]) -> list[Reaped]: ...

    def reap(self, timers: config.ServerTimers, batch: int = REAP_BATCH) -> list[Reaped]: ...


def _older_than(now_ms: int, limit_ms: float) -> Callable[[int], bool]:
    """The reaper's test of a stamp: older than ``limit_ms`` at ``now_ms`` (as ``reap_action`` reckons)."""
    return lambda stamp: now_ms - stamp > limit_ms


def _discard(index: dict[Any, dict[Any, SourceRecord]], bucket: Any, key: Any) -> None:
    """Remove ``key`` from ``index[bucket]``, and the bucket once empty (memory stays bounded)."""
    entries = index.get(bucket)
    if entries is not None:
        entries.pop(key, None)
        if not entries:
            del index[bucket]


# --- liveness rules (pure) ----------------------------------------------------


def is_fresh(record: SourceRecord, now_ms: int, heartbeat_timeout_s: float) -> bool:
    """Stamped, and no older than the heartbeat timeout."""
    return fresh_stamp(record.updated_at_ms, now_ms, heartbeat_timeout_s)


def fresh_stamp(stamp_ms: int, now_ms: int, heartbeat_timeout_s: float) -> bool:
    """The freshness rule on a stamp (``is_fresh``): set, and no older than the heartbeat timeout."""
    return stamp_ms > 0 and now_ms - stamp_ms <= heartbeat_timeout_s * 1000


def reap_action(record: SourceRecord, now_ms: int, timers: config.ServerTimers) -> ReapAction | None:
    """What the reaper does to ``record`` now, if anything."""
    age_ms = record.age_ms(now_ms)
    if record.status in LIVE_STATUSES and age_ms > timers.heartbeat_timeout_s * 1000:
        return ReapAction.MARK_STALE
    if record.status == STALE and age_ms > timers.gc_timeout_s * 1000:
        return ReapAction.DELETE
    return None


@dataclass(frozen=True)
class SourceQuery:
    """A ``ListSourcesRequest`` as plain values (``None`` = no filter)."""

    mx_source_id: str | None = None
    status: SourceStatus | None = None
    model_name: str | None = None
    worker_rank: int | None = None
    min_updated_at_ms: int = 0
    limit: int = 0

    @classmethod
    def from_request(cls, request: p2p_pb2.ListSourcesRequest) -> SourceQuery:
        by_identity = request.HasField("identity") and bool(request.identity.model_name)
        return cls(
            mx_source_id=mx_source_id(request.identity) if by_identity else None,
            status=request.status_filter if request.HasField("status_filter") else None,
            model_name=request.model_name_filter if request.HasField("model_name_filter") else None,
            worker_rank=request.worker_rank_filter if request.HasField("worker_rank_filter") else None,
            min_updated_at_ms=request.min_updated_at,
            limit=request.limit,
        )

    def matches(self, record: SourceRecord) -> bool:
        return (
            (self.mx_source_id is None or record.mx_source_id == self.mx_source_id)
            and (self.status is None or record.status == self.status)
            and (self.model_name is None or record.identity.model_name == self.model_name)
            and (self.worker_rank is None or record.worker.worker_rank == self.worker_rank)
            and record.updated_at_ms >= self.min_updated_at_ms
        )

    def select(self, records: Iterable[SourceRecord], now_ms: int, heartbeat_timeout_s: float) -> list[SourceRecord]:
        """Matching records, READY ones only while fresh, newest first, at most ``limit``.

        The same answer as filtering with ``matches`` and sorting in ``listing_order``; the stamp
        floor and (READY) freshness are one pass (``first_kept_stamp``), each other filter that
        is set one more.
        """
        sid, status, model, rank = self.mx_source_id, self.status, self.model_name, self.worker_rank
        first = self.first_kept_stamp(now_ms, heartbeat_timeout_s)
        chosen = list(records) if first is None else [r for r in records if r.updated_at_ms >= first]
        if sid is not None:
            chosen = [r for r in chosen if r.mx_source_id == sid]
        if status is not None:
            chosen = [r for r in chosen if r.status == status]
        if model is not None:
            chosen = [r for r in chosen if r.identity.model_name == model]
        if rank is not None:
            chosen = [r for r in chosen if r.worker.worker_rank == rank]
        if 0 < self.limit < len(chosen) // 4:
            # The newest ``limit`` all have a stamp >= the limit-th newest stamp: sort only those
            # (the stamps sort fast: a bucket is mostly in stamp order already).
            newest = sorted(map(_STAMP_ORDER, chosen))[-self.limit]
            chosen = [r for r in chosen if r.updated_at_ms >= newest]
        chosen.sort(key=_LISTING_ORDER)
        return chosen[: self.limit] if self.limit > 0 else chosen

    def keeps_stamp(self, stamp_ms: int, now_ms: int, heartbeat_timeout_s: float) -> bool:
        """Whether a record stamped ``stamp_ms`` passes the stamp floor and (READY) freshness."""
        return stamp_ms >= self.min_updated_at_ms and (
            self.status != READY or fresh_stamp(stamp_ms, now_ms, heartbeat_timeout_s)
        )

    def first_kept_stamp(self, now_ms: int, heartbeat_timeout_s: float) -> int | None:
        """The lowest stamp ``keeps_stamp`` keeps (every later one is kept too); ``None``: any."""
        if self.status != READY:
            return self.min_updated_at_ms if self.min_updated_at_ms > 0 else None
        stamp = max(self.min_updated_at_ms, 1, math.ceil(now_ms - heartbeat_timeout_s * 1000))
        while not self.keeps_stamp(stamp, now_ms, heartbeat_timeout_s):  # float rounding: a step or two
            stamp += 1
        while stamp > 1 and self.keeps_stamp(stamp - 1, now_ms, heartbeat_timeout_s):
            stamp -= 1
        return stamp

    def select_from_bucket(self, bucket: _ListingOrder, now_ms: int, heartbeat_timeout_s: float) -> list[SourceRecord]:
        """``select``'s answer from the index bucket of this query's source id and status.

        The bucket is in listing order, so the records the stamp floor and freshness keep are a
        prefix of it, and ``limit`` cuts that; the model and rank filters, where set, are one pass.
        """
        chosen = bucket.stamped_from(self.first_kept_stamp(now_ms, heartbeat_timeout_s))
        if self.model_name is not None:
            chosen = [r for r in chosen if r.identity.model_name == self.model_name]
        if self.worker_rank is not None:
            chosen = [r for r in chosen if r.worker.worker_rank == self.worker_rank]
        return chosen[: self.limit] if self.limit > 0 else chosen


_STAMP_ORDER = operator.attrgetter("updated_at_ms")


_LISTING_ORDER = operator.attrgetter("listing_order")
_LISTED = operator.attrgetter("listed")


# --- RPCs ---------------------------------------------------------------------


class Outcome(StrEnum):
    """The ``result`` label of ``mxref_server_rpcs_total``."""

    OK = "ok"
    REJECTED = "rejected"
    ERROR = "error"


RESERVED_WORKER_IDS = frozenset({"__attributes__"})
"""Worker ids no store accepts: ``mxref.redis_store`` keeps the identity in the field of that name."""


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
                             ByteBudget(self.limits.max_store_bytes))
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
        (``mxref.mx_service`` serves ModelExpress's package through this, ``mx=True``: the request
        is checked as ModelExpress's message, and its writes follow ``OwnerBook.mx_writes``)."""
        response = self._serve(method, raw, context, mx=mx)
        return response.message() if isinstance(response, Listing) else response

    def forget(self, key: tuple[str, str]) -> None:
        """The record at ``key`` is gone (the reaper deleted it): its owner and bytes go too."""
        self.claims.forget(key)

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
            response, outcome = self._handlers[method](request, _Call(len(raw), mx))
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
                key, request.owner_secret, mx=call.mx, size=call.size,
                write=lambda: self._store.publish(request.identity, request.worker, request.worker_id, status))
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
        return Listing(listable(chosen, _LISTED, self.skipped_listing)), Outcome.OK

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
    """What a handler knows of its call beyond the request: its size and its package."""

    size: int
    mx: bool


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
        return b"".join(map(_LISTED, self.records))

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


def metadata_server_options(limits: config.ServerLimits) -> list[tuple[str, int]]:
    """The metadata server's gRPC options: its receive limit, one connection's concurrent
    streams (a flooding client holds at most that many handler threads), no SO_REUSEPORT
    (a second process must not silently share a port still in use), and the native server's
    keepalive, idle and age limits (``mxref.native_grpc.FRONT_DOOR``)."""
    from mxref.native_grpc import FRONT_DOOR

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
    (``mxref.mx_service``) over the same store. The server has ``stop(grace).wait(timeout)``.

    ``credentials`` (default plaintext): TLS and the bearer-token check (``mxref.security``);
    ``on_refused`` hears of every call refused as unauthenticated. ``grpc_impl``: ``native``
    (the default, ``mxref.native_grpc``) or ``grpcio``.
    Raises ``LocalError`` when the address cannot be bound or the implementation cannot serve.
    The process's open-files limit is raised to its hard limit first (``mxref.front_door``).
    """
    if grpc_impl not in GRPC_IMPLS:
        raise LocalError(f"metadata server: gRPC implementation {grpc_impl!r}: must be one of {', '.join(GRPC_IMPLS)}")
    front_door.raise_open_files_limit()
    if grpc_impl == "native":
        from mxref.native_grpc import NativeMetadataServer, native_available

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


class Reaper:
    """Demotes silent workers to STALE and deletes long-STALE ones, every scan interval.

    ``scan_once()`` is the whole job (tests call it with an injected clock);
    ``start()``/``stop()`` run it on a daemon thread. A failing scan is logged
    and the next one runs as usual. Events come from the store's listener.
    """

    def __init__(self, store: SourceStore, timers: config.ServerTimers, *, metrics: ServerFamilies | None = None,
                 on_deleted: Callable[[Key], None] = lambda key: None) -> None:
        self._store = store
        self._timers = timers
        self._metrics = metrics
        self._on_deleted = on_deleted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mx-reaper", daemon=True)

    def scan_once(self) -> list[Reaped]:
        done = self._store.reap(self._timers)
        for item in done:
            if self._metrics is not None:
                self._metrics.reaper_actions.labels(item.action.value).inc()
            if item.action is ReapAction.DELETE:
                self._on_deleted(item.record.key)
        return done

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop scanning; true when the thread ended within ``timeout_s``."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._timers.reaper_scan_interval_s):
            try:
                self.scan_once()
            except Exception:
                logger.exception("reaper scan failed; retrying next interval")


# --- process --------------------------------------------------------------------


def _seconds(text: str) -> float:
    try:
        return config.parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _integer(low: int, high: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: an integer in ``low..high``; the error names the value and the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value

    return parse


_positive_int = _integer(1, sys.maxsize)
_rank = _integer(0, 0xFFFFFFFF, "a worker rank (a uint32)")
_port = _integer(0, 65535, "a port number")


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0")
    return value


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """The ``server`` subcommand's flags (timers: flag over env over default)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=0, help="gRPC port; 0 picks a free one (default 0)")
    parser.add_argument("--metrics-port", type=_port, default=0, help="/metrics port; 0 picks one (default 0)")
    parser.add_argument("--metrics-host", default=None,
                        help="address /metrics binds (default: the --host address, itself 127.0.0.1 by default)")
    parser.add_argument(
        "--heartbeat-timeout", type=_seconds, default=None, metavar="SECONDS",
        help=f"age at which a live record is stale [MX_HEARTBEAT_TIMEOUT_SECS, {config.DEFAULT_HEARTBEAT_TIMEOUT_S:g}]",
    )
    parser.add_argument(
        "--reaper-interval", type=_seconds, default=None, metavar="SECONDS",
        help=f"reaper scan interval [MX_REAPER_SCAN_INTERVAL_SECS, {config.DEFAULT_REAPER_SCAN_INTERVAL_S:g}]",
    )
    parser.add_argument(
        "--gc-timeout", type=_seconds, default=None, metavar="SECONDS",
        help=f"age at which a STALE record is deleted [MX_GC_TIMEOUT_SECS, {config.DEFAULT_GC_TIMEOUT_S:g}]",
    )
    parser.add_argument("--store", default="memory", metavar="URL",
                        help="where records live: 'memory' (default) or redis://HOST:PORT[/DB] "
                             "(ModelExpress's Redis key layout; mxref.redis_store)")
    parser.add_argument("--store-timeout", type=_seconds, default=1.0, metavar="SECONDS",
                        help="bound on one Redis socket operation (default 1; one retry)")
    parser.add_argument("--grpc-impl", choices=GRPC_IMPLS, default=DEFAULT_GRPC_IMPL,
                        help=f"native: gRPC framed in Rust (mxref_native), several times grpcio's calls per "
                             f"second (docs/mxref.md: Server at fleet scale); or grpcio, Python's (default {DEFAULT_GRPC_IMPL})")
    add_tls_server_args(parser)
    limits = parser.add_argument_group("limits (docs/mxref.md: Server limits)")
    default = config.ServerLimits()
    limits.add_argument("--max-message-bytes", type=_positive_int, default=default.max_message_bytes, metavar="N",
                        help=f"largest request gRPC accepts (default {default.max_message_bytes})")
    limits.add_argument("--max-blob-bytes", type=_positive_int, default=default.max_blob_bytes, metavar="N",
                        help=f"largest worker.nixl_metadata (default {default.max_blob_bytes})")
    limits.add_argument("--max-name-bytes", type=_positive_int, default=default.max_name_bytes, metavar="N",
                        help=f"longest model/worker/agent name or source id, UTF-8 (default {default.max_name_bytes})")
    limits.add_argument("--max-tensors", type=_positive_int, default=default.max_tensors, metavar="N",
                        help=f"most tensor descriptors in one list (default {default.max_tensors})")
    limits.add_argument("--max-worker-rank", type=_rank, default=default.max_worker_rank, metavar="N",
                        help=f"highest worker_rank accepted (default {default.max_worker_rank})")
    limits.add_argument("--publish-rate", type=_rate, default=default.publish_rate_per_s, metavar="PER_S",
                        help="PublishMetadata + UpdateStatus calls per second per client connection "
                             f"(default {default.publish_rate_per_s:g})")
    limits.add_argument("--publish-burst", type=_positive_int, default=default.publish_burst, metavar="N",
                        help=f"writes a client may send back to back (default {default.publish_burst})")
    limits.add_argument("--max-records", type=_positive_int, default=default.max_records, metavar="N",
                        help=f"worker records the store holds (default {default.max_records})")
    limits.add_argument("--max-record-bytes", type=_positive_int, default=default.max_record_bytes, metavar="N",
                        help=f"largest PublishMetadata request, the record it stores (default {default.max_record_bytes})")
    limits.add_argument("--max-store-bytes", type=_positive_int, default=default.max_store_bytes, metavar="N",
                        help=f"bytes of all records together, each its publish's size (default {default.max_store_bytes})")
    limits.add_argument("--peer-publish-rate", type=_rate, default=default.peer_publish_rate_per_s, metavar="PER_S",
                        help="writes per second per peer address, all its connections together "
                             f"(default {default.peer_publish_rate_per_s:g})")
    limits.add_argument("--peer-publish-burst", type=_positive_int, default=default.peer_publish_burst, metavar="N",
                        help=f"writes one peer address may send back to back (default {default.peer_publish_burst})")
    limits.add_argument("--mx-writes", choices=MX_WRITES, default=MxWrites.TRUSTED.value,
                        help="model_express.p2p writes, which carry no owner secret: trusted (first come; never "
                             "over an mxref publisher's record) or refused (docs/security.md; default trusted)")


def server_limits(args: argparse.Namespace) -> config.ServerLimits:
    """The ``ServerLimits`` of the parsed flags; ``ValueError`` naming an inconsistent pair."""
    return config.ServerLimits(
        max_message_bytes=args.max_message_bytes,
        max_blob_bytes=args.max_blob_bytes,
        max_name_bytes=args.max_name_bytes,
        max_tensors=args.max_tensors,
        max_worker_rank=args.max_worker_rank,
        publish_rate_per_s=args.publish_rate,
        publish_burst=args.publish_burst,
        max_records=args.max_records,
        max_record_bytes=args.max_record_bytes,
        max_store_bytes=args.max_store_bytes,
        peer_publish_rate_per_s=args.peer_publish_rate,
        peer_publish_burst=args.peer_publish_burst,
    )


def add_tls_server_args(parser: argparse.ArgumentParser) -> None:
    """``--tls-cert``/``--tls-key``/``--token-file``: a server's credentials (default: plaintext)."""
    g = parser.add_argument_group("control-plane security (default: plaintext, no token)")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="serve TLS with this certificate (chain)")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="the certificate's private key")
    g.add_argument("--token-file", default=None, metavar="PATH",
                   help="refuse calls without 'authorization: Bearer <this file's token>' (needs TLS)")
    g.add_argument("--reader-token-file", default=None, metavar="PATH",
                   help="also accept this file's token, for reads only: its PublishMetadata and UpdateStatus "
                        "are PERMISSION_DENIED (needs --token-file)")


def run_server(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    """Run the metadata server until SIGTERM/SIGINT (or ``stop`` is set); returns the exit code.

    ``args`` carries ``name``, ``events`` and the flags of ``add_server_args``.
    Exit codes (``mxref.process``): 0 after a clean stop, 2 when the credentials cannot be used,
    3 when an address cannot be bound.
    """
    events = EventLog(args.events, args.name, "server")
    try:
        return _run(args, events, stop)
    finally:
        events.close()


def _run(args: argparse.Namespace, events: EventLog, stop: threading.Event | None) -> int:
    def emit(event: str, **fields: Any) -> None:
        log_to_stderr(events.emit(event, **fields))

    timers = config.ServerTimers.resolve(args.heartbeat_timeout, args.reaper_interval, args.gc_timeout)
    try:
        limits = server_limits(args)
    except ValueError as exc:  # an inconsistent pair of limit flags
        logger.error("%s", exc)
        emit("exit", code=EXIT_USAGE, error=str(exc))
        return EXIT_USAGE
    emit("started", argv=sys.argv, version=__version__, env=config.logged_env(), timers=dataclasses.asdict(timers))
    try:
        credentials = security.ServerCredentials.from_files(
            getattr(args, "tls_cert", None), getattr(args, "tls_key", None), getattr(args, "token_file", None),
            getattr(args, "reader_token_file", None),
        )
    except security.SecurityError as exc:
        logger.error("%s", exc)
        emit("exit", code=EXIT_USAGE, error=str(exc))
        return EXIT_USAGE
    logger.info("limits: %s", dataclasses.asdict(limits))
    metrics = ServerMetrics()
    try:
        store_url = getattr(args, "store", "memory")
        store = open_store(store_url, EventJournal(events), limits.max_records,
                           getattr(args, "store_timeout", 1.0), metrics.server)
    except ValueError as exc:
        logger.error("%s", exc)
        emit("exit", code=EXIT_USAGE, error=str(exc))
        return EXIT_USAGE
    emit("store", url=store_url, reachable=store_reachable(store))
    owners = OwnerBook(MxWrites(getattr(args, "mx_writes", MxWrites.TRUSTED.value)), max_entries=2 * limits.max_records)
    servicer = P2pServicer(store, timers, metrics=metrics.server, limits=limits, owners=owners,
                           write_gate=WriteGate(credentials.reader_token))
    reaper = Reaper(store, timers, metrics=metrics.server, on_deleted=servicer.forget)
    code, error = EXIT_OK, ""
    grpc_impl = getattr(args, "grpc_impl", DEFAULT_GRPC_IMPL)
    refusals = refusal_reporter(emit, metrics.server)
    with StopSignals(stop) as signals:
        try:
            server, port = start_metadata_server(servicer, args.host, args.port, credentials=credentials,
                                                 on_refused=refusals.report, grpc_impl=grpc_impl)
        except LocalError as exc:
            refusals.close()
            logger.error("%s", exc)
            emit("exit", code=EXIT_STARTUP_FAILED, error=str(exc))
            return EXIT_STARTUP_FAILED
        try:
            emit("listening", what="grpc", port=port, endpoint=endpoint(args.host, port), grpc_impl=grpc_impl)
            metrics_host = getattr(args, "metrics_host", None) or args.host
            try:
                metrics_port = metrics.serve(args.metrics_port, metrics_host)
            except OSError as exc:
                error = f"metrics: cannot bind {endpoint(metrics_host, args.metrics_port)}: {exc}"
                logger.error("%s", error)
                code = EXIT_STARTUP_FAILED
            else:
                emit("listening", what="metrics", port=metrics_port, endpoint=endpoint(metrics_host, metrics_port))
                reaper.start()
                while not signals.stop.wait(RUN_LOOP_TICK_S):
                    failure = front_door.serving_failure(server)
                    if failure is not None:
                        error, code = f"the gRPC server stopped serving: {failure}", EXIT_SERVING_ENDED
                        logger.error("%s", error)
                        break
                if signals.received is not None:
                    emit("signal", signum=signals.received, name=signal.Signals(signals.received).name)
        finally:
            reaper.stop()
            metrics.close()
            stopped = server.stop(SHUTDOWN_GRACE_S).wait(SHUTDOWN_GRACE_S + 3.0)
            refusals.close()
            emit("shutdown_step", step="stop_server", ok=stopped, detail=f"grace {SHUTDOWN_GRACE_S:g}s")
    emit("exit", code=code, **({"error": error} if error else {}))
    return code


def open_store(
    url: str, listener: StoreListener, max_records: int | None, timeout_s: float, metrics: ServerFamilies
) -> SourceStore:
    """``memory`` (the default: ``Store``) or ``redis://HOST:PORT[/DB]`` (``RedisStore``, whose
    failures count in ``mxref_server_store_errors_total`` and ``mxref_server_store_up``).
    ``ValueError`` naming the value when it is neither."""
    if url == "memory":
        return Store(listener=listener, max_records=max_records)
    from mxref.redis_store import RedisStore  # imported here: it builds on this module

    def failed(op: str, exc: Exception) -> None:
        metrics.store_errors.labels(op).inc()
        metrics.store_up.set(0)

    return RedisStore(url, listener=listener, max_records=max_records, timeout_s=timeout_s,
                      on_error=failed, on_ok=lambda: metrics.store_up.set(1))


def store_reachable(store: SourceStore) -> bool:
    """One full read at startup (also primes the counts); false when the backend fails."""
    try:
        store.snapshot()
    except StoreUnavailable as exc:
        logger.warning("the store is unreachable at startup (the server runs, answering negatively): %s", exc)
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    """The standalone parser: the common ``--name``/``--events`` plus the server flags."""
    parser = argparse.ArgumentParser(prog="mxref-server", description="mxref metadata server (P2pService)")
    parser.add_argument("--name", default="server", help="process name in events (default: server)")
    parser.add_argument("--events", default=None, metavar="PATH", help="append JSON-lines events here")
    add_server_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: ``python -c 'from mxref.server import main; main()' --port 0 ...``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    return run_server(args)


if __name__ == "__main__":
    sys.exit(main())
