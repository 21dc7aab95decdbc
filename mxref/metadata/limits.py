"""What the metadata server checks in a request before it believes a word of it.

Two parts, both pure (no gRPC, no store), used by ``mxref.metadata.P2pServicer``:

- ``RequestChecker`` turns the raw bytes of a request into its message, or into the
  ``Violation`` that refuses it. It parses the bytes twice: first as a *wide twin*
  of the message (the same field numbers, with every ``uint32`` read as ``uint64``
  and every enum as ``int64``), so a rank of 2**32+5 is seen as itself instead of
  being silently truncated to 5 as protobuf does for ``uint32``; then, only when
  every check has passed, as the real message. The checks walk a plan precomputed
  per message type: string and bytes sizes, repeated-field counts, ``uint32``
  ranges, enum numbers (proto3 enums are open, so an unknown number parses), and
  the rank against ``max_worker_rank``.
- ``ClientBuckets``: one token bucket per client key (refill ``rate`` per second up
  to ``burst``) for the write rate, kept per connection and per peer address (a new
  connection does not reset the address's bucket); a client over either is refused
  before its request is parsed.
- ``Capacity``: the records and bytes the store holds, per record key and per peer address; a
  publish that would take the store past ``max_store_bytes``, its peer past its share of either
  budget (``peer_share``), or a peer that already holds a record into the headroom kept for new
  peers (``new_peer_headroom``) is refused (a replacement is charged only its growth).

Fields the schema does not define are refused in ``mxref.v1`` (an mxref client sends
none; a 16 MiB unknown field would otherwise ride into the store) and bounded to
``config.MAX_FOREIGN_UNKNOWN_BYTES`` in ModelExpress's package (a newer MX client may
add a field; it is stored, never listed). ModelExpress's own fields (``topology``,
``artifact_source``, ...) are checked by the plan of its schema (``parse(..., via=)``):
UTF-8, sizes, counts, like every other field.

A ``Violation`` names the field, the value's size and the limit; its ``reason`` is
the ``reason`` label of ``mxref_server_rejected_requests_total`` and its ``code``
the gRPC status the server answers with.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import grpc

# protobuf ships no type stubs (types-protobuf is not a dependency): these names are Any to mypy.
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
from google.protobuf.descriptor import Descriptor, FieldDescriptor  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError, Message  # type: ignore[import-untyped]

from mxref import config
from mxref.front_door import peer_address
from mxref.mx import p2p_pb2 as mx_pb2
from mxref.v1 import p2p_pb2

UINT32_MAX = 0xFFFFFFFF
NAME_FIELDS = frozenset({"model_name", "worker_id", "agent_name", "mx_source_id", "model_name_filter"})
RANK_FIELDS = frozenset({"worker_rank", "worker_rank_filter"})
WIDE_PACKAGE = "mxref.v1.wide"

MX_REQUESTS: dict[str, type[Any]] = {
    "PublishMetadata": mx_pb2.PublishMetadataRequest,
    "GetMetadata": mx_pb2.GetMetadataRequest,
    "UpdateStatus": mx_pb2.UpdateStatusRequest,
}
"""ModelExpress's request of each method served through ``P2pServicer.serve(..., mx=True)``: checked
as that (``RequestChecker.parse(via=)``), served as ours (``ListSources`` is translated here)."""



class RejectReason(StrEnum):
    """Why a request was refused: the ``reason`` label of ``mxref_server_rejected_requests_total``."""

    RATE_LIMITED = "rate_limited"
    STORE_FULL = "store_full"
    MALFORMED = "malformed"
    TOO_LARGE = "too_large"
    TOO_MANY = "too_many"
    OUT_OF_RANGE = "out_of_range"
    UNKNOWN_ENUM = "unknown_enum"
    UNKNOWN_FIELD = "unknown_field"
    INVALID = "invalid"
    FORBIDDEN = "forbidden"
    NOT_OWNER = "not_owner"


RESOURCE_REASONS = frozenset({RejectReason.RATE_LIMITED, RejectReason.STORE_FULL})
PERMISSION_REASONS = frozenset({RejectReason.FORBIDDEN, RejectReason.NOT_OWNER})


@dataclass(frozen=True)
class Violation:
    """One refused request: ``message`` names the field, the value's size and the limit."""

    reason: RejectReason
    field: str
    message: str

    @property
    def code(self) -> grpc.StatusCode:
        if self.reason in RESOURCE_REASONS:
            return grpc.StatusCode.RESOURCE_EXHAUSTED
        if self.reason in PERMISSION_REASONS:
            return grpc.StatusCode.PERMISSION_DENIED
        return grpc.StatusCode.INVALID_ARGUMENT


