"""The ``Host`` protocol and ``LocalHost``, this machine; ``NetnsHost`` (a network namespace
of the run, ``harness/hosts/netns.py``) extends it, ``SshHost`` (``harness/hosts/ssh.py``) satisfies it too.

A ``Host`` spawns long-running processes (each in its own session, so signals can
go to its whole process group and a terminal Ctrl-C never reaches it), runs short
commands with a deadline, reads files it produced (the runner tails events files
through ``read``, so a remote host only has to implement it), tells whether a TCP
port answers, and finds the processes of a run (``procscan.find``). A local process whose
environment carries ``MXCHAOS_RUN_ID`` joins that run's scope (``harness.machine.runscope``: its cgroup,
before it execs, and its ledger of pids), so every program started this way, and all it forks,
is found and ended by the leak scan and ``mxchaos cleanup`` without more work.
Every blocking call takes a timeout.

What the run reads of a host is declared here, on the protocol, and every kind answers it: its
kind and address, whether its processes bind and advertise that address, whether its files are
this machine's, the transport and accelerator its machine imposes, its veth ends, its clock
(``local_mono``), how its leftover processes are killed, and where a network fault's command
reaches it (``fault_place``: a ``Place``, a namespace of this machine or the host's own shell).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.errors import HostError
from harness.hosts.clocks import ClockOffsets
from harness.machine import procscan, runscope

__all__ = ["ExecResult", "Host", "LocalHost", "LocalProc", "Place", "Proc", "RemoteCommands", "StopResult", "make_host", "read_slice",
           "tcp_port_open"]


@dataclass(frozen=True)
class ExecResult:
    rc: int | None  # None: killed at the deadline
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.rc is None


@dataclass(frozen=True)
class StopResult:
    rc: int | None
    escalated: bool  # needed SIGKILL after the grace period
    seconds: float
    already_exited: bool = False


class Proc(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float) -> int | None: ...

    def signal(self, sig: int, *, group: bool = True) -> bool: ...

    def stop(self, grace: float) -> StopResult: ...


class RemoteCommands(Protocol):
    """A host that runs a network fault's commands itself, over its own connection (an ssh host)."""

    @property
    def connected(self) -> bool: ...  # open for the run (False once closed; a lost host still is: its commands fail)

    def run_privileged(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        """``argv`` there, as root when its machine says so: (exit code, output); FaultError naming
        the host when it does not return within ``timeout``."""
        ...


@dataclass(frozen=True)
class Place:
    """Where a network fault's commands act on a host: a network namespace of this machine
    (``name``), or, with ``remote``, the host's own shell (``name`` then only names it in records
    and errors: ``ssh:<run id>:<host>``). A fault's token keeps it, so its heal reaches the same
    place."""

    name: str
    remote: RemoteCommands | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.name


class Host(Protocol):
    name: str
    kind: str  # local | netns | ssh
    address: str  # where its processes' ports are reached from the harness
    # whether ``read`` serves its processes' events files from this machine's file system, as they
    # grow (its own files, or mirrors of remote ones): the monitor then wakes on their growth
    # (inotify) instead of its next poll
    events_local: bool
    own_address: bool  # its processes bind and advertise ``address`` (not loopback)
    # what its processes write is on this machine's file system, and they are this machine's
    # processes (in the run's scope here); False: an ssh host
    local_files: bool

    @property
    def transport(self) -> str | None: ...  # its processes' transport profile, over the scenario's (an inventory machine's)
    @property
    def accelerator(self) -> tuple[str, int | None] | None: ...  # its (kind, device id), unless a process sets its own
    @property
    def link(self) -> str | None: ...  # the root-namespace end of its veth, a port of the run's bridge (netns hosts)
    @property
    def inner_link(self) -> str | None: ...  # the device its network faults act on inside it (a netns veth, an ssh host's data device)

    def fault_place(self) -> Place | None:
        """Where a network fault's commands act on it (None: nowhere, a local host)."""
        ...

    def local_mono(self, mono: float) -> float:
        """One of its ``time.monotonic()`` readings (an events line's ``mono``) as the harness's."""
        ...

    def mono_error_s(self) -> float:
        """How far ``local_mono`` may be off (the clock probe's error; 0: the same clock)."""
        ...

    def kill_processes(self, pids: Sequence[int]) -> None:
        """SIGKILL these processes (its own pids; one already gone is no error)."""
        ...

    def wrap_clocks(self, argv: Sequence[str], offsets: ClockOffsets) -> list[str]:
        """``argv`` started there with ``offsets`` (``ClockOffsets.wrap``, with the libfaketime
        of the machine the program runs on); an error naming the host when it has none."""
        ...

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path) -> Proc: ...

    def exec(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float) -> ExecResult: ...

    def read(self, path: Path, offset: int, limit: int = 1 << 20) -> bytes: ...

    def port_open(self, port: int, timeout: float = 0.2) -> bool: ...

    def run_processes(self, run_id: str) -> list[procscan.RunProcess]: ...

    def close(self) -> None: ...


