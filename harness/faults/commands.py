"""The commands network faults run (iptables, tc, ip, ss), behind one small seam.

``netns.py`` and ``tcp_reset.py`` never call ``subprocess`` themselves: each command goes
through ``commands.shell.run(place, argv)`` (``place`` None: the root namespace; else where the
host answers its fault commands reach it, ``Host.fault_place``: one of this machine's network
namespaces, or an ssh host's own shell), each namespace listing through
``commands.shell.namespaces()`` and each tool lookup through ``commands.shell.have(program)``.
Unit tests replace ``shell`` with a fake that records the exact commands and answers them; the
integration tests run the real ones.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from typing import Protocol

from harness.errors import FaultError, HostError
from harness.hosts import netns
from harness.hosts.base import Place

__all__ = ["COMMAND_TIMEOUT_S", "HostShell", "Shell", "shell"]

COMMAND_TIMEOUT_S = 10.0


class Shell(Protocol):
    def run(self, place: Place | None, argv: Sequence[str]) -> tuple[int, str]:
        """Run ``argv`` at ``place`` (None: the root namespace), bounded; (exit code, stdout then
        stderr, stripped). FaultError when it does not return in time."""
        ...

    def namespaces(self) -> list[str]:
        """This machine's network namespaces (empty when they cannot be listed)."""
        ...

    def have(self, program: str) -> bool:
        """Whether ``program`` is on the PATH."""
        ...


class HostShell:
    """This machine's commands, and those of a host that runs them itself (``Place.remote``)."""

    def run(self, place: Place | None, argv: Sequence[str]) -> tuple[int, str]:
        if place is not None and place.remote is not None:
            return place.remote.run_privileged(argv, COMMAND_TIMEOUT_S)
        try:
            if place is not None:
                done = netns.ns_run(place.name, argv, timeout=COMMAND_TIMEOUT_S)
            else:
                done = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        except HostError as exc:
            raise FaultError(str(exc)) from None
        except subprocess.TimeoutExpired:
            raise FaultError(f"`{' '.join(argv)}` did not return within {COMMAND_TIMEOUT_S:g}s") from None
        except OSError as exc:  # the program is missing
            raise FaultError(f"`{' '.join(argv)}`: {exc}") from None
        return done.returncode, (done.stdout + done.stderr).strip()

    def namespaces(self) -> list[str]:
        try:
            return netns.namespaces()
        except HostError:
            return []

    def have(self, program: str) -> bool:
        return shutil.which(program) is not None


shell: Shell = HostShell()
