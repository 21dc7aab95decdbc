"""``ssh`` hosts: a scenario's logical host bound (``harness.hosts.inventory``) to a machine reached with
the OpenSSH client over one multiplexed connection per host.

Every ssh call goes through the host's control master (``ControlMaster=auto``, ``ControlPersist``,
``BatchMode=yes``, ``ConnectTimeout``, ``ServerAliveInterval``) and is bounded by a local timeout.
Nothing of the run folder is shared: the host has its own per-run folder ``<work_dir>/<run id>``,
and the run folder's paths in a command line or environment are rewritten to it (``remote``):

- **spawn**: a small Python wrapper on the host (the inventory's interpreter) forks the program
  into a session of its own (so signals reach its whole group) with ``MXCHAOS_RUN_ID`` and the
  rest of what the harness adds to the environment, its output to the remote log; it prints
  ``pid N`` and, when the program ends, ``rc N`` (negative: the signal), also written next to the
  log. The local ssh client of that wrapper is how an exit is seen; signals go by ``kill -SIG
  -PGID`` over the master. A local file named in the command line (the readers' checkpoint, a
  model file, the run's credentials) is copied to the host first; the harness's own interpreter
  becomes the host's.
- **read**: the first read of an events file starts ``tail -F`` of the remote one over the
  master, appending to the local file as lines come; reads are then local (live, one stream per
  file, no ssh exec per poll).
- **close**: stops the tails, fetches the per-run folder (logs, results, stacks) into the run
  folder with one ``tar`` stream, removes it on the host, and ends the master.
- **clock**: ``probe_clock`` estimates the host's monotonic clock offset from several round
  trips over one session (keeping the tightest); done when the host opens and when it closes.

A host that does not answer within its connect timeout is a ``HostError`` naming it, never a hang.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from harness.errors import FaultError, HostError
from harness.hosts import netns, srun
from harness.hosts.base import ExecResult, Place, StopResult, read_slice, stop_escalating, tcp_port_open
from harness.hosts.clocks import FAKETIME_LIBRARIES, FAKETIME_PROBE, ClockOffsets, found_faketime
from harness.hosts.hardware import Hardware, hardware_probe, parse_hardware
from harness.hosts.inventory import Inventory, Machine, bind_hosts
from harness.hosts.ssh_remote import CLOCK, PYTHON_FLAGS, SAFE_PATH_ENV, SCAN, WORKDIR, WRAPPER, RemoteShell
from harness.machine import procscan, statedir

__all__ = ["SshHost", "SshProc", "open_hosts"]

CONTROL_PERSIST_S = 300
CLOCK_PROBES = 7
FETCH_TIMEOUT_S = 120.0

class SshProc:
    """A process on an ssh host: its remote pid (== its process group) and the local ssh client
    of its wrapper, whose ``rc N`` line is its exit."""

    def __init__(self, host: SshHost, client: subprocess.Popen[bytes], pid: int, stdout: IO[bytes]) -> None:
        self.host = host
        self.pid = pid
        self._client = client
        self._rc: int | None = None
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(stdout,), name=f"mxchaos-ssh-{host.name}-{pid}", daemon=True)
        self._reader.start()

    def _read(self, stdout: IO[bytes]) -> None:
        with stdout:
            for raw in stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith("rc "):
                    with contextlib.suppress(ValueError):
                        self._rc = int(line[3:])
        self._client.wait()
        if self._rc is None:  # the connection ended first: ask the host (its wrapper wrote the rc)
            self._rc = self.host.recover_rc(self.pid)
            if self._rc is None and (self.host.lost or self.host.process_alive(self.pid) is not False):
                return  # not known to have ended: not reported as an exit
        self._done.set()

    def poll(self) -> int | None:
        return self._rc if self._done.is_set() else None

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + max(timeout, 0.0)
        while not self._done.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
            if self.host.lost or time.monotonic() >= deadline:
                break
        return self.poll()

    def signal(self, sig: int, *, group: bool = True) -> bool:
        if self._done.is_set():
            return False
        target = f"-{self.pid}" if group else str(self.pid)
        done = self.host.shell.run(f"kill -{int(sig)} {target}", timeout=self.host.machine.connect_timeout + 5)
        return done.rc == 0

    def stop(self, grace: float) -> StopResult:
        return stop_escalating(self, grace)


PLUMBING_ENV = "MXCHAOS_SSH_RUN_ID"  # the harness's ssh clients and remote helpers of a run
RUN_MARKER = ".mxchaos-run"  # in each per-run folder the harness made: its run id (what the sweep checks)
CONTROL_ROOT = Path("/tmp")  # short: a control socket's path must fit a unix socket name (~104 bytes)


def control_dir(run_id: str, host: str) -> Path:
    """The folder of a run's control socket for one host: ``mxc-ssh-<run token>-<host hash>``."""
    return CONTROL_ROOT / f"mxc-ssh-{netns.token(run_id)}-{hashlib.sha256(host.encode()).hexdigest()[:6]}"


