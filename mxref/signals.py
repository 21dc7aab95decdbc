"""Signal handlers that take no lock: ``Relay`` and ``QueuedSignal``.

A Python signal handler runs on the main thread between two bytecodes of whatever it was
doing, even while that code holds a lock (``threading.Event.wait`` holds its condition's lock
for a few bytecodes before it sleeps). A handler that then takes the same lock (``Event.set``,
a ``with lock:``, a write to a buffered stream) waits for itself for ever. So a handler here
only hands its work to a ``Relay``: ``queue.SimpleQueue.put`` may interrupt another ``put`` of
the same thread without harm, and a thread of ours runs the work.
"""

from __future__ import annotations

import functools
import logging
import queue
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

__all__ = ["JOIN_TIMEOUT_S", "QueuedSignal", "Relay"]

logger = logging.getLogger("mxref.signals")

JOIN_TIMEOUT_S = 2.0


class Relay:
    """Work handed over by a signal handler: ``put`` takes no lock, and a thread of ours runs
    each piece of work once, in the order it came (a failed one is logged; the next still runs)."""

    def __init__(self, name: str) -> None:
        self._work: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        return self

    def put(self, work: Callable[[], object]) -> None:
        """Safe to call from a signal handler."""
        self._work.put(work)

    def _run(self) -> None:
        while (work := self._work.get()) is not None:
            try:
                work()
            except Exception:  # a failed piece of work never kills the thread
                logger.exception("signal work %r failed", work)

    def close(self, join_s: float = JOIN_TIMEOUT_S) -> None:
        """Let the work already handed over run, then stop the thread (bounded)."""
        if self._thread.is_alive():
            self._work.put(None)
            self._thread.join(timeout=join_s)


class QueuedSignal:
    """Signals whose handler only hands them to a ``Relay``: ``action(signum)`` runs on a
    thread of ours, once per signal, in the order they came."""

    def __init__(self, signums: int | Iterable[int], action: Callable[[int], object], name: str) -> None:
        self.signums = (signums,) if isinstance(signums, int) else tuple(signums)
        self._action = action
        self._relay = Relay(name)
        self._previous: dict[int, Any] = {}

    def install(self) -> QueuedSignal:
        """Handle the signals (main thread only) and start the relay's thread."""
        self._relay.start()
        for signum in self.signums:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self._relay.put(functools.partial(self._action, signum))

    def close(self, join_s: float = JOIN_TIMEOUT_S) -> None:
        """Restore the previous handlers, let the queued signals' actions run, and stop the
        thread (bounded)."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
        self._relay.close(join_s)

    def __enter__(self) -> QueuedSignal:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.close()