# --- the wide twin ----------------------------------------------------------------


def _wide_file(file: Any) -> descriptor_pb2.FileDescriptorProto:
    """A schema file under package ``<package>.wide``: uint32 -> uint64, enum -> int64, no services."""
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    package = proto.package
    proto.name = proto.name.removesuffix(".proto") + "_wide.proto"
    proto.package = f"{package}.wide"
    del proto.service[:]

    def widen(messages: Any) -> None:
        for message in messages:
            for field in message.field:
                if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_UINT32:
                    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_UINT64
                elif field.type == descriptor_pb2.FieldDescriptorProto.TYPE_ENUM:
                    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
                    field.ClearField("type_name")
                elif field.type_name.startswith(f".{package}."):
                    field.type_name = f".{package}.wide." + field.type_name.removeprefix(f".{package}.")
            widen(message.nested_type)

    widen(proto.message_type)
    return proto


_WIDE_POOL = descriptor_pool.DescriptorPool()
_WIDE_POOL.Add(_wide_file(p2p_pb2.DESCRIPTOR))
_WIDE_POOL.Add(_wide_file(mx_pb2.DESCRIPTOR))


def wide_class(narrow: type[Message]) -> type[Message]:
    """The wide twin of a ``mxref.v1`` (or ``model_express.p2p``) message class."""
    descriptor = _WIDE_POOL.FindMessageTypeByName(f"{narrow.DESCRIPTOR.full_name.rsplit('.', 1)[0]}.wide."
                                                  f"{narrow.DESCRIPTOR.name}")
    wide: type[Message] = message_factory.GetMessageClass(descriptor)
    return wide


# --- the plan -----------------------------------------------------------------------


@dataclass(frozen=True)
class _FieldCheck:
    name: str
    kind: str  # string | bytes | uint32 | enum | message | map | count (a repeated field checked for length only)
    repeated: bool
    limit: int  # size limit of a string/bytes, the top of a uint32's range
    count_limit: int  # repeated fields and maps
    enum_numbers: frozenset[int] = frozenset()
    enum_name: str = ""
    sub: tuple[_FieldCheck, ...] = ()
    flag: str = ""  # the server flag that changes ``limit`` (named in the message)
    count_flag: str = ""


def _plan(descriptor: Descriptor, limits: config.ServerLimits) -> tuple[_FieldCheck, ...]:
    checks = []
    for field in descriptor.fields:
        repeated = field.label == FieldDescriptor.LABEL_REPEATED
        count_limit, count_flag = config.MAX_REPEATED, ""
        if field.name == "tensors":
            count_limit, count_flag = limits.max_tensors, "--max-tensors"
        elif field.name == "extra_parameters":
            count_limit = config.MAX_EXTRA_PARAMETERS
        elif field.name == "topology":
            count_limit = config.MAX_TOPOLOGY_ENTRIES
        common: dict[str, Any] = {"name": field.name, "repeated": repeated, "count_limit": count_limit,
                                  "count_flag": count_flag}
        if field.type == FieldDescriptor.TYPE_STRING:
            if field.name in NAME_FIELDS:
                checks.append(_FieldCheck(kind="string", limit=limits.max_name_bytes, flag="--max-name-bytes",
                                          **common))
            else:
                checks.append(_FieldCheck(kind="string", limit=config.MAX_STRING_BYTES, **common))
        elif field.type == FieldDescriptor.TYPE_BYTES:
            checks.append(_FieldCheck(kind="bytes", limit=limits.max_blob_bytes, flag="--max-blob-bytes", **common))
        elif field.type == FieldDescriptor.TYPE_UINT32:
            if field.name in RANK_FIELDS:
                checks.append(_FieldCheck(kind="uint32", limit=limits.max_worker_rank, flag="--max-worker-rank",
                                          **common))
            else:
                checks.append(_FieldCheck(kind="uint32", limit=UINT32_MAX, **common))
        elif field.type == FieldDescriptor.TYPE_ENUM:
            enum = field.enum_type
            checks.append(_FieldCheck(kind="enum", limit=0, enum_numbers=frozenset(enum.values_by_number),
                                      enum_name=enum.name, **common))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                # map<string, string> is the only map: its keys and values are strings. ModelExpress's
                # topology is listed with every ref, so each of its strings is held shorter.
                size = config.MAX_TOPOLOGY_STRING_BYTES if field.name == "topology" else config.MAX_STRING_BYTES
                checks.append(_FieldCheck(kind="map", limit=size, **common))
            elif repeated:
                # Tensor descriptors: only their number. Checking 65,536 of them field by field costs the
                # server ~0.3 s of CPU (the GIL) per publish; their total size is bounded by the message
                # limit, and a reader checks each tensor against its own model.
                checks.append(_FieldCheck(kind="count", limit=0, **common))
            else:
                checks.append(_FieldCheck(kind="message", limit=0, sub=_plan(field.message_type, limits), **common))
        elif repeated:
            checks.append(_FieldCheck(kind="count", limit=0, **common))  # e.g. a shape: only its length
    return tuple(checks)


