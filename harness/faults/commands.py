"""The commands network faults run (iptables, tc, ip, ss), behind one small seam.

``netns.py`` and ``tcp_reset.py`` never call ``subprocess`` themselves: each command goes
through ``commands.shell.run(ns, argv)`` (``ns`` None: the root namespace), each namespace
listing through ``commands.shell.namespaces()`` and each tool lookup through
``commands.shell.have(program)``. Unit tests replace ``shell`` with a fake that records the
exact commands and answers them; the integration tests run the real ones.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Protocol

from harness import netns
from harness.errors import FaultError, HostError

__all__ = ["COMMAND_TIMEOUT_S", "REMOTE", "HostShell", "Shell", "shell"]

COMMAND_TIMEOUT_S = 10.0


class Shell(Protocol):
    def run(self, ns: str | None, argv: Sequence[str]) -> tuple[int, str]:
        """Run ``argv`` in namespace ``ns`` (None: the root namespace), bounded; (exit code,
        stdout then stderr, stripped). FaultError when it does not return in time."""
        ...

    def namespaces(self) -> list[str]:
        """The machine's network namespaces (empty when they cannot be listed)."""
        ...

    def have(self, program: str) -> bool:
        """Whether ``program`` is on the PATH."""
        ...


# ssh hosts of live runs: key (their ``netns`` attribute) -> how to run a command there
# (``harness.ssh.SshHost`` registers itself while it is open; sudo there when its inventory says so)
REMOTE: dict[str, Callable[[Sequence[str], float], tuple[int, str]]] = {}


class HostShell:
    """This machine's commands (and those of the open ssh hosts, by their key)."""

    def run(self, ns: str | None, argv: Sequence[str]) -> tuple[int, str]:
        remote = REMOTE.get(ns) if ns is not None else None
        if remote is not None:
            return remote(argv, COMMAND_TIMEOUT_S)
        try:
            if ns is not None:
                done = netns.ns_run(ns, argv, timeout=COMMAND_TIMEOUT_S)
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
            return netns.namespaces() + list(REMOTE)
        except HostError:
            return list(REMOTE)

    def have(self, program: str) -> bool:
        return shutil.which(program) is not None


shell: Shell = HostShell()