def _control_masters(run_id: str) -> list[int]:
    """The ssh control masters of a run's hosts: their process title names their control socket
    (``ssh: /tmp/mxc-ssh-<token>-<host>/... [mux]``); the title overwrites the environment, so its
    tag is gone, and a master left running keeps its sshd session on the host."""
    marker = f"{CONTROL_ROOT}/mxc-ssh-{netns.token(run_id)}-".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{entry}/cmdline").read_bytes()
                if argv.startswith(b"ssh") and marker in argv:
                    pids.append(int(entry))
    return pids


def sweep_local(run_id: str) -> list[str]:
    """The ssh clients (they carry ``MXCHAOS_SSH_RUN_ID``), their control masters and
    control-socket folders a dead run's harness left here."""
    removed = []
    for pid in _control_masters(run_id):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            removed.append(f"ssh control master pid {pid}")
    with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
        done = subprocess.run([sys.executable, "-c", SCAN, run_id, PLUMBING_ENV], capture_output=True, text=True,
                              timeout=30, check=False)
        for pid, *_rest in json.loads(done.stdout or "[]"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                removed.append(f"ssh client pid {pid}")
    for folder in CONTROL_ROOT.glob(f"mxc-ssh-{netns.token(run_id)}-*"):
        with contextlib.suppress(OSError, statedir.StateDirError):
            statedir.ensure_dir(folder, create=False)  # only a folder of ours, never through a symlink
            for leftover in folder.iterdir():
                leftover.unlink()
            folder.rmdir()
            removed.append(f"ssh control folder {folder}")
    return removed


class SshHost:
    """A scenario host on an inventory machine (see the module docstring)."""

    kind = "ssh"
    own_address = True  # its processes bind and advertise the machine's data address
    local_files = False  # what it writes is not on this machine's file system
    link: str | None = None  # no veth of the run's: its cable is the machine's
    events_local = True  # but its events files are mirrored into the run folder as they grow (``read``)

    def __init__(self, name: str, machine_name: str, machine: Machine, run_id: str, run_dir: Path) -> None:
        self.name = name
        self.machine_name = machine_name
        self.machine = machine
        self.address = machine.data_address
        self.transport: str | None = machine.transport  # its processes' transport profile, over the scenario's
        acc = machine.accelerator
        self.accelerator: tuple[str, int | None] | None = (acc.kind, acc.device) if acc.kind != "cpu" else None
        self.run_id = run_id
        self.run_dir = run_dir
        self.work_dir = machine.work_dir  # absolute (a ~/ resolved there) once ``open`` made and checked it
        self.remote_dir = f"{machine.work_dir.rstrip('/')}/{run_id}"
        self._control_dir = control_dir(run_id, name)
        self._tails: dict[Path, subprocess.Popen[bytes]] = {}
        self._pushed: dict[str, str] = {}
        self._lock = threading.Lock()
        self.clock: dict[str, Any] = {}
        self.shell = RemoteShell(self)
        self.plumbing = f"{PLUMBING_ENV}={shlex.quote(run_id)}"  # marks our long-lived remote helpers
        # every local ssh client carries the run's id (not as MXCHAOS_RUN_ID: it is no process of the
        # scenario), so `mxchaos cleanup` finds it after a crash (``sweep_local``)
        self.local_env = {**{k: v for k, v in os.environ.items() if k != procscan.ENV_RUN_ID}, PLUMBING_ENV: run_id}
        # reach: srun: every command a step of the job on the node instead (``harness.hosts.srun``)
        self.srun = machine.srun if machine.reach == "srun" else None
        if self.srun is not None and self.srun.conf is not None:
            self.local_env["SLURM_CONF"] = str(self.srun.conf)
        self.lost: str | None = None  # why the host stopped answering (every call then fails at once)
        self.on_lost: Callable[[str], None] | None = None  # the runner aborts the run with that reason
        # network faults' commands run in its remote shell (``run_privileged``) while it is open
        self._place = Place(f"ssh:{run_id}:{name}", remote=self)
        self.connected = False
        self.inner_link: str | None = machine.data.device  # the interface they act on (not the ssh one)
        self.hardware: Hardware | None = None  # what the last capabilities(hardware=True) probe found
        self.faketime: str | None = None  # its libfaketime (the capabilities probe, or the first wall_clock start)

    # ------------------------------------------------------------------ ssh plumbing

    @property
    def where(self) -> str:
        """The host as errors name it: its machine and how it is reached."""
        if self.srun is not None:
            return f"srun host {self.name} (node {self.srun.node} of SLURM job {self.srun.job})"
        return f"ssh host {self.name} ({self.machine_name}, {self.machine.target}:{self.machine.port})"

    def ssh_argv(self, *, tty: bool = False) -> list[str]:
        """The command prefix a shell line to run there is appended to: the ssh client over the
        host's master, or (``reach: srun``) a step of the job on the node."""
        if self.srun is not None:
            return srun.argv(self.srun.job, self.srun.node)
        m = self.machine
        statedir.ensure_dir(self._control_dir)  # ours, 0700, no symlink: never a socket folder someone else made
        argv = ["ssh", "-p", str(m.port), "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(m.connect_timeout))}",
                "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3", "-o", "ControlMaster=auto",
                "-o", f"ControlPath={self._control_dir}/%C", "-o", f"ControlPersist={CONTROL_PERSIST_S}",
                "-o", "LogLevel=ERROR", "-T" if not tty else "-t"]
        if m.identity_file is not None:
            argv += ["-i", str(m.identity_file), "-o", "IdentitiesOnly=yes"]
        policy = m.known_hosts.policy
        if policy == "off":
            argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        else:
            argv += ["-o", f"StrictHostKeyChecking={'yes' if policy == 'strict' else 'accept-new'}"]
            if m.known_hosts.file is not None:
                argv += ["-o", f"UserKnownHostsFile={m.known_hosts.file}"]
        return [*argv, m.target]

    def mark_lost(self, why: str) -> None:
        """The host stopped answering: recorded once, the runner told; later calls fail at once."""
        if self.lost is not None:
            return
        self.lost = f"{self.where} stopped answering: {why}"
        if self.on_lost is not None:
            with contextlib.suppress(Exception):
                self.on_lost(self.lost)

    def check_alive(self) -> None:
        """After a connection ended: one bounded round trip, or the host is lost."""
        if self.lost is None:
            self.run_remote("true", timeout=self.machine.connect_timeout + 5)

    def process_alive(self, pid: int) -> bool | None:
        done = self.run_remote(f"kill -0 {int(pid)}", timeout=self.machine.connect_timeout + 5)
        return None if done.rc in (None, 255) else done.rc == 0

    def transport_failure(self, rc: int | None, stderr: str) -> str | None:
        """Why a command did not run there, by the client's own failure (ssh's rc 255; srun's
        lines, ``srun.failure``), else None: the rc is the command's."""
        if self.srun is not None:
            own = srun.failure(rc, stderr)
            return f"srun failed: {own}" if own else None
        return (stderr.strip()[-200:] or "ssh failed (rc 255)") if rc == 255 else None

    def run_remote(self, command: str, *, timeout: float, stdin: IO[bytes] | None = None) -> ExecResult:
        """``command`` (a shell line) on the host, bounded; the client's own failure
        (``transport_failure``) is rc 255, and the host is then lost, as when it does not answer in time."""
        started = time.monotonic()
        if self.lost:
            return ExecResult(255, "", self.lost, 0.0)
        try:
            done = subprocess.run([*self.ssh_argv(), command], capture_output=True, timeout=timeout, check=False, env=self.local_env,
                                  stdin=stdin if stdin is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            self.mark_lost(f"no answer within {timeout:g}s")
            return ExecResult(None, "", f"{self.name}: no answer within {timeout:g}s", time.monotonic() - started)
        except OSError as exc:
            raise HostError(f"{self.name}: cannot run ssh: {exc}") from exc
        stderr = done.stderr.decode(errors="replace")
        failed = self.transport_failure(done.returncode, stderr)
        if failed is not None:
            self.mark_lost(failed)
        return ExecResult(255 if failed is not None else done.returncode, done.stdout.decode(errors="replace"), stderr,
                          time.monotonic() - started)

    def _checked(self, command: str, what: str, timeout: float | None = None) -> ExecResult:
        done = self.run_remote(command, timeout=timeout or self.machine.connect_timeout + 10)
        if done.rc != 0:
            why = "did not answer" if done.timed_out else f"failed (rc {done.rc}): {done.stderr.strip()[-300:]}"
            raise HostError(self.lost or f"{self.where}: {what} {why}")
        return done

    def remote(self, text: str) -> str:
        """``text`` with the run folder's path replaced by the host's per-run folder."""
        return text.replace(str(self.run_dir), self.remote_dir)

    def _python(self) -> str:
        """Our own helper programs' interpreter there, isolated (``ssh_remote.PYTHON_FLAGS``)."""
        return f"{shlex.quote(self.machine.interpreter)} {PYTHON_FLAGS}"

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        """Connect (the master), make and check the work dir there and make the per-run folder in
        it (a new one) with its marker ``RUN_MARKER`` holding the run id (``ssh_remote.WORKDIR``:
        a work dir that is not the login's own is refused, naming host and path), probe the clock."""
        args = " ".join(shlex.quote(a) for a in (self.machine.work_dir, self.run_id, RUN_MARKER))
        done = self.run_remote(f"{self._python()} -c {shlex.quote(WORKDIR)} {args}", timeout=self.machine.connect_timeout + 10)
        where = self.where
        if done.rc == 3:
            raise HostError(f"{where}: {done.stderr.strip()[-400:]}")
        if done.rc != 0 or not done.stdout.strip().startswith("/"):
            why = "did not answer" if done.timed_out else f"failed (rc {done.rc}): {done.stderr.strip()[-300:]}"
            raise HostError(self.lost or f"{where}: making the work dir {self.machine.work_dir} {why}")
        self.work_dir = done.stdout.strip().splitlines()[-1]
        self.remote_dir = f"{self.work_dir.rstrip('/')}/{self.run_id}"
        self.clock = {"start": self.probe_clock()}
        self.shell.run("true", timeout=self.machine.connect_timeout + 10)  # started now, not by the first fault
        self.connected = True

    def fault_place(self) -> Place:
        """Its own shell: a network fault's commands reach it there (``run_privileged``)."""
        return self._place

    def run_privileged(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        """A network fault's command on the host (``sudo -n`` when the inventory says so), as
        ``harness.faults.commands`` runs it: (rc, output); FaultError naming the host when it
        does not answer in time."""
        line = shlex.join(["sudo", "-n", *argv] if self.machine.sudo else list(argv))
        done = self.shell.run(line, timeout=timeout)
        if done.timed_out:
            raise FaultError(f"{self.where}: `{line}` did not return within {timeout:g}s")
        if done.rc == 255 and not done.stdout:
            raise FaultError(f"{self.where}: `{line}`: {'srun' if self.srun is not None else 'ssh'} failed: "
                             f"{done.stderr.strip()[-200:]}")
        return int(done.rc or 0), (done.stdout + done.stderr).strip()

    def capabilities(self, *, hardware: bool = False) -> set[str]:
        """What faults can use there: root (uid 0, or sudo -n that works when the inventory says
        sudo), iptables, tc, ip, ss; and data-device when the inventory names one (network
        faults); root-login (the login itself is uid 0: a process starts as the login, never
        through sudo), unshare, timens (``/proc/self/ns/time``) and faketime (a library of
        ``FAKETIME_LIBRARIES``, kept in ``self.faketime``) for clock faults. ``hardware``: also
        what ``capabilities.HARDWARE_PROBE`` finds, kept in ``self.hardware`` (cuda, rdma and
        rdma-netdev: an RDMA device behind the data device are added)."""

        probe = ("id -u; for p in iptables tc ip ss unshare; do command -v $p >/dev/null 2>&1 && echo $p; done; "
                 f"[ -e /proc/self/ns/time ] && echo timens; {FAKETIME_PROBE}")
        if self.machine.sudo:
            probe += "; sudo -n true 2>/dev/null && echo sudo"
        if hardware:
            probe += "; " + hardware_probe(self.machine.data.device)
        done = self._checked(probe, "probing capabilities")
        self.hardware = parse_hardware(done.stdout) if hardware else None
        self.faketime = found_faketime(done.stdout)
        lines = [line for line in done.stdout.splitlines() if not line.startswith(("hw-", "faketime-library "))]
        lines = " ".join(lines).split()
        found = {word for word in lines[1:] if word != "sudo"}
        if self.hardware is not None:
            found |= {cap for cap, ok in (("cuda", self.hardware.gpus > 0), ("rdma", bool(self.hardware.rdma)),
                                          ("rdma-netdev", bool(self.hardware.netdev_rdma))) if ok}
        if lines and lines[0] == "0":
            found |= {"root", "root-login"}
        if "sudo" in lines[1:]:
            found.add("root")
        if self.machine.data.device:
            found.add("data-device")
        if self.faketime is not None:
            found.add("faketime")
        return found

    def wrap_clocks(self, argv: Sequence[str], offsets: ClockOffsets) -> list[str]:
        """``offsets.wrap`` for the host: its words (``unshare``, ``env LD_PRELOAD=``) are run
        there by the wrapper's exec, so the time namespace is the host's and the library its own
        (found there once, ``FAKETIME_PROBE``); a FaultError naming the host when it has none."""
        if not offsets.realtime_s:
            return offsets.wrap(argv)
        if self.faketime is None:
            done = self.shell.run(FAKETIME_PROBE, timeout=self.machine.connect_timeout + 10)
            self.faketime = found_faketime(done.stdout) if done.rc == 0 else None
            if self.faketime is None:
                raise FaultError(self.lost or f"ssh host {self.name} ({self.machine_name}, {self.machine.target}:{self.machine.port}) "
                                 f"has no libfaketime (apt-get install faketime there); looked in {', '.join(FAKETIME_LIBRARIES)}")
        return offsets.wrap(argv, faketime=self.faketime)

    def probe_clock(self, probes: int = CLOCK_PROBES) -> dict[str, float]:
        """The host's ``time.monotonic()`` minus ours, from the tightest of ``probes`` round trips
        over one session: ``offset_s`` (remote = local + offset) and ``error_s`` (half that RTT)."""
        client = subprocess.Popen([*self.ssh_argv(), f"{self._python()} -u -c {shlex.quote(CLOCK)}"], env=self.local_env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert client.stdin is not None and client.stdout is not None
        timer = threading.Timer(self.machine.connect_timeout + 10, client.kill)
        timer.start()
        best: tuple[float, float] | None = None
        try:
            for _ in range(probes):
                t0 = time.monotonic()
                client.stdin.write(b"\n")
                client.stdin.flush()
                line = client.stdout.readline()
                t1 = time.monotonic()
                if not line:
                    break
                remote_t = float(line)
                rtt = t1 - t0
                if best is None or rtt < best[1]:
                    best = (remote_t - (t0 + t1) / 2, rtt)
        except (OSError, ValueError):
            pass
        finally:
            timer.cancel()
            with contextlib.suppress(OSError):
                client.stdin.close()
            try:
                client.wait(5)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait(5)
            client.stdout.close()
        if best is None:
            raise HostError(f"ssh host {self.name}: the clock probe got no answer")
        return {"offset_s": round(best[0], 6), "error_s": round(best[1] / 2, 6), "probes": probes}

    def local_mono(self, remote: float) -> float:
        """A ``time.monotonic()`` of the host as the harness's (the offset probed at open)."""
        start = self.clock.get("start")
        return remote - float(start["offset_s"]) if start else remote

    def mono_error_s(self) -> float:
        return float((self.clock.get("start") or {}).get("error_s", 0.0))

    def close(self) -> None:
        """Stop the tails, fetch the per-run folder, remove it there, end the master."""
        self.connected = False
        self.shell.close()
        with self._lock:
            tails, self._tails = list(self._tails.values()), {}
        for tail in tails:
            tail.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                tail.wait(5)
        if self.lost is None:  # a host that stopped answering is not waited for again
            with contextlib.suppress(Exception):
                self.clock["end"] = self.probe_clock()
            with contextlib.suppress(Exception):
                self.fetch()
            with contextlib.suppress(Exception):
                self.run_remote(f"rm -rf {shlex.quote(self.remote_dir)}", timeout=self.machine.connect_timeout + 10)
        self.close_master()

    def close_master(self) -> None:
        """End the control master and remove its socket folder (an srun host has none)."""
        if self.srun is not None:
            return
        with contextlib.suppress(Exception):
            subprocess.run([*self.ssh_argv()[:-1], "-O", "exit", self.machine.target], capture_output=True, timeout=10,
                           check=False, env=self.local_env)
        with contextlib.suppress(OSError):
            for leftover in self._control_dir.iterdir():
                leftover.unlink()
            self._control_dir.rmdir()

    def fetch(self) -> None:
        """The per-run folder's files (but the copies pushed to it) into the run folder, one tar
        stream; events files already mirrored are overwritten by the host's full copy."""
        quoted = shlex.quote(self.remote_dir)
        with subprocess.Popen([*self.ssh_argv(), f"tar -C {quoted} --exclude=./files --exclude=./{RUN_MARKER} -cf - ."],
                              env=self.local_env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as source:
            untar = subprocess.run(["tar", "-C", str(self.run_dir), "-xf", "-"], stdin=source.stdout, capture_output=True,
                                   timeout=FETCH_TIMEOUT_S, check=False)
            source.wait(FETCH_TIMEOUT_S)
        if untar.returncode != 0:
            raise HostError(f"{self.name}: fetching {self.remote_dir} failed: {untar.stderr.decode(errors='replace')[-200:]}")

    def describe(self) -> dict[str, object]:
        m = self.machine
        reach = {"srun": f"job {self.srun.job} node {self.srun.node}"} if self.srun is not None else {"ssh": f"{m.target}:{m.port}"}
        return {"kind": self.kind, "machine": self.machine_name, **reach, "address": self.address,
                "device": m.data.device, "remote_dir": self.remote_dir, "sudo": m.sudo, "clock": self.clock,
                **({"lost": self.lost} if self.lost else {})}

    # ------------------------------------------------------------------ files

    def _push(self, local: str) -> str:
        """Copy a local file to the host's per-run folder (once per run); its remote path. The copy
        is 0600 and any folder made for it 0700, whatever the host's umask: it may be the run's
        token or TLS key."""
        with self._lock:
            if local in self._pushed:
                return self._pushed[local]
        path = Path(local)
        if path.resolve().is_relative_to(self.run_dir):
            target = self.remote(str(path))
        else:
            digest = hashlib.sha256(local.encode()).hexdigest()[:10]
            target = f"{self.remote_dir}/files/{digest}-{path.name}"
        size = path.stat().st_size
        quoted = shlex.quote(target)
        with open(path, "rb") as src:
            done = self.run_remote(f"umask 077 && mkdir -p \"$(dirname {quoted})\" && cat > {quoted}.part && chmod 600 {quoted}.part "
                                   f"&& mv {quoted}.part {quoted}",
                                   timeout=30 + size / 20e6, stdin=src)
        if done.rc != 0:
            raise HostError(f"{self.name}: copying {local} to {target} failed: {done.stderr.strip()[-200:]}")
        with self._lock:
            self._pushed[local] = target
        return target

    def _translate(self, token: str) -> str:
        if token == sys.executable:
            return self.machine.interpreter
        if token.startswith("/") and not token.startswith(str(self.run_dir / "procs")) and os.path.isfile(token):
            return self._push(token)
        return self.remote(token)

    def _remote_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """What the harness set or changed (never this machine's whole environment), the
        machine's own ``env``, and the checkout on ``PYTHONPATH``."""
        out = {k: self.remote(v) for k, v in env.items() if os.environ.get(k) != v or k.startswith("MXCHAOS_")}
        out.pop("PYTHONPATH", None)
        out.update(self.machine.env)
        out.update(SAFE_PATH_ENV)  # the working folder never on a Python's sys.path there (-P)
        if self.machine.repo:
            out["PYTHONPATH"] = self.machine.repo
        return out

    # ------------------------------------------------------------------ Host protocol

    def launch_line(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path) -> str:
        """The shell line that starts ``argv`` there: ``WRAPPER`` given the translated argv (a
        clock fault's ``unshare`` / ``env LD_PRELOAD=`` words included, so they run there),
        environment, folder and log as JSON."""
        spec: dict[str, Any] = {"argv": [self._translate(a) for a in argv], "env": self._remote_env(env),
                "cwd": self.remote(str(cwd)), "log": self.remote(str(log_path)),
                "rc": self.remote(str(log_path.with_suffix(".rc")))}
        return f"mkdir -p \"$(dirname {shlex.quote(spec['log'])})\" && {self.plumbing} exec {self._python()} -u -c " \
               f"{shlex.quote(WRAPPER)} {shlex.quote(json.dumps(spec))}"

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path) -> SshProc:
        command = self.launch_line(argv, env=env, cwd=cwd, log_path=log_path)
        client = subprocess.Popen([*self.ssh_argv(), command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, start_new_session=True, env=self.local_env)
        assert client.stdout is not None
        pid = self._first_line_pid(client, client.stdout)
        return SshProc(self, client, pid, client.stdout)

    def _first_line_pid(self, client: subprocess.Popen[bytes], stdout: IO[bytes]) -> int:
        found: list[bytes] = []
        reader = threading.Thread(target=lambda: found.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.machine.connect_timeout + 10)
        line = found[0].decode(errors="replace").strip() if found else ""
        if not line.startswith("pid "):
            client.kill()
            client.wait(5)
            stdout.close()
            why = "no answer" if not found else f"got {line!r}"
            if self.srun is not None:
                self.check_alive()  # srun's own failure (no job, no such node, no step) names itself
            raise HostError(self.lost or f"{self.where}: starting a process failed ({why})")
        return int(line[4:])

    def recover_rc(self, pid: int) -> int | None:
        """The exit code the wrapper wrote, after the connection ended before it reported it."""
        done = self.run_remote(f"cat {shlex.quote(self.remote_dir)}/procs/*.rc.{pid} 2>/dev/null",
                               timeout=self.machine.connect_timeout + 5)
        with contextlib.suppress(ValueError):
            return int(done.stdout.strip())
        return None

    def exec(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float) -> ExecResult:
        pairs = " ".join(shlex.quote(f"{k}={v}") for k, v in self._remote_env(env).items())
        line = " ".join(shlex.quote(self._translate(a)) for a in argv)
        return self.run_remote(f"cd {shlex.quote(self.remote(str(cwd)))} 2>/dev/null || cd {shlex.quote(self.remote_dir)}; "
                               f"exec env {pairs} {line}", timeout=timeout)

    def read(self, path: Path, offset: int, limit: int = 1 << 20) -> bytes:
        """From the local mirror of ``path``, which a ``tail -F`` of the host's file fills."""
        with self._lock:
            if path not in self._tails:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "ab") as sink:
                    self._tails[path] = subprocess.Popen(
                        [*self.ssh_argv(), f"{self.plumbing} exec tail -s 0.05 -c +1 -F {shlex.quote(self.remote(str(path)))}"],
                        stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.DEVNULL, start_new_session=True,
                        env=self.local_env)
        return read_slice(path, offset, limit)

    def port_open(self, port: int, timeout: float = 0.2) -> bool:
        return tcp_port_open(self.address, port, timeout)

    def run_processes(self, run_id: str, *, plumbing: bool = False) -> list[procscan.RunProcess]:
        """The run's processes there (``plumbing``: the harness's own tails, shells and wrappers
        of the run instead; ``run_id`` empty: of every run)."""
        key = " MXCHAOS_SSH_RUN_ID" if plumbing else ""
        done = self.run_remote(f"{self._python()} -c {shlex.quote(SCAN)} {shlex.quote(run_id)}{key}",
                               timeout=self.machine.connect_timeout + 10)
        if done.rc != 0:
            raise HostError(self.lost or f"ssh host {self.name}: scanning its processes failed: {done.stderr.strip()[-200:]}")
        return [procscan.RunProcess(pid, rid, proc, hp, hs, state, cmd) for pid, rid, proc, state, cmd, hp, hs in json.loads(done.stdout)]

    def kill_processes(self, pids: Sequence[int]) -> None:
        if pids:
            self.shell.run(f"kill -9 {' '.join(str(int(p)) for p in pids)}", timeout=self.machine.connect_timeout + 5)


def open_hosts(hosts: Sequence[str], inventory: Inventory, run_id: str, run_dir: Path, *, scenario: str) -> dict[str, SshHost]:
    """The scenario's hosts bound to the inventory's machines, connected; on a failure the ones
    opened are closed again and the error names the host."""
    bound = bind_hosts(hosts, inventory, scenario=scenario)
    opened: dict[str, SshHost] = {}
    try:
        for host, machine in bound.items():
            ssh_host = SshHost(host, machine, inventory.machines[machine], run_id, run_dir)
            ssh_host.open()
            opened[host] = ssh_host
    except BaseException:
        for done in opened.values():
            with contextlib.suppress(Exception):
                done.close()
        raise
    return opened
