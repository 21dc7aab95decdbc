"""The metadata server's Redis store: ``RedisStore``, the same interface as the in-memory ``Store``.

``python -m mxref server --store redis://HOST:PORT[/DB]`` keeps the records in Redis, laid out
as ModelExpress's Redis backend lays them out (``docs/modelexpress-wire.md#redis-layout``):

- ``mx:source:{mx_source_id}`` (hash): ``__attributes__`` = the ``SourceIdentity`` as JSON, once
  per source; one field per ``worker_id`` = that worker's summary (JSON ``worker_rank``,
  ``status``, ``updated_at``, ``accelerator``): what a listing reads.
- ``mx:source:{mx_source_id}:{worker_id}`` (hash): field ``{worker_rank}`` = the record (JSON:
  ``worker_rank``, ``status``, ``updated_at`` and ``worker``, the ``WorkerMetadata`` as protobuf
  JSON), written by a publish only; field ``status:{worker_rank}`` = the rank's mutable summary;
  field ``mxref:owner`` (mxref's own) = the record's owner as ``mxref.metadata.ownership`` keeps
  it (the SHA-256 of its owner secret in hex, never the secret), so a restarted server knows it.
- ``mxref:age:{status}`` (sorted set, mxref's own addition): ``{mx_source_id}:{worker_id}`` by
  ``updated_at``, kept in the same scripts, so the reaper reads only the records old enough to
  act on (as the in-memory store's age order does) instead of every record each scan.

A heartbeat (``update_status``) rewrites only the two summaries, never the record (ModelExpress
#607), in one Lua script that applies it only when it is at least as fresh as the stored
summary (a compare-and-set on ``updated_at``: two servers with skewed clocks cannot move a
record back in time). The reaper's demotions and deletions are compare-and-sets too: each
applies only if the summary is still the one the decision was made on. Listings find sources
by ``SCAN mx:source:????????????????`` (16-character ids), as ModelExpress does, so a wiped
store (FLUSHALL) is simply empty: heartbeats of the wiped workers are refused (unknown worker)
and the sources publish again.

Every Redis call is bounded (``timeout_s`` per socket operation, one retry); a failure raises
``StoreUnavailable`` naming the operation and the store, which the servicer turns into
ModelExpress's negative answers (an empty list, ``success=false``, ``found=false``), and
``on_error``/``on_ok`` let the server's metrics say the store is failing. A publish is one Lua
script that counts the records (``ZCARD`` of each age index) and refuses a new one past
``max_records`` in the same step, so the limit is exact however many servers share the store.
``count`` and ``len`` answer from the last publish, reaper scan or full read, so a /metrics scrape
never waits on Redis. Records written by a server that keeps no age index
(ModelExpress's own, on the same Redis) are listed but not reaped by this one.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis
from google.protobuf import json_format  # type: ignore[import-untyped]
from redis.backoff import NoBackoff
from redis.retry import Retry

from mxref import config
from mxref.identity import mx_source_id
from mxref.metadata.query import SourceQuery, reap_action
from mxref.metadata.records import (
    LIVE_STATUSES,
    STALE,
    Clock,
    ReapAction,
    Reaped,
    SourceRecord,
    SourceStatus,
    StatusChange,
    StoreFull,
    StoreListener,
    StoreUnavailable,
    UpdateRejected,
)
from mxref.v1 import p2p_pb2

__all__ = ["DEFAULT_TIMEOUT_S", "KEY_PREFIX", "RedisStore", "parse_store_url"]

KEY_PREFIX = "mx:source:"
_INDEXED_STATUSES = (0, 1, 2, 3)  # UNKNOWN .. STALE: a publish clears the member from each
SOURCE_SCAN_PATTERN = KEY_PREFIX + "?" * 16
ATTRIBUTES_FIELD = "__attributes__"
STATUS_FIELD_PREFIX = "status:"
OWNER_FIELD = "mxref:owner"
"""The worker hash's field that keeps the record's owner (mxref's own addition)."""
AGE_PREFIX = "mxref:age:"
"""``mxref:age:{status}``: sorted sets of ``{mx_source_id}:{worker_id}`` by ``updated_at`` (mxref's
own index, not ModelExpress's layout): the reaper reads only the members old enough to act on."""
REAP_BATCH = 1024
DEFAULT_TIMEOUT_S = 1.0
"""Bound on one socket operation (connect, send, receive) with Redis."""
SCAN_COUNT = 500

# KEYS: worker key, source key. ARGV: rank, status field, worker_id, status, updated_at, age
# member, age key prefix (the member moves to the age index of its new status).
# Returns {1, previous status, previous updated_at, accelerator} when applied, {0, ...} when the
# stored summary is fresher, {-1} for an unknown worker, {-2, the ranks it has} for a wrong rank.
# The new summary is the stored one with status and updated_at replaced (cjson keeps 14 digits:
# unix ms until the year 5138).
_UPDATE_IF_FRESH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  local ranks = {}
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(f, 1, 7) ~= 'status:' and f ~= 'mxref:owner' then table.insert(ranks, f) end
  end
  return {-2, table.concat(ranks, ',')}
end
local summary = {worker_rank = tonumber(ARGV[1]), accelerator = ''}
local current = redis.call('HGET', KEYS[1], ARGV[2])
if current then
  local ok, s = pcall(cjson.decode, current)
  if ok and type(s) == 'table' then summary = s end
end
local previous, before = tonumber(summary['status']) or -1, tonumber(summary['updated_at']) or 0
local accelerator = tostring(summary['accelerator'] or '')
if before > tonumber(ARGV[5]) then return {0, previous, before, accelerator} end
summary['status'] = tonumber(ARGV[4])
summary['updated_at'] = tonumber(ARGV[5])
local encoded = cjson.encode(summary)
redis.call('HSET', KEYS[1], ARGV[2], encoded)
redis.call('HSET', KEYS[2], ARGV[3], encoded)
if previous >= 0 then redis.call('ZREM', ARGV[7] .. previous, ARGV[6]) end
redis.call('ZADD', ARGV[7] .. ARGV[4], ARGV[5], ARGV[6])
return {1, previous, before, accelerator}
"""

# KEYS: source key, worker key. ARGV: max records (0: none), attributes JSON, worker_id, summary,
# rank, record JSON, status, updated_at, age member, age key prefix, owner ('' keeps none).
# Returns {0, records} when a new record would pass max records, else {1, records after, 1 if new}.
_PUBLISH = """
local new = 1 - redis.call('EXISTS', KEYS[2])
local n = 0
for s = 0, 3 do n = n + redis.call('ZCARD', ARGV[10] .. s) end
if new == 1 and tonumber(ARGV[1]) > 0 and n >= tonumber(ARGV[1]) then return {0, n} end
redis.call('HSET', KEYS[1], '__attributes__', ARGV[2], ARGV[3], ARGV[4])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], ARGV[5], ARGV[6], 'status:' .. ARGV[5], ARGV[4])
if ARGV[11] ~= '' then redis.call('HSET', KEYS[2], 'mxref:owner', ARGV[11]) end
local indexed = 0
for s = 0, 3 do indexed = indexed + redis.call('ZREM', ARGV[10] .. s, ARGV[9]) end
redis.call('ZADD', ARGV[10] .. ARGV[7], ARGV[8], ARGV[9])
return {1, n + 1 - indexed, new}
"""

# KEYS: worker key, source key. ARGV: status field, worker_id, expected updated_at, expected
# status, new summary JSON (demote) or '' (delete), age member, age key prefix. Applies only if
# the summary is unchanged; a member whose summary is gone leaves the age index.
_REAP_IF_UNCHANGED = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then
  redis.call('ZREM', ARGV[7] .. ARGV[4], ARGV[6])
  return 0
end
local ok, s = pcall(cjson.decode, current)
if not ok or type(s) ~= 'table' then return 0 end
if tostring(s['updated_at']) ~= ARGV[3] or tostring(s['status']) ~= ARGV[4] then return 0 end
redis.call('ZREM', ARGV[7] .. ARGV[4], ARGV[6])
if ARGV[5] == '' then
  redis.call('DEL', KEYS[1])
  redis.call('HDEL', KEYS[2], ARGV[2])
  if redis.call('HLEN', KEYS[2]) <= 1 and redis.call('HEXISTS', KEYS[2], '__attributes__') == 1 then
    redis.call('DEL', KEYS[2])
  end
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[5])
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[5])
  redis.call('ZADD', ARGV[7] .. '3', ARGV[3], ARGV[6])
end
return 1
"""


