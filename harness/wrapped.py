"""What a wrapper process (``harness.subjects.redisd``, ``harness.subjects.mx_serverd``) does for the one
child it runs: the child dies with its wrapper, however the wrapper dies (``dies_with``: a
SIGKILLed or crashed wrapper forwards nothing, so the kernel's parent-death signal does it), and
the wrapper hands TERM and INT on to it (``forward_signals``)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

__all__ = ["dies_with", "forward_signals"]

PR_SET_PDEATHSIG = 1


def dies_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: SIGKILL when ``parent`` dies, and end at once if it is already gone.
    libc is loaded here, before the fork (nothing is imported between fork and exec)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def forward_signals(proc: subprocess.Popen[Any]) -> None:
    """TERM and INT to this process go on to ``proc`` while it runs."""

    def forward(signum: int, frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
