"""Find processes started by mxchaos runs.

``find(run_id)`` is the one way the harness, its leak scan and ``mxchaos cleanup`` find a run's
processes: its scope (``harness.machine.runscope``: its cgroup, the ledger of what it spawned and their
sessions, and every descendant) merged with ``scan()``, the processes whose environment carries
``MXCHAOS_RUN_ID`` (and the harness's pid and start time). The environment alone misses a child
started with a clean one and a program that overwrites it with its process title (redis-server,
sshd); the scope misses nothing spawned through a host, and the tag reaches a process that
another harness's scope does not hold (a remote host's, seen from the same /proc in the lab).

``scan()`` reads ``/proc/*/environ`` (processes we may not read are skipped). An environment is
anyone's to write, so a tag counts only on a process of our own user (real and effective uid the
harness's euid): an unprivileged process carrying a live run's ``MXCHAOS_RUN_ID`` (run ids are
visible: cgroup names, link aliases) and a dead harness's pid is no evidence about that run, and
is never a target. A tag whose run id is malformed (``runscope.valid_run_id``) is skipped and named
in ``skipped``, never fatal. ``harness_alive`` tells whether the run's harness still exists (pid
plus its start time, so a reused pid does not count). Each ``RunProcess`` carries its start time,
which ``runscope.signal_exact`` checks again before any signal.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from harness.machine import runscope

__all__ = ["ENV_HARNESS_PID", "ENV_HARNESS_START", "ENV_PROC", "ENV_RUN_ID", "RunProcess", "find", "harness_alive", "listeners", "ours",
           "proc_start_time", "scan"]

ENV_RUN_ID = "MXCHAOS_RUN_ID"
ENV_PROC = "MXCHAOS_PROC"
ENV_HARNESS_PID = "MXCHAOS_HARNESS_PID"
ENV_HARNESS_START = "MXCHAOS_HARNESS_START"


@dataclass(frozen=True)
class RunProcess:
    pid: int
    run_id: str
    proc: str | None
    harness_pid: int | None
    harness_start: int | None
    state: str
    cmdline: str
    start: int | None = None  # clock ticks since boot: the pid is this process only while it matches
    tagged: bool = True  # found by its own MXCHAOS_RUN_ID (False: only through the run's scope)

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "run_id": self.run_id, "proc": self.proc, "state": self.state, "cmdline": self.cmdline}


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    st = runscope.proc_stat(pid)
    return st.start if st is not None else None


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat[stat.rindex(")") + 2 :].split()[0]


def harness_alive(pid: int | None, start: int | None) -> bool:
    if pid is None:
        return False
    current = proc_start_time(pid)
    if current is None or _state(pid) in ("Z", "X"):
        return False  # gone, or a zombie nobody reaped yet
    return start is None or current == start


def ours(pid: int) -> bool:
    """Whether ``pid`` runs as our user (its real and effective uid our euid), from
    ``/proc/PID/status``; False when it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("Uid:"):
            uids = line.split()[1:3]
            return len(uids) == 2 and all(u.isdigit() and int(u) == os.geteuid() for u in uids)
    return False


def scan(skipped: list[str] | None = None) -> list[RunProcess]:
    """The processes of our user tagged with a run id (module docstring); a malformed run id is
    named in ``skipped`` (when given) and its process left out."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == me:
            continue
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if ENV_RUN_ID.encode() not in raw:
            continue
        env = {}
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep and key.startswith(b"MXCHAOS_"):
                env[key.decode(errors="replace")] = value.decode(errors="replace")
        run_id = env.get(ENV_RUN_ID)
        if not run_id or not ours(pid):
            continue
        try:
            runscope.valid_run_id(run_id)
        except ValueError as exc:
            if skipped is not None:
                skipped.append(f"pid {pid}: {exc}")
            continue
        st = runscope.proc_stat(pid)
        state = st.state if st is not None else "?"
        if state == "Z" or st is None:
            continue  # a zombie is already dead; its parent reaps it
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmdline = ""
        hp = env.get(ENV_HARNESS_PID)
        hs = env.get(ENV_HARNESS_START)
        found.append(
            RunProcess(
                pid=pid,
                run_id=run_id,
                proc=env.get(ENV_PROC),
                harness_pid=int(hp) if hp and hp.isdigit() else None,
                harness_start=int(hs) if hs and hs.isdigit() else None,
                state=state,
                cmdline=cmdline[:300],
                start=st.start,
            )
        )
    return found


def find(run_id: str | None = None, skipped: list[str] | None = None) -> list[RunProcess]:
    """Every live process of ``run_id`` (None: of every run with a tag or a scope here): tagged
    ones as ``scan`` reports them (``skipped``: the malformed tags it named); the rest of the scope
    (a wrapper's child with a blank environment) named after its nearest tagged ancestor, with the
    harness its ledger names."""
    tagged = scan(skipped)
    by_pid = {p.pid: p for p in tagged if run_id is None or p.run_id == run_id}
    rids = {run_id} if run_id is not None else {p.run_id for p in tagged} | runscope.runs()
    parents: dict[int, int] = {}
    for rid in sorted(rids):
        seeds = [p.pid for p in tagged if p.run_id == rid]
        pids = runscope.members(rid, seeds) - set(by_pid)
        if not pids:
            continue
        hp, hs = runscope.owner(rid)
        if hp is None and seeds:
            first = next(p for p in tagged if p.pid == seeds[0])
            hp, hs = first.harness_pid, first.harness_start
        for pid in sorted(pids):
            st = runscope.proc_stat(pid)
            if st is None:
                continue
            parents[pid] = st.ppid
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmdline = ""
            by_pid[pid] = RunProcess(pid=pid, run_id=rid, proc=None, harness_pid=hp, harness_start=hs, state=st.state,
                                     cmdline=cmdline[:300], start=st.start, tagged=False)
    for pid in parents:  # a scope member's name: its nearest ancestor's that has one
        up, seen = parents[pid], {pid}
        while up not in seen and up > 1:
            seen.add(up)
            known = by_pid.get(up)
            if known is not None and known.proc is not None:
                by_pid[pid] = dataclasses.replace(by_pid[pid], proc=known.proc)
                break
            st = runscope.proc_stat(up)
            up = st.ppid if st else 0
    return sorted(by_pid.values(), key=lambda p: p.pid)


def listeners(port: int) -> set[int]:
    """The pids holding a listening TCP socket on ``port`` (IPv4 or IPv6), in any network
    namespace this process can see through /proc: each namespace's table is read once, through
    the first process found in it, and a socket is matched to its holders by inode. Processes we
    may not read are skipped (so an empty answer means "none seen", not "none")."""
    wanted = f"{port:04X}"
    listening: dict[str, set[str]] = {}  # network namespace -> inodes listening on the port
    holders: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ns = os.readlink(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if ns not in listening:
            listening[ns] = _listening_inodes(entry, wanted)
        inodes = listening[ns]
        if not inodes:
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                holders.add(int(entry))
                break
    return holders


def _listening_inodes(pid: str, port_hex: str) -> set[str]:
    """Inodes of the sockets listening on the port (``port_hex``, as /proc/net/tcp writes it) in
    ``pid``'s network namespace."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st ... inode: the local port after the colon, st 0A = LISTEN
            if len(fields) > 9 and fields[3] == "0A" and fields[1].rsplit(":", 1)[-1] == port_hex:
                inodes.add(fields[9])
    return inodes