def _utf8_over(text: str, limit: int) -> int | None:
    """The UTF-8 size of ``text`` when it is over ``limit``, else None (encodes only when it must)."""
    if len(text) > limit:
        return len(text.encode())
    if 4 * len(text) <= limit:
        return None
    size = len(text.encode())
    return size if size > limit else None


def _flag(flag: str) -> str:
    return f" ({flag})" if flag else ""


def _check(message: Any, plan: tuple[_FieldCheck, ...], path: str) -> Violation | None:
    for check in plan:
        where = f"{path}{check.name}"
        value = getattr(message, check.name)
        if check.repeated or check.kind == "map":
            if len(value) > check.count_limit:
                return Violation(RejectReason.TOO_MANY, where,
                                 f"{where} has {len(value)} entries, over the limit of {check.count_limit}"
                                 f"{_flag(check.count_flag)}")
            if check.kind == "count":
                continue
            if check.kind == "map":
                for key, item in value.items():
                    for part, text in (("key", key), ("value", item)):
                        size = _utf8_over(text, check.limit)
                        if size is not None:
                            return Violation(RejectReason.TOO_LARGE, f"{where}[{key[:32]!r}]",
                                             f"{where} {part} is {size} bytes, over the limit of {check.limit} bytes")
                continue
            items: Iterator[tuple[str, Any]] = ((f"{where}[{i}]", v) for i, v in enumerate(value))
        else:
            if check.kind == "message" and not message.HasField(check.name):
                continue
            items = iter(((where, value),))
        for at, item in items:
            found = _check_one(check, item, at)
            if found is not None:
                return found
    return None


def _check_one(check: _FieldCheck, value: Any, at: str) -> Violation | None:
    if check.kind in ("string", "bytes"):
        size = _utf8_over(value, check.limit) if check.kind == "string" else (
            len(value) if len(value) > check.limit else None)
        if size is not None:
            return Violation(RejectReason.TOO_LARGE, at,
                             f"{at} is {size} bytes, over the limit of {check.limit} bytes{_flag(check.flag)}")
    elif check.kind == "uint32":
        if value > check.limit:
            return Violation(RejectReason.OUT_OF_RANGE, at,
                             f"{at} is {value}, outside the range 0..{check.limit}{_flag(check.flag)}")
    elif check.kind == "enum":
        if value not in check.enum_numbers:
            return Violation(RejectReason.UNKNOWN_ENUM, at,
                             f"{at} is {value}, not a {check.enum_name} "
                             f"(known: {', '.join(str(n) for n in sorted(check.enum_numbers))})")
    elif check.kind == "message":
        return _check(value, check.sub, f"{at}.")
    return None


def _unknown_fields(parsed: Any, name: str, *, foreign: bool) -> Violation | None:
    """Fields the schema does not define, anywhere in the message: refused in ``mxref.v1``, at
    most ``MAX_FOREIGN_UNKNOWN_BYTES`` in ModelExpress's package. ``parsed`` loses them."""
    whole = parsed.ByteSize()
    parsed.DiscardUnknownFields()
    unknown = whole - parsed.ByteSize()
    if unknown <= 0:
        return None
    if not foreign:
        return Violation(RejectReason.UNKNOWN_FIELD, name,
                         f"{name} carries {unknown} bytes in fields mxref.v1 does not define (an mxref client "
                         "sends none)")
    if unknown > config.MAX_FOREIGN_UNKNOWN_BYTES:
        return Violation(RejectReason.UNKNOWN_FIELD, name,
                         f"{name} carries {unknown} bytes in fields its schema does not define, over the limit "
                         f"of {config.MAX_FOREIGN_UNKNOWN_BYTES} bytes")
    return None


