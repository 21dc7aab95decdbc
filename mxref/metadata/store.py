"""The in-memory store (``Store``, the default) and what any store offers (``SourceStore``).

``Store`` is the thread-safe record of every published worker, keyed by ``(mx_source_id,
worker_id)``. It owns the clock (injectable, wall seconds), stamps ``updated_at`` in unix ms, and
applies the reaper's decisions atomically. It reports every change to a ``StoreListener`` *under
its lock*, so the ``source_*`` events (``EventJournal``) appear in the order the changes happened."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from mxref import config
from mxref.identity import mx_source_id
from mxref.metadata.query import ListingOrder, SourceQuery, reap_action
from mxref.metadata.records import (
    LIVE_STATUSES,
    STALE,
    Clock,
    Key,
    ReapAction,
    Reaped,
    SourceRecord,
    SourceStatus,
    StatusChange,
    StoreFull,
    StoreListener,
    UpdateRejected,
    _Silent,
)
from mxref.v1 import p2p_pb2

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
        self._owners: dict[Key, str] = {}  # each record's owner as ``mxref.metadata.ownership`` keeps it
        self._by_source: dict[str, dict[str, SourceRecord]] = {}
        self._by_source_status: dict[tuple[str, int], ListingOrder] = {}
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
            bucket = self._by_source_status[(sid, status)] = ListingOrder()
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
        self._owners.pop(record.key, None)

    # -- the API --

    def publish(
        self,
        identity: p2p_pb2.SourceIdentity,
        worker: p2p_pb2.WorkerMetadata,
        worker_id: str,
        status: SourceStatus,
        owner: str | None = None,
    ) -> SourceRecord:
        """Store (or replace) the worker's record, stamped now, with its ``owner`` (kept until the
        record goes; None keeps none); returns it.

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
            if owner is None:
                self._owners.pop((source_id, worker_id), None)
            else:
                self._owners[(source_id, worker_id)] = owner
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

    def holds(self, key: Key) -> bool:
        with self._lock:
            return key in self._records

    def owner(self, key: Key) -> str | None:
        """The owner kept with the record at ``key`` (None: no record, or none kept)."""
        with self._lock:
            return self._owners.get(key)

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
    ``mxref.metadata.redis_store.RedisStore`` (``--store redis://...``). A backend failure raises
    ``StoreUnavailable``; ``count``/``len`` never block on a backend."""

    def now_ms(self) -> int: ...

    def publish(
        self, identity: p2p_pb2.SourceIdentity, worker: p2p_pb2.WorkerMetadata, worker_id: str, status: SourceStatus,
        owner: str | None = None,
    ) -> SourceRecord: ...

    def get(self, mx_source_id: str, worker_id: str) -> SourceRecord | None: ...

    def holds(self, key: Key) -> bool: ...

    def owner(self, key: Key) -> str | None: ...

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

