"""Who may write a record: its publisher, and no reader.

Two rules the metadata server applies to every write (``PublishMetadata``, ``UpdateStatus``),
after the token check and the wire checks, before the store is touched:

- **Readers do not write.** A server given a reader token (``--reader-token-file``) accepts it
  beside the source token (``--token-file``); a call that carries the reader's token may list
  and get, and a write is refused with PERMISSION_DENIED (``forbidden``). ``WriteGate``.
- **A record belongs to its publisher.** The first publish of an ``(mx_source_id, worker_id)``
  gets an ``owner_secret`` back (32 random bytes, hex); a republish and every ``UpdateStatus``
  of that record must carry it, or are refused with PERMISSION_DENIED (``not_owner``): a
  caller that knows a record's ids cannot move its endpoints nor keep it READY. ``OwnerBook``
  keeps a SHA-256 of each secret, compared in constant time; an entry goes when the reaper
  deletes the record (a record wiped from Redis keeps its owner: only its publisher may publish
  it again).

ModelExpress's clients send no secret (their package is fixed). ``MxWrites`` says what they may do:
``trusted`` (the default) lets ModelExpress's package publish a key nobody owns and then
republish and heartbeat the records that package published (first come: any ModelExpress
client can write any ModelExpress-published record, none can write a record an mxref publisher
owns, and an mxref publisher cannot write a ModelExpress one); ``refused`` answers every
ModelExpress write with PERMISSION_DENIED (its reads are served as before).

The owner survives the server: each record's owner is kept **with the record** in the store (the
digest, never the secret: ``OWNER_FIELD`` on Redis; see ``persisted``), and the book is a cache
over it. A server restarted over Redis reads a record's owner from the store at its first write,
so the first writer after a restart does not become the owner; an entry the cache drops is read
again. Records written without an owner (by an older server, or ModelExpress's own) are first
come, as before: the first heartbeat's sender (``adopt``), for this server's life.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

from mxref.metadata.limits import Capacity, RejectReason, Violation
from mxref.security import AUTHORIZATION_KEY, BEARER_PREFIX

__all__ = ["MX_WRITES", "BudgetExceeded", "Claims", "MxWrites", "NotAllowed", "OwnerBook", "WriteGate"]

T = TypeVar("T")

SECRET_BYTES = 32
_MX_OWNED = b""
"""The book's entry for a record ModelExpress's package published (no secret to check)."""
MX_OWNER = "model_express.p2p"
"""How the store keeps ``_MX_OWNED`` (any other owner is the digest's 64 hex digits)."""

Key = tuple[str, str]
OwnerLoader = Callable[[Key], "str | None"]


def persisted(entry: bytes) -> str:
    """The book's entry as the store keeps it: the digest in hex, or ``MX_OWNER``."""
    return MX_OWNER if entry == _MX_OWNED else entry.hex()


def _entry(text: str | None) -> bytes | None:
    """The store's owner text as a book entry; None for none (or for text this server never wrote)."""
    if text is None:
        return None
    if text == MX_OWNER:
        return _MX_OWNED
    try:
        digest = bytes.fromhex(text)
    except ValueError:
        return None
    return digest if len(digest) == hashlib.sha256().digest_size else None


class MxWrites(StrEnum):
    """``--mx-writes``: what ModelExpress's package (which sends no secret) may write."""

    TRUSTED = "trusted"
    REFUSED = "refused"


MX_WRITES = tuple(m.value for m in MxWrites)


class NotAllowed(Exception):
    """A write the rules refuse; ``violation`` is the refusal (PERMISSION_DENIED)."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation.message)
        self.violation = violation


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


class OwnerBook:
    """Each record's owner: the digest of its secret, or "ModelExpress's package" (module docstring).

    ``claim`` (a publish) and ``check`` (a heartbeat) raise ``NotAllowed`` or return; the
    servicer serializes a claim with its store write. The book caches what the store keeps
    (``load``: a record's persisted owner, read on a miss), so dropping an entry loses nothing:
    at most ``max_entries`` entries (the oldest claimed go first past it).
    """

    def __init__(self, mx_writes: MxWrites = MxWrites.TRUSTED, *, max_entries: int = 200_000) -> None:
        self.mx_writes = mx_writes
        self._max_entries = max_entries
        self._owners: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._lock = threading.Lock()
        self.load: OwnerLoader = lambda key: None

    def _held(self, key: Key) -> bytes | None:
        """``key``'s owner: the cached entry, else the store's (cached from then on)."""
        with self._lock:
            held = self._owners.get(key)
        if held is not None:
            return held
        held = _entry(self.load(key))
        if held is not None:
            with self._lock:
                self._set(key, held)
        return held

    def __len__(self) -> int:
        with self._lock:
            return len(self._owners)

    def claim(self, key: tuple[str, str], secret: str, *, mx: bool) -> str:
        """May this publish write ``key``? Returns the secret to hand back ("" for ModelExpress's
        package) and records the owner: a key with no owner gets a new secret."""
        self._refuse_mx(mx, "PublishMetadata")
        held_before = self._held(key)
        with self._lock:
            held = self._owners.get(key, held_before)
            if held is None:  # a new record (or one this server never saw published): first come
                if mx:
                    self._set(key, _MX_OWNED)
                    return ""
                fresh = secrets.token_hex(SECRET_BYTES)
                self._set(key, _digest(fresh))
                return fresh
            self._owned_by_caller(key, held, secret, mx, "republish")
            return "" if mx else secret

    def check(self, key: tuple[str, str], secret: str, *, mx: bool) -> None:
        """May this heartbeat (``UpdateStatus``) write ``key``? A key with no owner passes (the
        store refuses an unknown worker; ``adopt`` then records a heartbeat the store accepted)."""
        self._refuse_mx(mx, "UpdateStatus")
        held = self._held(key)
        if held is not None:
            self._owned_by_caller(key, held, secret, mx, "UpdateStatus")

    def adopt(self, key: tuple[str, str], secret: str, *, mx: bool) -> None:
        """The store accepted a heartbeat of ``key``: if it has no owner (a record written without
        one: by an older server, or ModelExpress's own), the heartbeat's sender owns it from now on."""
        with self._lock:
            if key not in self._owners and (mx or secret):
                self._set(key, _MX_OWNED if mx else _digest(secret))

    def entry(self, key: tuple[str, str]) -> bytes | None:
        """``key``'s entry as it is (for ``restore`` when the write a claim was for fails)."""
        with self._lock:
            return self._owners.get(key)

    def restore(self, key: tuple[str, str], entry: bytes | None) -> None:
        with self._lock:
            if entry is None:
                self._owners.pop(key, None)
            else:
                self._owners[key] = entry

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._owners.pop(key, None)

    def _refuse_mx(self, mx: bool, method: str) -> None:
        if mx and self.mx_writes is MxWrites.REFUSED:
            raise NotAllowed(Violation(
                RejectReason.FORBIDDEN, "mx_writes",
                f"{method} through model_express.p2p is refused on this server (--mx-writes refused): "
                "publish through mxref.v1, whose records carry an owner secret"))

    @staticmethod
    def _owned_by_caller(key: tuple[str, str], held: bytes, secret: str, mx: bool, what: str) -> None:
        if held == _MX_OWNED:
            if mx:
                return
            raise NotAllowed(_not_owner(key, what, "was published through model_express.p2p; only that "
                                                   "package may write it"))
        if mx:
            raise NotAllowed(_not_owner(key, what, "belongs to an mxref publisher; model_express.p2p sends no "
                                                   "owner_secret"))
        if not secret:
            raise NotAllowed(_not_owner(key, what, "carries no owner_secret"))
        if not hmac.compare_digest(held, _digest(secret)):
            raise NotAllowed(_not_owner(key, what, "carries an owner_secret that is not this record's"))

    def _set(self, key: tuple[str, str], entry: bytes) -> None:
        self._owners[key] = entry
        self._owners.move_to_end(key)
        while len(self._owners) > self._max_entries:
            self._owners.popitem(last=False)


class BudgetExceeded(Exception):
    """A publish that would take the store past its byte budget, or its peer past its share (the
    message says which and by how much)."""


class Claims:
    """Each write's claim on its record, applied around the store write: the owner (``OwnerBook``)
    and the capacity (``Capacity``: bytes, and each peer's share). A publish's claim, capacity
    check and store write are one step, and so is the reaper's ``forget`` (under one lock:
    publishes are rare next to heartbeats, which take no lock here).

    ``holds(key)`` says whether the store still holds a record (``forget`` drops the claim only if
    it does not: a publish may have put it back since the reaper deleted it); ``owner_of(key)``
    is the owner the store keeps with it (``OwnerBook.load``).
    """

    def __init__(self, owners: OwnerBook, capacity: Capacity, *, holds: Callable[[Key], bool] = lambda key: False,
                 owner_of: OwnerLoader = lambda key: None) -> None:
        self.owners = owners
        self.capacity = capacity
        self._holds = holds
        owners.load = owner_of
        self._lock = threading.Lock()

    @property
    def store_bytes(self) -> int:
        return self.capacity.total

    def publish(self, key: Key, secret: str, *, mx: bool, size: int, peer: str,
                write: Callable[[str], T]) -> tuple[T, str]:
        """``write(owner)`` (the store's publish, keeping ``owner`` with the record: ``persisted``)
        once the caller may write ``key`` and ``size`` bytes from ``peer`` fit; returns what it
        returned and the owner secret to hand back. ``NotAllowed``, ``BudgetExceeded``, or what
        ``write`` raised (then nothing is claimed)."""
        with self._lock:
            over = self.capacity.admit(key, peer, size)
            if over is not None:
                raise BudgetExceeded(over)
            held = self.owners.entry(key)
            handed = self.owners.claim(key, secret, mx=mx)
            owner = self.owners.entry(key)
            try:
                if owner is None:  # not reached: a claim that returns leaves an owner
                    raise AssertionError(f"claim of {key} left no owner")
                written = write(persisted(owner))
            except BaseException:  # the store refused or failed: the claim was for nothing
                self.owners.restore(key, held)
                raise
            self.capacity.charge(key, peer, size)
        return written, handed

    def heartbeat(self, key: Key, secret: str, *, mx: bool, write: Callable[[], T]) -> T:
        """``write()`` (the store's status update) once the caller may write ``key``; a heartbeat
        the store accepted for a record with no owner makes its sender the owner (``adopt``)."""
        self.owners.check(key, secret, mx=mx)
        written = write()
        self.owners.adopt(key, secret, mx=mx)
        return written

    def forget(self, key: Key) -> bool:
        """The reaper deleted the record at ``key``: its owner and bytes go too, under the publish
        lock and only if the store still holds no record there (a publish in between keeps its
        claim). True when forgotten; a store that cannot say keeps the claim (``holds`` raised)."""
        with self._lock:
            if self._holds(key):
                return False
            self.owners.forget(key)
            self.capacity.forget(key)
        return True


def _not_owner(key: tuple[str, str], what: str, why: str) -> Violation:
    """``why`` completes "the request ..." or "the record ..." (see the callers)."""
    sid, wid = key
    subject = "the request" if why.startswith("carries") else "the record"
    return Violation(RejectReason.NOT_OWNER, "owner_secret",
                     f"{what} of worker {wid[:64]!r} of source {sid[:32]!r} refused: {subject} {why} "
                     "(a record belongs to its first publisher)")


class WriteGate:
    """Refuses writes from a caller that presented the reader token (``--reader-token-file``).

    The token check itself (any accepted token, else UNAUTHENTICATED) runs before; this only
    tells a reader's token from a source's. No reader token: every authenticated caller may write.
    """

    def __init__(self, reader_token: str | None = None) -> None:
        self._reader = (BEARER_PREFIX + reader_token).encode("ascii") if reader_token else None

    def refusal(self, method: str, context: Any) -> Violation | None:
        if self._reader is None:
            return None
        metadata = context.invocation_metadata() or ()
        for key, value in metadata:
            if key != AUTHORIZATION_KEY:
                continue
            given = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")
            if hmac.compare_digest(given, self._reader):
                return Violation(RejectReason.FORBIDDEN, "authorization",
                                 f"{method} refused: the caller presented the reader token, which may list and "
                                 "get but not write (a source needs the source token, --token-file)")
        return None
