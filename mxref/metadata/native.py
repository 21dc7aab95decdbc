"""The metadata server on the native gRPC implementation, its default (``mxref_native``: HTTP/2 and gRPC in Rust).

Python's grpcio server hands every call to a pool thread and back, with its own call state,
and on 2 cores tops out near 1-2k calls per second whatever the servicer costs (the servicer's
own heartbeat path: ~30-50 us). The native implementation (``mxref/native``, tonic on tokio) frames
the calls in Rust and queues them; Python threads take the queued calls in batches
(``lanes_for``) and answer each through the same ``P2pServicer.serve`` path, for both packages (``mxref.v1``
and ModelExpress's ``model_express.p2p``), so every check, count, event and answer is the
one the grpcio server gives. What differs, by design:

- a rate-limited write is still answered after ``rate_limit_delay_s``, but the delay holds
  only the caller's stream (the native side sleeps), not a worker: no cap on such calls is
  needed (``P2pServicer._hold_back`` asks the context);
- TLS is rustls's, from the same certificate and key files; a call carrying none of the
  accepted bearer values (``ServerCredentials.bearer_values``) is refused in Rust before its
  body is read or it is queued, with grpcio's code and details; the refusals are counted there
  per peer address and reported here (``on_refused``, with their count) by a thread of their
  own, so a flood of them costs Python one report per peer a poll, not one per call. Python
  still checks the token of every call it answers (``mxref.security.check_authorization``);
- an unknown method is UNIMPLEMENTED; a request over the receive limit is refused by the
  framing (RESOURCE_EXHAUSTED, as grpcio words it) before Python sees it;
- the queues are bounded (``MAX_QUEUED_CALLS`` each, ``MAX_QUEUED_BYTES`` together): a call
  finding its queue full is RESOURCE_EXHAUSTED at once;
- reads (ListSources, GetMetadata) and writes wait in queues of their own. Over the in-memory
  store one worker takes the reads and one the writes (``LANES``), and the writer lets go of
  the GIL before a write while reads are open (``Server.yield_to_reads``), so a listing waits
  for at most the heartbeat being answered, not for a batch of them nor for Python's switch
  interval; a yield lasts until ``TAKE_MOST`` reads are answered (or ``READ_YIELD_MOST_S``) and
  the writer then answers ``TAKE_MOST`` writes before it yields again, so a flood of listings
  does not starve the heartbeats either;
- its own accept loop goes on after any accept error, caps connections (in all and per peer
  address), times out TLS handshakes, pings idle connections and closes them after
  ``IDLE_TIMEOUT_S`` without a call or ``MAX_CONNECTION_AGE_S`` (``FRONT_DOOR``). If serving
  ever ends without being asked, ``failure`` says why (the server process exits non-zero).

``python -m mxref.bench.fleet --grpc-impl native`` measures it with native clients, sent from
the benchmark's process without the GIL.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from mxref import config, security
from mxref.errors import LocalError
from mxref.metadata.modelexpress import MX_METHODS, MX_SERVICE_NAME, MxP2pService
from mxref.metadata.servicer import RPCS, SERVER_THREADS, SERVICE_NAME, P2pServicer
from mxref.metadata.store import Store

logger = logging.getLogger(__name__)

READS, WRITES = "reads", "writes"
"""The lanes a worker can take from (``mxref_native.Server.take``); ``None``: both, a read and a
write in turn."""
LANES: tuple[str | None, ...] = (READS, WRITES)
"""The workers over the in-memory store, whose calls only take CPU: one per lane. On 2 cores
1-2 threads give the most calls per second (each more adds GIL hand-offs: 12k/s with 1, 9.8k
with 4, 7.6k with 10, heartbeats alone, 2026-12-02)."""
MIXED_LANES: tuple[str | None, ...] = (None, None)
"""Two workers each taking both kinds in turn: what served the in-memory store before the lanes
(``python -m mxref.bench.fleet --native-lanes mixed`` measures it beside ``LANES``)."""
TAKE_MOST = 16
"""Calls one worker takes at once (a worker of both lanes: a read and a write in turn, reads
first). Between batches a worker lets go of the GIL: at a 10k/s heartbeat target, limit-16
listing p99 6 ms with 16, 9.9 with 64 (2026-12-02, two workers of both lanes)."""
READ_YIELD_MOST_S = 0.005
"""The longest a writer waits for the reads in one yield (``yield_to_reads``): Python's own
switch interval, the longest a thread asking for the GIL waits anyway. A yield waits without
using the GIL, so under a flood of listings on a busy host (each taking longer on the clock) a
longer bound would leave the writes idle: with this one the writer still answers ``TAKE_MOST``
writes per 5 ms of reads at the least."""
TAKE_WAIT_S = 0.5
"""How long an idle worker waits for a call before it looks at the stop flag again."""
MAX_QUEUED_CALLS = 4096
"""Calls one queue (reads, writes) holds; a heartbeat fleet of 10k/s drains it in well under a
second, and beyond it a caller hears RESOURCE_EXHAUSTED at once rather than waiting."""
MAX_QUEUED_BYTES = 256 << 20
"""Request bytes received (each frame counted as it arrives, before it is kept) and queued, together
(64 calls at the 4 MiB receive limit)."""
FRONT_DOOR: dict[str, float] = {
    "max_connections": 4096,  # in all; each is a descriptor and up to 64 streams. At the cap the oldest
    # connection that has sent no call is dropped for the newcomer, else the one idle longest (1 s at least)
    "max_connections_per_peer": 1024,  # per peer address: a fleet's host opens a few each
    "max_connections_per_block": 2048,  # per IPv4 /24 or IPv6 /64: a few addresses cannot take every place
    "handshake_timeout_s": 10.0,  # TLS: a peer that connects and says nothing is dropped
    "first_request_timeout_s": 10.0,  # after accept (after TLS, with it): the first call's headers, or dropped
    "keepalive_interval_s": 30.0,  # HTTP/2 PING on a quiet connection ...
    "keepalive_timeout_s": 20.0,  # ... unanswered this long: the peer is gone, closed
    "idle_timeout_s": 600.0,  # no call this long: closed (GOAWAY; clients reconnect when they need to)
    "max_connection_age_s": 7200.0,  # then GOAWAY, +-10% per connection; the calls in flight finish
    "body_timeout_s": 10.0,  # a call's body is due within this ...
    "min_body_bytes_per_s": 256 * 1024,  # ... plus its size at this rate (8 MiB: 42 s); else DEADLINE_EXCEEDED
    "send_stall_timeout_s": 30.0,  # answers waiting this long without a byte read: the connection is dropped
    "max_unsent_bytes_per_connection": 32 << 20,  # answers not yet read, per connection ...
    "max_unsent_bytes": 256 << 20,  # ... and in all; beyond either a call is answered RESOURCE_EXHAUSTED
}
"""The native server's connection and call limits (``mxref_native.Server``'s ``front_door``: Rust
keeps no default of its own, and names a key missing or unknown). Request bodies count against
``MAX_QUEUED_BYTES`` as they arrive, before they are kept."""


def method_table() -> list[tuple[str, str, bool]]:
    """What the Rust server routes, as ``(service, method, is_read)``: every method of the
    servicer's table (``RPCS``) in ``mxref.v1`` and in ModelExpress's package, a read unless it
    ``writes`` (reads and writes wait in queues of their own). Rust keeps no list of its own: a
    method added to ``RPCS`` is served."""
    return [(service, name, not RPCS[name].writes)
            for service, names in ((SERVICE_NAME, tuple(RPCS)), (MX_SERVICE_NAME, MX_METHODS)) for name in names]


def routing() -> dict[str, Any]:
    """``mxref_native.Server``'s routing keywords: the method table and the token's metadata key
    (``mxref.security``'s)."""
    return {"methods": method_table(), "authorization_key": security.AUTHORIZATION_KEY}


def lanes_for(servicer: P2pServicer) -> tuple[str | None, ...]:
    """One worker per lane over the in-memory store (``LANES``); over a store that waits on the
    network (Redis: up to ``--store-timeout`` and a retry per call) a slow call holds its worker
    and lets go of the GIL while it waits, so as many workers of both lanes as grpcio's pool has
    threads."""
    return LANES if isinstance(servicer.store, Store) else (None,) * SERVER_THREADS


def native_available() -> str | None:
    """None when ``mxref_native`` imports; else why not (the build is ``.ci/bootstrap``'s)."""
    try:
        # late: importing it is the test (optional; its absence is the answer)
        import mxref_native  # noqa: F401
    except ImportError as exc:
        return (f"mxref_native is not installed ({exc}): pip install ./mxref/native (needs cargo; .ci/bootstrap does it), "
                "or serve on Python's gRPC with --grpc-impl grpcio")
    return None


class _Aborted(Exception):
    """``NativeContext.abort`` was called: the call's answer is the error it recorded."""


@dataclass
class NativeContext:
    """The part of ``grpc.ServicerContext`` the servicer uses, for one native call."""

    _peer: str
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    trailing: list[tuple[str, str]] = field(default_factory=list)
    delay_s: float = 0.0
    authorization: tuple[Any, ...] = ()
    """The call's ``authorization`` values (``mxref.metadata.ownership.WriteGate`` tells a reader's token)."""

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return tuple((security.AUTHORIZATION_KEY, value) for value in self.authorization)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise _Aborted

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing = [(str(k), str(v)) for k, v in metadata]

    def delay_answer(self, seconds: float) -> None:
        """Send this call's answer ``seconds`` later without holding a thread (the hold-back)."""
        self.delay_s = seconds


class NativeMetadataServer:
    """A started native server and its workers. ``stop(grace)`` answers like grpcio's: an
    object whose ``wait(timeout)`` returns once it has stopped."""

    def __init__(self, servicer: P2pServicer, host: str, port: int, *, lanes: tuple[str | None, ...] | None = None,
                 credentials: security.ServerCredentials | None = None,
                 on_refused: Callable[[security.Refusal], None] | None = None,
                 front_door: dict[str, float] | None = None,
                 max_queued_calls: int = MAX_QUEUED_CALLS, max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:
        """``credentials`` (default plaintext): TLS and the bearer token, as ``start_metadata_server``
        takes them; ``on_refused`` hears of every call refused as unauthenticated (a refusal made
        in Rust comes with its count, within ``TAKE_WAIT_S``). ``front_door``: ``FRONT_DOOR``'s
        keys to change; ``max_queued_*``: the queues' bounds; ``lanes``: a worker per entry (default
        ``lanes_for(servicer)``)."""
        # late: the native extension is optional; its absence is reported, not raised at import
        import mxref_native


        credentials = credentials or security.ServerCredentials()
        self._serve = {SERVICE_NAME: servicer.serve_encoded, MX_SERVICE_NAME: MxP2pService(servicer).serve_encoded}
        self._token = credentials.accepted_tokens or None
        self._on_refused = on_refused
        unknown = set(front_door or {}) - set(FRONT_DOOR)
        if unknown:
            raise LocalError(f"metadata server (--grpc-impl native): unknown front-door limits {sorted(unknown)}")
        limits = {**FRONT_DOOR, **(front_door or {})}
        try:
            self._server = mxref_native.Server(
                host, port, **routing(), max_concurrent_streams=config.MAX_STREAMS_PER_CONNECTION,
                max_message_bytes=servicer.limits.max_message_bytes,
                tls_cert_pem=credentials.cert_pem, tls_key_pem=credentials.key_pem,
                accepted_authorization=credentials.bearer_values(),
                refusal_details={reason.value: security.refusal_details(reason) for reason in security.RefusalReason},
                max_queued_calls=max_queued_calls, max_queued_bytes=max_queued_bytes, front_door=limits,
            )
        except (OSError, ValueError) as exc:
            raise LocalError(f"metadata server (--grpc-impl native): {exc}") from exc
        self.port: int = self._server.port
        self._stopping = threading.Event()
        self._workers = [threading.Thread(target=self._work, args=(lane,), name=f"metadata-native-{lane or 'any'}-{i}",
                                          daemon=True)
                         for i, lane in enumerate(lanes if lanes is not None else lanes_for(servicer))]
        self._workers.append(threading.Thread(target=self._report_refusals, name="metadata-native-refusals",
                                              daemon=True))
        for worker in self._workers:
            worker.start()

    def _work(self, lane: str | None) -> None:
        """Answer ``lane``'s calls until stopped; a writer yields to the open reads before a
        write, at most once per ``TAKE_MOST`` writes."""
        since_yield = TAKE_MOST
        while True:
            calls = self._server.take(TAKE_MOST, TAKE_WAIT_S, lane)
            if calls is None:  # the server stopped and nothing is left
                return
            if not calls and self._stopping.is_set():
                return
            for call in calls:
                if lane == WRITES and since_yield >= TAKE_MOST and self._server.yield_to_reads(
                        TAKE_MOST, READ_YIELD_MOST_S):
                    since_yield = 0
                self._answer(call)
                since_yield += 1

    def _report_refusals(self) -> None:
        """Hand the refusals Rust counted to ``on_refused``, until stopped (then once more)."""
        while True:
            stopping = self._stopping.is_set()
            for service, method, reason, peer, count in self._server.refusals(0 if stopping else TAKE_WAIT_S):
                if self._on_refused is not None:
                    try:
                        self._on_refused(security.Refusal(f"/{service}/{method}", security.RefusalReason(reason),
                                                          peer, count))
                    except Exception:  # a report that fails must not stop the reports
                        logger.exception("reporting refused calls failed")
            if stopping:
                return

    def stats(self) -> dict[str, int]:
        """The front door's counts (``mxref_native.Server.stats``)."""
        return dict(self._server.stats())

    def failure(self) -> str | None:
        """Why serving ended without being asked, or None (serving, or stopped by ``stop``)."""
        if self._stopping.is_set():
            return None
        why: str | None = self._server.ended(0)
        return why

    def _refusal(self, call: Any) -> security.RefusalReason | None:
        """Why the call is refused as unauthenticated (reported), or None; always None without a token."""
        if self._token is None:
            return None
        reason = security.check_authorization(call.authorization, self._token)
        if reason is not None and self._on_refused is not None:
            self._on_refused(security.Refusal(f"/{call.service}/{call.method}", reason, call.peer))
        return reason

    def _answer(self, call: Any) -> None:
        context = NativeContext(call.peer, authorization=tuple(call.authorization or ()))
        try:
            refused = self._refusal(call)
            if refused is not None:
                call.answer(grpc.StatusCode.UNAUTHENTICATED.value[0], security.refusal_details(refused), [], b"")
                return
            response = self._serve[call.service](call.method, call.request, context)
        except _Aborted:
            call.answer(context.code.value[0], context.details, context.trailing, b"", context.delay_s)
            return
        except Exception as exc:  # never leave a call unanswered
            logger.exception("%s/%s failed", call.service, call.method)
            call.answer(grpc.StatusCode.INTERNAL.value[0], f"{call.method}: internal error: {exc}", [], b"")
            return
        call.answer(0, "", [], response, context.delay_s)

    def stop(self, grace: float | None) -> _Stopped:
        """Stop accepting and let the calls in flight finish (up to ``grace`` s, and the workers'
        last batch); the returned object's ``wait`` says whether it is done."""
        self._stopping.set()
        stopped = self._server.stop(grace or 0.0)
        for worker in self._workers:
            worker.join(TAKE_WAIT_S + 5)
        alive = [w.name for w in self._workers if w.is_alive()]
        if alive or not stopped:
            logger.warning("native metadata server: not stopped in time (workers alive: %s)", alive)
        return _Stopped(stopped and not alive)


@dataclass(frozen=True)
class _Stopped:
    done: bool

    def wait(self, timeout: float | None = None) -> bool:
        return self.done
