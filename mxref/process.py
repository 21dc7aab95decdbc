"""What every mxref process shares: its name, events, metrics and stop signals.

``Process`` is entered once in ``__main__``: it emits ``started``, serves
/metrics and reports the port, turns SIGTERM/SIGINT into a stop event (the
handler only sets the event: emitting from a handler could deadlock on a lock
the interrupted code holds), and emits ``exit`` with the code on the way out.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import logging
import os
import random
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from mxref import __version__, config
from mxref.events import EventLog, log_to_stderr
from mxref.metrics import ProcessMetrics
from mxref.signals import QueuedSignal

logger = logging.getLogger("mxref.process")

# Exit codes shared by every role (docs/mxref.md documents them).
EXIT_OK = 0
EXIT_LOAD_FAILED = 1  # reader: no verified load (no source worked and no usable checkpoint)
EXIT_USAGE = 2  # bad flags or input
EXIT_STARTUP_FAILED = 3  # cannot bind, NIXL missing, ...
EXIT_SERVING_ENDED = 4  # server: its gRPC server stopped serving without being asked


EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_PICK = random.SystemRandom()  # never a seeded generator: two processes seeded alike would pick alike


def listener_ports() -> range:
    """The ports ``free_port`` picks from: those below the kernel's ephemeral range (from 10000),
    which no outgoing connection is ever given on its own; above it when that leaves fewer than
    2000. Empty when neither side has room (then the kernel picks)."""
    try:
        low, high = (int(x) for x in Path(EPHEMERAL_RANGE).read_text().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    below, above = range(10000, low), range(high + 1, 65536)
    return below if len(below) >= 2000 else above if len(above) >= 2000 else range(0)


def free_port(attempts: int = 64) -> int:
    """A port nobody holds right now on any address, for listeners that cannot bind port 0
    themselves (NIXL's metadata listener, the real client's). Picked at random outside the
    kernel's ephemeral range (``listener_ports``): a port the kernel handed out for a probe at
    port 0 is an ephemeral one, which any process's next outgoing connection may take before the
    listener binds it (the real client's source lost its bind so, EADDRINUSE, on a machine busy
    with three matrices). The probe binds every address (INADDR_ANY), as NIXL's listener does: a
    port free on 127.0.0.1 alone may be held on another address. Still racy between two pickers
    (one chance in thousands); callers report the port they used."""
    ports = listener_ports()
    for _ in range(attempts if len(ports) else 0):
        port = _PICK.choice(ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room outside: the kernel's pick
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def read_json_line(stream: Any, deadline_s: float, what: str) -> dict[str, Any]:
    """The first line starting with ``{`` on a child's output pipe, parsed, within
    ``deadline_s`` (other lines, e.g. NIXL's own logging, are skipped). Reads the pipe's file
    descriptor directly (Python's buffering would hide lines from ``select``), so the caller
    must not read ``stream`` afterwards. TimeoutError at the deadline, RuntimeError when the
    pipe closes first: a hung child never hangs us."""
    fd = stream.fileno()
    deadline = time.monotonic() + deadline_s
    pending = b""
    while True:
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.startswith(b"{"):
                return dict(json.loads(line))
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what} printed no JSON line within {deadline_s:g}s")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"{what} exited before printing its JSON line")
            pending += chunk


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, before any fork: nothing is loaded between fork and exec


def die_with_parent(signum: int = signal.SIGTERM, parent: int | None = None) -> None:
    """``preexec_fn`` for children that must not outlive their parent, even if it crashes.

    Linux only (PR_SET_PDEATHSIG = 1): the child gets ``signum`` (SIGTERM by default) when the
    thread that forked it dies, so fork from a thread that lives as long as the child (the main
    thread). With ``parent`` (the forking process's pid, ``functools.partial(die_with_parent,
    signal.SIGKILL, os.getpid())``), a child whose parent died before the signal was armed ends at
    once. SIGKILL is the one that acts on a stopped (SIGSTOPped) child: a SIGTERM stays pending
    until a SIGCONT that nobody is left to send.
    """
    _LIBC.prctl(1, signum, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


class StopSignals:
    """While entered, SIGTERM/SIGINT set ``stop`` and record the signal (the handler only queues
    it: ``mxref.signals.QueuedSignal``; setting an Event from the handler could wait on the lock
    of the very ``stop.wait`` it interrupted)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.stop = stop if stop is not None else threading.Event()
        self.received: int | None = None
        self._queued: QueuedSignal | None = None

    def _handle(self, signum: int) -> None:
        self.received = signum
        self.stop.set()

    def wait(self, tick_s: float = 0.5) -> None:
        """Block until stopped, in bounded ticks (so signals are seen promptly)."""
        while not self.stop.wait(tick_s):
            pass

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._queued = QueuedSignal(self.SIGNALS, self._handle, "mx-stop-signals").install()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._queued is not None:
            self._queued.close()
            self._queued = None


class Process:
    """One mxref process's lifetime; ``metrics`` is its role's registry (``mxref.metrics``),
    served while entered when ``metrics_port`` is not None."""

    def __init__(self, name: str, role: str, events_path: str | None, metrics_port: int | None,
                 metrics: ProcessMetrics, metrics_host: str = "127.0.0.1") -> None:
        self.name = name
        self.role = role
        self.events = EventLog(events_path, name, role)
        self.metrics = metrics
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.signals = StopSignals()

    @property
    def stop(self) -> threading.Event:
        return self.signals.stop

    def emit(self, event: str, **fields: Any) -> None:
        log_to_stderr(self.events.emit(event, **fields))

    def __enter__(self) -> Process:
        self.signals.__enter__()
        # `kill -USR1 PID` writes every thread's stack to the log (where py-spy may not attach)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        self.emit("started", argv=sys.argv, version=__version__, env=config.logged_env())
        if self.metrics_port is not None:
            port = self.metrics.serve(self.metrics_port, self.metrics_host)
            self.emit("listening", what="metrics", port=port, endpoint=f"{self.metrics_host}:{port}")
        return self

    def note_signal(self) -> None:
        if self.signals.received is not None:
            self.emit("signal", signum=self.signals.received, name=signal.Signals(self.signals.received).name)

    def finish(self, code: int) -> int:
        self.emit("exit", code=code)
        return code

    def __exit__(self, *exc: object) -> None:
        self.signals.__exit__()
        self.metrics.close()
        self.events.close()
