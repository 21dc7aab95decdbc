"""What the metadata server does at its front door, the same on both gRPC implementations.

- ``raise_open_files_limit``: at start, the soft limit on open descriptors goes up to the hard
  one, so a burst of connections meets the cap the operator set, not a shell's default of 1024;
- ``RefusalEvents``: calls refused as unauthenticated are counted one by one (the
  ``mxref_server_rpcs_total{result="unauthenticated"}`` metric, exact), but written as at most
  one ``unauthenticated`` event per (peer address, method, reason) per second, with a count:
  the first refusal of a quiet key at once, the rest of that second in one line when it ends.
  A flood of refused calls cannot turn into a flood of log lines (each line costs the server
  a write and the disk its space);
- ``serving_failure``: why a started server stopped serving without being asked (the native
  one reports it; grpcio's core does not stop by itself), for the run loop to exit non-zero.
"""

from __future__ import annotations

import ipaddress
import logging
import resource
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mxref import security

logger = logging.getLogger(__name__)

WINDOW_S = 1.0
"""One ``unauthenticated`` line per key at most this often."""
MAX_KEYS = 1024
"""Keys (peer address, method, reason) followed at once; beyond, refusals count under the peer ``other``."""
OTHER_PEER = "other"


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns (before, after).
    Failing to (a platform that refuses) leaves it as it was, logged."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logger.warning("open-files limit stays %d (cannot raise it to %d: %s)", soft, hard, exc)
        return soft, soft
    logger.info("open-files limit raised from %d to %d", soft, hard)
    return soft, hard


def peer_address(peer: str) -> str:
    """The caller's address without its port, as gRPC names peers: ``ipv4:10.0.0.1:5123`` ->
    ``ipv4:10.0.0.1``, ``ipv6:[::1]:5123`` (or grpcio's ``ipv6:%5B::1%5D:5123``) -> ``ipv6:[::1]``;
    a name already without a port, or of another kind, stays as it is."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")
    if kind == "ipv4" and rest.count(":") == 1:
        return f"ipv4:{rest.rsplit(':', 1)[0]}"
    if kind == "ipv6" and rest.startswith("[") and "]:" in rest:
        return f"ipv6:{rest[:rest.index(']') + 1]}"
    return urllib.parse.unquote(peer)


def peer_holder(peer: str) -> str:
    """Whose share a caller's writes count in (``mxref.metadata.limits.Capacity``): its IPv4
    address, or its IPv6 address's /64 (a host is handed a /64: one per address would be 2**64
    shares); an IPv4-mapped IPv6 address counts as its IPv4 address."""
    address = peer_address(peer)
    kind, _, rest = address.partition(":")
    if kind != "ipv6" or not rest.startswith("["):
        return address
    try:
        ip = ipaddress.IPv6Address(rest.strip("[]").split("%", 1)[0])
    except ValueError:
        return address
    if ip.ipv4_mapped is not None:
        return f"ipv4:{ip.ipv4_mapped}"
    return f"ipv6:[{ipaddress.IPv6Network((ip, 64), strict=False).network_address}]/64"


Key = tuple[str, str, str]


@dataclass
class _Window:
    pending: int
    next_at: float


class RefusalEvents:
    """Refusals in, ``unauthenticated`` events out, bounded (see the module docstring).

    ``emit(peer=, method=, reason=, count=)`` writes one event; ``count(method, n)`` counts the
    metric. ``report`` is the servers' ``on_refused``; ``start`` runs the flusher thread,
    ``close`` stops it and writes what is pending."""

    def __init__(self, emit: Callable[..., None], count: Callable[[str, int], None], *,
                 window_s: float = WINDOW_S, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._emit = emit
        self._count = count
        self._window_s = window_s
        self._max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[Key, _Window] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self, refusal: security.Refusal) -> None:
        self._count(refusal.short_method, refusal.count)
        key: Key = (peer_address(refusal.peer), refusal.short_method, refusal.reason.value)
        now = self._clock()
        with self._lock:
            if key not in self._keys and len(self._keys) >= self._max_keys:
                key = (OTHER_PEER, key[1], key[2])
            window = self._keys.get(key)
            if window is None or (window.pending == 0 and now >= window.next_at):
                self._keys[key] = _Window(0, now + self._window_s)
                now_count = refusal.count
            else:
                window.pending += refusal.count
                now_count = 0
        if now_count:
            self._write(key, now_count)

    def flush(self, *, everything: bool = False) -> None:
        """Write each key whose window has ended (all pending ones with ``everything``); forget
        keys quiet for a whole window."""
        now = self._clock()
        due: list[tuple[Key, int]] = []
        with self._lock:
            for key, window in list(self._keys.items()):
                if window.pending and (everything or now >= window.next_at):
                    due.append((key, window.pending))
                    window.pending, window.next_at = 0, now + self._window_s
                elif not window.pending and now >= window.next_at + self._window_s:
                    del self._keys[key]
        for key, n in due:
            self._write(key, n)

    def _write(self, key: Key, n: int) -> None:
        peer, method, reason = key
        try:
            self._emit(peer=peer, method=method, reason=reason, count=n)
        except Exception:  # an event that cannot be written must not fail a call
            logger.exception("unauthenticated event not written")

    def start(self) -> RefusalEvents:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="refusal-events", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._window_s / 4):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.flush(everything=True)


def serving_failure(server: Any) -> str | None:
    """Why ``server`` (as ``start_metadata_server`` returned it) stopped serving without being
    asked, or None: the native server says (``failure``); grpcio's does not stop by itself."""
    failure = getattr(server, "failure", None)
    return failure() if callable(failure) else None