def parse_store_url(text: str) -> str:
    """Check ``redis://HOST:PORT[/DB]`` (the ``--store`` value other than ``memory``); returns it.

    ``ValueError`` naming the value and the rule when it is not one.
    """
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme != "redis":
        raise ValueError(f"--store {text!r}: expected 'memory' or redis://HOST:PORT[/DB]")
    try:
        port = parsed.port
    except ValueError:
        raise ValueError(f"--store {text!r}: the port is not a number in 0..65535") from None
    if not parsed.hostname or port is None:
        raise ValueError(f"--store {text!r}: redis://HOST:PORT[/DB] needs a host and a port")
    db = parsed.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"--store {text!r}: the database {db!r} is not a number")
    return text


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _member(sid: str, wid: str) -> str:
    return f"{sid}:{wid}"


def _worker_key(sid: str, wid: str) -> str:
    return f"{KEY_PREFIX}{sid}:{wid}"


def _summary(rank: int, status: int, updated_at_ms: int, accelerator: str) -> str:
    return json.dumps(
        {"worker_rank": rank, "status": int(status), "updated_at": updated_at_ms, "accelerator": accelerator},
        separators=(",", ":"),
    )


@dataclass(frozen=True)
class _Summary:
    worker_rank: int
    status: int
    updated_at_ms: int
    accelerator: str

    @classmethod
    def parse(cls, text: str | bytes) -> _Summary | None:
        try:
            value = json.loads(text)
            return cls(int(value["worker_rank"]), int(value["status"]), int(value["updated_at"]),
                       str(value.get("accelerator", "")))
        except (ValueError, KeyError, TypeError):
            return None  # a field this store did not write (ModelExpress's legacy rank-only rows)


