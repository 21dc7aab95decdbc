"""Runs a fault's helper process (the disk fault's FUSE layer, the syscall fault's strace) for
as long as the harness that started it lives.

``python harness/faults/_tether.py HARNESS_PID -- ARGV...`` starts ``ARGV``, hands TERM and INT
on to it (``harness.wrapped.forward_signals``: a heal's SIGTERM to the tether reaches the
helper), and ends it (TERM, then KILL after ``GRACE_S``) as soon as the harness is gone (its
parent is no longer ``HARNESS_PID``), which a parent-death signal cannot do: that fires when the
*thread* that started the process ends, and a fault may be injected from a parallel branch's
thread that ends long before its heal. Exits with the helper's code (128 + signal when killed).

The harness side: ``spawn`` starts a helper under a tether (kept here by pid, so that ``end``
reaps its own child) and ``end`` sends the tether SIGTERM, waits, bounded, until the fault's own
sign that the helper let go (``done``), then reaps it, killing it if it has not ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from harness.wrapped import forward_signals

__all__ = ["GRACE_S", "POLL_S", "end", "main", "spawn"]

GRACE_S = 5.0
POLL_S = 0.2


# the tethers this harness started, by pid: ``end`` waits for (reaps) its own child
_HELPERS: dict[int, subprocess.Popen[bytes]] = {}


def spawn(argv: Sequence[str], out: IO[Any]) -> subprocess.Popen[bytes]:
    """Start ``argv`` under a tether to this process, its output to ``out``."""
    # run as a file, not ``-m harness.faults._tether``: that would import every fault kind first
    tethered = [sys.executable, "-P", __file__, str(os.getpid()), "--", *argv]  # -P: not its folder on sys.path
    proc = subprocess.Popen(tethered, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    _HELPERS[proc.pid] = proc
    return proc


def end(pid: int, done: Callable[[], bool], wait_s: float) -> None:
    """SIGTERM the tether ``pid`` (it hands it on to its helper), wait until ``done()`` or
    ``wait_s``, then reap the tether (SIGKILL if it has not ended by then). Idempotent."""
    proc = _HELPERS.pop(pid, None)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not done():
        time.sleep(0.02)
    if proc is not None:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(wait_s)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python harness/faults/_tether.py HARNESS_PID -- ARGV...", file=sys.stderr)
        return 2
    harness, command = int(argv[0]), argv[2:]
    if os.getppid() != harness:
        return 1  # the harness is gone already
    proc = subprocess.Popen(command)
    forward_signals(proc)
    while proc.poll() is None:
        if os.getppid() != harness:
            proc.terminate()
            try:
                proc.wait(GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
            break
        time.sleep(POLL_S)
    rc = proc.wait()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
