"""The one freshness rule and the listing it shapes: a record is fresh when stamped and no older
than the heartbeat timeout (``is_fresh``); the reaper acts on the same ages (``reap_action``);
``ListSources`` with ``status_filter=READY`` hides records that are not fresh, even before the
reaper has run (``SourceQuery``), newest first (``ListingOrder``)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from sortedcontainers import SortedKeyList

from mxref import config
from mxref.identity import mx_source_id
from mxref.metadata.records import LISTING_ORDER, LIVE_STATUSES, READY, STALE, STAMP_ORDER, ReapAction, SourceRecord, SourceStatus
from mxref.v1 import p2p_pb2


class ListingOrder:
    """One index bucket's records in the order a listing gives them (``listing_order``: newest
    stamp first, then by name), kept sorted as records come and go (O(log n) each).

    A listing is then a slice: the records the stamp floor and freshness keep are a prefix
    (``SourceQuery.first_kept_stamp``), and ``limit`` cuts it.
    """

    def __init__(self) -> None:
        self._records: SortedKeyList[SourceRecord, tuple[int, str, str]] = SortedKeyList(key=LISTING_ORDER)

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
        if os.environ.get("MXREF_SIMULATED_BUG") == "future_stamps" and status == READY:
            chosen = [r for r in chosen if r.updated_at_ms <= now_ms]  # SIMULATED BUG: a stamp ahead of this clock is "corrupt"
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
            newest = sorted(map(STAMP_ORDER, chosen))[-self.limit]
            chosen = [r for r in chosen if r.updated_at_ms >= newest]
        chosen.sort(key=LISTING_ORDER)
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

    def select_from_bucket(self, bucket: ListingOrder, now_ms: int, heartbeat_timeout_s: float) -> list[SourceRecord]:
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