def read_slice(path: Path, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of a local file from ``offset`` (nothing yet: empty)."""
    try:
        with open(path, "rb") as src:
            src.seek(offset)
            return src.read(limit)
    except FileNotFoundError:
        return b""


def tcp_port_open(address: str, port: int, timeout: float) -> bool:
    """Whether a TCP connect to ``address:port`` succeeds within ``timeout``."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def stop_escalating(proc: Proc, grace: float) -> StopResult:
    """TERM (+CONT, so a paused process can act on it), wait ``grace``, then KILL and wait up to
    10 s: how every host's process is stopped. One already gone gets a KILL for its group."""
    started = time.monotonic()
    if proc.poll() is not None:
        proc.signal(signal.SIGKILL)
        return StopResult(proc.poll(), False, 0.0, already_exited=True)
    proc.signal(signal.SIGTERM)
    proc.signal(signal.SIGCONT)
    rc = proc.wait(grace)
    escalated = False
    if rc is None:
        escalated = True
        proc.signal(signal.SIGKILL)
        rc = proc.wait(10.0)
    return StopResult(rc, escalated, time.monotonic() - started)


class LocalProc:
    """A child in its own session (pgid == pid)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float) -> int | None:
        try:
            return self._popen.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def signal(self, sig: int, *, group: bool = True) -> bool:
        """Send ``sig`` to the process (or its group). False when it is gone."""
        try:
            if group:
                os.killpg(self.pid, sig)
            elif self._popen.returncode is None:
                os.kill(self.pid, sig)
            else:
                return False
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self, grace: float) -> StopResult:
        """TERM (+CONT, so a paused process can act on it), wait ``grace``, then KILL. Any
        member of the group still alive after the leader exits is killed too."""
        result = stop_escalating(self, grace)
        if not result.already_exited:
            self.signal(signal.SIGKILL)  # stragglers in the group; ESRCH when none
        return result


class LocalHost:
    """Processes on this machine, reached over loopback."""

    kind = "local"
    events_local = True
    own_address = False
    local_files = True
    transport: str | None = None
    accelerator: tuple[str, int | None] | None = None
    link: str | None = None
    inner_link: str | None = None

    def __init__(self, name: str = "local") -> None:
        self.name = name
        self.address = "127.0.0.1"

    def fault_place(self) -> Place | None:
        return None

    def local_mono(self, mono: float) -> float:
        return mono  # the same clock

    def mono_error_s(self) -> float:
        return 0.0

    def wrap_clocks(self, argv: Sequence[str], offsets: ClockOffsets) -> list[str]:
        return offsets.wrap(argv)  # this machine's unshare and libfaketime

    def kill_processes(self, pids: Sequence[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path) -> LocalProc:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        run_id = env.get(procscan.ENV_RUN_ID)
        with open(log_path, "ab", buffering=0) as log, runscope.joining(run_id) as join:
            try:
                popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=str(cwd),
                    env=dict(env),
                    start_new_session=True,
                    close_fds=True,
                    preexec_fn=join,
                )
            except OSError as exc:
                raise HostError(f"{self.name}: cannot start {argv[0]!r}: {exc}") from exc
        _record(run_id, popen.pid, env)
        return LocalProc(popen)

    def exec(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float) -> ExecResult:
        started = time.monotonic()
        run_id = env.get(procscan.ENV_RUN_ID)
        with runscope.joining(run_id) as join:
            try:
                popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=str(cwd),
                    env=dict(env),
                    start_new_session=True,
                    preexec_fn=join,
                )
            except OSError as exc:
                raise HostError(f"{self.name}: cannot run {argv[0]!r}: {exc}") from exc
        _record(run_id, popen.pid, env)
        try:
            out, err = popen.communicate(timeout=timeout)
            rc: int | None = popen.returncode
        except subprocess.TimeoutExpired:
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = popen.communicate(timeout=10)
            rc = None
        return ExecResult(rc, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - started)

    def read(self, path: Path, offset: int, limit: int = 1 << 20) -> bytes:
        return read_slice(path, offset, limit)

    def port_open(self, port: int, timeout: float = 0.2) -> bool:
        return tcp_port_open(self.address, port, timeout)

    def run_processes(self, run_id: str) -> list[procscan.RunProcess]:
        return procscan.find(run_id)

    def close(self) -> None:
        return None


def _record(run_id: str | None, pid: int, env: Mapping[str, str]) -> None:
    """A process of a run goes into the run's ledger of pids, naming the harness that started it."""
    if not run_id:
        return
    hp, hs = env.get(procscan.ENV_HARNESS_PID, ""), env.get(procscan.ENV_HARNESS_START, "")
    runscope.record(run_id, pid, (int(hp), int(hs) if hs.isdigit() else None) if hp.isdigit() else None)


def make_host(name: str, kind: str) -> Host:
    """A host that needs nothing built first (netns hosts come from the run's ``netns.Network``)."""
    if kind == "local":
        return LocalHost(name)
    raise HostError(f"host kind {kind!r} is not made here (netns: harness.hosts.netns.Network) or not implemented yet")
