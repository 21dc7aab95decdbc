"""Debug hooks (``--debug-hooks``): make a process's registered memory wrong, or refit it, on demand.

For tests and chaos runs only. While installed, SIGUSR2 toggles the corruption of the
memory a process serves from: byte 0 of every tensor is XORed with 0xFF (a second
SIGUSR2 XORs it back, restoring the bytes exactly), and ``debug_corrupt`` is emitted
with ``corrupted`` (the state now) and ``tensors`` (how many were flipped). On a source,
SIGHUP asks a refit (``RefitTrigger``): the source drains its tensor read leases, rewrites
its weights and admits leases again (``mxref.roles.source.SourceService.refit``). Without
the flag nothing is installed and both signals keep their default actions.

Each signal is a ``mxref.signals.QueuedSignal``: its handler only queues it, and a thread of
ours does the work and emits the events.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from mxref.model import Arena
from mxref.signals import QueuedSignal


def flipped_addresses(arena: Any) -> tuple[str, list[int]]:
    """Where the toggle flips: ``("host", [address of byte 0 of each non-empty tensor])`` for a
    host arena (the harness reads them back through ``/proc/PID/mem``: the corrupt fault's
    witness), ``("device", [...])`` for one in device memory."""
    where = "host" if isinstance(arena, Arena) else "device"
    return where, [addr for (addr, size) in arena.regions() if size]


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
        self._signal = QueuedSignal(signal.SIGUSR2, lambda _signum: self.toggle(), "mx-debug-hooks")
        self._refit: QueuedSignal | None = None

    def set_arena(self, arena: Any) -> None:
        """Corrupt ``arena`` from now on (its bytes are taken as they are: not corrupted)."""
        with self._lock:
            self._arena = arena
            self.corrupted = False

    def install(self) -> CorruptionToggle:
        """Handle SIGUSR2 (main thread only) and start the worker thread."""
        self._signal.install()
        return self

    def on_refit(self, refit: Callable[[], object]) -> CorruptionToggle:
        """Also run ``refit`` on each SIGHUP (a source: ``SourceService.refit``), on its own thread."""
        self._refit = QueuedSignal(signal.SIGHUP, lambda _signum: refit(), "mx-refit-hook")
        self._refit.install()
        return self

    def toggle(self) -> bool:
        """Flip once; returns the state now, after emitting ``debug_corrupt`` (with where it
        flipped: ``memory`` and ``addrs``, ``flipped_addresses``)."""
        with self._lock:
            arena = self._arena
            if arena is not None and os.environ.get("MXREF_SIMULATED_BUG") == "corrupt_in_word_only":
                # SIMULATED BUG: the toggle says it flipped and flips nothing (the fault's witness catches it)
                tensors = len(flipped_addresses(arena)[1])
            else:
                tensors = flip_first_bytes(arena) if arena is not None else 0
            if tensors:
                self.corrupted = not self.corrupted
            corrupted = self.corrupted
        if arena is None:  # nothing held yet: nothing flipped, nowhere
            self.emit("debug_corrupt", corrupted=corrupted, tensors=tensors)
        else:
            memory, addrs = flipped_addresses(arena)
            self.emit("debug_corrupt", corrupted=corrupted, tensors=tensors, memory=memory, addrs=addrs)
        return corrupted

    def rewrite(self) -> int:
        """A refit's write, simulated: every tensor's byte 0 flipped and flipped back, under the
        toggle's lock (a corruption in place stays as it was); returns the tensors written."""
        with self._lock:
            if self._arena is None:
                return 0
            flip_first_bytes(self._arena)
            return flip_first_bytes(self._arena)

    def close(self) -> None:
        """Restore the signals' previous handlers and stop the threads (bounded)."""
        if self._refit is not None:
            self._refit.close()
        self._signal.close()


LEAK_KINDS = ("fd", "registration")
"""What ``--debug-leak`` leaks once per load of a looping reader (``--load-loop``)."""


class PlantedLeak:
    """A per-transfer leak planted on purpose (``--debug-leak KIND``, off by default), for the soak
    to catch (``mxchaos soak``): after every load, ``fd`` opens ``/dev/null`` and never closes it;
    ``registration`` registers one page of fresh memory with the load's NIXL agent (counted by its
    audit, ``mxref.audit``) and never deregisters it (the page itself is kept too). Each leak
    emits ``debug_leak`` with ``kind`` and ``leaked`` (how many so far)."""

    PAGE = 4096

    def __init__(self, kind: str, emit: Callable[..., Any]) -> None:
        if kind not in LEAK_KINDS:
            raise ValueError(f"--debug-leak {kind!r}: one of {', '.join(LEAK_KINDS)}")
        self.kind = kind
        self.emit = emit
        self._kept: list[Any] = []  # the descriptors or pages, held until the process exits

    def leak(self, agent: Any = None) -> None:
        """Leak one of ``kind``; ``agent`` (an audited NIXL agent) is needed for ``registration``."""
        if self.kind == "fd":
            self._kept.append(os.open(os.devnull, os.O_RDONLY))
        else:
            if agent is None:
                return  # the load held no agent (a fallback to disk): nothing to register with
            page = np.zeros(self.PAGE, dtype=np.uint8)
            agent.register_memory(np.array([(page.ctypes.data, self.PAGE, 0)], dtype=np.uint64), "DRAM")
            self._kept.append(page)
        self.emit("debug_leak", kind=self.kind, leaked=len(self._kept))


def duplicate_registration(agent: Any, emit: Callable[..., Any], page_bytes: int = 4096) -> bool:
    """A NIXL probe (``--probe-duplicate-registration``, NIXL #1792): register one range of fresh
    memory twice with ``agent`` (a load's audited agent, ``mxref.audit``), then deregister what each
    call gave, the second first. Emits ``duplicate_registration``: ``baseline`` (registrations open
    before), ``registered`` (open after both calls), ``after`` (open after the deregistrations),
    ``balanced`` (after == baseline) and each call's outcome (``ok`` or the error). A call that
    raises is reported, not raised: the probe's question is whether the process survives and the
    count returns. Returns ``balanced``; no agent (a load from disk): emits nothing, returns True."""
    import numpy as np

    if agent is None:
        return True
    audit = agent.audit
    page = np.zeros(page_bytes, dtype=np.uint8)  # held until the probe returns: the range stays valid
    descs = np.array([(page.ctypes.data, page_bytes, 0)], dtype=np.uint64)
    outcomes: dict[str, str] = {}
    regs: list[Any] = []
    baseline: int = audit.open()["registrations"]
    for call in ("register_first", "register_second"):
        try:
            regs.append(agent.register_memory(descs, "DRAM"))
            outcomes[call] = "ok"
        except Exception as exc:  # noqa: BLE001 - the probe reports what NIXL answered
            outcomes[call] = f"error: {type(exc).__name__}: {exc}"
    registered = audit.open()["registrations"]
    for i, reg in enumerate(reversed(regs)):
        try:
            agent.deregister_memory(reg)
            outcomes[f"deregister_{i + 1}"] = "ok"
        except Exception as exc:  # noqa: BLE001 - likewise
            outcomes[f"deregister_{i + 1}"] = f"error: {type(exc).__name__}: {exc}"
    after: int = audit.open()["registrations"]
    emit("duplicate_registration", baseline=baseline, registered=registered, after=after,
         balanced=after == baseline, bytes=page_bytes, **outcomes)
    return after == baseline