class RequestChecker:
    """Raw request bytes -> the message, or the ``Violation`` that refuses it."""

    def __init__(self, limits: config.ServerLimits) -> None:
        self.limits = limits
        self._plans: dict[type[Message], tuple[type[Message], tuple[_FieldCheck, ...]]] = {}
        self._lock = threading.Lock()

    def parse(self, narrow: type[Message], raw: bytes, *, via: type[Message] | None = None) -> Message | Violation:
        """``raw`` as ``narrow``, once it passes the checks of ``via``'s schema (default ``narrow``'s):
        ModelExpress's requests are checked as ModelExpress's messages, then served as ours (their
        own fields riding as unknown fields, checked already)."""
        schema = via if via is not None else narrow
        wide, plan = self._plan_for(schema)
        name = schema.DESCRIPTOR.name
        try:
            parsed = wide.FromString(raw)
        except DecodeError as exc:
            return Violation(RejectReason.MALFORMED, name, f"{name} ({len(raw)} bytes) does not parse: {exc}")
        found = _check(parsed, plan, "")
        if found is not None:
            return found
        found = _unknown_fields(parsed, name, foreign=schema.DESCRIPTOR.file.package != p2p_pb2.DESCRIPTOR.package)
        if found is not None:
            return found
        try:
            return narrow.FromString(raw)  # the same bytes parsed as a wider twin (or the other package's)
        except DecodeError as exc:  # only across packages: a field one schema types differently
            return Violation(RejectReason.MALFORMED, name, f"{name} ({len(raw)} bytes) does not parse: {exc}")

    def check(self, request: Message) -> Violation | None:
        """The checks of ``parse`` on a message already built (its uint32s cannot be out of range)."""
        _wide, plan = self._plan_for(type(request))
        return _check(request, plan, "")

    def _plan_for(self, narrow: type[Message]) -> tuple[type[Message], tuple[_FieldCheck, ...]]:
        with self._lock:
            entry = self._plans.get(narrow)
            if entry is None:
                entry = (wide_class(narrow), _plan(narrow.DESCRIPTOR, self.limits))
                self._plans[narrow] = entry
            return entry


# --- per-client rate ------------------------------------------------------------


