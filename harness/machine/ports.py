"""Ports the harness itself must choose (e.g. a toxiproxy API or proxy listener).

Scenario processes never need this: they bind port 0 and report the port in a
``listening`` event. When the harness has to hand a port to a program that cannot report
its own, ``lease_port()`` asks the kernel for a free one (bind to port 0) and takes an
exclusive ``flock`` on ``<state dir>/ports/<port>.lock`` (``harness.machine.statedir``) before releasing the socket, so two
harnesses (pytest-xdist workers, parallel CI jobs) never hand out the same port; the lock is
held until the lease is released.
"""

from __future__ import annotations

import fcntl
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from harness.machine import statedir

__all__ = ["PortLease", "lease_port", "try_lock"]


def _lock_dir() -> Path:
    """``ports/`` of the state directory, checked (``harness.machine.statedir``)."""
    folder = statedir.subdir("ports")
    assert folder is not None
    return folder


def try_lock(path: Path) -> int | None:
    """An exclusive, non-blocking flock on ``path`` (created 0600 if needed; never through a
    symlink: ``statedir.open_lock``): the open descriptor (closing it releases the lock, also when
    the process dies), or None if someone holds it."""
    fd = statedir.open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@dataclass
class PortLease:
    port: int
    _fd: int | None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> PortLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lease_port(host: str = "127.0.0.1", attempts: int = 50) -> PortLease:
    folder = _lock_dir()
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
            fd = try_lock(folder / f"{port}.lock")
            if fd is None:
                continue
        return PortLease(port, fd)
    raise OSError(f"no free port on {host} after {attempts} attempts")
