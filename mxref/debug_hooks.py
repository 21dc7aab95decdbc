"""Debug hooks (``--debug-hooks``): make a process's registered memory wrong on demand.

For tests and chaos runs only. While installed, SIGUSR2 toggles the corruption of the
memory a process serves from: byte 0 of every tensor is XORed with 0xFF (a second
SIGUSR2 XORs it back, restoring the bytes exactly), and ``debug_corrupt`` is emitted
with ``corrupted`` (the state now) and ``tensors`` (how many were flipped). Without
the flag nothing is installed and SIGUSR2 keeps its default action.

The signal handler only queues the request (``queue.SimpleQueue.put`` is safe to call
from a handler); a thread of ours flips the bytes and emits the event, so the handler
never takes a lock that the code it interrupted may hold.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger("mxref.debug_hooks")

JOIN_TIMEOUT_S = 2.0


def flip_first_bytes(arena: Any) -> int:
    """XOR byte 0 of every tensor of ``arena`` (host ``Arena`` or ``CudaArena``) with 0xFF
    in place; returns the number of tensors flipped (empty tensors are left alone)."""
    flipped = 0
    for offset, spec in zip(arena.offsets, arena.specs):
        if spec.nbytes:
            arena.buffer[offset] ^= 0xFF
            flipped += 1
    return flipped


class CorruptionToggle:
    """SIGUSR2 -> flip the current arena's first bytes (see module docstring).

    ``arena`` may be set later (a reader holds memory only after its load); a signal
    while it holds none reports ``corrupted=False, tensors=0``. ``emit`` is called as
    ``emit("debug_corrupt", corrupted=..., tensors=...)``.
    """

    def __init__(self, emit: Callable[..., Any], arena: Any = None) -> None:
        self.emit = emit
        self._lock = threading.Lock()
        self._arena = arena
        self.corrupted = False
        self._requests: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="mx-debug-hooks", daemon=True)
        self._previous: Any = None
        self._installed = False

    def set_arena(self, arena: Any) -> None:
        """Corrupt ``arena`` from now on (its bytes are taken as they are: not corrupted)."""
        with self._lock:
            self._arena = arena
            self.corrupted = False

    def install(self) -> CorruptionToggle:
        """Handle SIGUSR2 (main thread only) and start the worker thread."""
        self._previous = signal.signal(signal.SIGUSR2, self._handle)
        self._installed = True
        self._thread.start()
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self._requests.put(signum)

    def _run(self) -> None:
        while self._requests.get() is not None:
            try:
                self.toggle()
            except Exception:  # a failed toggle never kills the hook thread
                logger.exception("debug hook: toggling the corruption failed")

    def toggle(self) -> bool:
        """Flip once; returns the state now, after emitting ``debug_corrupt``."""
        with self._lock:
            tensors = flip_first_bytes(self._arena) if self._arena is not None else 0
            if tensors:
                self.corrupted = not self.corrupted
            corrupted = self.corrupted
        self.emit("debug_corrupt", corrupted=corrupted, tensors=tensors)
        return corrupted

    def close(self) -> None:
        """Restore SIGUSR2's previous handler and stop the thread (bounded)."""
        if not self._installed:
            return
        signal.signal(signal.SIGUSR2, self._previous)
        self._installed = False
        self._requests.put(None)
        self._thread.join(timeout=JOIN_TIMEOUT_S)