class ClientBuckets:
    """A token bucket per client key: ``burst`` tokens, refilled at ``rate_per_s``.

    ``take(key)`` spends one token, or returns False when the bucket is empty. The
    table is bounded: past ``max_clients`` keys, buckets that have refilled (idle
    clients, whose state equals a new bucket's) are dropped; if none has, the
    oldest half goes (their clients start again with a full bucket).
    """

    def __init__(self, rate_per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = config.MAX_TRACKED_CLIENTS) -> None:
        if not math.isfinite(rate_per_s) or rate_per_s <= 0 or burst < 1:
            raise ValueError(f"rate_per_s={rate_per_s!r}, burst={burst!r}: both must be > 0")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._max_clients = max_clients
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, key: str) -> bool:
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate_per_s)
            allowed = tokens >= 1.0
            if allowed:
                tokens -= 1.0
            if key not in self._buckets and len(self._buckets) >= self._max_clients:
                self._prune(now)
            self._buckets[key] = (tokens, now)
            return allowed

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)

    def _prune(self, now: float) -> None:
        full_after_s = self.burst / self.rate_per_s
        idle = [k for k, (_tokens, at) in self._buckets.items() if now - at >= full_after_s]
        if not idle:
            idle = list(self._buckets)[: max(1, len(self._buckets) // 2)]
        for key in idle:
            del self._buckets[key]


# --- capacity ------------------------------------------------------------------------


@dataclass
class _Holding:
    records: int = 0
    bytes: int = 0


class Capacity:
    """What the store's records weigh (each its publish's size) and who published them, against
    the budgets (``max_records``, ``max_store_bytes``) and each peer's fair share of them.

    Three rules, checked by ``admit(key, peer, size)`` before a publish is written:

    - **the budget**: the bytes of every record together stay within ``max_store_bytes`` (a
      replacement is charged only its growth);
    - **a peer's share**: the records published from one peer address hold at most
      ``peer_share`` of ``max_records`` and of ``max_store_bytes`` together (at least one record);
    - **headroom for new peers**: a peer that already holds a record may not take the store past
      ``1 - new_peer_headroom`` of either budget; a peer that holds none may (its first record).

    So one address (or several) filling what they may cannot stop a new source from publishing:
    its first record fits the headroom. ``charge`` records a publish once stored, ``forget`` a
    record the reaper deleted (the caller holds its publish lock). The tables hold one entry per
    record the store holds and one per peer that holds a record.
    """

    def __init__(self, limits: config.ServerLimits) -> None:
        self.limits = limits
        self.peer_records = max(1, int(limits.max_records * limits.peer_share))
        self.peer_bytes = max(limits.max_record_bytes, int(limits.max_store_bytes * limits.peer_share))
        self.shared_records = limits.max_records - int(limits.max_records * limits.new_peer_headroom)
        self.shared_bytes = limits.max_store_bytes - int(limits.max_store_bytes * limits.new_peer_headroom)
        self._held: dict[tuple[str, str], tuple[str, int]] = {}  # record key -> (peer, size)
        self._peers: dict[str, _Holding] = {}
        self._total = _Holding()
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        """The bytes the records hold together."""
        with self._lock:
            return self._total.bytes

    def holding(self, peer: str) -> tuple[int, int]:
        """(records, bytes) published from ``peer`` and still held."""
        with self._lock:
            held = self._peers.get(peer)
            return (held.records, held.bytes) if held is not None else (0, 0)

    def admit(self, key: tuple[str, str], peer: str, size: int) -> str | None:
        """``None`` when ``peer`` may hold ``size`` bytes at ``key``, else the reason it may not."""
        limits = self.limits
        with self._lock:
            before_peer, before = self._held.get(key, ("", 0))
            new_record = key not in self._held
            total_bytes = self._total.bytes - before + size
            if total_bytes > limits.max_store_bytes:
                return (f"the store holds {self._total.bytes} bytes of records; {size} more would pass its limit of "
                        f"{limits.max_store_bytes} bytes (--max-store-bytes)")
            mine = self._peers.get(peer, _Holding())
            moved = before_peer != peer  # a new record, or one published before from another address
            peer_records = mine.records + (1 if moved else 0)
            peer_bytes = mine.bytes + size - (0 if moved else before)
            if peer_records > self.peer_records or peer_bytes > self.peer_bytes:
                return (f"peer {peer[:64]} holds {mine.records} records of {mine.bytes} bytes; this one "
                        f"({size} bytes) would pass its share of {self.peer_records} records and "
                        f"{self.peer_bytes} bytes (--peer-share {limits.peer_share:g} of --max-records and "
                        "--max-store-bytes)")
            if mine.records > 0:
                over_records = new_record and self._total.records + 1 > self.shared_records
                if over_records or (total_bytes > self.shared_bytes and size > before):
                    return (f"the store holds {self._total.records} records of {self._total.bytes} bytes; the last "
                            f"{limits.new_peer_headroom:g} of each budget is kept for peers that hold no record yet "
                            f"(--new-peer-headroom), and peer {peer[:64]} holds {mine.records}")
            return None

    def charge(self, key: tuple[str, str], peer: str, size: int) -> None:
        with self._lock:
            self._drop(key)
            self._held[key] = (peer, size)
            mine = self._peers.setdefault(peer, _Holding())
            mine.records += 1
            mine.bytes += size
            self._total.records += 1
            self._total.bytes += size

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        held = self._held.pop(key, None)
        if held is None:
            return
        peer, size = held
        mine = self._peers[peer]
        mine.records -= 1
        mine.bytes -= size
        if mine.records == 0:
            del self._peers[peer]
        self._total.records -= 1
        self._total.bytes -= size


class WriteRates:
    """The write rate a caller is held to: per connection (``client``: its gRPC peer, address and
    port) and per peer address (every connection of the host together, so a new connection does not
    reset it); and a record's size (``max_record_bytes``), checked before the request is parsed."""

    def __init__(self, limits: config.ServerLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._connections = ClientBuckets(limits.publish_rate_per_s, limits.publish_burst, clock=clock)
        self._addresses = ClientBuckets(limits.peer_publish_rate_per_s, limits.peer_publish_burst, clock=clock)

    def refusal(self, client: str) -> Violation | None:
        """Spend one write of ``client``'s; the ``rate_limited`` refusal when either bucket is empty."""
        limits = self.limits
        if not self._connections.take(client):
            return Violation(RejectReason.RATE_LIMITED, "rate",
                             f"over the write rate of {limits.publish_rate_per_s:g}/s, burst {limits.publish_burst}, "
                             "per client (--publish-rate, --publish-burst); PublishMetadata and UpdateStatus count")
        if not self._addresses.take(peer_address(client)):
            return Violation(RejectReason.RATE_LIMITED, "rate",
                             f"over the write rate of {limits.peer_publish_rate_per_s:g}/s, burst "
                             f"{limits.peer_publish_burst}, per peer address, every connection together "
                             "(--peer-publish-rate, --peer-publish-burst)")
        return None

    def record_refusal(self, size: int) -> Violation | None:
        """A publish of ``size`` bytes over ``max_record_bytes``: refused before it is parsed."""
        if size <= self.limits.max_record_bytes:
            return None
        return Violation(RejectReason.TOO_LARGE, "record",
                         f"the record is {size} bytes, over the limit of {self.limits.max_record_bytes} bytes "
                         "(--max-record-bytes)")
