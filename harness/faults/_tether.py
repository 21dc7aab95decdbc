"""Runs a fault's helper process (the disk fault's FUSE layer, the syscall fault's strace) for
as long as the harness that started it lives.

``python -m harness.faults._tether HARNESS_PID -- ARGV...`` starts ``ARGV``, hands TERM and INT
on to it (``harness.wrapped.forward_signals``: a heal's SIGTERM to the tether reaches the
helper), and ends it (TERM, then KILL after ``GRACE_S``) as soon as the harness is gone (its
parent is no longer ``HARNESS_PID``), which a parent-death signal cannot do: that fires when the
*thread* that started the process ends, and a fault may be injected from a parallel branch's
thread that ends long before its heal. Exits with the helper's code (128 + signal when killed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from harness.wrapped import forward_signals

__all__ = ["GRACE_S", "POLL_S", "main"]

GRACE_S = 5.0
POLL_S = 0.2


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m harness.faults._tether HARNESS_PID -- ARGV...", file=sys.stderr)
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