class RedisStore:
    """Records in Redis (module docstring); the interface and the guarantees of ``Store``.

    Listings return records whose ``worker`` holds only what a listing needs (rank and
    accelerator); ``get`` returns the full published ``WorkerMetadata``.
    """

    def __init__(
        self,
        url: str,
        clock: Clock = time.time,
        listener: StoreListener | None = None,
        *,
        max_records: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        on_error: Callable[[str, Exception], None] = lambda op, exc: None,
        on_ok: Callable[[], None] = lambda: None,
    ) -> None:
        self.url = parse_store_url(url)
        if os.environ.get("MXREF_SIMULATED_BUG") == "monotonic_stamps" and clock is time.time:
            clock = time.monotonic  # SIMULATED BUG: stamps on this host's monotonic clock, in a store other servers read
        self._clock = clock
        self._listener = listener
        self._max_records = max_records
        self._on_error = on_error
        self._on_ok = on_ok
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1), health_check_interval=0,
        )
        self._update = self._redis.register_script(_UPDATE_IF_FRESH)
        self._publish = self._redis.register_script(_PUBLISH)
        self._reap = self._redis.register_script(_REAP_IF_UNCHANGED)
        self._lock = threading.Lock()  # guards the cached counts
        self._counts: Counter[int] = Counter()
        self._total = 0
        self._identities: dict[bytes, p2p_pb2.SourceIdentity] = {}

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def close(self) -> None:
        self._redis.close()

    def flushall(self) -> None:
        """Empty the whole Redis database (benchmarks and tests start from nothing)."""
        self._call("flushall", self._redis.flushall)

    def _call(self, op: str, fn: Callable[[], Any]) -> Any:
        """Run one Redis operation; ``StoreUnavailable`` (and ``on_error``) when Redis fails."""
        try:
            result = fn()
        except redis.RedisError as exc:
            self._on_error(op, exc)
            raise StoreUnavailable(f"redis store {self.url}: {op} failed: {type(exc).__name__}: {exc}") from exc
        self._on_ok()
        return result

    # -- writes --

    def publish(
        self,
        identity: p2p_pb2.SourceIdentity,
        worker: p2p_pb2.WorkerMetadata,
        worker_id: str,
        status: SourceStatus,
        owner: str | None = None,
    ) -> SourceRecord:
        """Store (or replace) the worker's record, stamped now, with its ``owner`` (``OWNER_FIELD``;
        None keeps none); ``StoreFull`` when a new record would pass ``max_records`` (counted in
        the same script as the write: exact)."""
        if worker_id == ATTRIBUTES_FIELD:  # the servicer refuses it first (RESERVED_WORKER_IDS); never trust that
            raise UpdateRejected(f"worker_id {worker_id!r} is reserved: the source's identity is kept under it")
        sid = mx_source_id(identity)
        now_ms = self.now_ms()
        rank = worker.worker_rank
        summary = _summary(rank, status, now_ms, worker.accelerator)
        record_json = json.dumps({
            "worker_rank": rank, "status": int(status), "updated_at": now_ms,
            "worker": json_format.MessageToDict(worker, preserving_proto_field_name=True),
        }, separators=(",", ":"))
        attributes = json_format.MessageToJson(identity, preserving_proto_field_name=True, indent=None)
        wkey, skey, member = _worker_key(sid, worker_id), KEY_PREFIX + sid, _member(sid, worker_id)
        args: list[str | int] = [self._max_records or 0, attributes, worker_id, summary, rank, record_json,
                                 int(status), now_ms, member, AGE_PREFIX, owner or ""]
        reply = self._call("publish", lambda: self._publish(keys=[skey, wkey], args=args))
        records = int(reply[1])
        with self._lock:
            self._total = records
        if not int(reply[0]):
            raise StoreFull(f"the store holds {records} records, its limit (--max-records)")
        stored_identity, stored_worker = p2p_pb2.SourceIdentity(), p2p_pb2.WorkerMetadata()
        stored_identity.CopyFrom(identity)
        stored_worker.CopyFrom(worker)
        record = SourceRecord(sid, worker_id, stored_identity, stored_worker, status, now_ms)
        if self._listener is not None:
            self._listener.published(record)
        return record

    def holds(self, key: tuple[str, str]) -> bool:
        """Whether the store holds a record at ``key`` now."""
        exists: int = self._call("holds", lambda: self._redis.exists(_worker_key(*key)))
        return bool(exists)

    def owner(self, key: tuple[str, str]) -> str | None:
        """The owner kept with the record at ``key`` (None: no record, or none kept)."""
        value = self._call("owner", lambda: self._redis.hget(_worker_key(*key), OWNER_FIELD))
        return None if value is None else _text(value)

    def update_status(self, mx_source_id: str, worker_id: str, worker_rank: int, status: SourceStatus) -> StatusChange:
        """Set the status and stamp ``updated_at`` (a heartbeat) without rewriting the record;
        ``UpdateRejected`` for an unknown worker or a wrong rank."""
        if worker_id == ATTRIBUTES_FIELD:
            raise UpdateRejected(f"worker_id {worker_id!r} is reserved: the source's identity is kept under it")
        now_ms = self.now_ms()
        wkey, skey = _worker_key(mx_source_id, worker_id), KEY_PREFIX + mx_source_id
        args: list[str | int] = [worker_rank, f"{STATUS_FIELD_PREFIX}{worker_rank}", worker_id, int(status), now_ms,
                                 _member(mx_source_id, worker_id), AGE_PREFIX]
        reply = self._call("update_status", lambda: self._update(keys=[wkey, skey], args=args))
        code = int(reply[0])
        if code == -1:
            raise UpdateRejected(f"no worker {worker_id!r} is published under source {mx_source_id!r}")
        if code == -2:
            ranks = _text(reply[1])
            raise UpdateRejected(f"worker_rank {worker_rank} does not match the rank {ranks} worker {worker_id!r} published")
        previous, accelerator = int(reply[1]), _text(reply[3])
        previous_status: SourceStatus = previous if previous >= 0 else status  # type: ignore[assignment]
        identity = p2p_pb2.SourceIdentity()
        worker = p2p_pb2.WorkerMetadata(worker_rank=worker_rank, accelerator=accelerator)
        if code == 0:  # the stored summary is fresher (another server's clock): keep it
            return StatusChange(SourceRecord(mx_source_id, worker_id, identity, worker, previous_status,
                                             int(reply[2])), previous_status)
        record = SourceRecord(mx_source_id, worker_id, identity, worker, status, now_ms)
        if previous_status != status and self._listener is not None:
            self._listener.status_changed(record, previous_status, by="rpc")
        return StatusChange(record, previous_status)

    # -- reads --

    def get(self, mx_source_id: str, worker_id: str) -> SourceRecord | None:
        """The full record (the published ``WorkerMetadata``, its live status overlaid), or None."""
        wkey, skey = _worker_key(mx_source_id, worker_id), KEY_PREFIX + mx_source_id

        def read() -> tuple[dict[bytes, bytes], bytes | None]:
            pipe = self._redis.pipeline(transaction=False)
            pipe.hgetall(wkey)
            pipe.hget(skey, ATTRIBUTES_FIELD)
            fields, attributes = pipe.execute()
            return fields, attributes

        fields, attributes = self._call("get", read)
        if not fields or attributes is None:
            return None
        for name, value in fields.items():
            if name.startswith(STATUS_FIELD_PREFIX.encode()) or name == OWNER_FIELD.encode():
                continue
            body = json.loads(value)
            worker = json_format.ParseDict(body["worker"], p2p_pb2.WorkerMetadata(), ignore_unknown_fields=True)
            status, stamp = int(body["status"]), int(body["updated_at"])
            live = fields.get(f"{STATUS_FIELD_PREFIX}{int(body['worker_rank'])}".encode())
            overlay = _Summary.parse(live) if live is not None else None
            if overlay is not None and overlay.updated_at_ms >= stamp:
                status, stamp = overlay.status, overlay.updated_at_ms
            return SourceRecord(mx_source_id, worker_id, self._identity(attributes), worker,
                                status, stamp)  # type: ignore[arg-type]
        return None

    def _identity(self, attributes: bytes) -> p2p_pb2.SourceIdentity:
        identity = self._identities.get(attributes)
        if identity is None:
            identity = json_format.Parse(attributes, p2p_pb2.SourceIdentity(), ignore_unknown_fields=True)
            if len(self._identities) > 4096:
                self._identities.clear()
            self._identities[attributes] = identity
        return identity

    def _source_keys(self) -> list[bytes]:
        return list(self._redis.scan_iter(match=SOURCE_SCAN_PATTERN, count=SCAN_COUNT))

    def _read(self, source_keys: Iterable[bytes | str]) -> list[SourceRecord]:
        """The listing records of these source hashes (one pipelined HGETALL each)."""
        keys = list(source_keys)
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        records: list[SourceRecord] = []
        for key, fields in zip(keys, pipe.execute(), strict=True):
            attributes = fields.get(ATTRIBUTES_FIELD.encode())
            if attributes is None:
                continue
            sid = (key.decode() if isinstance(key, bytes) else key).removeprefix(KEY_PREFIX)
            identity = self._identity(attributes)
            for name, value in fields.items():
                if name == ATTRIBUTES_FIELD.encode():
                    continue
                summary = _Summary.parse(value)
                if summary is None:
                    continue
                worker = p2p_pb2.WorkerMetadata(worker_rank=summary.worker_rank, accelerator=summary.accelerator)
                records.append(SourceRecord(sid, name.decode(), identity, worker,
                                            summary.status, summary.updated_at_ms))  # type: ignore[arg-type]
        return records

    def _read_all(self) -> list[SourceRecord]:
        records: list[SourceRecord] = self._call("scan", lambda: self._read(self._source_keys()))
        counts = Counter(int(r.status) for r in records)
        with self._lock:
            self._counts, self._total = counts, len(records)
        return records

    def snapshot(self) -> list[SourceRecord]:
        return self._read_all()

    def candidates(self, query: SourceQuery) -> list[SourceRecord]:
        """The records ``query`` may match (one source's hash when it names a source; else all)."""
        if query.mx_source_id is not None:
            sid = query.mx_source_id
            records: list[SourceRecord] = self._call("list", lambda: self._read([KEY_PREFIX + sid]))
            return records
        return self._read_all()

    def listing(self, query: SourceQuery, heartbeat_timeout_s: float) -> list[SourceRecord]:
        """``query``'s answer: ``SourceQuery.select`` over ``candidates``."""
        return query.select(self.candidates(query), self.now_ms(), heartbeat_timeout_s)

    def count(self, status: SourceStatus) -> int:
        """Records with ``status`` as of the last full read (never waits on Redis)."""
        with self._lock:
            return self._counts.get(int(status), 0)

    def __len__(self) -> int:
        with self._lock:
            return self._total

    # -- the reaper --

    def sweep(self, decide: Callable[[SourceRecord, int], ReapAction | None]) -> list[Reaped]:
        """Apply ``decide(record, now_ms)`` to every record (a full read); each action a
        compare-and-set on the summary it was decided on (a heartbeat in between wins)."""
        records = self._read_all()
        now_ms = self.now_ms()
        done = self._apply([(r, a) for r in records if (a := decide(r, now_ms)) is not None])
        with self._lock:  # the counts of the read, moved by what was applied
            for item in done:
                self._counts[int(item.record.status)] -= 1
                if item.action is ReapAction.DELETE:
                    self._total -= 1
                else:
                    self._counts[int(STALE)] += 1
        return done

    def reap(self, timers: config.ServerTimers, batch: int = REAP_BATCH) -> list[Reaped]:
        """The reaper's rules (``reap_action``), reading only the records old enough to act on
        (the age index, ``AGE_PREFIX``): deletions first, then demotions, at most ``batch`` per
        round trip; then the counts (``ZCARD`` of each status), so ``count`` stays current."""
        now_ms = self.now_ms()
        gc_ms, heartbeat_ms = timers.gc_timeout_s * 1000, timers.heartbeat_timeout_s * 1000
        done: list[Reaped] = []
        for statuses, limit_ms in (((int(STALE),), gc_ms), (tuple(int(s) for s in sorted(LIVE_STATUSES)), heartbeat_ms)):
            for status in statuses:
                while True:
                    members = self._old_members(status, now_ms - limit_ms, batch)
                    records = self._records_of(members)
                    decided = [(r, a) for r in records if (a := reap_action(r, now_ms, timers)) is not None]
                    done += self._apply(decided)
                    if len(members) < batch or not decided:
                        break
        self._refresh_counts()
        return done

    def _old_members(self, status: int, older_than_ms: float, batch: int) -> list[str]:
        key = f"{AGE_PREFIX}{status}"
        found = self._call("reap", lambda: self._redis.zrangebyscore(key, "-inf", f"({older_than_ms!r}", start=0, num=batch))
        return [_text(m) for m in found]

    def _records_of(self, members: list[str]) -> list[SourceRecord]:
        """The listing records of age-index members (``{sid}:{wid}``); a member whose summary is
        gone is returned as a record with that stamp so the compare-and-set drops it."""
        if not members:
            return []
        keys = [m.partition(":") for m in members]

        def read() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for sid, _, wid in keys:
                pipe.hmget(KEY_PREFIX + sid, [wid, ATTRIBUTES_FIELD])
            results: list[Any] = pipe.execute()
            return results

        records: list[SourceRecord] = []
        orphans: list[str] = []
        for (sid, _, wid), (summary_text, attributes) in zip(keys, self._call("reap", read), strict=True):
            summary = _Summary.parse(summary_text) if summary_text is not None else None
            if summary is None or attributes is None:
                orphans.append(_member(sid, wid))
                continue
            worker = p2p_pb2.WorkerMetadata(worker_rank=summary.worker_rank, accelerator=summary.accelerator)
            records.append(SourceRecord(sid, wid, self._identity(attributes), worker,
                                        summary.status, summary.updated_at_ms))  # type: ignore[arg-type]
        if orphans:  # indexed, but the record is gone (deleted by a server that keeps no index)
            self._call("reap", lambda: [self._redis.zrem(f"{AGE_PREFIX}{s}", *orphans) for s in _INDEXED_STATUSES])
        return records

    def _refresh_counts(self) -> None:
        def read() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for status in _INDEXED_STATUSES:
                pipe.zcard(f"{AGE_PREFIX}{status}")
            results: list[Any] = pipe.execute()
            return results

        counts = Counter({status: int(n) for status, n in zip(_INDEXED_STATUSES, self._call("reap", read), strict=True)})
        with self._lock:
            self._counts, self._total = counts, sum(counts.values())

    def _apply(self, decided: list[tuple[SourceRecord, ReapAction]]) -> list[Reaped]:
        """The reaper's actions as compare-and-sets (one pipeline); what was applied, reported."""
        if not decided:
            return []

        def apply() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for record, action in decided:
                rank = record.worker.worker_rank
                new = "" if action is ReapAction.DELETE else _summary(
                    rank, STALE, record.updated_at_ms, record.worker.accelerator)
                self._reap(keys=[_worker_key(record.mx_source_id, record.worker_id), KEY_PREFIX + record.mx_source_id],
                           args=[f"{STATUS_FIELD_PREFIX}{rank}", record.worker_id, record.updated_at_ms,
                                 int(record.status), new, _member(record.mx_source_id, record.worker_id), AGE_PREFIX],
                           client=pipe)
            results: list[Any] = pipe.execute()
            return results

        done: list[Reaped] = []
        for (record, action), applied in zip(decided, self._call("reap", apply), strict=True):
            if not int(applied):
                continue
            done.append(Reaped(action, record))
            if self._listener is None:
                continue
            if action is ReapAction.DELETE:
                self._listener.deleted(record, by="reaper")
            else:
                stale = SourceRecord(record.mx_source_id, record.worker_id, record.identity, record.worker,
                                     STALE, record.updated_at_ms)
                self._listener.status_changed(stale, record.status, by="reaper")
        return done
